//! Cost model: FLOPs and bytes of each IR op (forward, backward, recompute), their time on
//! a [`Hardware`] profile, and the time of FSDP's collectives. Every term, and where its
//! constants come from (each GPU profile in `models/hardware/` cites its figures):
//!
//! **Kernels.** An op is one or more kernels; it takes `Σ kernel time + launches ·
//! op_overhead_s` (`launches` = the ATen kernels eager PyTorch dispatches for it, following
//! HF's implementation, [`launches`]; on a GPU `op_overhead_s` is the gap between back-to-back
//! kernels, ~2.5 µs). A kernel takes the slower of its compute and its memory traffic
//! (`bytes / (hbm_bandwidth · efficiency.memory)`, streaming efficiency of the part's HBM).
//! On a GPU profile (`gpu: Some(…)`):
//!
//! - **GEMMs by shape** ([`crate::hardware::GemmModel::time`]): a linear `[T, in] @ [in,
//!   out]` is one GEMM forward and two backward (input grad `[T, out] @ [out, in]`, weight
//!   grad `[out, T] @ [T, in]`); output tiles run in waves over the SMs, each tile's main loop
//!   over `K + k_fill`, plus a fixed time — so skinny GEMMs (a GQA key projection, few
//!   tokens) and partial waves cost what cuBLAS's do. Constants: fitted to XLA's measured H100
//!   table (375 shapes, 5.9% RMS, `planner/tests/kernels.rs`; A100 from HF's LlamaMLP
//!   through `F.linear`), peak from the datasheet times the part's `clock_factor` (its clock
//!   against the measured part's) and `sustained` (the clock a training step's back-to-back
//!   kernels hold, against the cool, short runs the measurements come from: NVIDIA's
//!   1830 MHz compute clock over the 1980 MHz boost on H100, HPL's 1305 of 1410 MHz on
//!   A100), and no faster than the part's power limit sustains ([`crate::hardware::Power`]:
//!   the measured rate of a stream of large GEMMs at 700 W, scaled under a lower limit by the
//!   power above idle — H100's large GEMMs run at 700 TFLOP/s at 700 W, 471 at 500 W;
//!   attention and small GEMMs stay under it). MoE experts are grouped GEMMs, each expert
//!   taking `T·k/E` rows; eager attention's `QKᵀ` and `PV` are batched GEMMs.
//! - **Attention** (SDPA's flash backend = FlashAttention-2): `flops / measured FA2 FLOP/s` at
//!   the op's head dim, mask and sequence length (interpolated in log(seq); backward from
//!   the forward and forward+backward benchmarks) times the same clock factors (and under
//!   the same power limit), then the output's transpose copy.
//! - **Element-wise ops** move the bytes of their kernels ([`traffic`]: RMSNorm's float32
//!   upcast, RoPE's rotate_half, SiLU, products, sums, dropout, the loss's float32 logits);
//!   their FLOPs are not counted. HF's eager RMSNorm and RoPE run slower than their bytes
//!   at streaming speed: they are scaled to their measured time ([`EAGER_RMSNORM`],
//!   [`EAGER_ROPE`], Liger-Kernel's benchmarks of the HF modules). A GEMM's or attention's bytes (operands and result) only
//!   matter when they exceed its compute. Under `--compile` the decoder blocks' element-wise
//!   ops are inductor's fused kernels instead ([`Fusion`], [`COMPILED_RMSNORM`],
//!   [`COMPILED_ROPE`]): fewer bytes, one launch each, memory unchanged.
//!
//! Without a GPU model (the CPU profile, fitted by `calibrate`): `flops / (peak · eff)`,
//! `eff` = `efficiency.matmul` or `.attention`, bytes from [`crate::activation`]'s spec
//! (inputs, params, output, saved tensors, 2 × scratch).
//!
//! FLOPs of the forward, with `T` the rows of the op (batch · seq tokens):
//!
//! - linear `[T, in] @ [in, out]`: `2·T·in·out` (+ `T·out` with a bias);
//! - MoE experts (SwiGLU, intermediate `I`, top-k `k`): `2·T·k·(2·I·H + I·H) = 6·T·k·H·I`;
//! - attention: `4·b·s²·h·hd` (`QKᵀ` and `PV`, `h` query heads of width `hd`), halved when
//!   causal and run by SDPA / flash-attention (they skip the key tiles above the diagonal);
//!   eager attention materializes the full `s×s` matrix and is not halved; its softmax,
//!   scaling and casts are a second, memory-bound kernel over the score tensors. Sliding-window
//!   layers (Mistral, Gemma 3's local layers) with `s > w`: flash-attention's window counts
//!   the `w(w+1)/2 + (s−w)·w` (query, key) pairs it visits; SDPA gets HF's explicit mask and
//!   computes every tile (`4·b·s²·h·hd`, at the non-causal rate); eager is unchanged.
//!
//! Backward: `2×` the forward FLOPs for GEMMs; `2.5×` for SDPA/flash attention
//! (FlashAttention-2 recomputes `QKᵀ`), `2×` for eager attention. Recompute (activation
//! checkpointing) costs like the forward.
//!
//! **Collectives** (NCCL rings, [`nccl_time`] on a GPU): latency `base + steps ·
//! per-step latency` (NCCL's tuning model, NVLink and network steps apart), then the slower
//! of the NVLink hops at the measured bus bandwidth and the network, which every node
//! drives through one NIC per GPU — NCCL pipelines the two. `B` = the full unsharded buffer:
//! all-gather and reduce-scatter move `(n−1)/n · B` per rank, all-reduce twice that. A group
//! of one rank per node (HSDP's replicate group) uses one NIC. Constants: busbw from XLA's
//! measured 8×H100 table (6.2% RMS above 16 MiB, `planner/tests/kernels.rs`), NIC rates
//! from NVIDIA. FSDP2's copy-in before a collective and the reduce-scatter's `chunk_cat` are
//! memory traffic on the collective's stream; the copy-out is on the compute stream
//! ([`crate::timeline`]).
//!
//! **Overlap and the CPU** ([`crate::timeline`]): compute overlapping a collective runs
//! `comm_sm_share` slower (the collective's SMs); the CPU launches every kernel
//! (`cpu_launch_s` each, FSDP2's hooks `fsdp_cpu_per_unshard_s` per all-gather), so a GPU op
//! never starts before its launch.
//!
//! Without a GPU model, collectives are `α·(n−1) + (n−1)/n · B / (β·e)` per ring with the
//! profile's link latency `α`, bandwidth `β` and `e` = `efficiency.comm`, hierarchical across
//! nodes (an inter-node ring over `B/g`, then an intra-node one).
//!
//! Hybrid sharding: the shard group is `shard_size` consecutive ranks (intra-node when it
//! fits), the replicate group takes every `shard_size`-th rank.
//!
//! **What each knob `tune` trades costs** (the same terms, seen per knob):
//!
//! - *Activation checkpointing* (full, per block): the block's forward ops run again before
//!   its backward (`Recompute` ops, priced as forward ops: GEMMs, attention, element-wise),
//!   and FSDP2 re-gathers any unit inside the region whose params were resharded. *Op-level
//!   SAC*: only the ops whose outputs the policy does not keep run again (the kept matmuls and
//!   attention are `cached` recomputes: zero time), so it costs the elementwise work and every
//!   other matmul.
//! - *`reshard_after_forward`*: true frees a unit after forward and all-gathers it again in
//!   backward (one more all-gather of the unit's params in the param dtype, on the all-gather
//!   stream); false skips that all-gather and keeps the memory. The all-gather costs step time
//!   only where the compute stream waits for it (exposed) or shares SMs with it
//!   (`comm_sm_share`).
//! - *Prefetch*: FSDP2's implicit prefetch issues the next unit's all-gather when the current
//!   one's forward (backward) starts; an explicit depth issues more ahead. A shallow prefetch
//!   exposes an all-gather whenever one unit's compute is shorter than the next unit's
//!   all-gather (small micro-batches, slow networks).
//! - *HSDP shard group*: all-gathers and reduce-scatters run over the shard group (NVLink
//!   inside a node), then each unit's sharded gradient is all-reduced over the replicate group
//!   (one rank per node per group: one NIC), on its own stream; shards are larger, so memory
//!   grows with world size / shard size.
//! - *Micro-batch × accumulation*: every micro-batch runs the forward and backward (GEMM
//!   efficiency falls with fewer rows); FSDP2 without gradient sync keeps each unit's
//!   unsharded gradients (in the reduce dtype) across micro-batches and reduce-scatters once.
//! - *Gradient sync per micro-batch* (`--grad-sync each`, torchtitan's loop): every
//!   micro-batch's backward reduce-scatters each unit (as the last one does, and under HSDP
//!   all-reduces it over the replicas), k times the reduction bytes of a step, on their
//!   streams beside the backward's compute — exposed only where a unit's backward is
//!   shorter than its reduction, and slowing compute by `comm_sm_share` while they run —
//!   against no unsharded gradient kept from one micro-batch to the next (each reduced shard
//!   added into the sharded gradient; memory exact against FSDP2).
//! - *`reshard_after_forward=N`* (an int): the backward all-gather runs over N consecutive
//!   ranks (NVLink inside a node when N ≤ its GPUs) instead of the whole shard group, at
//!   the memory of a 1/N slice of each unit's params held from forward to backward.
//! - *Unit groups* (`--unit-group k`): one all-gather and one reduce-scatter per k blocks, k
//!   times the bytes: the collectives' fixed latency is paid 1/k as often and large messages
//!   reach a higher bus bandwidth, against k blocks' unsharded params held at once and a
//!   first gather that waits for k blocks' worth of bytes.
//! - *Edge units* (`--policy modules:<embeddings>,<blocks>,<head>`, in `tune`'s space where
//!   they are untied: the embeddings and the LM head units of their own): two more
//!   all-gathers and reduce-scatters of those params per step (and their all-gathers in
//!   backward when resharded), against the root no longer holding them
//!   unsharded through the step.
//! - *CPU offload* (`--offload cpu`, FSDP2's `CPUOffloadPolicy`): before each all-gather
//!   every parameter's shard is copied host→device in its own dtype and cast to the param
//!   dtype, after each reduce-scatter each reduced shard goes device→host
//!   ([`offload_copy_s`]: bytes over the profile's pinned copy-engine bandwidth per
//!   direction with every GPU of the node copying, a launch per parameter), on the
//!   collective's stream — so they lengthen the collective, exposed wherever it is; and the
//!   optimizer runs on the host while the GPU waits ([`host_optimizer_s`]: the rank's
//!   parameters × the ranks sharing the host over torch's CPU Adam rate). With
//!   `--grad-sync each` every micro-batch past the first adds its reduced shards into the
//!   host's grads: a blocking copy, then the CPU's add ([`host_accumulate_s`]), the CPU's
//!   launches held back meanwhile. Against that, the
//!   device holds no shards, gradients or optimizer state (memory: exact against FSDP2).

