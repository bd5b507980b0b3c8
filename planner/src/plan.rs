//! The plan: plain serializable data, everything a runtime or a printer needs.

use crate::ids::{BufferId, OpId, UnitId};
use crate::options::Options;
use crate::units::Unit;
use fsdp_ir::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const FORMAT_VERSION: u32 = 1;

/// FSDPMemTracker's categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    ShardedParam,
    UnshardedParam,
    ShardedGrad,
    UnshardedGrad,
    Optstate,
    AllGather,
    ReduceScatter,
    Activation,
    Temp,
    Inputs,
    Buffer,
}

impl Category {
    pub const ALL: [Category; 11] = [
        Category::ShardedParam,
        Category::UnshardedParam,
        Category::ShardedGrad,
        Category::UnshardedGrad,
        Category::Optstate,
        Category::AllGather,
        Category::ReduceScatter,
        Category::Activation,
        Category::Temp,
        Category::Inputs,
        Category::Buffer,
    ];
    /// Position in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Category::ShardedParam => "sharded_param",
            Category::UnshardedParam => "unsharded_param",
            Category::ShardedGrad => "sharded_grad",
            Category::UnshardedGrad => "unsharded_grad",
            Category::Optstate => "optstate",
            Category::AllGather => "all_gather",
            Category::ReduceScatter => "reduce_scatter",
            Category::Activation => "activation",
            Category::Temp => "temp",
            Category::Inputs => "inputs",
            Category::Buffer => "buffer",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Compute,
    AllGather,
    ReduceScatter,
    AllReduce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Setup,
    Forward,
    Backward,
    Optimizer,
}

/// Process group a collective runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    Shard,
    Replicate,
    World,
    /// A unit's post-forward group (`reshard_after_forward=int` N: N consecutive ranks).
    PostForward,
}

/// A model op's name in a schedule op: shared (an op of every micro-batch and its recompute
/// name the same model op; a plan has tens of thousands of them, `tune` builds thousands of
/// plans).
pub type OpName = std::sync::Arc<str>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OpKind {
    /// Persistent state of the step: sharded params, optimizer state, buffers, inputs.
    Setup,
    /// All-gather a unit's shards into the buffer `out`.
    AllGather { unit: UnitId, numel: u64, dtype: DType, group: Group, prefetch: bool },
    /// Wait for the all-gather and copy out into the unsharded params.
    CopyOut { unit: UnitId },
    Forward { op: OpName, unit: UnitId },
    /// An op of a checkpointed region run again before its backward. `cached`: FSDP2 does
    /// not run it (selective AC serves its kept output; the early stop ends the recompute
    /// before it): it takes no time and allocates nothing; it stands in the schedule for our
    /// runtime, which rebuilds the op's autograd node there.
    Recompute {
        op: OpName,
        unit: UnitId,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cached: bool,
    },
    Backward { op: OpName, unit: UnitId },
    /// Free the unsharded params (reshard).
    Reshard { unit: UnitId },
    /// Reduce-scatter the unit's gradients (`numel` = the unsharded, padded input).
    ReduceScatter { unit: UnitId, numel: u64, dtype: DType, group: Group },
    AllReduce { unit: UnitId, numel: u64, dtype: DType, group: Group },
    /// Relabel/keep the unit's unsharded grads (no gradient sync on this micro-batch); under
    /// FSDP2 mixed precision, upcast to the reduce dtype (`to_accumulated_grad_if_needed`).
    KeepGrads { unit: UnitId },
    /// FSDP2 mixed precision after a micro-batch without sync: this backward's grads are added
    /// into the unit's kept (reduce-dtype) grads and freed (`accumulate_unsharded_grad_if_needed`).
    AccumulateGrads { unit: UnitId },
    OptimizerStep { unit: UnitId },
    ZeroGrad,
    /// End of a phase: frees what the phase leaves behind (e.g. the last RS input).
    PhaseEnd,
}

/// An op's cross-stream dependencies: none or one in every schedule the planner builds, kept
/// inline (a plan has thousands of ops and `tune` builds thousands of plans).
pub type OpDeps = smallvec::SmallVec<[OpId; 2]>;
/// An op's allocations and frees, in order: up to four inline (about three ops in four).
pub type OpEvents = smallvec::SmallVec<[Event; 4]>;

