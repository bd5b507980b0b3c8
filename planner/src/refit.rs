//! Refitting a hardware profile to measured step throughputs (`fsdp-plan rows FILE --fit`):
//! a user with their own cluster's numbers (a rows file of configurations and measured
//! tokens/s/GPU) scales the profile's three rates so that the model predicts them.
//!
//! The profile's kernel-level constants keep their shape (GEMM waves, FlashAttention's
//! curve, NCCL's sizes); three factors scale them ([`scale`]): **compute** (GEMMs and
//! attention: the GPU's sustained clock and its power-limited rates; a CPU profile's peak
//! FLOP/s), **memory** (HBM
//! bandwidth: element-wise kernels, copies, the optimizer) and **communication** (NCCL's bus
//! bandwidths and the NICs; a CPU profile's links). The fit minimizes the sum of squared log
//! errors of tokens/s over the rows by Levenberg–Marquardt on the factors' logarithms
//! (bounded to [e^-1.5, e^1.5], Jacobian by finite differences); the plans are built once,
//! only the timeline runs again. A factor the rows barely constrain (communication, when it
//! is hidden under compute in most rows) can move far to absorb what the other rates do not
//! explain: read the factors before trusting the profile, and fix such a factor at 1
//! (`--fit-factors compute,memory`).

use crate::hardware::Hardware;
use crate::plan::Plan;
use crate::timeline::predict;
use fsdp_ir::Model;

/// The three factors, in [`scale`]'s order: compute, memory, communication.
pub type Factors = [f64; 3];

/// `hw` with its rates scaled by `f`.
pub fn scale(hw: &Hardware, f: Factors) -> Hardware {
    let mut h = hw.clone();
    let [c, m, n] = f;
    match h.gpu.as_mut() {
        Some(g) => {
            g.sustained *= c;
            if let Some(p) = g.power.as_mut() {
                p.bf16 *= c;
                p.fp16 *= c;
                p.fp8 = p.fp8.map(|f| f * c);
            }
            g.nccl.all_gather_busbw *= n;
            g.nccl.reduce_scatter_busbw *= n;
            g.nccl.all_reduce_busbw *= n;
            g.nccl.nic_bandwidth *= n;
        }
        None => {
            h.peak_flops.bf16 *= c;
            h.peak_flops.fp16 *= c;
            h.peak_flops.tf32 *= c;
            h.peak_flops.fp32 *= c;
        }
    }
    h.hbm_bandwidth *= m;
    h.intra_node.bandwidth *= n;
    h.inter_node.bandwidth *= n;
    h
}

/// One measured configuration: its plan, its model and the measured tokens/s/GPU.
pub struct Case<'a> {
    pub plan: &'a Plan,
    pub model: &'a Model,
    pub measured_tokens_per_s: f64,
}

/// A refit: the factors, the fitted profile, and each case's prediction before and after.
#[derive(Debug, Clone)]
pub struct Refit {
    pub factors: Factors,
    pub hardware: Hardware,
    pub before: Vec<f64>,
    pub after: Vec<f64>,
    /// Root mean square of the log errors before and after (×100: ~percent).
    pub rms_before: f64,
    pub rms_after: f64,
}

fn predictions(cases: &[Case], hw: &Hardware) -> Vec<f64> {
    cases.iter().map(|c| predict(c.plan, c.model, hw).tokens_per_s_per_gpu).collect()
}

/// `m · d = g` for a 3×3 system (Cramer's rule); `None` when singular.
fn solve3(m: [[f64; 3]; 3], g: [f64; 3]) -> Option<[f64; 3]> {
    let det = |m: [[f64; 3]; 3]| m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
    let d = det(m);
    if d.abs() < 1e-300 || !d.is_finite() {
        return None;
    }
    Some([0, 1, 2].map(|k| {
        let mut mk = m;
        for (row, v) in mk.iter_mut().zip(g) {
            row[k] = v;
        }
        det(mk) / d
    }))
}