use crate::activation::{op_mem, Ctx};
use crate::hardware::Hardware;
use crate::options::{AttnImpl, Optimizer, Options};
use crate::plan::{Group, Plan};
use crate::units::Unit;
use fsdp_ir::{numel, DType, Dims, Model, Op, OpKind};
use rustc_hash::FxHashMap as HashMap;

/// What bounds a kernel's FLOPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Matmul,
    Attention,
    /// Memory-bound: FLOPs not counted.
    Memory,
}

/// The shape a GPU profile times a compute kernel by ([`crate::hardware::Gpu`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// `b` GEMMs of `[m, k] @ [k, n]`.
    Gemm { b: u64, m: u64, n: u64, k: u64 },
    /// FlashAttention's forward or backward at this head dim, mask and sequence length.
    Flash { head_dim: u64, causal: bool, seq: u64, backward: bool },
    None,
}

/// One kernel of an op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kernel {
    pub flops: f64,
    pub bytes: f64,
    pub dtype: DType,
    pub work: Work,
    pub shape: Shape,
}

impl Kernel {
    /// The slower of its compute and its memory traffic. With a GPU model: a GEMM by its
    /// shape ([`crate::hardware::GemmModel::time`]), attention by FlashAttention-2's measured
    /// throughput, either no faster than the power limit sustains
    /// ([`crate::hardware::Power`]), memory at `hbm_bandwidth · efficiency.memory`; without
    /// one (the CPU profile), `flops / (peak · efficiency)`.
    pub fn time(&self, hw: &Hardware) -> f64 {
        let m = self.bytes / (hw.hbm_bandwidth * hw.efficiency.memory);
        if self.work == Work::Memory || self.flops <= 0.0 {
            return m;
        }
        // no faster than the part's power limit sustains (large GEMMs on a capped part)
        let powered = |c: f64, g: &crate::hardware::Gpu| match g.power.as_ref().and_then(|p| p.flops(self.dtype)) {
            Some(f) => c.max(self.flops / f),
            None => c,
        };
        let c = match (&hw.gpu, self.shape) {
            (Some(g), Shape::Gemm { b, m, n, k }) => powered(g.gemm.time(g.sms, hw.peak(self.dtype) * g.compute_factor(), b, m, n, k), g),
            (Some(g), Shape::Flash { head_dim, causal, seq, backward }) => powered(
                match g.attention_flops(head_dim, causal, seq, backward) {
                    Some(f) => self.flops / f,
                    None => self.flops / (hw.peak(self.dtype) * g.compute_factor() * hw.efficiency.attention),
                },
                g,
            ),
            _ => {
                let eff = match self.work {
                    Work::Matmul => hw.efficiency.matmul,
                    _ => hw.efficiency.attention,
                };
                self.flops / (hw.peak(self.dtype) * eff * hw.gpu.as_ref().map_or(1.0, |g| g.compute_factor()))
            }
        };
        c.max(m)
    }
}