/// One event of an op, in order; the peak is checked after every allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    Alloc(BufferId),
    Free(BufferId),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleOp {
    pub id: OpId,
    pub kind: OpKind,
    pub stream: Stream,
    pub phase: Phase,
    pub micro_batch: u32,
    /// Ops that must complete before this one starts (cross-stream dependencies).
    #[serde(default, skip_serializing_if = "smallvec::SmallVec::is_empty")]
    pub deps: OpDeps,
    #[serde(default, skip_serializing_if = "smallvec::SmallVec::is_empty")]
    pub events: OpEvents,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferInfo {
    pub id: BufferId,
    pub name: String,
    pub category: Category,
    pub bytes: u64,
    /// Offset in the per-rank arena.
    pub offset: u64,
    pub alloc: OpId,
    /// `None`: alive past the end of the step (persistent state).
    pub free: Option<OpId>,
    /// The unit whose params this buffer holds or serves, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<UnitId>,
    /// The buffers whose storage this one is, relabeled (FSDPMemTracker's view changes, no
    /// allocation happens: param grads becoming the unit's unsharded grads, the
    /// reduce-scatter's copy-in becoming its input). They are freed just before it is
    /// allocated; the caching allocator model ([`crate::reserved`]) keeps their blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub continues: Vec<BufferId>,
}

/// One collective of the steady-state step, as the fixtures record them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collective {
    pub kind: String,
    pub unit: String,
    pub numel: u64,
    pub dtype: String,
    pub op: OpId,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub peak_bytes: u64,
    /// The op after whose allocation the peak is reached, printed.
    pub peak_at: String,
    pub peak_op: OpId,
    pub breakdown: BTreeMap<Category, u64>,
    /// Size of the per-rank arena (max offset + size over all buffers).
    pub arena_bytes: u64,
    /// The rank the figures are for (rank 0 holds the largest shards).
    pub rank: u64,
    /// What the host holds for the step under `--offload cpu` ([`crate::memory::host`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMemory>,
}

/// FSDP2's CPUOffloadPolicy on the host, per rank (FSDPMemTracker's `cpu` device): all of it
/// is alive at the optimizer step, the host's peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMemory {
    pub peak_bytes: u64,
    /// The sharded params: padded, in their own dtype.
    pub sharded_param: u64,
    /// The sharded grads: unpadded, one tensor per parameter, in the params' dtype.
    pub sharded_grad: u64,
    /// The optimizer state and step counters.
    pub optstate: u64,
    /// The optimizer step's temporaries at their largest.
    pub optimizer_temp: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format_version: u32,
    pub model_name: String,
    /// SHA-256 of the model's canonical RON.
    pub model_hash: String,
    /// SHA-256 of the model hash and the options.
    pub plan_hash: String,
    pub options: Options,
    pub attn_implementation: String,
    pub policy: String,
    /// (shared: `tune` plans many configurations from one outer point's units)
    pub units: std::sync::Arc<Vec<Unit>>,
    pub schedule: Vec<ScheduleOp>,
    pub buffers: Vec<BufferInfo>,
    pub collectives: Vec<Collective>,
    pub memory: Memory,
    /// Tied parameters and the modules that share them.
    pub shared: Vec<SharedParam>,
    /// The schedule's gradient accumulation repeats its second-to-last micro-batch
    /// ([`crate::schedule::Schedule::steady`]): what `tune` plans a longer accumulation from.
    #[serde(skip)]
    pub steady: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedParam {
    pub param: String,
    pub aliases: Vec<String>,
    pub unit: String,
    pub modules: Vec<String>,
}

impl Plan {
    pub fn unit(&self, id: UnitId) -> &Unit {
        &self.units[id.index()]
    }

    /// Index of the unit owning each (primary) parameter name.
    pub fn param_owners(&self) -> rustc_hash::FxHashMap<&str, usize> {
        self.units
            .iter()
            .enumerate()
            .flat_map(|(i, u)| u.params.iter().map(move |p| (p.name.as_str(), i)))
            .collect()
    }
}
