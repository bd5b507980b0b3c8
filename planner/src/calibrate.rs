//! `fsdp-plan calibrate`: fits a hardware profile's efficiency factors (and per-op overhead)
//! to a measured timeline of the same plan, so predictions match what the runtime does.
//!
//! Each schedule op falls in one class — matmul, attention or memory-bound compute (by the
//! model op it runs), collective, or bookkeeping. For a few rounds, every class's
//! efficiency is divided by `measured / predicted` summed over its ops; bookkeeping sets the
//! per-op overhead (their median); a last overall factor on every rate, the overhead and the
//! latencies matches the step total. Efficiencies above 1 are folded into the peak rates
//! (FLOP/s, memory or link bandwidth), so the written profile stays loadable.

use crate::hardware::Hardware;
use crate::plan::{OpKind, Plan};
use crate::timeline::predict;
use fsdp_ir::Model;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Class {
    Matmul,
    Attention,
    Memory,
    Comm,
    Bookkeeping,
}

fn classes(plan: &Plan, model: &Model) -> Vec<Class> {
    let kinds: HashMap<&str, &fsdp_ir::OpKind> = model.ops.iter().map(|o| (o.name.as_str(), &o.kind)).collect();
    plan.schedule
        .iter()
        .map(|o| match &o.kind {
            OpKind::Forward { op, .. } | OpKind::Backward { op, .. } | OpKind::Recompute { op, .. } => match kinds.get(op.as_str()) {
                Some(fsdp_ir::OpKind::Linear { .. } | fsdp_ir::OpKind::Experts { .. }) => Class::Matmul,
                Some(fsdp_ir::OpKind::Attention { .. }) => Class::Attention,
                Some(_) => Class::Memory,
                None => Class::Bookkeeping,
            },
            OpKind::AllGather { .. } | OpKind::ReduceScatter { .. } | OpKind::AllReduce { .. } => Class::Comm,
            // memory copies: the optimizer's element-wise kernels, FSDP2's copy-out
            OpKind::OptimizerStep { .. } | OpKind::CopyOut { .. } => Class::Memory,
            _ => Class::Bookkeeping,
        })
        .collect()
}

/// The fitted profile and the step-time error before and after, relative to the measurement.
#[derive(Debug, Clone)]
pub struct Calibration {
    pub hardware: Hardware,
    pub measured_step_s: f64,
    pub predicted_before_s: f64,
    pub predicted_after_s: f64,
}

impl Calibration {
    pub fn error_before(&self) -> f64 {
        (self.predicted_before_s - self.measured_step_s) / self.measured_step_s
    }
    pub fn error_after(&self) -> f64 {
        (self.predicted_after_s - self.measured_step_s) / self.measured_step_s
    }
}

fn durations(plan: &Plan, model: &Model, hw: &Hardware) -> (Vec<f64>, f64) {
    let r = predict(plan, model, hw);
    (r.ops.iter().map(|s| s.end - s.start).collect(), r.step_time_s)
}