/// Time of an op made of `kernels`, dispatched as `launches` eager kernels: their times plus
/// the per-dispatch overhead.
pub fn op_time(hw: &Hardware, kernels: &[Kernel], launches: u32) -> f64 {
    kernels.iter().map(|k| k.time(hw)).sum::<f64>() + launches.max(1) as f64 * hw.op_overhead_s
}

/// `torch.compile`d HF `LlamaRMSNorm` measured on H100 NVL (bf16, 2048 rows × 32768,
/// 67M elements — the size of Llama-3-8B's norms at 2 × 8192 tokens: forward 0.156 ms,
/// backward 0.588 ms; linkedin/Liger-Kernel `benchmark/data/h100_all_benchmark_data.csv`
/// @3534d446, `rms_norm,torchcompile`) over [`Fusion`]'s bytes (`2c`, `4c`) at that part's
/// streaming rate (3.9 TB/s × 0.78): forward ×1.77, backward ×3.33 (the weight's grad is a
/// reduction over every row). The same file's eager HF rows are 0.609 / 1.580 ms at half
/// that size: compile is ~8× faster forward, ~5× backward.
pub const COMPILED_RMSNORM: (f64, f64) = (1.77, 3.33);
/// `torch.compile`d HF `apply_rotary_pos_emb` on H100 NVL (bf16, 8192 tokens, 32 q heads
/// and 8 kv heads of 256: 84M elements; forward 0.264 ms, backward 0.596 ms; same file,
/// `rope,torchcompile`) over `2c` per element at the streaming rate: ×2.40, ×5.41.
pub const COMPILED_ROPE: (f64, f64) = (2.40, 5.41);

/// What `torch.compile` does to the element-wise ops of each decoder block (torchtitan's
/// `apply_compile`: every `TransformerBlock` compiled on its own; the embedding, the final
/// norm, the output projection and the loss stay eager). Inductor's default (no
/// max-autotune) leaves GEMMs to cuBLAS and SDPA to its flash kernel and fuses each chain
/// of point-wise and reduction ops into one Triton kernel that reads its inputs and writes
/// its outputs once, at streaming speed (no eager-HF slowness factors), one launch each:
///
/// - RMSNorm: read `x`, write `y` (`2c` per element); backward read `dy` and `x`, write
///   `dx`, then the weight's grad as a second reduction kernel (`4c`, two launches); scaled
///   to inductor's measured kernels ([`COMPILED_RMSNORM`]);
/// - RoPE (on q, on k): `2c` forward and backward, one kernel each, scaled to inductor's
///   measured kernels ([`COMPILED_ROPE`]);
/// - SwiGLU's `silu(gate) · up`: the activation fused into the product (the activation op
///   costs nothing; the product reads gate and up and writes once: `3c`; backward reads
///   `dy`, gate and up and writes both grads: `5c`); an activation feeding anything else
///   (GPT-2's GELU before `c_proj`) is one kernel of `2c` / `3c`;
/// - a residual add stays `3c` both ways (its fusion into the next norm's read is not
///   counted); dropout with `p > 0` keeps eager's bytes.
///
/// Memory: what the partitioner saves is [`crate::activation::compiled`]'s. Not modelled:
/// compile's effect on the CPU (each remaining kernel keeps eager's launch cost).
struct Fusion {
    /// Module paths of the compiled blocks.
    blocks: Vec<String>,
    /// Activations whose only consumers are products (fused into them).
    into_product: rustc_hash::FxHashSet<String>,
}

impl Fusion {
    fn new(model: &Model) -> Fusion {
        let blocks = crate::activation::compiled_blocks(model);
        let mut consumers: HashMap<&str, Vec<&OpKind>> = HashMap::default();
        for op in &model.ops {
            for i in &op.inputs {
                consumers.entry(i.as_str()).or_default().push(&op.kind);
            }
        }
        let into_product = model
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Activation { .. }))
            .filter(|o| consumers.get(o.name.as_str()).is_some_and(|c| c.iter().all(|k| matches!(k, OpKind::Mul))))
            .map(|o| o.name.clone())
            .collect();
        Fusion { blocks, into_product }
    }

    /// A compiled element-wise op's ((forward, backward) bytes, (forward, backward)
    /// launches); `None` for an op compile leaves as it is.
    fn compiled(&self, cx: &Ctx, op: &Op, out: f64) -> Option<((f64, f64), (u32, u32))> {
        let inside = self.blocks.iter().any(|b| op.module.strip_prefix(b.as_str()).is_some_and(|r| r.is_empty() || r.starts_with('.')));
        if !inside {
            return None;
        }
        let c = cx.cd.size() as f64;
        let n = out / c;
        match &op.kind {
            OpKind::RmsNorm { .. } => Some(((2.0 * c * n * COMPILED_RMSNORM.0, 4.0 * c * n * COMPILED_RMSNORM.1), (1, 2))),
            OpKind::Rope { .. } => Some(((2.0 * c * n * COMPILED_ROPE.0, 2.0 * c * n * COMPILED_ROPE.1), (1, 1))),
            OpKind::Activation { .. } if self.into_product.contains(&op.name) => Some(((0.0, 0.0), (0, 0))),
            OpKind::Activation { .. } => Some(((2.0 * c * n, 3.0 * c * n), (1, 1))),
            OpKind::Mul => Some(((3.0 * c * n, 5.0 * c * n), (1, 1))),
            // Phi-3's fused SwiGLU: the same kernel as an activation fused into its product
            OpKind::GatedActivation { .. } => Some(((3.0 * c * n, 5.0 * c * n), (1, 1))),
            OpKind::Add => Some(((3.0 * c * n, 3.0 * c * n), (1, 1))),
            _ => None,
        }
    }
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
        // (Gemma's embedding scale: a low-precision copy of the scalar first)
        OpKind::Scale { buffer, .. } => (1 + c * u32::from(*buffer), 1),
        // chunk's views, act, mul; backward: mul's two, act's, the cat of the halves' grads
        OpKind::GatedActivation { .. } => (2, 4),
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
        // float(), the complex product, type_as (views between); backward the same three
        OpKind::Rope { complex: true, .. } => (1 + 2 * c, 1 + 2 * c),
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
        // (the gate's linear is its own op) (cast), softmax, topk, sum, div, cast, cat;
        // backward: softmax backward, topk's zero fill + scatter, div's two-sided backward (4),
        // sum's expand-add, the add of the two uses
        OpKind::Router { .. } => (6 + c, 10 + c),
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
    if let Some(g) = &hw.gpu {
        return nccl_time(&g.nccl, kind, bytes, n, per_node);
    }
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

