//! torchao's float8 linear (torchtitan's `--float8`, the tensorwise recipe) on libtorch's
//! `_scaled_mm`: what `torchao.float8.Float8Linear` computes, op for op, so that the losses
//! and gradients equal torchao's (checked against torchao 0.18.0 in
//! `runtime/tests/train_parity.rs` and, beside FSDP2, by `scripts/gpu-check.sh`).
//!
//! Dynamic tensorwise scaling: each operand's scale is `finfo.max / max(|t|, 1e-12)` (in
//! float64, kept in float32), its bits `clamp(t · scale, ±finfo.max)` in float8 — e4m3 for the
//! input and the weight, e5m2 for the output gradient — and `_scaled_mm` multiplies the bits
//! with the inverse scales into the input's dtype (fast accumulation for the output GEMM
//! only, as torchao's defaults). Like torchao's `matmul_with_hp_or_float8_args`, the forward
//! keeps the high-precision input and weight for the backward (the executor holds them), and
//! the backward casts them again: `grad_input = go₈ · w₈`, `grad_weight = go₈ᵀ · x₈`, with the
//! layout copies `_scaled_mm` needs (row-major first operand, column-major second) where
//! torchao makes them, so that the memory the runtime measures is torchao's.
//! A bias is added after the GEMM in the output's dtype (`output + bias.to(output.dtype)`).
//! Under `--float8-all-gather` (torchao's `enable_fsdp_float8_all_gather`) each weight's
//! shard is cast before the all-gather with the scale of the whole weight (its amax the max
//! over the shard group: [`weight_shard`]), and the linear takes the gathered bits as they are
//! ([`Weight::Float8`]), in the forward and again in the backward.
//! Under torchtitan's op-level SAC (its save list of the rows' runs keeps `abs` and `max`)
//! each forward cast's `|t|` and amax stay from the forward to the recompute, which takes
//! them rather than computing them again ([`Sac`]); a linear whose GEMM output SAC keeps runs
//! its casts again and takes the GEMM from the cache.

use crate::error::RtError;
use std::collections::VecDeque;
use tch::{Kind, Tensor};

/// e4m3fn's largest finite value (`torch.finfo(torch.float8_e4m3fn).max`).
const E4M3_MAX: f64 = 448.0;
/// e5m2's largest finite value.
const E5M2_MAX: f64 = 57344.0;
/// torchao's floor under an amax (`float8_utils.EPS`).
const EPS: f64 = 1e-12;

/// A tensor's dynamic tensorwise scale into a float8 format whose largest value is `max`:
/// torchao's `tensor_to_scale` (`torch.max(torch.abs(x))`, then `amax_to_scale` in float64).
fn scale(x: &Tensor, max: f64) -> Tensor {
    scale_of_amax(&x.abs().max(), max)
}

