//! Cost model: FLOPs and bytes of each IR op (forward, backward, recompute), their time on
//! a [`Hardware`] profile, and the time of FSDP's collectives.
//!
//! An op is one or more kernels; a kernel takes
//!
//! ```text
//! t = max(flops / (peak(dtype) · eff), bytes / (hbm_bandwidth · eff_memory))
//! ```
//!
//! and an op takes `Σ t + launches · op_overhead_s`, `launches` being the ATen kernels eager
//! PyTorch dispatches for it (HF's implementation: an RMSNorm is six element-wise kernels in
//! the forward, a Linear one; see [`launches`]). `eff` is `efficiency.matmul` for GEMMs and
//! `efficiency.attention` for attention kernels. Element-wise ops, norms, embeddings,
//! rotary, router and loss are memory-bound: their FLOPs are not counted, only bytes.
//!
//! FLOPs of the forward, with `T` the rows of the op (batch · seq tokens):
//!
//! - linear `[T, in] @ [in, out]`: `2·T·in·out` (+ `T·out` with a bias);
//! - MoE experts (SwiGLU, intermediate `I`, top-k `k`): `2·T·k·(2·I·H + I·H) = 6·T·k·H·I`;
//! - attention: `4·b·s²·h·hd` (`QKᵀ` and `PV`, `h` query heads of width `hd`), halved when
//!   causal and run by SDPA / flash-attention: those kernels skip the key tiles above the
//!   diagonal, so they compute `s(s+tile)/2 ≈ s²/2` scores. Eager attention materializes the
//!   full `s×s` matrix and is not halved; its softmax, scaling and casts are a second,
//!   memory-bound kernel over the score tensors.
//!
//! Backward: `2×` the forward FLOPs for GEMMs (input grad and weight grad); `2.5×` for
//! SDPA/flash attention (five `s×s` GEMMs against two: FlashAttention-2 recomputes `QKᵀ`),
//! `2×` for eager attention. Recompute (activation checkpointing) costs like the forward.
//!
//! Bytes moved, from [`crate::activation`]'s spec of the op (`cd` = compute dtype):
//! forward = inputs read + params read (gathered rows for embeddings) + output written +
//! saved tensors written + 2 × forward scratch (written and read back); backward = output
//! grad read + input grads written + saved tensors and saved inputs read + 2 × backward
//! scratch + params read and param grads written.
//!
//! Collectives (NCCL ring algorithms), `B` = the full unsharded buffer in bytes, `n` ranks,
//! `α` per-hop latency, `β` link bandwidth per GPU per direction, `e` = `efficiency.comm`:
//!
//! ```text
//! all-gather  = reduce-scatter = α·(n−1) + (n−1)/n · B / (β·e)
//! all-reduce  = 2 × that (reduce-scatter + all-gather)
//! ```
//!
//! A group inside one node uses the intra-node link; a group with one rank per node (the
//! HSDP replicate group) the inter-node link. A group with `g > 1` ranks on each of `N > 1`
//! nodes runs hierarchically — an inter-node ring over the `N` nodes on `B/g` bytes (each
//! GPU drives its own NIC), then an intra-node ring over the `g` local ranks on `B`:
//!
//! ```text
//! t = α_inter·(N−1) + (N−1)/N · (B/g) / (β_inter·e)  +  α_intra·(g−1) + (g−1)/g · B / (β_intra·e)
//! ```
//!
//! (reduce-scatter runs the two rings in the other order; the time is the same). Hybrid
//! sharding: the shard group is `shard_size` consecutive ranks (intra-node when it fits), the
//! replicate group takes every `shard_size`-th rank. FSDP2's copy-in before a collective and
//! the reduce-scatter's `chunk_cat` are not costed; the copy-out is (see [`crate::timeline`]).

use crate::activation::{op_mem, Ctx};
use crate::hardware::Hardware;
use crate::options::{AttnImpl, Optimizer, Options};
use crate::plan::{Group, Plan};
use crate::units::Unit;
use fsdp_ir::{numel, DType, Dims, Model, Op, OpKind};
use std::collections::HashMap;

/// What bounds a kernel's FLOPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Matmul,
    Attention,
    /// Memory-bound: FLOPs not counted.
    Memory,
}

/// One kernel of an op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kernel {
    pub flops: f64,
    pub bytes: f64,
    pub dtype: DType,
    pub work: Work,
}

