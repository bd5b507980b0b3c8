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
            OpKind::OptimizerStep { .. } => Class::Memory,
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
    let mut book: Vec<f64> = cls.iter().zip(&meas).filter(|(c, _)| **c == Class::Bookkeeping).map(|(_, m)| *m).collect();
    book.sort_by(|a, b| a.total_cmp(b));
    if let Some(&m) = book.get(book.len() / 2) {
        h.op_overhead_s = m;
    }
    for _ in 0..4 {
        let (pred, _) = durations(plan, model, &h);
        let sum = |c: Class, v: &[f64]| -> f64 { cls.iter().zip(v).filter(|(x, _)| **x == c).map(|(_, t)| *t).sum() };
        for c in [Class::Matmul, Class::Attention, Class::Memory, Class::Comm] {
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