/// NCCL's ring over `n` ranks, `per_node` of them on each node, of a buffer of `bytes`
/// (nccl-tests' `S`: the gathered output, the scattered input): a latency of
/// `base + intra steps · nvlink_step + inter steps · net_step` (NCCL's tuning model: a ring
/// takes `n − 1` steps, `nodes − 1` of them across the network; twice for all-reduce), then
/// the slower of the NVLink hops at the measured bus bandwidth (`S·(n−1)/n / busbw`) and the
/// network: every node receives the other nodes' `S·(nodes−1)/nodes` through its NICs (one
/// per GPU, rail-optimized; a group with one rank per node, HSDP's replicate group, has
/// one). NCCL pipelines the two, so the slower one bounds the collective.
pub fn nccl_time(c: &crate::hardware::Nccl, kind: Coll, bytes: f64, n: u64, per_node: u64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let per = per_node.clamp(1, n);
    let nodes = n.div_ceil(per);
    let twice = if kind == Coll::AllReduce { 2.0 } else { 1.0 };
    let steps = twice * (n - 1) as f64;
    let net_steps = twice * (nodes - 1) as f64;
    let latency = c.base_latency_s + (steps - net_steps) * c.nvlink_step_s + net_steps * c.net_step_s;
    let busbw = match kind {
        Coll::AllGather => c.all_gather_busbw,
        Coll::ReduceScatter => c.reduce_scatter_busbw,
        Coll::AllReduce => c.all_reduce_busbw,
    };
    let link = if per > 1 { twice * bytes * (n - 1) as f64 / n as f64 / busbw } else { 0.0 };
    let nics = c.nics_per_node.min(per).max(1) as f64;
    let net = if nodes > 1 { twice * bytes * (nodes - 1) as f64 / nodes as f64 / (nics * c.nic_bandwidth) } else { 0.0 };
    latency + link.max(net)
}

/// Ranks in a process group and how many of them share a node, for a plan's options.
pub fn group_shape(opts: &Options, group: Group, post_forward: Option<u64>, gpus_per_node: u64) -> (u64, u64) {
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
        // N consecutive ranks (the unit's own N: `post_forward`): inside a node when N is at
        // most a node's GPUs
        Group::PostForward => {
            let n = post_forward.unwrap_or(1).max(1);
            (n, n.min(gpn))
        }
    }
}

/// Per-plan cost tables: the forward, backward and recompute kernels of every model op.
pub struct CostModel {
    fwd: HashMap<String, Vec<Kernel>>,
    bwd: HashMap<String, Vec<Kernel>>,
    /// Eager kernel launches of each model op: (forward, backward).
    launches: HashMap<String, (u32, u32)>,
    /// Ops `torch.compile` fuses into their consumer (`--compile`): no kernel of their own.
    fused: rustc_hash::FxHashSet<String>,
    /// Model FLOPs of one micro-batch's training step (see [`model_flops`]).
    pub model_flops: f64,
    /// Compute dtype (the param dtype under mixed precision).
    pub cd: DType,
    /// The op times on the last hardware profile asked ([`CostModel::times`]).
    times: std::sync::OnceLock<(Hardware, OpTimes)>,
    /// Those times by the address of a schedule's op name ([`CostModel::with_times`]), with
    /// the name (kept alive: the address is no other name's).
    by_name: std::sync::Mutex<HashMap<usize, (crate::plan::OpName, OpTime)>>,
}

/// Names [`CostModel::with_times`] keeps before it starts afresh (plans built from their own
/// schedule preludes bring new names each).
const BY_NAME_MAX: usize = 1 << 18;

/// What the timeline reads of a model op on one hardware profile.
#[derive(Debug, Clone, Copy)]
pub struct OpTime {
    /// `torch.compile` fused it into its consumer: no time of its own.
    pub fused: bool,
    /// Forward and backward kernels' time with their launches ([`op_time`]; `None`: none).
    pub forward: Option<f64>,
    pub backward: Option<f64>,
    /// Eager kernel launches: (forward, backward).
    pub launches: (u32, u32),
}

/// Every model op's [`OpTime`] on one hardware profile, by name.
#[derive(Debug, Clone)]
pub struct OpTimes(HashMap<String, OpTime>);

impl OpTimes {
    /// The op named `name` (one the model does not have: no kernels, one launch each way).
    pub fn get(&self, name: &str) -> OpTime {
        self.0.get(name).copied().unwrap_or(OpTime { fused: false, forward: None, backward: None, launches: (1, 1) })
    }
}

pub use crate::activation::compute_dtype;

