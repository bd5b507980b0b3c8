//! Hardware profiles: peak FLOP/s per dtype, memory and link bandwidths, latencies and
//! efficiency factors. Plain data; the binary reads them from `models/hardware/*.ron`
//! (this crate does no IO). Field checks run while deserializing, so a RON parser reports
//! a bad value at its file:line:col.

use fsdp_ir::DType;
use serde::{Deserialize, Deserializer, Serialize};

/// Dense (no sparsity) peak tensor/vector throughput, FLOP/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakFlops {
    #[serde(deserialize_with = "positive")]
    pub bf16: f64,
    #[serde(deserialize_with = "positive")]
    pub fp16: f64,
    /// TF32 tensor cores: used for float32 matmuls when `allow_tf32` is set.
    #[serde(deserialize_with = "positive")]
    pub tf32: f64,
    #[serde(deserialize_with = "positive")]
    pub fp32: f64,
    /// Float8 (e4m3/e5m2) tensor cores, dense; absent on parts without them (A100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<f64>,
}

/// One class of link: bandwidth per GPU per direction (bytes/s) and per-hop latency (s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    #[serde(deserialize_with = "positive")]
    pub bandwidth: f64,
    #[serde(deserialize_with = "non_negative")]
    pub latency: f64,
}

/// Achieved fraction of a peak, per kind of work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// GEMMs (linear layers, MoE experts) against the dtype's peak FLOP/s.
    #[serde(default = "d_matmul", deserialize_with = "fraction")]
    pub matmul: f64,
    /// Attention kernels (SDPA/flash; eager's two batched matmuls) against the peak.
    #[serde(default = "d_attention", deserialize_with = "fraction")]
    pub attention: f64,
    /// Memory-bound kernels (element-wise, norms, copies, optimizer) against HBM bandwidth.
    #[serde(default = "d_memory", deserialize_with = "fraction")]
    pub memory: f64,
    /// Collectives against the link bandwidth (NCCL bus bandwidth / link bandwidth).
    #[serde(default = "d_comm", deserialize_with = "fraction")]
    pub comm: f64,
}

fn d_matmul() -> f64 {
    0.7
}
fn d_attention() -> f64 {
    0.35
}
fn d_memory() -> f64 {
    0.8
}
fn d_comm() -> f64 {
    0.8
}
fn d_overhead() -> f64 {
    5e-6
}

impl Default for Efficiency {
    fn default() -> Self {
        Efficiency {
            matmul: d_matmul(),
            attention: d_attention(),
            memory: d_memory(),
            comm: d_comm(),
        }
    }
}

/// A hardware profile (`models/hardware/*.ron`). Units: FLOP/s, bytes, bytes/s, seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub name: String,
    pub peak_flops: PeakFlops,
    /// Use TF32 tensor cores for float32 matmuls (torch's `allow_tf32`; off by default).
    #[serde(default)]
    pub allow_tf32: bool,
    /// Device memory per GPU (the default `--memory-limit` of `sweep`).
    #[serde(deserialize_with = "positive_u64")]
    pub memory_bytes: u64,
    /// HBM (or DRAM) bandwidth, bytes/s.
    #[serde(deserialize_with = "positive")]
    pub hbm_bandwidth: f64,
    /// Within a node (NVLink / shared memory).
    pub intra_node: Link,
    /// Between nodes (per-GPU NIC share).
    pub inter_node: Link,
    #[serde(deserialize_with = "positive_u64")]
    pub gpus_per_node: u64,
    #[serde(default)]
    pub efficiency: Efficiency,
    /// Fixed time of every eager kernel launch (an op costs its launches times this: see
    /// `cost::launches`), and the whole time of FSDP bookkeeping ops (reshard, setup, phase
    /// end, zero_grad).
    #[serde(default = "d_overhead", deserialize_with = "non_negative")]
    pub op_overhead_s: f64,
    /// Fixed extra time of each backward op: what running the autograd engine once per op
    /// costs our CPU runtime (0 where one backward call runs the whole graph).
    #[serde(default, deserialize_with = "non_negative")]
    pub backward_op_overhead_s: f64,
    /// Fixed extra time of each forward (or recompute) model op: what dispatching one op
    /// costs the runtime beyond its kernel launches (Python module call in eager PyTorch; our
    /// CPU runtime's per-op bookkeeping). 0 unless calibrated.
    #[serde(default, deserialize_with = "non_negative")]
    pub forward_op_overhead_s: f64,
    /// Every op runs on one thread in schedule order (collectives block compute): our CPU
    /// runtime. GPUs overlap their streams.
    #[serde(default)]
    pub serial_streams: bool,
    /// The host behind each GPU, for `--offload cpu` ([`crate::cost::offload_copy_s`],
    /// [`crate::cost::host_optimizer_s`]); absent where host and device are one memory (the
    /// CPU profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
    /// A GPU's kernels modelled from published kernel measurements (GEMM sweeps,
    /// FlashAttention benchmarks, nccl-tests, launch costs), each figure cited in its profile.
    /// Without it (the CPU profile, which `calibrate` fits) every kernel takes the
    /// `efficiency` factors above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Gpu>,
}

