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
}

impl Hardware {
    /// Peak FLOP/s of matmuls computing in `dtype`.
    pub fn peak(&self, dtype: DType) -> f64 {
        match dtype {
            DType::Bfloat16 => self.peak_flops.bf16,
            DType::Float16 => self.peak_flops.fp16,
            DType::Float32 if self.allow_tf32 => self.peak_flops.tf32,
            _ => self.peak_flops.fp32,
        }
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