/// What op-level SAC does with a forward cast's `abs` and `max` (torchtitan's policy of
/// Dec 2024 saves both: `torch.ops.aten.abs.default`, `torch.ops.aten.max.default` — the
/// plan's `Step::MakeSaved`).
pub enum Sac<'a> {
    /// Not in a selective-op region: computed and dropped.
    Off,
    /// The forward of a selective-op region: `|t|` and its amax pushed, in cast order (the
    /// input's, then the weight's where the linear casts it), and kept.
    Keep(&'a mut VecDeque<Tensor>),
    /// Its recompute: taken from the front instead of computed; `|t|` goes once the amax is
    /// had, the amax once the scale is (as torch drops what the cache served).
    Take(&'a mut VecDeque<Tensor>),
}

/// [`scale`] under op-level SAC.
fn scale_sac(x: &Tensor, max: f64, sac: &mut Sac) -> Result<Tensor, RtError> {
    match sac {
        Sac::Off => Ok(scale(x, max)),
        Sac::Keep(kept) => {
            let a = x.abs();
            let m = a.max();
            let s = scale_of_amax(&m, max);
            kept.push_back(a);
            kept.push_back(m);
            Ok(s)
        }
        Sac::Take(kept) => {
            let (Some(a), Some(m)) = (kept.pop_front(), kept.pop_front()) else {
                return Err(RtError::Plan("float8 linear: the recompute finds no abs and amax kept by selective AC".into()));
            };
            drop(a);
            Ok(scale_of_amax(&m, max))
        }
    }
}

/// torchao's `amax_to_scale`.
fn scale_of_amax(amax: &Tensor, max: f64) -> Tensor {
    (amax.to_kind(Kind::Double).clamp_min(EPS).reciprocal() * max).to_kind(Kind::Float)
}

/// A float8 linear's weight as the linear gets it.
pub enum Weight<'a> {
    /// In high precision: the linear casts it (each GEMM's own cast).
    High(&'a Tensor),
    /// Gathered in float8 (e4m3 bits [out, in] and their scale), used as they are.
    Float8 { bits: &'a Tensor, scale: &'a Tensor },
}

impl Weight<'_> {
    /// The transposed weight's e4m3 bits [in, out] (column-major) and scale.
    fn cast_t(&self, sac: &mut Sac) -> Result<(Tensor, Tensor), RtError> {
        Ok(match self {
            Weight::High(w) => {
                let wt = w.tr();
                let sw = scale_sac(&wt, E4M3_MAX, sac)?;
                (bits(&wt, &sw, E4M3_MAX, Kind::Float8e4m3fn), sw)
            }
            Weight::Float8 { bits, scale } => (bits.tr(), scale.shallow_clone()),
        })
    }

    fn out_features(&self) -> i64 {
        match self {
            Weight::High(w) | Weight::Float8 { bits: w, .. } => w.size()[0],
        }
    }

    fn in_features(&self) -> i64 {
        match self {
            Weight::High(w) | Weight::Float8 { bits: w, .. } => w.size()[1],
        }
    }
}

/// A weight's shard cast for torchao's float8 all-gather (`fsdp_pre_all_gather`: dynamic
/// scaling with the amax all-reduced over the shard group — `amax`, the max of every rank's
/// [`local_amax`]): its e4m3 bits and the scale, which every rank computes alike.
pub fn weight_shard(shard: &Tensor, amax: &Tensor) -> (Tensor, Tensor) {
    let s = scale_of_amax(amax, E4M3_MAX);
    (bits(shard, &s, E4M3_MAX, Kind::Float8e4m3fn), s)
}

/// `torch.max(torch.abs(shard))` in the shard's dtype (0 for an empty shard), [1], for the
/// all-reduce.
pub fn local_amax(shard: &Tensor) -> Tensor {
    match shard.numel() {
        0 => Tensor::zeros([1], (shard.kind(), shard.device())),
        _ => shard.abs().max().reshape([1]),
    }
}

/// `x`'s float8 bits under `scale` (torchao's `hp_tensor_and_scale_to_float8`: scaled in
/// float32, saturated, cast).
fn bits(x: &Tensor, scale: &Tensor, max: f64, kind: Kind) -> Tensor {
    (x.to_kind(Kind::Float) * scale).clamp(-max, max).to_kind(kind)
}

/// torchao's `is_row_major`: a 2-d stride whose rows are contiguous.
fn row_major(t: &Tensor) -> bool {
    let s = t.stride();
    s.len() == 2 && s[0] > s[1] && s[1] == 1
}

/// `a · b` of float8 bits with their scales into `out` (torchao's `preprocess_addmm` and
/// `addmm_float8_unwrapped`: `a` made row-major, `b` column-major, inverse scales).
fn scaled_mm(a: &Tensor, sa: &Tensor, b: &Tensor, sb: &Tensor, out: Kind, fast: bool) -> Result<Tensor, RtError> {
    let a = if row_major(a) { a.shallow_clone() } else { a.contiguous() };
    let b = if row_major(b) { b.tr().contiguous().tr() } else { b.shallow_clone() };
    Ok(a.f_internal_scaled_mm::<Tensor>(&b, &sa.reciprocal(), &sb.reciprocal(), None, None, out, fast)?)
}