/// A GPU's host: its PCIe link and the CPU that runs an offloaded optimizer step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Pinned host→device copy bandwidth per GPU (copy engine), bytes/s, with every GPU of
    /// the node copying at once.
    #[serde(deserialize_with = "positive")]
    pub h2d_bandwidth: f64,
    /// Pinned device→host copy bandwidth per GPU, likewise.
    #[serde(deserialize_with = "positive")]
    pub d2h_bandwidth: f64,
    /// torch.optim's Adam/AdamW (its default single-tensor loop on CPU tensors) over the
    /// node's host: parameters per second for all the node's ranks together (they step at
    /// once and share the cores and memory).
    #[serde(deserialize_with = "positive")]
    pub adam_params_per_s: f64,
    /// The node's host memory (its DRAM), bytes: what the offloaded state of all the node's
    /// ranks must fit in ([`crate::memory::HostNeed`]); unknown where absent (nothing is
    /// checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// The GPU kernel models ([`crate::cost`] documents how each is used).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Streaming multiprocessors: GEMM tiles run in waves of this many.
    pub sms: u32,
    /// The tensor-core clock of this part relative to the part the GEMM and attention figures
    /// were measured on (1 for that part itself). A power limit's effect is [`Power`]'s where
    /// the profile has one.
    #[serde(default = "one", deserialize_with = "positive")]
    pub clock_factor: f64,
    /// Tensor-core throughput under a training step's back-to-back load, relative to the
    /// short, cool microbenchmarks the GEMM and attention figures come from (they run at
    /// the maximum boost clock: XLA's table takes 5 runs with host copies between them,
    /// FlashAttention's benchmark 30 repeats): the part's sustained clock over its maximum.
    /// Applies to GEMMs and attention, not to memory-bound kernels or NCCL.
    #[serde(default = "one", deserialize_with = "positive")]
    pub sustained: f64,
    /// What the part's power limit lets its tensor cores sustain ([`Power`]); `None`: no
    /// power-limited rate is known (the kernel models alone).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "power_above_idle")]
    pub power: Option<Power>,
    pub gemm: GemmModel,
    /// FlashAttention-2's measured throughput (what SDPA's flash backend runs).
    pub attention: Vec<AttnPoint>,
    pub nccl: Nccl,
    /// Share of the SMs a running NCCL collective takes from concurrent compute kernels
    /// (its CTAs), which then run this much slower.
    #[serde(deserialize_with = "fraction_or_zero")]
    pub comm_sm_share: f64,
    /// CPU time eager PyTorch spends to dispatch and launch one kernel (Python, dispatcher,
    /// autograd, cudaLaunchKernel): the GPU cannot start a kernel before its launch.
    #[serde(deserialize_with = "non_negative")]
    pub cpu_launch_s: f64,
    /// CPU time of FSDP2's hooks per all-gather (copy-in bookkeeping, stream waits, the
    /// foreach copies' launches).
    #[serde(deserialize_with = "non_negative")]
    pub fsdp_cpu_per_unshard_s: f64,
}