impl Kernel {
    /// `max(flops / (peak · eff), bytes / (hbm_bandwidth · eff_memory))`.
    pub fn time(&self, hw: &Hardware) -> f64 {
        let eff = match self.work {
            Work::Matmul => hw.efficiency.matmul,
            Work::Attention => hw.efficiency.attention,
            Work::Memory => 1.0,
        };
        let c = if self.work == Work::Memory || self.flops <= 0.0 { 0.0 } else { self.flops / (hw.peak(self.dtype) * eff) };
        let m = self.bytes / (hw.hbm_bandwidth * hw.efficiency.memory);
        c.max(m)
    }
}

/// Time of an op made of `kernels`, dispatched as `launches` eager kernels: their times plus
/// the per-dispatch overhead.
pub fn op_time(hw: &Hardware, kernels: &[Kernel], launches: u32) -> f64 {
    kernels.iter().map(|k| k.time(hw)).sum::<f64>() + launches.max(1) as f64 * hw.op_overhead_s
}

/// ATen kernels eager PyTorch dispatches for `op` (forward, backward), following HF
/// transformers 5.17's implementations (views not counted). `cast` is whether the op upcasts
/// low-precision activations to float32 on the way (RMSNorm, softmax, loss).
pub fn launches(op: &Op, cast: bool) -> (u32, u32) {
    let c = u32::from(cast);
    match &op.kind {
        OpKind::Embedding => (1, 2),
        OpKind::PositionEmbedding => (2, 2),
        OpKind::Linear { bias, .. } => (1, 2 + u32::from(*bias)),
        OpKind::LayerNorm { .. } => (1, 1),
        // pow, mean, add, rsqrt, mul, mul (+ two casts); backward ~ two kernels per node
        OpKind::RmsNorm { .. } => (6 + 2 * c, 10 + 2 * c),
        OpKind::Add => (1, 1),
        OpKind::Mul => (1, 2),
        OpKind::Activation { act } => match act {
            // NewGELUActivation: 0.5·x·(1 + tanh(c·(x + 0.044715·x³))), eight kernels
            fsdp_ir::Act::GeluTanh => (8, 14),
            _ => (1, 1),
        },
        // ATen's CPU dropout: bernoulli, div, mul; backward a mul
        OpKind::Dropout { p } => {
            if *p > 0.0 {
                (3, 1)
            } else {
                (1, 1)
            }
        }
        OpKind::RotaryEmbedding { .. } => (10, 0),
        // neg, cat, mul, mul, add (halves are views)
        OpKind::Rope { .. } => (5, 8),
        OpKind::Attention { dropout, .. } => {
            // SDPA plus the output's transpose copy; eager: matmul, scale, mask, softmax,
            // cast, matmul, copy
            if *dropout > 0.0 {
                (10, 12)
            } else {
                (3, 4)
            }
        }
        // linear, (cast), softmax, topk, sum, div, cast, cat; backward: the two GEMMs of the
        // linear, softmax backward, topk's zero fill + scatter, div's two-sided backward (4),
        // sum's expand-add, the add of the two uses
        OpKind::Router { .. } => (7 + c, 12 + c),
        // grouped_mm_experts_forward: cast, sort (copy + sort), two gathers, bincount (min,
        // max, fill, count), cumsum, three masks, two grouped matmuls (an offsets cast, a
        // zero fill and one GEMM per expert each), silu, mul, routing weights, arange +
        // scatter for the inverse permutation, gather back, sum over k; backward: each
        // gather's zero fill + index_add (4 gathers), the masks, two grouped matmuls (two
        // zero fills, an offsets cast and two GEMMs per expert each), silu's and the two
        // muls' backward, chunk's cat, the weight slice's fill + copy, sum's expand, the
        // transposed weights' grads made contiguous
        OpKind::Experts { experts, .. } => {
            let e = *experts as u32;
            (26 + 2 * e, 30 + 4 * e)
        }
        OpKind::CrossEntropy { .. } => (4 + c, 3 + c),
    }
}

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllGather,
    ReduceScatter,
    AllReduce,
}

/// One flat ring: `α·(n−1) + (n−1)/n · bytes / (β·e)`.
pub fn ring(bytes: f64, n: f64, latency: f64, bandwidth: f64, eff: f64) -> f64 {
    if n <= 1.0 {
        return 0.0;
    }
    latency * (n - 1.0) + (n - 1.0) / n * bytes / (bandwidth * eff)
}