/// Fits [`Factors`] on `cases` from `hw` (see the module doc). `fit[i]` says whether case
/// `i` takes part (the others are only predicted: held out); `free[k]` whether factor `k`
/// is fitted (else it stays 1).
pub fn refit(cases: &[Case], fit: &[bool], free: [bool; 3], hw: &Hardware) -> Refit {
    let fitted: Vec<usize> = (0..cases.len()).filter(|&i| fit.get(i).copied().unwrap_or(true)).collect();
    // residuals: the log error of each fitted case at log-factors `x`
    let residuals = |x: [f64; 3]| -> Vec<f64> {
        let h = scale(hw, x.map(f64::exp));
        fitted.iter().map(|&i| (predict(cases[i].plan, cases[i].model, &h).tokens_per_s_per_gpu / cases[i].measured_tokens_per_s).ln()).collect()
    };
    let sq = |r: &[f64]| r.iter().map(|v| v * v).sum::<f64>();
    let mut x = [0.0f64; 3];
    if !fitted.is_empty() {
        // Levenberg–Marquardt on the log factors, Jacobian by forward differences
        let mut r = residuals(x);
        let mut lambda = 1e-3;
        for _ in 0..40 {
            let h = 1e-4;
            let cols: Vec<Vec<f64>> = (0..3)
                .map(|k| {
                    let mut y = x;
                    y[k] += h;
                    residuals(y).iter().zip(&r).map(|(a, b)| (a - b) / h).collect()
                })
                .collect();
            // normal equations (JᵀJ + λ·diag(JᵀJ)) δ = −Jᵀr
            let mut a = [[0.0f64; 3]; 3];
            let mut g = [0.0f64; 3];
            for i in 0..3 {
                for j in 0..3 {
                    a[i][j] = cols[i].iter().zip(&cols[j]).map(|(p, q)| p * q).sum();
                }
                g[i] = -cols[i].iter().zip(&r).map(|(p, q)| p * q).sum::<f64>();
            }
            // a fixed factor: its row and column of the system are the identity's, δ = 0
            for k in (0..3).filter(|&k| !free[k]) {
                a[k] = [0.0; 3];
                for row in a.iter_mut() {
                    row[k] = 0.0;
                }
                a[k][k] = 1.0;
                g[k] = 0.0;
            }
            let mut improved = false;
            for _ in 0..8 {
                let mut m = a;
                for (i, row) in m.iter_mut().enumerate() {
                    row[i] += lambda * a[i][i].max(1e-12);
                }
                let Some(d) = solve3(m, g) else { break };
                let y = [0, 1, 2].map(|k| (x[k] + d[k]).clamp(-1.5, 1.5));
                let ry = residuals(y);
                if sq(&ry) < sq(&r) {
                    x = y;
                    r = ry;
                    lambda = (lambda / 3.0).max(1e-9);
                    improved = true;
                    break;
                }
                lambda *= 4.0;
            }
            if !improved || sq(&r) < 1e-14 {
                break;
            }
        }
    }
    let factors = x.map(f64::exp);
    let hardware = scale(hw, factors);
    let before = predictions(cases, hw);
    let after = predictions(cases, &hardware);
    let sub = |v: &[f64]| -> (Vec<f64>, Vec<f64>) { (fitted.iter().map(|&i| v[i]).collect(), fitted.iter().map(|&i| cases[i].measured_tokens_per_s).collect()) };
    let r = |v: &[f64]| {
        let (p, m) = sub(v);
        if p.is_empty() {
            return 0.0;
        }
        100.0 * (p.iter().zip(&m).map(|(p, m)| (p / m).ln().powi(2)).sum::<f64>() / p.len() as f64).sqrt()
    };
    let (rms_before, rms_after) = (r(&before), r(&after));
    Refit { factors, hardware, before, after, rms_before, rms_after }
}