/// The tensor-core FLOP/s a GPU's power limit sustains. A long stream of large GEMMs draws
/// the board to its limit and the clock falls until it holds there, so such kernels run at a
/// measured sustained rate whatever their shape would allow; under a lower limit the rate
/// falls with the power left above what the board draws idle (the SM clock's dynamic power,
/// to first order proportional to the clock at the low voltages a capped part runs at):
/// `rate · (limit_w − idle_w) / (measured_at_w − idle_w)`. Kernels slower than that (small
/// GEMMs, attention, memory-bound ones) are not power-bound and keep their own model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Power {
    /// The part's power limit (W).
    #[serde(deserialize_with = "positive")]
    pub limit_w: f64,
    /// The limit the sustained rates below were measured at (W).
    #[serde(deserialize_with = "positive")]
    pub measured_at_w: f64,
    /// Board power that does not scale with the SM clock (W): the idle draw.
    #[serde(deserialize_with = "non_negative")]
    pub idle_w: f64,
    /// Sustained GEMM FLOP/s at `measured_at_w` per tensor-core dtype.
    #[serde(deserialize_with = "positive")]
    pub bf16: f64,
    #[serde(deserialize_with = "positive")]
    pub fp16: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<f64>,
}

/// A profile's [`Power`], checked: its rates scale by the power above idle, so both limits
/// must exceed the idle draw, and a float8 rate must be a rate.
fn power_above_idle<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Power>, D::Error> {
    let Some(p) = Option::<Power>::deserialize(d)? else { return Ok(None) };
    if p.limit_w <= p.idle_w || p.measured_at_w <= p.idle_w {
        return Err(serde::de::Error::custom(format!("power: limit_w ({}) and measured_at_w ({}) must exceed idle_w ({})", p.limit_w, p.measured_at_w, p.idle_w)));
    }
    if p.fp8.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
        return Err(serde::de::Error::custom("power: fp8 must be a positive rate"));
    }
    Ok(Some(p))
}

impl Power {
    /// The power-limited FLOP/s of tensor-core work in `dtype` at `limit_w` (`None`: a dtype
    /// without a measured rate, float32 on the CUDA cores among them).
    pub fn flops(&self, dtype: DType) -> Option<f64> {
        let rate = match dtype {
            DType::Bfloat16 => self.bf16,
            DType::Float16 => self.fp16,
            DType::Float8E4m3fn => self.fp8?,
            _ => return None,
        };
        let span = self.measured_at_w - self.idle_w;
        (span > 0.0).then(|| rate * (self.limit_w - self.idle_w).max(0.0) / span)
    }
}

/// cuBLAS GEMM time: output tiles in waves over the SMs, a pipeline fill per K, a fixed
/// time (see [`GemmModel::time`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmModel {
    /// Fraction of the dtype's peak a full wave of the best tile sustains.
    #[serde(deserialize_with = "fraction")]
    pub efficiency: f64,
    /// Extra K of each tile's main loop (prologue and epilogue).
    #[serde(deserialize_with = "non_negative")]
    pub k_fill: f64,
    /// Fixed time per GEMM (launch on the GPU, setup, the last tile's tail).
    #[serde(deserialize_with = "non_negative")]
    pub fixed_s: f64,
    /// The tiles cuBLAS's heuristic picks from: (rows, columns, throughput per SM relative to
    /// the best tile).
    pub tiles: Vec<(u64, u64, f64)>,
}

impl GemmModel {
    /// Seconds for `b` GEMMs of `[m, k] @ [k, n]` on `sms` SMs at `peak` FLOP/s:
    /// `fixed + min over tiles ⌈b·⌈m/tm⌉·⌈n/tn⌉ / sms⌉ · 2·tm·tn·(k + k_fill) / (peak · e · r / sms)`.
    pub fn time(&self, sms: u32, peak: f64, b: u64, m: u64, n: u64, k: u64) -> f64 {
        let sms = sms.max(1) as f64;
        let per_sm = peak * self.efficiency / sms;
        let waves = |tm: u64, tn: u64| ((b.max(1) * m.div_ceil(tm.max(1)) * n.div_ceil(tn.max(1))) as f64 / sms).ceil();
        let best = self
            .tiles
            .iter()
            .map(|&(tm, tn, r)| waves(tm, tn) * 2.0 * (tm * tn) as f64 * (k as f64 + self.k_fill) / (per_sm * r.max(1e-9)))
            .fold(f64::INFINITY, f64::min);
        self.fixed_s + if best.is_finite() { best } else { 2.0 * (b * m * n * k) as f64 / (peak * self.efficiency) }
    }
}