impl CostModel {
    pub fn new(plan: &Plan, model: &Model) -> CostModel {
        let opts = &plan.options;
        let attn = AttnImpl::parse(&plan.attn_implementation).unwrap_or(AttnImpl::Sdpa);
        let cx = Ctx::new(model, opts, attn);
        let (cd, dims) = (cx.cd, cx.dims);
        // bytes of every tensor by name: op outputs (aliases resolve to their input) and inputs
        let mut tensor: HashMap<&str, f64> = HashMap::default();
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
        let fusion = opts.compile.then(|| Fusion::new(model));
        let mut fused = rustc_hash::FxHashSet::default();
        let mut fwd = HashMap::default();
        let mut bwd = HashMap::default();
        let mut launch = HashMap::default();
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
            // element-wise ops: the bytes their kernels move, from HF's implementation
            let elementwise = traffic(&cx, op, out, ins.first().copied().unwrap_or(0.0));
            let (f, b) = match &op.kind {
                OpKind::Attention { causal, heads, sliding_window, .. } => {
                    let eager = cx.attn == AttnImpl::Eager;
                    // (DeepSeek's latent attention: q/k heads `hd` wide, v heads `vd`; SDPA then
                    // runs its memory-efficient kernel on CUDA, costed here at the flash rate
                    // of a `hd` head: not measured)
                    let (hd, vd) = head_widths(op);
                    // (SDPA under an explicit sliding-window mask runs its kernel unmasked by
                    // causality: the non-causal rate; flash-attention's window, the causal one)
                    let causal = &(*causal && !(cx.attn == AttnImpl::Sdpa && cx.window_masks(*sliding_window)));
                    let qkvo = in_sum + out;
                    let (bh, s) = (dims.batch * heads, dims.seq);
                    if eager {
                        // QKᵀ and PV as batched GEMMs; softmax, scaling, mask and casts over the scores
                        let mem_f = saved + 2.0 * fscratch;
                        let mem_b = saved + 2.0 * bscratch;
                        (
                            vec![gemm(bh, s, s, hd, cd), gemm(bh, s, vd, s, cd), k(0.0, mem_f, cd, Work::Memory)],
                            // dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q
                            vec![gemm(bh, s, s, vd, cd), gemm(bh, s, vd, s, cd), gemm(bh, s, hd, s, cd), gemm(bh, s, hd, s, cd), k(0.0, mem_b, cd, Work::Memory)],
                        )
                    } else {
                        let flash = |backward| Shape::Flash { head_dim: hd, causal: *causal, seq: s, backward };
                        // SDPA's kernel, then the output's transpose to [b, s, h·hd] (a copy)
                        (
                            vec![Kernel { flops: mf, bytes: qkvo, dtype: cd, work: Work::Attention, shape: flash(false) }, k(0.0, 2.0 * out, cd, Work::Memory)],
                            vec![Kernel { flops: 2.5 * mf, bytes: 2.0 * qkvo, dtype: cd, work: Work::Attention, shape: flash(true) }, k(0.0, 2.0 * out, cd, Work::Memory)],
                        )
                    }
                }
                OpKind::Linear { .. } => match (linear_dims(&cx, op), opts.float8.filter(|_| crate::float8::is_float8_linear(model, op))) {
                    (Some((rows, i, o)), Some(f8)) => float8_linear(rows, i, o, cd, f8, opts.compile),
                    // forward, then the input's grad and the weight's grad
                    // (DeepSeek's router linear runs in float32)
                    (Some((rows, i, o)), None) => {
                        let d = if let OpKind::Linear { float32: true, .. } = op.kind { DType::Float32 } else { cd };
                        (vec![gemm(1, rows, o, i, d)], vec![gemm(1, rows, i, o, d), gemm(1, o, i, rows, d)])
                    }
                    (None, _) => (vec![k(mf, f_bytes, cd, Work::Matmul)], vec![k(2.0 * mf, b_bytes, cd, Work::Matmul)]),
                },
                OpKind::Experts { experts, top_k, intermediate, .. } => {
                    // grouped GEMMs: each expert takes its share of the routed token rows
                    let h = last_dim(&cx, op);
                    let rows = numel(&op.shape, dims).unwrap_or(0) / h.max(1);
                    let (e, i) = ((*experts).max(1), *intermediate);
                    let re = (rows * top_k).div_ceil(e);
                    let routing = k(0.0, elementwise.0, cd, Work::Memory);
                    let routing_b = k(0.0, elementwise.1, cd, Work::Memory);
                    (
                        vec![gemm(e, re, 2 * i, h, cd), gemm(e, re, h, i, cd), routing],
                        vec![gemm(e, re, h, 2 * i, cd), gemm(e, 2 * i, h, re, cd), gemm(e, re, i, h, cd), gemm(e, h, i, re, cd), routing_b],
                    )
                }
                _ if elementwise != (0.0, 0.0) => (vec![k(0.0, elementwise.0, cd, Work::Memory)], vec![k(0.0, elementwise.1, cd, Work::Memory)]),
                _ => (vec![k(0.0, f_bytes, cd, Work::Memory)], vec![k(0.0, b_bytes, cd, Work::Memory)]),
            };
            let (mut lf, mut lb) = launches(op, cd != DType::Float32);
            if let (OpKind::Attention { .. }, AttnImpl::Eager) = (&op.kind, cx.attn) {
                (lf, lb) = (lf.max(7), lb.max(8));
            }
            let (f, b) = match fusion.as_ref().and_then(|fu| fu.compiled(&cx, op, out)) {
                Some((bytes, launches)) => {
                    if launches == (0, 0) {
                        fused.insert(op.name.clone());
                    }
                    (lf, lb) = launches;
                    let kern = |b: f64| if b > 0.0 { vec![k(0.0, b, cd, Work::Memory)] } else { vec![] };
                    (kern(bytes.0), kern(bytes.1))
                }
                None => (f, b),
            };
            let b = if m.differentiable || !op.params.is_empty() { b } else { vec![] };
            launch.insert(op.name.clone(), (lf, lb));
            fwd.insert(op.name.clone(), f);
            bwd.insert(op.name.clone(), b);
        }
        CostModel { fwd, bwd, launches: launch, fused, model_flops: flops, cd, times: std::sync::OnceLock::new(), by_name: Default::default() }
    }

    /// Forward (and recompute) kernels of the model op named `name`.
    pub fn forward(&self, name: &str) -> Option<&[Kernel]> {
        self.fwd.get(name).map(|v| v.as_slice())
    }

    /// Whether `torch.compile` fused the model op named `name` into its consumer (it takes
    /// no time of its own, forward or backward).
    pub fn fused(&self, name: &str) -> bool {
        self.fused.contains(name)
    }

    /// Eager kernel launches of the model op named `name`: (forward, backward).
    pub fn launches(&self, name: &str) -> (u32, u32) {
        self.launches.get(name).copied().unwrap_or((1, 1))
    }

    /// Backward kernels of the model op named `name` (empty when it has no gradient).
    pub fn backward(&self, name: &str) -> Option<&[Kernel]> {
        self.bwd.get(name).map(|v| v.as_slice())
    }

    /// Every model op's time on `hw`: kept for the first profile asked (`tune` times hundreds
    /// of plans with one cost model), made afresh for another.
    pub fn times(&self, hw: &Hardware) -> std::borrow::Cow<'_, OpTimes> {
        let make = || {
            let mut t: HashMap<String, OpTime> = HashMap::default();
            for name in self.fwd.keys().chain(self.bwd.keys()).chain(self.launches.keys()).chain(self.fused.iter()) {
                if t.contains_key(name.as_str()) {
                    continue;
                }
                let launches = self.launches(name);
                let op = OpTime {
                    fused: self.fused(name),
                    forward: self.forward(name).map(|k| op_time(hw, k, launches.0)),
                    backward: self.backward(name).map(|k| op_time(hw, k, launches.1)),
                    launches,
                };
                t.insert(name.clone(), op);
            }
            OpTimes(t)
        };
        let (h, t) = self.times.get_or_init(|| (hw.clone(), make()));
        if h == hw {
            std::borrow::Cow::Borrowed(t)
        } else {
            std::borrow::Cow::Owned(make())
        }
    }
}

impl CostModel {
    /// Calls `f` with a look-up of model ops' [`OpTime`]s on `hw` by a schedule's op name: a
    /// name (one string for the op's forward, recompute and backward in a schedule, and in
    /// every plan `tune` builds from one schedule prelude) looked up by its text once, then by
    /// its address.
    pub fn with_times<R>(&self, hw: &Hardware, f: impl FnOnce(&mut dyn FnMut(&crate::plan::OpName) -> OpTime) -> R) -> R {
        let times = self.times(hw);
        let kept = matches!(times, std::borrow::Cow::Borrowed(_));
        let mut local = HashMap::default();
        let mut guard = if kept { self.by_name.lock().ok() } else { None };
        let memo = match guard.as_deref_mut() {
            Some(m) => {
                if m.len() > BY_NAME_MAX {
                    m.clear();
                }
                m
            }
            None => &mut local,
        };
        f(&mut |name| memo.entry(name.as_ptr() as usize).or_insert_with(|| (name.clone(), times.get(name))).1)
    }
}

fn k(flops: f64, bytes: f64, dtype: DType, work: Work) -> Kernel {
    Kernel { flops, bytes, dtype, work, shape: Shape::None }
}