/// Fits `hw` to `measured`: one (start, end) per schedule op of `plan`, in seconds.
pub fn calibrate(plan: &Plan, model: &Model, hw: &Hardware, measured: &[(f64, f64)]) -> Calibration {
    let cls = classes(plan, model);
    let meas: Vec<f64> = measured.iter().map(|(a, b)| (b - a).max(0.0)).collect();
    let measured_step = measured.last().map(|x| x.1).unwrap_or(0.0) - measured.first().map(|x| x.0).unwrap_or(0.0);
    let (_, before) = durations(plan, model, hw);
    let mut h = hw.clone();
    // compute: least squares of every compute op's measured time on its launches, memory
    // bytes, matmul and attention FLOPs (each at the profile's peak), for the per-launch
    // overhead and the three efficiencies
    // (twice: which term bounds each kernel is decided with the profile of the pass before)
    let mut fitted = false;
    for _ in 0..2 {
        if let Some([o, xm, xf, xa, ob]) = fit_compute(plan, model, &h, &meas, &cls) {
            let peaks = h.clone();
            h.op_overhead_s = o;
            h.backward_op_overhead_s = ob;
            h.efficiency.memory = 1.0 / (xm * peaks.hbm_bandwidth);
            h.efficiency.matmul = 1.0 / xf;
            h.efficiency.attention = 1.0 / xa;
            normalize(&mut h);
            fitted = true;
        }
    }
    if !fitted {
        let mut book: Vec<f64> = cls.iter().zip(&meas).filter(|(c, _)| **c == Class::Bookkeeping).map(|(_, m)| *m).collect();
        book.sort_by(|a, b| a.total_cmp(b));
        if let Some(&m) = book.get(book.len() / 2) {
            h.op_overhead_s = m;
        }
    }
    for _ in 0..4 {
        let (pred, _) = durations(plan, model, &h);
        let sum = |c: Class, v: &[f64]| -> f64 { cls.iter().zip(v).filter(|(x, _)| **x == c).map(|(_, t)| *t).sum() };
        for c in [Class::Comm] {
            let (m, p) = (sum(c, &meas), sum(c, &pred));
            if m <= 0.0 || p <= 0.0 {
                continue;
            }
            let ratio = m / p;
            let e = match c {
                Class::Matmul => &mut h.efficiency.matmul,
                Class::Attention => &mut h.efficiency.attention,
                Class::Memory => &mut h.efficiency.memory,
                _ => &mut h.efficiency.comm,
            };
            *e /= ratio;
        }
        normalize(&mut h);
    }
    // Then one overall factor on every rate and the overhead, so the step total matches too
    // (the per-class fit leaves what the fixed overhead and latencies cannot absorb).
    for _ in 0..3 {
        let (_, step) = durations(plan, model, &h);
        if step <= 0.0 || measured_step <= 0.0 {
            break;
        }
        let r = measured_step / step;
        h.op_overhead_s *= r;
        h.backward_op_overhead_s *= r;
        h.efficiency.matmul /= r;
        h.efficiency.attention /= r;
        h.efficiency.memory /= r;
        h.efficiency.comm /= r;
        h.intra_node.latency *= r;
        h.inter_node.latency *= r;
        normalize(&mut h);
    }
    let (_, after) = durations(plan, model, &h);
    h.name = format!("{} (calibrated)", hw.name);
    Calibration {
        hardware: h,
        measured_step_s: measured_step,
        predicted_before_s: before,
        predicted_after_s: after,
    }
}