/// FlashAttention-2 throughput at one head dim, mask and sequence length (FLOPs counted as
/// the flash-attention benchmarks count them: `4·b·s²·h·hd`, halved when causal; backward
/// 2.5× forward).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttnPoint {
    pub head_dim: u64,
    pub causal: bool,
    pub seq: u64,
    /// Forward FLOP/s.
    #[serde(deserialize_with = "positive")]
    pub fwd: f64,
    /// Forward + backward FLOP/s (3.5 forwards' FLOPs over their time).
    #[serde(deserialize_with = "positive")]
    pub fwd_bwd: f64,
}

impl Gpu {
    /// FLOP/s of FlashAttention-2's forward (or backward) at this head dim, mask and
    /// sequence length: interpolated in log(seq) between measured points of the nearest
    /// measured head dim with the same mask, held flat past the ends.
    pub fn attention_flops(&self, head_dim: u64, causal: bool, seq: u64, backward: bool) -> Option<f64> {
        let mask: Vec<&AttnPoint> = self.attention.iter().filter(|p| p.causal == causal).collect();
        let hd = mask.iter().map(|p| p.head_dim).min_by_key(|&h| (h as i64 - head_dim as i64).unsigned_abs())?;
        let mut pts: Vec<(f64, f64)> = mask
            .iter()
            .filter(|p| p.head_dim == hd)
            .map(|p| {
                // backward from the two measurements: t_fb = 3.5/fwd_bwd, t_f = 1/fwd per FLOP
                let v = if backward { 2.5 / (3.5 / p.fwd_bwd - 1.0 / p.fwd).max(1e-30) } else { p.fwd };
                ((p.seq.max(1) as f64).ln(), v)
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let x = (seq.max(1) as f64).ln();
        let v = match pts.iter().position(|p| p.0 >= x) {
            None => pts.last()?.1,
            Some(0) => pts[0].1,
            Some(i) => {
                let (a, b) = (pts[i - 1], pts[i]);
                a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0)
            }
        };
        Some(v * self.compute_factor())
    }

    /// What a compute kernel's measured throughput is multiplied by on this part: its power
    /// limit's clock and the sustained clock under load.
    pub fn compute_factor(&self) -> f64 {
        self.clock_factor * self.sustained
    }
}

/// NCCL's ring collectives (all-gather, reduce-scatter; all-reduce) inside a node and across
/// nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nccl {
    /// Fixed latency of a ring collective.
    #[serde(deserialize_with = "non_negative")]
    pub base_latency_s: f64,
    /// Latency of each ring step over NVLink, and over the network.
    #[serde(deserialize_with = "non_negative")]
    pub nvlink_step_s: f64,
    #[serde(deserialize_with = "non_negative")]
    pub net_step_s: f64,
    /// Bus bandwidth inside one node (nccl-tests' busbw, large messages), per collective.
    #[serde(deserialize_with = "positive")]
    pub all_gather_busbw: f64,
    #[serde(deserialize_with = "positive")]
    pub reduce_scatter_busbw: f64,
    #[serde(deserialize_with = "positive")]
    pub all_reduce_busbw: f64,
    /// What one NIC sustains (bytes/s, one direction), and NICs per node.
    #[serde(deserialize_with = "positive")]
    pub nic_bandwidth: f64,
    pub nics_per_node: u64,
}

impl Hardware {
    /// Peak FLOP/s of matmuls computing in `dtype`.
    pub fn peak(&self, dtype: DType) -> f64 {
        match dtype {
            DType::Bfloat16 => self.peak_flops.bf16,
            DType::Float16 => self.peak_flops.fp16,
            DType::Float32 if self.allow_tf32 => self.peak_flops.tf32,
            // (a part without float8 tensor cores: `plan` refuses --float8 on it)
            DType::Float8E4m3fn => self.peak_flops.fp8.unwrap_or(self.peak_flops.bf16),
            _ => self.peak_flops.fp32,
        }
    }
}

fn one() -> f64 {
    1.0
}

fn fraction_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!("must be in [0, 1), got {v}")))
    }
}

fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!("must be a positive number, got {v}")))
    }
}

fn non_negative<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!("must be >= 0, got {v}")))
    }
}

fn fraction<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!("an efficiency must be in (0, 1], got {v}")))
    }
}

fn positive_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    // RON writes large sizes as floats too (`85.5e9`): accept whole numbers either way.
    let v = f64::deserialize(d)?;
    if v.is_finite() && v >= 1.0 && v.fract() == 0.0 && v < 1.8e19 {
        Ok(v as u64)
    } else {
        Err(serde::de::Error::custom(format!("must be a positive whole number, got {v}")))
    }
}