/// Time of a collective over `n` ranks, `per_node` of them on each node, of a buffer of
/// `bytes` (the full unsharded size). See the module docs for the formulas.
pub fn collective_time(hw: &Hardware, kind: Coll, bytes: f64, n: u64, per_node: u64) -> f64 {
    let e = hw.efficiency.comm;
    let (ia, ib) = (hw.intra_node.latency, hw.intra_node.bandwidth);
    let (xa, xb) = (hw.inter_node.latency, hw.inter_node.bandwidth);
    let per_node = per_node.clamp(1, n.max(1));
    let one = if n <= 1 {
        0.0
    } else if per_node >= n {
        ring(bytes, n as f64, ia, ib, e)
    } else if per_node == 1 {
        ring(bytes, n as f64, xa, xb, e)
    } else {
        let g = per_node as f64;
        let nodes = n as f64 / g;
        ring(bytes / g, nodes, xa, xb, e) + ring(bytes, g, ia, ib, e)
    };
    match kind {
        Coll::AllReduce => 2.0 * one,
        _ => one,
    }
}

/// Ranks in a process group and how many of them share a node, for a plan's options.
pub fn group_shape(opts: &Options, group: Group, gpus_per_node: u64) -> (u64, u64) {
    let gpn = gpus_per_node.max(1);
    let ws = opts.world_size.max(1);
    match group {
        Group::World => (ws, ws.min(gpn)),
        Group::Shard => {
            let s = opts.shard_size().max(1);
            (s, s.min(gpn))
        }
        Group::Replicate => {
            let s = opts.shard_size().max(1);
            let r = opts.replicate_size().max(1);
            // every s-th rank: gpn/s of them per node when a node holds several shard groups
            let per = if s >= gpn { 1 } else { (gpn / s).clamp(1, r) };
            (r, per)
        }
    }
}

/// Per-plan cost tables: the forward, backward and recompute kernels of every model op.
pub struct CostModel {
    fwd: HashMap<String, Vec<Kernel>>,
    bwd: HashMap<String, Vec<Kernel>>,
    /// Eager kernel launches of each model op: (forward, backward).
    launches: HashMap<String, (u32, u32)>,
    /// Model FLOPs of one micro-batch's training step (see [`model_flops`]).
    pub model_flops: f64,
    /// Compute dtype (the param dtype under mixed precision).
    pub cd: DType,
}

pub use crate::activation::compute_dtype;