/// torchao's `_scaled_mm` without `use_fast_accum` (its tensorwise recipe's two backward
/// GEMMs; the forward's uses fast accumulation): 1,175 TFLOP/s at 8192³ on H100 where
/// cuBLASLt's fast-accumulating FP8 GEMM reaches 1,609 (gitea.d-robotics.cc/han.zhao/
/// test_gpu_scripts `reports_cublaslt_fp8_crosscheck_20260524.md`, 8 GPUs each): 0.73 of
/// the fast rate, which [`GemmModel`](crate::hardware::GemmModel) at the float8 peak gives
/// (1,587 at 8192³).
pub const FP8_SLOW_ACCUM: f64 = 0.73;

/// A float8 linear's kernels (torchao, tensorwise): each cast to float8 is an amax pass and
/// a scaled cast (eager: `abs`, `max`, `to(f32)`, `mul`, `clamp`, `to(float8)` = 33 bytes per
/// bf16 element; under `torch.compile` one reduction and one fused cast, 5 bytes); the
/// forward casts the input (and the weight unless it was all-gathered in float8), the
/// backward the output's grad twice, the input again and (without float8 all-gather) the
/// weight; `_scaled_mm` wants its second operand column-major, so eager makes 1-byte copies of
/// the weight, the output's grad and the input for the backward's GEMMs.
///
/// Rowwise scaling (torchao's `rowwise` recipe): the forward GEMM is the rowwise kernel with
/// fast accumulation, priced as the tensorwise one (no rowwise measurement at hand); the
/// backward's run the tensorwise kernel without fast accumulation and then multiply their
/// output by the scales' outer product, an `[m, n]` float32 tensor made first (eager: write 4,
/// read 4 + 2, write 2 bytes per output element; compiled: one fused pass over the output).
fn float8_linear(rows: u64, i: u64, o: u64, cd: DType, f: crate::options::Float8, compiled: bool) -> (Vec<Kernel>, Vec<Kernel>) {
    let gathered = f.all_gather;
    let rowwise = f.recipe == crate::options::Float8Recipe::Rowwise;
    let f8 = DType::Float8E4m3fn;
    let per = if compiled { 3.0 + cd.size() as f64 } else { 5.0 + 14.0 * cd.size() as f64 };
    let cast = |n: u64| k(0.0, per * n as f64, cd, Work::Memory);
    let (x, w, g) = (rows * i, i * o, rows * o);
    let mut fwd = vec![cast(x)];
    if !gathered {
        fwd.push(cast(w));
    }
    fwd.push(gemm(1, rows, o, i, f8));
    let slow = |kk: u64| (kk as f64 / FP8_SLOW_ACCUM).round() as u64;
    let mut bwd = vec![cast(g), cast(g), cast(x)];
    if !gathered {
        bwd.push(cast(w));
    }
    if !compiled {
        bwd.push(k(0.0, 2.0 * (w + g + x) as f64, f8, Work::Memory));
    }
    let mut gi = gemm(1, rows, i, slow(o), f8);
    let mut gw = gemm(1, o, i, slow(rows), f8);
    gi.flops = 2.0 * (rows * i * o) as f64;
    gw.flops = gi.flops;
    bwd.extend([gi, gw]);
    if rowwise {
        let per = if compiled { 2.0 * cd.size() as f64 } else { 10.0 + 2.0 * cd.size() as f64 };
        bwd.push(k(0.0, per * (rows * i + o * i) as f64, cd, Work::Memory));
    }
    (fwd, bwd)
}

/// `b` GEMMs `[m, k] @ [k, n]` in `dtype`: their FLOPs and the bytes of their operands.
fn gemm(b: u64, m: u64, n: u64, kk: u64, dtype: DType) -> Kernel {
    let c = dtype.size() as f64;
    let (bf, mf, nf, kf) = (b as f64, m as f64, n as f64, kk as f64);
    Kernel { flops: 2.0 * bf * mf * nf * kf, bytes: bf * (mf * kf + kf * nf + mf * nf) * c, dtype, work: Work::Matmul, shape: Shape::Gemm { b, m, n, k: kk } }
}

/// HF's eager `LlamaRMSNorm` measured on H100 SXM 80GB (bf16, 8192 rows × 4096:
/// forward 0.575 ms, backward 1.405 ms; linkedin/Liger-Kernel
/// `benchmark/data/all_benchmark_data.csv` @76fece80, `rms_norm,huggingface`) over what
/// [`traffic`]'s bytes give at the profile's streaming rate (3.35 TB/s × 0.78) once the
/// launch gaps are taken out (8 and 12 kernels × 2.5 µs): forward ×1.20, backward ×1.62.
pub const EAGER_RMSNORM: (f64, f64) = (1.20, 1.62);
/// HF's eager `apply_rotary_pos_emb` measured forward + backward on H100 (NVL, 8192
/// tokens: 2.931 ms; Liger-Kernel `rope,huggingface,full` @3534d446) over [`traffic`]'s
/// bytes at that part's streaming rate: ×2.1 (the A100 measurement gives ×1.8).
pub const EAGER_ROPE: f64 = 2.1;

/// A linear op's `(rows, in, out)`: `[rows, in] @ [in, out]`.
fn linear_dims(cx: &Ctx, op: &Op) -> Option<(u64, u64, u64)> {
    let OpKind::Linear { transposed, .. } = op.kind else { return None };
    let w = op.params.first().and_then(|p| cx.model.param(p))?;
    let (o, i) = match (w.shape.as_slice(), transposed) {
        ([a, b], false) => (*a, *b),
        ([a, b], true) => (*b, *a),
        _ => return None,
    };
    let out_n = numel(&op.shape, cx.dims)?;
    Some((out_n / o.max(1), i, o))
}

