//! `fsdp-plan calibrate`: fits a hardware profile to measured timelines of plans, so
//! predictions match what the runtime does.
//!
//! Each schedule op is compute (a model op's forward, backward or recompute, a copy-out, an
//! optimizer step), a collective, or bookkeeping. Compute ops are fitted together by least
//! squares: measured time = eager kernel launches × per-launch overhead + bytes of their
//! memory-bound kernels × seconds per byte + matmul and attention FLOPs ÷ (peak × efficiency),
//! plus a per-op overhead for forward and one for backward model ops. Collectives get one factor on the link efficiency;
//! a last overall factor on every rate, the overheads and the latencies matches the step
//! total. Efficiencies above 1 are folded into the peak rates (FLOP/s, memory or link
//! bandwidth), so the written profile stays loadable.

use crate::hardware::Hardware;
use crate::plan::{OpKind, Plan};
use crate::timeline::predict;
use fsdp_ir::Model;
use std::collections::HashSet;

/// Unknowns of the compute regression (see [`fit_compute`]).
const N: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Forward,
    Backward,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Class {
    Compute,
    Comm,
    Bookkeeping,
}

fn classes(plan: &Plan, model: &Model) -> Vec<Class> {
    let ops: HashSet<&str> = model.ops.iter().map(|o| o.name.as_str()).collect();
    plan.schedule
        .iter()
        .map(|o| match &o.kind {
            OpKind::Forward { op, .. } | OpKind::Backward { op, .. } | OpKind::Recompute { op, .. } if ops.contains(&**op) => Class::Compute,
            OpKind::AllGather { .. } | OpKind::ReduceScatter { .. } | OpKind::AllReduce { .. } => Class::Comm,
            // memory copies: the optimizer's element-wise kernels, FSDP2's copy-out
            OpKind::OptimizerStep { .. } | OpKind::CopyOut { .. } => Class::Compute,
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

/// One measured step: one (start, end) per schedule op of `plan`, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    pub plan: &'a Plan,
    pub model: &'a Model,
    pub measured: &'a [(f64, f64)],
}

impl Sample<'_> {
    fn op_times(&self) -> Vec<f64> {
        self.measured.iter().map(|(a, b)| (b - a).max(0.0)).collect()
    }
    fn step(&self) -> f64 {
        self.measured.last().map(|x| x.1).unwrap_or(0.0) - self.measured.first().map(|x| x.0).unwrap_or(0.0)
    }
}

/// Fits `hw` to `measured`: one (start, end) per schedule op of `plan`, in seconds.
pub fn calibrate(plan: &Plan, model: &Model, hw: &Hardware, measured: &[(f64, f64)]) -> Calibration {
    calibrate_many(&[Sample { plan, model, measured }], hw)
}

/// Fits `hw` to several measured steps at once (e.g. two shapes of one model): the
/// regression pools their ops, the factors their sums. The figures of the returned
/// [`Calibration`] are sums over the samples.
pub fn calibrate_many(samples: &[Sample], hw: &Hardware) -> Calibration {
    let cls: Vec<Vec<Class>> = samples.iter().map(|s| classes(s.plan, s.model)).collect();
    let meas: Vec<Vec<f64>> = samples.iter().map(Sample::op_times).collect();
    let measured_step: f64 = samples.iter().map(Sample::step).sum();
    let total = |h: &Hardware| -> f64 { samples.iter().map(|s| durations(s.plan, s.model, h).1).sum() };
    let before = total(hw);
    let mut h = hw.clone();
    // compute: least squares of every compute op's measured time on its launches, memory
    // bytes, matmul and attention FLOPs (each at the profile's peak) and whether it is a
    // backward op (twice: which term bounds each kernel is decided with the profile of the
    // pass before)
    let mut fitted = false;
    for _ in 0..2 {
        if let Some([o, xm, xf, xa, ob, of]) = fit_compute(samples, &h, &meas, &cls) {
            let peaks = h.clone();
            h.op_overhead_s = o;
            h.backward_op_overhead_s = ob;
            h.forward_op_overhead_s = of;
            h.efficiency.memory = 1.0 / (xm * peaks.hbm_bandwidth);
            h.efficiency.matmul = 1.0 / xf;
            h.efficiency.attention = 1.0 / xa;
            normalize(&mut h);
            fitted = true;
        }
    }
    if !fitted {
        let mut book: Vec<f64> = cls.iter().flatten().zip(meas.iter().flatten()).filter(|(c, _)| **c == Class::Bookkeeping).map(|(_, m)| *m).collect();
        book.sort_by(|a, b| a.total_cmp(b));
        if let Some(&m) = book.get(book.len() / 2) {
            h.op_overhead_s = m;
        }
    }
    // collectives: one factor on the link efficiency (iterated: latency and the copies do
    // not scale with it)
    for _ in 0..50 {
        let (mut m, mut p) = (0.0, 0.0);
        for (i, s) in samples.iter().enumerate() {
            let (pred, _) = durations(s.plan, s.model, &h);
            for ((c, mt), pt) in cls[i].iter().zip(&meas[i]).zip(&pred) {
                if *c == Class::Comm {
                    m += mt;
                    p += pt;
                }
            }
        }
        if m <= 0.0 || p <= 0.0 || (m / p - 1.0).abs() < 1e-9 {
            break;
        }
        h.efficiency.comm /= m / p;
        normalize(&mut h);
    }
    // Then one overall factor on every rate and the overhead, so the step total matches too
    // (the fit leaves what the fixed overhead and latencies cannot absorb).
    for _ in 0..3 {
        let step = total(&h);
        if step <= 0.0 || measured_step <= 0.0 {
            break;
        }
        let r = measured_step / step;
        h.op_overhead_s *= r;
        h.backward_op_overhead_s *= r;
        h.forward_op_overhead_s *= r;
        h.efficiency.matmul /= r;
        h.efficiency.attention /= r;
        h.efficiency.memory /= r;
        h.efficiency.comm /= r;
        h.intra_node.latency *= r;
        h.inter_node.latency *= r;
        normalize(&mut h);
    }
    let after = total(&h);
    h.name = format!("{} (calibrated)", hw.name);
    Calibration {
        hardware: h,
        measured_step_s: measured_step,
        predicted_before_s: before,
        predicted_after_s: after,
    }
}

/// The compute regression: per compute op `i` (model ops, copy-out, optimizer), measured
/// `t_i ≈ L_i·o + B_i·xm + F_i·xf + A_i·xa + [backward]·ob + [forward]·of` with `L` launches,
/// `B` bytes of its memory-bound kernels, `F`/`A` its matmul/attention FLOPs divided by the
/// profile's peak; unknowns the per-launch overhead `o`, seconds per byte `xm`, the inverse
/// matmul/attention efficiencies and the per-op overheads of backward (`ob`) and forward or
/// recompute (`of`) model ops. A variable with no data or a negative solution is dropped and the rest
/// refitted. `None` when fewer ops than unknowns were measured.
fn fit_compute(samples: &[Sample], hw: &Hardware, meas: &[Vec<f64>], cls: &[Vec<Class>]) -> Option<[f64; N]> {
    use crate::cost::CostModel;
    let mut rows: Vec<([f64; N], f64)> = vec![];
    for (si, sample) in samples.iter().enumerate() {
        let (plan, cls, meas) = (sample.plan, &cls[si], &meas[si]);
        let cm = CostModel::new(plan, sample.model);
        sample_rows(plan, &cm, hw, meas, cls, &mut rows);
    }
    solve_rows(&rows, hw)
}

/// One regression row per compute op of one sample.
fn sample_rows(plan: &Plan, cm: &crate::cost::CostModel, hw: &Hardware, meas: &[f64], cls: &[Class], rows: &mut Vec<([f64; N], f64)>) {
    use crate::cost::Work;
    // `pass`: the model op's pass (None: copy-out, optimizer)
    let mut add = |kernels: &[crate::cost::Kernel], launches: u32, pass: Option<Pass>, t: f64| {
        let mut x = [launches.max(1) as f64, 0.0, 0.0, 0.0, (pass == Some(Pass::Backward)) as u8 as f64, (pass == Some(Pass::Forward)) as u8 as f64];
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
        if cls[i] != Class::Compute {
            continue;
        }
        let t = meas[i];
        match &op.kind {
            OpKind::Forward { op: n, .. } | OpKind::Recompute { op: n, .. } => {
                if let Some(k) = cm.forward(n) {
                    add(k, cm.launches(n).0, Some(Pass::Forward), t);
                }
            }
            OpKind::Backward { op: n, .. } => {
                if let Some(k) = cm.backward(n) {
                    add(k, cm.launches(n).1, Some(Pass::Backward), t);
                }
            }
            OpKind::OptimizerStep { unit } => {
                let (k, l) = crate::cost::optimizer_kernels(plan.unit(*unit), &plan.options);
                add(&k, l, None, t);
            }
            OpKind::CopyOut { unit } if plan.options.layout == crate::options::Layout::Fsdp2 => {
                let b = crate::cost::unsharded_bytes(plan.unit(*unit), &plan.options) as f64;
                add(&[crate::cost::Kernel { flops: 0.0, bytes: 2.0 * b, dtype: fsdp_ir::DType::Float32, work: Work::Memory, shape: crate::cost::Shape::None }], 1, None, t);
            }
            _ => {}
        }
    }
}

/// Least squares over `rows`, dropping variables without data or with a negative solution.
fn solve_rows(rows: &[([f64; N], f64)], hw: &Hardware) -> Option<[f64; N]> {
    let mut active = [true; N];
    for v in 0..N {
        active[v] = rows.iter().any(|(x, _)| x[v] > 0.0);
    }
    // the regression has no intercept; refit without any variable that comes out negative
    for _ in 0..N {
        let idx: Vec<usize> = (0..N).filter(|&v| active[v]).collect();
        if idx.is_empty() || rows.len() < idx.len() {
            return None;
        }
        let n = idx.len();
        let mut a = vec![vec![0.0; n + 1]; n];
        for (x, t) in rows {
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
        let mut out = [0.0; N];
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
        if !active[5] {
            out[5] = hw.forward_op_overhead_s;
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
        let pivot = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot[col];
                for (x, p) in row.iter_mut().zip(&pivot).skip(col) {
                    *x -= f * p;
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