/// The float8 linear's output for input `x` [..., in], weight `w` [out, in] and bias, its
/// casts' `abs` and `max` as op-level SAC has them ([`Sac`]), and, with `keep_gemm`, the GEMM's
/// result before the bias (what SAC's cache keeps of a linear with a bias: the `mm` output).
/// `cached`: that result (the output itself without a bias) as the cache kept it, which the
/// recompute takes after running the casts again (torch serves `mm` from the cache; the casts
/// are other ops), adding the bias to it anew; it goes once used, as the cache's entry does.
pub fn forward(x: &Tensor, w: Weight, bias: Option<&Tensor>, mut sac: Sac, cached: Option<Tensor>, keep_gemm: bool) -> Result<(Tensor, Option<Tensor>), RtError> {
    let kind = x.kind();
    let sx = scale_sac(x, E4M3_MAX, &mut sac)?;
    let x8 = bits(x, &sx, E4M3_MAX, Kind::Float8e4m3fn);
    let (w8t, sw) = w.cast_t(&mut sac)?;
    if let Some(y) = cached {
        drop((x8, w8t));
        return Ok(match bias {
            Some(b) => (&y + b.to_kind(kind), None),
            None => (y, None),
        });
    }
    let mut shape = x.size();
    let fan_in = *shape.last().ok_or_else(|| RtError::Plan("float8 linear: a 0-dim input".into()))?;
    let y = scaled_mm(&x8.reshape([-1, fan_in]), &sx, &w8t, &sw, kind, true)?;
    // (torchao's autograd function returns here: its casts go before the bias is added)
    drop((x8, w8t));
    if let Some(l) = shape.last_mut() {
        *l = w.out_features();
    }
    let y = y.reshape(shape.as_slice());
    Ok(match bias {
        Some(b) => {
            let out = &y + b.to_kind(kind);
            (out, keep_gemm.then_some(y))
        }
        None => (y, None),
    })
}

/// The gradients of a float8 linear's input, weight and bias (when it has one) for output
/// gradient `g`, from the forward's high-precision input `x` and weight `w`.
pub struct Grads {
    pub input: Tensor,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

/// torchao's `matmul_with_hp_or_float8_args.backward` (and autograd's for the bias add).
pub fn backward(x: &Tensor, w: Weight, has_bias: bool, g: &Tensor) -> Result<Grads, RtError> {
    let gshape = g.size();
    let fan_out = *gshape.last().ok_or_else(|| RtError::Plan("float8 linear: a 0-dim gradient".into()))?;
    let kind = g.kind();
    // the bias's grad first: autograd runs the add's node before the GEMMs'
    let bias = has_bias.then(|| {
        let lead: Vec<i64> = (0..gshape.len() as i64 - 1).collect();
        g.sum_dim_intlist(lead.as_slice(), false, None::<Kind>)
    });
    let g2 = g.reshape([-1, fan_out]);
    // grad_input = go₈ (e5m2) · w₈ (e4m3, cast again from the weight)
    let sg = scale(&g2, E5M2_MAX);
    let g8 = bits(&g2, &sg, E5M2_MAX, Kind::Float8e5m2);
    let (w8t, sw) = w.cast_t(&mut Sac::Off)?;
    let gi = scaled_mm(&g8, &sg, &w8t.tr(), &sw, kind, false)?;
    let mut ishape = gshape.clone();
    if let Some(l) = ishape.last_mut() {
        *l = w.in_features();
    }
    let input = gi.reshape(ishape.as_slice());
    // grad_weight = go₈ᵀ · x₈ (both cast again, as torchao casts each GEMM's operands;
    // grad_input's operands live on to the end, as torchao's locals do)
    let fan_in = *x.size().last().ok_or_else(|| RtError::Plan("float8 linear: a 0-dim input".into()))?;
    let x2 = x.reshape([-1, fan_in]);
    let sg1 = scale(&g2, E5M2_MAX);
    let g8t = bits(&g2, &sg1, E5M2_MAX, Kind::Float8e5m2).tr();
    let sx = scale(&x2, E4M3_MAX);
    let x8 = bits(&x2, &sx, E4M3_MAX, Kind::Float8e4m3fn);
    let weight = scaled_mm(&g8t, &sg1, &x8, &sx, kind, false)?;
    Ok(Grads { input, weight, bias })
}