/// The compute regression: per compute op `i` (model ops, copy-out, optimizer), measured
/// `t_i ≈ L_i·o + B_i·xm + F_i·xf + A_i·xa + [backward]·ob` with `L` launches, `B` bytes of
/// its memory-bound kernels, `F`/`A` its matmul/attention FLOPs divided by the profile's peak;
/// unknowns the per-launch overhead `o`, seconds per byte `xm`, the inverse matmul/attention
/// efficiencies and the per-backward-op overhead `ob`. A variable with no data or a negative solution is dropped and the rest
/// refitted. `None` when fewer ops than unknowns were measured.
fn fit_compute(plan: &Plan, model: &Model, hw: &Hardware, meas: &[f64], cls: &[Class]) -> Option<[f64; 5]> {
    use crate::cost::{CostModel, Work};
    let cm = CostModel::new(plan, model);
    let mut rows: Vec<([f64; 5], f64)> = vec![];
    let mut add = |kernels: &[crate::cost::Kernel], launches: u32, backward: bool, t: f64| {
        let mut x = [launches.max(1) as f64, 0.0, 0.0, 0.0, if backward { 1.0 } else { 0.0 }];
        for k in kernels {
            // the term that bounds the kernel under `hw` (see `Kernel::time`)
            let eff = match k.work {
                Work::Matmul => hw.efficiency.matmul,
                Work::Attention => hw.efficiency.attention,
                Work::Memory => 1.0,
            };
            let compute = k.work != Work::Memory && k.flops > 0.0 && k.flops / (hw.peak(k.dtype) * eff) >= k.bytes / (hw.hbm_bandwidth * hw.efficiency.memory);
            match (k.work, compute) {
                (Work::Matmul, true) => x[2] += k.flops / hw.peak(k.dtype),
                (Work::Attention, true) => x[3] += k.flops / hw.peak(k.dtype),
                _ => x[1] += k.bytes,
            }
        }
        rows.push((x, t));
    };
    for (i, op) in plan.schedule.iter().enumerate() {
        if cls[i] == Class::Comm || cls[i] == Class::Bookkeeping {
            continue;
        }
        let t = meas[i];
        match &op.kind {
            OpKind::Forward { op: n, .. } | OpKind::Recompute { op: n, .. } => {
                if let Some(k) = cm.forward(n) {
                    add(k, cm.launches(n).0, false, t);
                }
            }
            OpKind::Backward { op: n, .. } => {
                if let Some(k) = cm.backward(n) {
                    add(k, cm.launches(n).1, true, t);
                }
            }
            OpKind::OptimizerStep { unit } => {
                let (k, l) = crate::cost::optimizer_kernels(plan.unit(*unit), &plan.options);
                add(&k, l, false, t);
            }
            OpKind::CopyOut { unit } if plan.options.layout == crate::options::Layout::Fsdp2 => {
                let b = crate::cost::unsharded_bytes(plan.unit(*unit), &plan.options) as f64;
                add(&[crate::cost::Kernel { flops: 0.0, bytes: 2.0 * b, dtype: fsdp_ir::DType::Float32, work: Work::Memory }], 1, false, t);
            }
            _ => {}
        }
    }
    let mut active = [true; 5];
    for v in 0..5 {
        active[v] = rows.iter().any(|(x, _)| x[v] > 0.0);
    }
    // the regression has no intercept; refit without any variable that comes out negative
    for _ in 0..5 {
        let idx: Vec<usize> = (0..5).filter(|&v| active[v]).collect();
        if idx.is_empty() || rows.len() < idx.len() {
            return None;
        }
        let n = idx.len();
        let mut a = vec![vec![0.0; n + 1]; n];
        for (x, t) in &rows {
            for (r, &i) in idx.iter().enumerate() {
                for (c, &j) in idx.iter().enumerate() {
                    a[r][c] += x[i] * x[j];
                }
                a[r][n] += x[i] * t;
            }
        }
        let sol = solve(a)?;
        if let Some(r) = sol.iter().position(|&v| v <= 0.0) {
            active[idx[r]] = false;
            continue;
        }
        let mut out = [0.0; 5];
        for (r, &i) in idx.iter().enumerate() {
            out[i] = sol[r];
        }
        // dropped variables keep the profile's values
        if !active[0] {
            out[0] = hw.op_overhead_s;
        }
        if !active[1] {
            out[1] = 1.0 / (hw.hbm_bandwidth * hw.efficiency.memory);
        }
        if !active[2] {
            out[2] = 1.0 / hw.efficiency.matmul;
        }
        if !active[3] {
            out[3] = 1.0 / hw.efficiency.attention;
        }
        if !active[4] {
            out[4] = hw.backward_op_overhead_s;
        }
        return Some(out);
    }
    None
}

/// Gaussian elimination with partial pivoting on the augmented matrix `a` (n × n+1).
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    // scale columns so the pivots are comparable (launches ~1, bytes ~1e5, FLOP-seconds ~1e-6)
    let scale: Vec<f64> = (0..n).map(|c| a[c][c].abs().sqrt().max(f64::MIN_POSITIVE)).collect();
    for r in 0..n {
        for c in 0..n {
            a[r][c] /= scale[r] * scale[c];
        }
        a[r][n] /= scale[r];
    }
    for col in 0..n {
        let piv = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        for r in 0..n {
            if r != col {
                let f = a[r][col] / a[col][col];
                for c in col..=n {
                    a[r][c] -= f * a[col][c];
                }
            }
        }
    }
    Some((0..n).map(|r| a[r][n] / a[r][r] / scale[r]).collect())
}

/// Folds efficiencies above 1 into the peak rates.
fn normalize(h: &mut Hardware) {
    let s = h.efficiency.matmul.max(h.efficiency.attention);
    if s > 1.0 {
        h.peak_flops.bf16 *= s;
        h.peak_flops.fp16 *= s;
        h.peak_flops.tf32 *= s;
        h.peak_flops.fp32 *= s;
        h.efficiency.matmul /= s;
        h.efficiency.attention /= s;
    }
    if h.efficiency.memory > 1.0 {
        h.hbm_bandwidth *= h.efficiency.memory;
        h.efficiency.memory = 1.0;
    }
    if h.efficiency.comm > 1.0 {
        h.intra_node.bandwidth *= h.efficiency.comm;
        h.inter_node.bandwidth *= h.efficiency.comm;
        h.efficiency.comm = 1.0;
    }
}