/// Bytes the kernels of an element-wise op move (forward, backward), following HF's
/// implementation kernel by kernel (`c` = bytes of the compute dtype; `n` elements of the
/// output, `x` bytes of the first input): RMSNorm upcasts to float32 (cast, pow, mean, mul,
/// cast back, weight: `4c + 28` B/element; its backward ~`7c + 52`), RoPE is `x·cos +
/// rotate_half(x)·sin` (neg of a half, cat, two muls, an add: `10c`; backward ~`14c`) or,
/// as complex pairs (DeepSeek-V2's, torchtitan's `apply_rotary_emb`), a float32 copy, the
/// complex product and the cast back (`2c + 16` each way, streaming: not scaled), SiLU
/// `2c` (backward `3c`), a product `3c` (backward `6c`), a sum `3c` (its backward passes the
/// grad on; the second use's grad is summed: `3c`), dropout's bernoulli, div and mul `6c`
/// (`3c`), LayerNorm `2c` (`5c`), an embedding gather `2c` (its backward a scatter-add `3c`);
/// the loss upcasts the `[T, V]` logits and runs log-softmax and NLL (`c + 16` B per logit,
/// backward `c + 24`). `(0, 0)`: not an element-wise op (or one the bytes of its tensors
/// describe well enough).
///
/// RMSNorm and RoPE are then scaled to what HF's eager kernels measure ([`EAGER_RMSNORM`],
/// [`EAGER_ROPE`]): their small reductions, broadcasts and strided halves stream well
/// below a copy.
fn traffic(cx: &Ctx, op: &Op, out: f64, x: f64) -> (f64, f64) {
    let c = cx.cd.size() as f64;
    let n = out / c; // elements of the output, in the compute dtype
    let cast = cx.cd != DType::Float32;
    match &op.kind {
        OpKind::RmsNorm { .. } => {
            let (f, b) = match cast {
                true => (4.0 * c + 28.0, 7.0 * c + 52.0),
                false => (28.0, 64.0),
            };
            (n * f * EAGER_RMSNORM.0, n * b * EAGER_RMSNORM.1)
        }
        // the pairs as complex numbers times the table: a float32 copy, the complex product,
        // the cast back (each way), three streaming kernels (one in float32)
        OpKind::Rope { complex: true, .. } => {
            let per = if cast { 2.0 * c + 16.0 } else { 2.0 * c };
            (n * per, n * per)
        }
        OpKind::Rope { .. } => (n * 10.0 * c * EAGER_ROPE, n * 14.0 * c * EAGER_ROPE),
        OpKind::Activation { act } => {
            let (lf, lb) = launches(op, cast);
            match act {
                fsdp_ir::Act::GeluTanh => (n * 2.0 * c * lf as f64, n * 2.5 * c * lb as f64),
                _ => (n * 2.0 * c, n * 3.0 * c),
            }
        }
        OpKind::Mul => (n * 3.0 * c, n * 6.0 * c),
        // act (read gate, write) and the product (read both, write); backward: the product's
        // two grads, act's, the cat of both halves
        OpKind::GatedActivation { .. } => (n * 5.0 * c, n * 13.0 * c),
        OpKind::Add => (n * 3.0 * c, n * 3.0 * c),
        OpKind::Scale { .. } => (n * 2.0 * c, n * 2.0 * c),
        OpKind::Dropout { p } if *p > 0.0 => (n * 6.0 * c, n * 3.0 * c),
        OpKind::LayerNorm { .. } => (n * 2.0 * c, n * 5.0 * c),
        OpKind::Embedding | OpKind::PositionEmbedding => (n * 2.0 * c, n * 3.0 * c),
        OpKind::CrossEntropy { .. } => {
            let logits = x / c;
            (logits * (c + 16.0), logits * (c + 24.0))
        }
        OpKind::Experts { .. } => {
            // sort, gathers and scatters of the routed rows: ~10 passes over the hidden states
            (n * 10.0 * c, n * 14.0 * c)
        }
        _ => (0.0, 0.0),
    }
}

fn last_dim(cx: &Ctx, op: &Op) -> u64 {
    op.shape.last().and_then(|d| d.eval(cx.dims)).unwrap_or(1).max(1)
}