impl CostModel {
    pub fn new(plan: &Plan, model: &Model) -> CostModel {
        let opts = &plan.options;
        let attn = AttnImpl::parse(&plan.attn_implementation).unwrap_or(AttnImpl::Sdpa);
        let cx = Ctx::new(model, opts, attn);
        let (cd, dims) = (cx.cd, cx.dims);
        // bytes of every tensor by name: op outputs (aliases resolve to their input) and inputs
        let mut tensor: HashMap<&str, f64> = HashMap::new();
        for i in &model.inputs {
            tensor.insert(&i.name, (numel(&i.shape, dims).unwrap_or(0) * i.dtype.size()) as f64);
        }
        let mut mems = Vec::with_capacity(model.ops.len());
        for op in &model.ops {
            let m = op_mem(&cx, op);
            let b = match m.out {
                Some(t) => t.bytes() as f64,
                None => op.inputs.first().and_then(|n| tensor.get(n.as_str()).copied()).unwrap_or(0.0),
            };
            tensor.insert(&op.name, b);
            mems.push(m);
        }
        let pnumel: HashMap<&str, u64> = model.params.iter().map(|p| (p.name.as_str(), p.numel())).collect();
        let mut fwd = HashMap::new();
        let mut bwd = HashMap::new();
        let mut launch = HashMap::new();
        let mut flops = 0.0;
        for (op, m) in model.ops.iter().zip(&mems) {
            let ins: Vec<f64> = op.inputs.iter().map(|n| tensor.get(n.as_str()).copied().unwrap_or(0.0)).collect();
            let out = tensor.get(op.name.as_str()).copied().unwrap_or(0.0);
            let params: f64 = op.params.iter().map(|p| pnumel.get(model.primary_of(p)).copied().unwrap_or(0) as f64).sum::<f64>() * cd.size() as f64;
            let saved: f64 = m.saved.iter().map(|t| t.bytes() as f64).sum();
            let saved_in: f64 = ins.iter().zip(&m.saves_inputs).filter(|x| *x.1).map(|x| *x.0).sum();
            let fscratch: f64 = m.fwd_scratch.iter().map(|t| t.bytes() as f64).sum();
            let bscratch: f64 = m.bwd_scratch.iter().map(|t| t.bytes() as f64).sum();
            let in_sum: f64 = ins.iter().sum();
            let gathers = matches!(op.kind, OpKind::Embedding | OpKind::PositionEmbedding);
            let p_read = if gathers { out } else { params };
            let f_bytes = in_sum + p_read + out + saved + 2.0 * fscratch;
            let b_bytes = out + in_sum + saved + saved_in + if m.saves_output { out } else { 0.0 } + 2.0 * bscratch + 2.0 * params;
            let mf = matmul_flops(&cx, op);
            flops += 3.0 * model_op_flops(&cx, op);
            let (f, b) = match &op.kind {
                OpKind::Attention { .. } => {
                    let eager = cx.attn == AttnImpl::Eager;
                    let qkvo = in_sum + out;
                    if eager {
                        let mem_f = saved + 2.0 * fscratch;
                        let mem_b = saved + 2.0 * bscratch;
                        (
                            vec![k(mf, qkvo, cd, Work::Attention), k(0.0, mem_f, cd, Work::Memory)],
                            vec![k(2.0 * mf, 2.0 * qkvo, cd, Work::Attention), k(0.0, mem_b, cd, Work::Memory)],
                        )
                    } else {
                        (vec![k(mf, f_bytes, cd, Work::Attention)], vec![k(2.5 * mf, b_bytes, cd, Work::Attention)])
                    }
                }
                OpKind::Linear { .. } | OpKind::Experts { .. } => {
                    (vec![k(mf, f_bytes, cd, Work::Matmul)], vec![k(2.0 * mf, b_bytes, cd, Work::Matmul)])
                }
                _ => (vec![k(0.0, f_bytes, cd, Work::Memory)], vec![k(0.0, b_bytes, cd, Work::Memory)]),
            };
            let b = if m.differentiable || !op.params.is_empty() { b } else { vec![] };
            let (mut lf, mut lb) = launches(op, cd != DType::Float32);
            if let (OpKind::Attention { .. }, AttnImpl::Eager) = (&op.kind, cx.attn) {
                (lf, lb) = (lf.max(7), lb.max(8));
            }
            launch.insert(op.name.clone(), (lf, lb));
            fwd.insert(op.name.clone(), f);
            bwd.insert(op.name.clone(), b);
        }
        CostModel { fwd, bwd, launches: launch, model_flops: flops, cd }
    }

    /// Forward (and recompute) kernels of the model op named `name`.
    pub fn forward(&self, name: &str) -> Option<&[Kernel]> {
        self.fwd.get(name).map(|v| v.as_slice())
    }

    /// Eager kernel launches of the model op named `name`: (forward, backward).
    pub fn launches(&self, name: &str) -> (u32, u32) {
        self.launches.get(name).copied().unwrap_or((1, 1))
    }

    /// Backward kernels of the model op named `name` (empty when it has no gradient).
    pub fn backward(&self, name: &str) -> Option<&[Kernel]> {
        self.bwd.get(name).map(|v| v.as_slice())
    }
}

fn k(flops: f64, bytes: f64, dtype: DType, work: Work) -> Kernel {
    Kernel { flops, bytes, dtype, work }
}

fn last_dim(cx: &Ctx, op: &Op) -> u64 {
    op.shape.last().and_then(|d| d.eval(cx.dims)).unwrap_or(1).max(1)
}

/// FLOPs the op's kernels execute in the forward (causal SDPA/flash attention halved).
pub fn matmul_flops(cx: &Ctx, op: &Op) -> f64 {
    let out_n = numel(&op.shape, cx.dims).unwrap_or(0) as f64;
    match &op.kind {
        OpKind::Linear { bias, transposed } => {
            let w = op.params.first().and_then(|p| cx.model.param(p));
            let Some(w) = w else { return 0.0 };
            let (o, i) = match (w.shape.as_slice(), transposed) {
                ([a, b], false) => (*a, *b),
                ([a, b], true) => (*b, *a),
                _ => return 0.0,
            };
            let rows = out_n / o.max(1) as f64;
            2.0 * rows * i as f64 * o as f64 + if *bias { rows * o as f64 } else { 0.0 }
        }
        OpKind::Experts { top_k, intermediate, .. } => {
            let h = last_dim(cx, op) as f64;
            let rows = out_n / h;
            6.0 * rows * *top_k as f64 * h * *intermediate as f64
        }
        OpKind::Attention { heads, head_dim, causal, .. } => {
            let full = attention_flops(cx.dims, *heads, *head_dim);
            if *causal && cx.attn != AttnImpl::Eager {
                full / 2.0
            } else {
                full
            }
        }
        _ => 0.0,
    }
}

/// `4·b·s²·h·hd`: the two `s×s` GEMMs of attention, no causal discount.
pub fn attention_flops(d: Dims, heads: u64, head_dim: u64) -> f64 {
    4.0 * d.batch as f64 * (d.seq as f64).powi(2) * heads as f64 * head_dim as f64
}

/// Model FLOPs of the op's forward for MFU: GEMMs (`2·T·in·out`, active experts only) and
/// attention `4·b·s²·h·hd` without the causal discount (the PaLM / torchtitan convention);
/// memory-bound ops count zero. Training = 3 × this (backward = 2 × forward).
pub fn model_op_flops(cx: &Ctx, op: &Op) -> f64 {
    match &op.kind {
        OpKind::Attention { heads, head_dim, .. } => attention_flops(cx.dims, *heads, *head_dim),
        OpKind::Linear { .. } => {
            let out_n = numel(&op.shape, cx.dims).unwrap_or(0) as f64;
            let w = op.params.first().and_then(|p| cx.model.param(p));
            match w.map(|w| w.shape.as_slice()) {
                Some([a, b]) => {
                    let o = if let OpKind::Linear { transposed: true, .. } = op.kind { *b } else { *a };
                    2.0 * out_n / o.max(1) as f64 * (*a as f64) * (*b as f64)
                }
                _ => 0.0,
            }
        }
        OpKind::Experts { .. } => matmul_flops(cx, op),
        _ => 0.0,
    }
}

/// Model FLOPs of one micro-batch's training step:
/// `3 · Σ model_op_flops = 6·N·T + 12·L·h·hd·s·T` for a dense transformer, with `N` the
/// parameters of the GEMMs (embedding gathers excluded, the LM head included), `T = b·s`
/// tokens and `L` attention layers.
pub fn model_flops(model: &Model, opts: &Options, attn: AttnImpl) -> f64 {
    let cx = Ctx::new(model, opts, attn);
    model.ops.iter().map(|o| 3.0 * model_op_flops(&cx, o)).sum()
}

/// Bytes of a unit's unsharded params in the compute dtype (what the copy-out writes).
pub fn unsharded_bytes(unit: &Unit, opts: &Options) -> u64 {
    unit.params
        .iter()
        .map(|p| {
            let d = match opts.param_dtype {
                Some(d) if p.dtype.is_float() => d,
                _ => p.dtype,
            };
            p.padded_numel * d.size()
        })
        .sum()
}

/// The optimizer step of one unit: memory-bound over the rank's shard.
///
/// Adam/AdamW touch each element 16 times (param, grad, `exp_avg`, `exp_avg_sq` read; param
/// and both moments written; the `sqrt`/`denom` temporaries written and read; the update
/// read and written), SGD 3 times (param and grad read, param written); ~10 kernel launches
/// per step of a unit (foreach kernels).
pub fn optimizer_kernels(unit: &Unit, opts: &Options) -> (Vec<Kernel>, u32) {
    let ws = opts.shard_size();
    let bytes: u64 = unit.params.iter().filter(|p| p.requires_grad).map(|p| p.local_numel(ws, 0) * p.dtype.size()).sum();
    let touches = match opts.optimizer {
        Optimizer::Adam | Optimizer::AdamW => 16.0,
        Optimizer::Sgd => 3.0,
        Optimizer::None => 0.0,
    };
    // CUDA: torch's foreach Adam, a handful of launches for all of the unit's tensors; CPU:
    // the single-tensor path, ~8 kernels per parameter (FSDP2: one tensor per parameter)
    let tensors = match opts.layout {
        crate::options::Layout::Flat => 1,
        crate::options::Layout::Fsdp2 => unit.params.iter().filter(|p| p.requires_grad).count() as u32,
    };
    let launches = match (opts.optimizer, opts.device) {
        (Optimizer::None, _) => 0,
        (_, crate::options::Device::Cuda) => 10,
        (_, crate::options::Device::Cpu) => 8 * tensors.max(1),
    };
    (vec![k(0.0, touches * bytes as f64, unit.dtype, Work::Memory)], launches)
}