/// FLOPs the op's kernels execute in the forward (causal SDPA/flash attention halved).
pub fn matmul_flops(cx: &Ctx, op: &Op) -> f64 {
    let out_n = numel(&op.shape, cx.dims).unwrap_or(0) as f64;
    match &op.kind {
        OpKind::Linear { bias, transposed, .. } => {
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
        OpKind::Attention { heads, causal, sliding_window, .. } => {
            let (qk, v) = head_widths(op);
            let full = attention_flops(cx.dims, *heads, qk, v);
            let (s, w) = (cx.dims.seq, sliding_window.unwrap_or(u64::MAX));
            match cx.attn {
                AttnImpl::Eager => full,
                // flash-attention's window: query i attends to min(i + 1, w) keys, tiles
                // outside the band skipped
                AttnImpl::FlashAttention2 if *causal && cx.window_masks(*sliding_window) => {
                    let pairs = (w * (w + 1) / 2 + (s - w) * w) as f64;
                    full * pairs / (s as f64 * s as f64)
                }
                // SDPA under HF's explicit sliding-window mask: a masked kernel computes every
                // tile (no causal skip)
                AttnImpl::Sdpa if cx.window_masks(*sliding_window) => full,
                _ if *causal => full / 2.0,
                _ => full,
            }
        }
        _ => 0.0,
    }
}

/// `2·b·s²·h·(qk + v)` (`4·b·s²·h·hd` when q, k and v heads are as wide): the two `s×s`
/// GEMMs of attention, no causal discount.
pub fn attention_flops(d: Dims, heads: u64, qk: u64, v: u64) -> f64 {
    2.0 * d.batch as f64 * (d.seq as f64).powi(2) * heads as f64 * (qk + v) as f64
}

/// An attention op's q/k and v head widths (DeepSeek's latent attention: `qk_head_dim` and
/// `v_head_dim`; else both `head_dim`).
fn head_widths(op: &Op) -> (u64, u64) {
    match op.kind {
        OpKind::Attention { head_dim, mla: Some(m), .. } => (head_dim, m.v_head_dim),
        OpKind::Attention { head_dim, .. } => (head_dim, head_dim),
        _ => (0, 0),
    }
}

/// Model FLOPs of the op's forward for MFU: GEMMs (`2·T·in·out`, active experts only) and
/// attention `4·b·s²·h·hd` without the causal discount (the PaLM / torchtitan convention);
/// memory-bound ops count zero. Training = 3 × this (backward = 2 × forward).
pub fn model_op_flops(cx: &Ctx, op: &Op) -> f64 {
    match &op.kind {
        OpKind::Attention { heads, .. } => {
            let (qk, v) = head_widths(op);
            attention_flops(cx.dims, *heads, qk, v)
        }
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
    unit.params.iter().map(|p| p.padded_numel * opts.gathered_dtype_of(p).size())
        .sum()
}

/// `--offload cpu` (FSDP2's `CPUOffloadPolicy`, pinned host memory): `unit`'s copies over
/// PCIe (0 without offload). Before each all-gather (`to_device`) every parameter's padded
/// shard goes host→device in its own dtype (one copy per parameter on the all-gather's
/// copy-in stream: no foreach fast path) and is cast to the param dtype on the device (a read
/// and a write); after each reduction every parameter's reduced shard goes back device→host
/// on the collective's stream. `bytes / bandwidth` (per direction, every GPU of the node copying
/// at once) plus a launch per copy. The copies sit on the collective's stream, so they delay
/// it — and are exposed wherever the collective is. Without a host in the profile (host and
/// device one memory) they cost nothing.
pub fn offload_copy_s(hw: &Hardware, unit: &Unit, opts: &Options, to_device: bool) -> f64 {
    let Some(h) = hw.host.as_ref().filter(|_| opts.offload == crate::options::Offload::Cpu) else {
        return 0.0;
    };
    let ps = &unit.params;
    if to_device {
        let cast: u64 = ps.iter().filter(|p| opts.gathered_dtype_of(p) != p.dtype).map(|p| p.shard_numel * (p.dtype.size() + opts.gathered_dtype_of(p).size())).sum();
        let bytes: u64 = ps.iter().map(|p| p.shard_numel * p.dtype.size()).sum();
        bytes as f64 / h.h2d_bandwidth + ps.len() as f64 * hw.op_overhead_s + cast as f64 / (hw.hbm_bandwidth * hw.efficiency.memory)
    } else {
        let ws = opts.shard_size();
        let bytes: u64 = ps.iter().map(|p| p.grad_shard_bytes(ws)).sum();
        bytes as f64 / h.d2h_bandwidth + ps.iter().filter(|p| p.requires_grad).count() as f64 * hw.op_overhead_s
    }
}

/// `--offload cpu --grad-sync each`: what the CPU does after a reduction of a micro-batch
/// past the step's first, where the host already holds the unit's grads (FSDP2 2.11
/// `foreach_reduce`: `to_accumulate_grad`). The copy to the host is then a blocking one
/// (`non_blocking = pin_memory and not to_accumulate_grad`: "the CPU add kernel depends on
/// the copy result"), so the CPU waits for the collective and the copy to end, and then adds
/// each parameter's reduced shard into its host grad (`grad._local_tensor += new`): 3 of
/// Adam's 16 passes over the rank's shard ([`host_optimizer_s`]'s rate, shared by the node's
/// ranks, which add at once) plus a dispatch per parameter. The timeline holds the CPU's
/// launches back by it ([`crate::timeline`]): the GPU runs dry after the work already
/// queued. (The copy itself, into pageable memory where the first micro-batch's goes into
/// pinned, is priced at the pinned rate of [`offload_copy_s`]: no sourced pageable figure —
/// a floor.) `None` without a host in the profile.
pub fn host_accumulate_s(hw: &Hardware, unit: &Unit, opts: &Options) -> Option<f64> {
    let h = hw.host.as_ref()?;
    let grads = unit.params.iter().filter(|p| p.requires_grad).count();
    Some(host_node_elements(hw, unit, opts) / (h.adam_params_per_s * HOST_THREE_PASSES) + grads as f64 * hw.op_overhead_s)
}

/// `--offload cpu`: the optimizer step of one unit on the host (torch.optim on the rank's
/// CPU shards, while the GPU waits): its parameters (elements) over the rate the node's host
/// steps them at ([`crate::hardware::Host::adam_params_per_s`]), shared by the ranks on the
/// node, which all step at once; SGD, 3 of Adam's 16 passes over memory
/// ([`optimizer_kernels`]), that much faster. Without a host in the profile: `None` (the
/// device's kernels).
pub fn host_optimizer_s(hw: &Hardware, unit: &Unit, opts: &Options) -> Option<f64> {
    Some(host_node_elements(hw, unit, opts) / host_optimizer_rate(hw, opts)?)
}

/// Parameters per second the node's host steps (`None` without a host; infinite for no
/// optimizer: its step takes no time).
fn host_optimizer_rate(hw: &Hardware, opts: &Options) -> Option<f64> {
    let h = hw.host.as_ref()?;
    Some(match opts.optimizer {
        Optimizer::Adam | Optimizer::AdamW => h.adam_params_per_s,
        Optimizer::Sgd => h.adam_params_per_s * HOST_THREE_PASSES,
        Optimizer::None => f64::INFINITY,
    })
}

/// A floor of an offloaded step's time at shard group `shard` (`tune` passes by the shard
/// groups where it cannot beat the best without offload): the host's optimizer step over
/// `trainable` parameters, [`host_optimizer_s`] summed over the units with each rank's share
/// taken as `trainable / shard` (a rank's padded shard is no smaller). Every unit's step is
/// an op of the compute stream, one after the other: no step is shorter. 0 without a host.
pub fn host_step_floor_s(hw: &Hardware, opts: &Options, trainable: u64, shard: u64) -> f64 {
    // (a hair under: the units' steps summed round otherwise)
    host_optimizer_rate(hw, opts).map_or(0.0, |rate| trainable as f64 / shard.max(1) as f64 * opts.world_size.min(hw.gpus_per_node).max(1) as f64 / rate * (1.0 - 1e-9))
}

/// How much faster the host runs 3 passes over a shard (SGD's step, an add) than Adam's 16.
const HOST_THREE_PASSES: f64 = 16.0 / 3.0;

/// The elements of `unit`'s grads on one rank times the node's ranks (which share the host's
/// cores and memory, all at once).
fn host_node_elements(hw: &Hardware, unit: &Unit, opts: &Options) -> f64 {
    let ws = opts.shard_size();
    let elements: u64 = unit.params.iter().filter(|p| p.requires_grad).map(|p| p.local_numel(ws, 0)).sum();
    elements as f64 * opts.world_size.min(hw.gpus_per_node).max(1) as f64
}

/// The optimizer step of one unit: memory-bound over the rank's shard.
///
/// Adam/AdamW touch each element 16 times (param, grad, `exp_avg`, `exp_avg_sq` read; param
/// and both moments written; the `sqrt`/`denom` temporaries written and read; the update
/// read and written), SGD 3 times (param and grad read, param written); ~10 kernel launches
/// per step of a unit (foreach kernels).
pub fn optimizer_kernels(unit: &Unit, opts: &Options) -> (Vec<Kernel>, u32) {
    let ws = opts.shard_size();
    let bytes: u64 = unit.params.iter().map(|p| p.grad_shard_bytes(ws)).sum();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sliding-window attention: flash-attention's window visits each query's last `w` keys,
    /// SDPA under HF's explicit mask and eager compute every (query, key) pair. Expected
    /// values from counting the pairs one by one (4 FLOPs per pair per head-dim element).
    #[test]
    fn sliding_window_attention_counts_the_pairs_each_kernel_computes() {
        let cfg = r#"{"architectures": ["Gemma3ForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "sliding_window": 4, "sliding_window_pattern": 2, "vocab_size": 256}"#;
        let model = fsdp_ir::hf::import_hf(cfg, "t.json", "t").expect("imports");
        let (b, s, w, h, hd) = (2u64, 8u64, 4u64, 4u64, 16u64);
        let opts = Options { batch: b, seq: s, ..Options::default() };
        let window_pairs = (0..s).flat_map(|i| (0..s).map(move |j| (i, j))).filter(|&(i, j)| j <= i && i - j < w).count() as f64;
        let per_pair = (4 * b * h * hd) as f64;
        let all = per_pair * (s * s) as f64;
        let attn = |name: &str| model.ops.iter().find(|o| o.name == name).expect("op");
        let (local, global) = (attn("model.layers.0.self_attn.sdpa"), attn("model.layers.1.self_attn.sdpa"));
        for (imp, want_local, want_global) in [
            (AttnImpl::FlashAttention2, per_pair * window_pairs, all / 2.0),
            (AttnImpl::Sdpa, all, all / 2.0),
            (AttnImpl::Eager, all, all),
        ] {
            let cx = Ctx::new(&model, &opts, imp);
            assert_eq!(matmul_flops(&cx, local), want_local, "{imp:?} local layer");
            assert_eq!(matmul_flops(&cx, global), want_global, "{imp:?} global layer");
        }
    }
}
