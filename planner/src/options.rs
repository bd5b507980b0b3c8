//! Planning options, named after PyTorch FSDP's knobs, with FSDP2's defaults.

use crate::error::{opt_err, PlanError};
use fsdp_ir::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which modules become FSDP units (the root always is one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Policy {
    /// `transformer:` every instance of these classes (FSDP's transformer_auto_wrap_policy).
    Transformer(Vec<String>),
    /// `size:` FSDP1's size_based_auto_wrap_policy with this min_num_params.
    Size(u64),
    /// `modules:` these module paths (manual `fully_shard` calls).
    Modules(Vec<String>),
    /// `none`: the root only.
    None,
    /// `auto`: `transformer:` with the model's decoder-layer class (HF models), else `none`.
    Auto,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Policy, PlanError> {
        let bad = |m: &str| PlanError::Policy {
            policy: s.to_string(),
            message: m.to_string(),
        };
        // (a `modules:` unit of several, `a + b`, kept as `a+b`)
        let list = |r: &str| -> Vec<String> {
            r.split(',').map(|x| x.split('+').map(str::trim).collect::<Vec<_>>().join("+")).filter(|x| !x.is_empty()).collect()
        };
        match s.split_once(':') {
            Some(("transformer", r)) if !list(r).is_empty() => Ok(Policy::Transformer(list(r))),
            Some(("modules", r)) if !list(r).is_empty() => Ok(Policy::Modules(list(r))),
            Some(("size", r)) => {
                let v: f64 = r
                    .trim()
                    .parse()
                    .map_err(|_| bad("min_num_params must be a number, e.g. size:1e8"))?;
                if !(v.is_finite() && v >= 1.0) {
                    return Err(bad("min_num_params must be >= 1"));
                }
                Ok(Policy::Size(v as u64))
            }
            Some(_) => Err(bad("expected transformer:<Class>[,…], size:<min_num_params>, modules:<path>[+<path>…][,…], none or auto")),
            None if s == "none" => Ok(Policy::None),
            None if s == "auto" => Ok(Policy::Auto),
            None => Err(bad("expected transformer:<Class>[,…], size:<min_num_params>, modules:<path>[+<path>…][,…], none or auto")),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Transformer(c) => write!(f, "transformer:{}", c.join(",")),
            Policy::Size(n) => write!(f, "size:{n}"),
            Policy::Modules(m) => write!(f, "modules:{}", m.join(",")),
            Policy::None => f.write_str("none"),
            Policy::Auto => f.write_str("auto"),
        }
    }
}

/// Shard layout: FSDP2 per-parameter dim-0 shards, or FSDP1's padded FlatParameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    Fsdp2,
    Flat,
}

impl Layout {
    /// The `--layout` value.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Fsdp2 => "fsdp2",
            Layout::Flat => "flat",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Strategy {
    FullShard,
    ShardGradOp,
    NoShard,
    /// Shard within groups of `shard_size` ranks, replicate across groups.
    HybridShard { shard_size: u64 },
}

impl Strategy {
    /// The `--strategy` value.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::FullShard => "full-shard",
            Strategy::ShardGradOp => "shard-grad-op",
            Strategy::NoShard => "no-shard",
            Strategy::HybridShard { .. } => "hybrid-shard",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackwardPrefetch {
    /// FSDP2's default: each unit's pre-backward prefetches the unit before it (1 deep).
    Implicit,
    /// FSDP2 `set_modules_to_backward_prefetch` with this many units ahead.
    Depth(u32),
    /// FSDP1 BACKWARD_PRE.
    Pre,
    /// FSDP1 BACKWARD_POST.
    Post,
    /// No backward prefetch.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Optimizer {
    Adam,
    AdamW,
    Sgd,
    None,
}

impl Optimizer {
    /// The `--optimizer` value.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Adam => "adam",
            Optimizer::AdamW => "adamw",
            Optimizer::Sgd => "sgd",
            Optimizer::None => "none",
        }
    }

    /// Whether it keeps per-parameter state (Adam's exp_avg and exp_avg_sq; torch's SGD
    /// without momentum keeps none).
    pub fn keeps_state(self) -> bool {
        matches!(self, Optimizer::Adam | Optimizer::AdamW)
    }
}

/// What a checkpointed region keeps from its forward (torchtitan's `--activation_checkpoint.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum AcMode {
    /// Only the region's inputs; everything is recomputed (`torch.utils.checkpoint`).
    #[default]
    Full,
    /// torchtitan's op-level selective AC: the outputs of every other `mm` (the 1st, 3rd, …
    /// of each region call) and of SDPA's kernel are kept (`create_selective_checkpoint_contexts`
    /// with MUST_SAVE), everything else is recomputed.
    SelectiveOp,
}

impl AcMode {
    pub fn parse(s: &str) -> Option<AcMode> {
        match s {
            "full" => Some(AcMode::Full),
            "selective-op" | "op" => Some(AcMode::SelectiveOp),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            AcMode::Full => "full",
            AcMode::SelectiveOp => "selective-op",
        }
    }
    fn is_full(&self) -> bool {
        *self == AcMode::Full
    }
}

/// The training loop around the model (`--train-loop`): how it computes the loss and what it
/// keeps between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TrainLoop {
    /// `loss = model(input_ids, labels=labels).loss`: HF's loss inside the forward (labels
    /// padded and shifted, the logits upcast for it), the logits dropped with the output.
    #[default]
    #[serde(rename = "hf")]
    Hf,
    /// torchtitan before it freed the logits (83c879f, the PR #165 runs):
    /// `pred = model(input_ids)` with float32 logits out of the model (`output(h).float()`),
    /// `loss = cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))` on labels the data
    /// loader shifted, and `pred` kept until the next step's forward reassigns it.
    #[serde(rename = "torchtitan-2024")]
    Torchtitan2024,
}

impl TrainLoop {
    pub fn parse(s: &str) -> Option<TrainLoop> {
        match s {
            "hf" => Some(TrainLoop::Hf),
            "torchtitan-2024" => Some(TrainLoop::Torchtitan2024),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TrainLoop::Hf => "hf",
            TrainLoop::Torchtitan2024 => "torchtitan-2024",
        }
    }
    fn is_hf(&self) -> bool {
        *self == TrainLoop::Hf
    }
}

/// Which micro-batches of a gradient-accumulation step reduce their gradients
/// (`--grad-sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GradSync {
    /// The last only: the others run under `set_requires_gradient_sync(False)` (FSDP2;
    /// accelerate's and FSDP1's `no_sync`) and keep their unsharded gradients for the next
    /// micro-batch's to add into: one reduce-scatter per step, a step's unsharded gradients
    /// held from the first micro-batch's backward to the last's.
    #[default]
    Last,
    /// Every one (torchtitan's loop, FSDP2's default): each backward reduce-scatters and adds
    /// its reduced shard into the sharded gradient (`foreach_reduce`: `grad += new`), so no
    /// unsharded gradient outlives its backward; a reduce-scatter per micro-batch.
    Each,
}

impl GradSync {
    pub fn parse(s: &str) -> Option<GradSync> {
        match s {
            "last" => Some(GradSync::Last),
            "each" => Some(GradSync::Each),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GradSync::Last => "last",
            GradSync::Each => "each",
        }
    }
    fn is_last(&self) -> bool {
        *self == GradSync::Last
    }
}

/// Where the sharded state lives (`--offload`): FSDP2's `offload_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    /// `OffloadPolicy()`: shards, gradients and optimizer state on the device.
    #[default]
    None,
    /// `CPUOffloadPolicy()`: the sharded params (padded, in their own dtype), the sharded
    /// grads and the optimizer state and step on the host; each all-gather first copies every
    /// parameter's shard to the device (then casts it to the param dtype), each reduce-scatter's
    /// output goes back to the host parameter by parameter.
    ///
    /// Under `--device cpu` the host is what the CPU runtime keeps apart from its counted
    /// "device" memory (a rank thread's allocations): the same copies and casts, on one
    /// memory. FSDP2 itself moves nothing on a CPU mesh, so what such a plan is checked
    /// against is the runtime (`runtime/tests/memory_parity.rs`), not an FSDP2 run.
    Cpu,
}

impl Offload {
    pub fn parse(s: &str) -> Option<Offload> {
        match s {
            "none" => Some(Offload::None),
            "cpu" => Some(Offload::Cpu),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Cpu => "cpu",
        }
    }
    fn is_none(&self) -> bool {
        *self == Offload::None
    }
}

/// Where FSDP2's hooks sit relative to each activation checkpoint (`--ac-wrapper`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AcWrapper {
    /// HF's `gradient_checkpointing_enable` (accelerate's too): the checkpoint runs the
    /// block's `__call__`, its FSDP hooks inside — and again in the recompute, whose tensors
    /// FSDPMemTracker then counts as activation.
    #[default]
    Hf,
    /// torchtitan's: `checkpoint_wrapper` around each block before `fully_shard` — the
    /// block's FSDP hooks outside the checkpoint and SAC's cache, not in the recompute (its
    /// tensors counted as temp).
    Torchtitan,
}

impl AcWrapper {
    pub fn parse(s: &str) -> Option<AcWrapper> {
        match s {
            "hf" => Some(AcWrapper::Hf),
            "torchtitan" => Some(AcWrapper::Torchtitan),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            AcWrapper::Hf => "hf",
            AcWrapper::Torchtitan => "torchtitan",
        }
    }
    fn is_hf(&self) -> bool {
        *self == AcWrapper::Hf
    }
}

/// One `--checkpoint` entry: a module class or path, with its own mode after `=`
/// (`model.layers.3=selective-op`) or `--ac-mode`'s. A path may name a range of blocks as
/// the shell would, `model.layers.{0..7}` (both ends included).
pub fn checkpoint_spec(entry: &str, default: AcMode) -> Result<(Vec<String>, AcMode), String> {
    let (name, mode) = match entry.rsplit_once('=') {
        None => (entry.trim(), default),
        Some((name, mode)) => match AcMode::parse(mode.trim()) {
            Some(m) => (name.trim(), m),
            None => return Err(format!("`{entry}`: the mode after `=` is full or selective-op")),
        },
    };
    if !name.contains('{') {
        return Ok((vec![name.to_string()], mode));
    }
    match brace_range(name) {
        Some((head, a, b, tail)) if a <= b && b - a < 1_000_000 => Ok(((a..=b).map(|i| format!("{head}{i}{tail}")).collect(), mode)),
        _ => Err(format!("`{entry}`: a range is written {{FIRST..LAST}}, e.g. model.layers.{{0..7}}")),
    }
}

/// `head{a..b}tail` as `(head, a, b, tail)`: a range of numbers as the shell writes it (the
/// `--checkpoint` paths, the `modules:` policy's patterns); `None` unless well formed.
pub fn brace_range(s: &str) -> Option<(&str, u64, u64, &str)> {
    let (head, rest) = s.split_once('{')?;
    let (range, tail) = rest.split_once('}')?;
    let (a, b) = range.split_once("..")?;
    Some((head, a.trim().parse().ok()?, b.trim().parse().ok()?, tail))
}

impl Options {
    /// The dtype a param of dtype `d` is all-gathered and computed in: `param_dtype` for
    /// floating-point params (MixedPrecisionPolicy casts only those), else its own.
    pub fn gathered_dtype(&self, d: DType) -> DType {
        match self.param_dtype {
            Some(pd) if d.is_float() => pd,
            _ => d,
        }
    }

    /// The dtype unit param `p` is all-gathered in: float8 for a float8 linear's weight under
    /// `Float8::all_gather`, else [`Options::gathered_dtype`].
    pub fn gathered_dtype_of(&self, p: &crate::units::UnitParam) -> DType {
        match self.float8 {
            Some(Float8 { all_gather: true, .. }) if p.float8 => DType::Float8E4m3fn,
            _ => self.gathered_dtype(p.dtype),
        }
    }

    /// `--checkpoint`'s entries, ranges expanded: (module class or path, mode). Entries that
    /// do not parse are dropped here; [`Options::check`] refuses them.
    pub fn checkpoints(&self) -> Vec<(String, AcMode)> {
        self.checkpoint
            .iter()
            .filter_map(|c| checkpoint_spec(c, self.ac_mode).ok())
            .flat_map(|(names, m)| names.into_iter().map(move |n| (n, m)))
            .collect()
    }
}

/// HF `attn_implementation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttnImpl {
    Sdpa,
    Eager,
    FlashAttention2,
}

impl AttnImpl {
    pub fn parse(s: &str) -> Option<AttnImpl> {
        Some(match s {
            "sdpa" => AttnImpl::Sdpa,
            "eager" => AttnImpl::Eager,
            "flash_attention_2" | "flash" => AttnImpl::FlashAttention2,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            AttnImpl::Sdpa => "sdpa",
            AttnImpl::Eager => "eager",
            AttnImpl::FlashAttention2 => "flash_attention_2",
        }
    }
}

/// Where the step runs: it decides kernel choices (dropout masks, SDPA backends) and the
/// allocator's rounding (512 B blocks on CUDA, exact on CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Device {
    Cuda,
    Cpu,
}

impl Device {
    pub fn parse(s: &str) -> Option<Device> {
        match s {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
    /// The bytes the device's allocator takes for a `bytes` request: CUDA's caching allocator
    /// rounds up to whole 512-byte blocks; the CPU allocator takes the size as asked.
    pub fn allocated_bytes(self, bytes: u64) -> u64 {
        match self {
            Device::Cuda if bytes > 0 => bytes.div_ceil(512) * 512,
            _ => bytes,
        }
    }
    /// Where the device's allocator starts a block: c10's CPU allocator aligns to 64 bytes,
    /// CUDA's caching allocator hands out whole 512-byte blocks. The arena starts every
    /// storage there too: libtorch's vectorized CPU kernels (and MKL's) may split a loop
    /// differently on a differently aligned buffer and round differently, so a tensor placed
    /// off this alignment would not compute bit-identically to one from the heap.
    pub fn alignment(self) -> u64 {
        match self {
            Device::Cuda => 512,
            Device::Cpu => 64,
        }
    }
}

/// The most ranks a plan may have (2^20).
pub const MAX_WORLD_SIZE: u64 = 1 << 20;
/// The most tokens (batch × seq) one micro-batch of one rank may have (2^32).
pub const MAX_TOKENS: u64 = 1 << 32;
/// The most tokens per sequence (2^20: attention's scores grow with its square).
pub const MAX_SEQ: u64 = 1 << 20;
/// The most micro-batches per step (1024: the schedule holds every micro-batch's ops).
pub const MAX_GRAD_ACCUM: u32 = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Options {
    pub world_size: u64,
    pub policy: Policy,
    pub layout: Layout,
    pub strategy: Strategy,
    /// Non-root units; `None` = the strategy's default (true for full-shard).
    pub reshard_after_forward: Option<bool>,
    /// The root unit; `None` = FSDP2's default (false: the root keeps its params).
    pub root_reshard_after_forward: Option<bool>,
    /// Per-unit `reshard_after_forward`, over the default above: `(unit, value)` with the
    /// unit's module path (or a pattern of paths, `model.layers.{24..31}`: every unit it
    /// matches), `root`, or `last` for the last non-root unit in forward order (torchtitan
    /// leaves its last block unsharded: FSDP2 would prefetch it right away).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unit_reshard: Vec<(String, bool)>,
    /// Per-unit `reshard_after_forward=N` (FSDP2's int, on those units only): `(unit, N)`,
    /// units named as in `unit_reshard` (not the root), applied after it and over
    /// `reshard_to`. Each unit its own N (FSDP2 builds a post-forward mesh per int).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unit_reshard_to: Vec<(String, u64)>,
    /// FSDP2's `shard_placement_fn`: the params whose name (or a tied alias) matches a
    /// pattern are sharded on that dim (`Shard(dim)`) instead of dim 0 — torchtitan's MoE
    /// experts on dim 1 where the shard group is larger than the experts stacked on dim 0:
    /// `(pattern, dim)`, the last matching entry winning.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_dims: Vec<(String, u32)>,
    pub param_dtype: Option<DType>,
    pub reduce_dtype: Option<DType>,
    /// The dtype of the sharded (master) parameters — and so of their gradients and the
    /// optimizer state; `None` = the model file's (HF's `torch_dtype`). torchtitan and most
    /// FSDP training keep float32 masters of a bf16 checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_dtype: Option<DType>,
    /// Explicit forward prefetch depth (0 = FSDP2's implicit behaviour / FSDP1 off).
    pub forward_prefetch: u32,
    pub backward_prefetch: BackwardPrefetch,
    pub grad_accum: u32,
    /// Which micro-batches reduce their gradients under accumulation.
    #[serde(default, skip_serializing_if = "GradSync::is_last")]
    pub grad_sync: GradSync,
    /// Module classes (or module paths) run under activation checkpointing.
    pub checkpoint: Vec<String>,
    /// What those regions keep from the forward.
    #[serde(default, skip_serializing_if = "AcMode::is_full")]
    pub ac_mode: AcMode,
    /// Where the blocks' FSDP hooks sit relative to their checkpoints.
    #[serde(default, skip_serializing_if = "AcWrapper::is_hf")]
    pub ac_wrapper: AcWrapper,
    /// The training loop around the model.
    #[serde(default, skip_serializing_if = "TrainLoop::is_hf")]
    pub train_loop: TrainLoop,
    /// FSDP2's offload policy.
    #[serde(default, skip_serializing_if = "Offload::is_none")]
    pub offload: Offload,
    pub optimizer: Optimizer,
    pub batch: u64,
    pub seq: u64,
    /// `None` = the model file's default, else `sdpa`.
    pub attn_implementation: Option<AttnImpl>,
    pub device: Device,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (torchtitan's launch script sets
    /// it): the caching allocator grows one segment per pool instead of caching fixed ones.
    /// Changes reserved memory only ([`crate::reserved`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expandable_segments: bool,
    /// torchtitan's `--compile`: each decoder block under `torch.compile` (inductor fuses
    /// its element-wise ops; GEMMs and SDPA stay cuBLAS's and FlashAttention's). Changes the
    /// predicted time ([`crate::cost`]) and what the blocks save and recompute
    /// ([`crate::activation::compiled`]: inductor's partitioner, float8 linears included but
    /// in a full-AC recompute), and turns HF's KV cache off (torchtitan's model has none).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compile: bool,
    /// Unit groups: `k` consecutive decoder blocks per FSDP unit (FSDP2's
    /// `fully_shard([block_i, …, block_i+k-1])`: one all-gather and one reduce-scatter for
    /// the k, gathered before the first's forward and resharded after the last's); 1 = one
    /// unit per block.
    #[serde(default = "one_u32", skip_serializing_if = "is_one_u32")]
    pub unit_group: u32,
    /// FSDP2's `reshard_after_forward=N` for the non-root units that reshard: after forward
    /// each keeps a 1/N slice of its gathered params and the backward gathers them again
    /// over N consecutive ranks (intra-node for N ≤ a node's GPUs) instead of all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard_to: Option<u64>,
    /// torchao float8 training (torchtitan's `--float8`): the linears [`crate::float8`] picks
    /// become `Float8Linear`s with the recipe's scaling, their GEMMs in float8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float8: Option<Float8>,
}

/// torchao's float8 recipes (`Float8LinearConfig.from_recipe_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Float8Recipe {
    /// One scale per tensor (dynamic), e4m3 input and weight, e5m2 grad; the forward GEMM
    /// with fast accumulation.
    #[default]
    Tensorwise,
    /// One scale per row of the input and the grad and per column of the weight, rounded down
    /// to powers of 2, e4m3 everywhere; the backward's GEMMs as tensorwise kernels with the
    /// scales' outer product applied to their output (torchao: the rowwise kernel is slow
    /// without fast accumulation).
    Rowwise,
}

impl Float8Recipe {
    pub fn parse(s: &str) -> Option<Float8Recipe> {
        match s {
            "tensorwise" => Some(Float8Recipe::Tensorwise),
            "rowwise" => Some(Float8Recipe::Rowwise),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Float8Recipe::Tensorwise => "tensorwise",
            Float8Recipe::Rowwise => "rowwise",
        }
    }
}

/// torchao's `Float8LinearConfig` as torchtitan sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Float8 {
    #[serde(default, skip_serializing_if = "is_tensorwise")]
    pub recipe: Float8Recipe,
    /// `enable_fsdp_float8_all_gather`: the float8 linears' weights are cast to float8 on
    /// their shard (one amax all-reduce each) and all-gathered in float8 (1 byte per element;
    /// a unit mixing them with other params gathers one uint8 buffer of their bytes).
    pub all_gather: bool,
}

fn is_tensorwise(r: &Float8Recipe) -> bool {
    *r == Float8Recipe::Tensorwise
}

fn one_u32() -> u32 {
    1
}

fn is_one_u32(x: &u32) -> bool {
    *x == 1
}

impl Default for Options {
    fn default() -> Self {
        Options {
            world_size: 8,
            policy: Policy::Auto,
            layout: Layout::Fsdp2,
            strategy: Strategy::FullShard,
            reshard_after_forward: None,
            root_reshard_after_forward: None,
            unit_reshard: vec![],
            unit_reshard_to: vec![],
            shard_dims: vec![],
            param_dtype: None,
            reduce_dtype: None,
            master_dtype: None,
            forward_prefetch: 0,
            backward_prefetch: BackwardPrefetch::Implicit,
            grad_accum: 1,
            grad_sync: GradSync::Last,
            checkpoint: vec![],
            ac_mode: AcMode::Full,
            ac_wrapper: AcWrapper::Hf,
            train_loop: TrainLoop::Hf,
            offload: Offload::None,
            optimizer: Optimizer::Adam,
            batch: 1,
            seq: 2048,
            attn_implementation: None,
            device: Device::Cuda,
            expandable_segments: false,
            compile: false,
            unit_group: 1,
            float8: None,
            reshard_to: None,
        }
    }
}

impl Options {
    /// Whether any unit reshards to an int after forward (`reshard_to`, or a per-unit int).
    pub fn reshards_to_int(&self) -> bool {
        self.reshard_to.is_some() || !self.unit_reshard_to.is_empty()
    }

    /// Checks every option alone and against the others (not against a model).
    pub fn check(&self) -> Result<(), PlanError> {
        if self.world_size == 0 {
            return Err(opt_err("--world-size", "must be at least 1"));
        }
        if self.batch == 0 {
            return Err(opt_err("--batch", "must be at least 1"));
        }
        if self.seq == 0 {
            return Err(opt_err("--seq", "must be at least 1"));
        }
        for c in &self.checkpoint {
            checkpoint_spec(c, self.ac_mode).map_err(|e| opt_err("--checkpoint", e))?;
        }
        if self.grad_accum == 0 {
            return Err(opt_err("--grad-accum", "must be at least 1"));
        }
        if self.unit_group == 0 || self.unit_group > 1024 {
            return Err(opt_err("--unit-group", format!("{}: blocks per unit, 1 to 1024", self.unit_group)));
        }
        if let Some((u, _)) = self.unit_reshard_to.iter().find(|(u, _)| u == "root") {
            return Err(opt_err("--unit-reshard", format!("{u}=N: the root's reshard_after_forward is true or false")));
        }
        // (every post-forward group size named, each checked: they may differ per unit, FSDP2
        // building each unit's post-forward mesh from its own int)
        let ints = self.reshard_to.map(|n| ("--reshard-after-forward", n.to_string(), n)).into_iter().chain(self.unit_reshard_to.iter().map(|(u, n)| ("--unit-reshard", format!("{u}={n}"), *n)));
        for (flag, what, n) in ints {
            let s = self.shard_size();
            if !matches!(self.strategy, Strategy::FullShard) || self.layout == Layout::Flat || n < 2 || n >= s || !s.is_multiple_of(n) {
                return Err(opt_err(flag, format!("{what}: an int reshards to groups of that many ranks: FSDP2 full-shard only, a divisor of the world size ({s}) other than 1 and itself")));
            }
        }
        if self.float8.is_some_and(|f| f.all_gather) && self.ac_wrapper == AcWrapper::Hf && self.checkpoints().iter().any(|(_, m)| *m == AcMode::SelectiveOp) {
            return Err(opt_err("--float8-all-gather", "not under op-level selective AC with HF's checkpointing (--ac-wrapper hf): FSDP's pre-forward hook runs inside each checkpoint, and SAC's cache takes in torchao's casts of the weight shards too, which the plan does not model; use --ac-wrapper torchtitan (torchtitan's checkpoint_wrapper before fully_shard), full AC, or weights gathered as they are"));
        }
        if self.float8.is_some_and(|f| f.all_gather && f.recipe != Float8Recipe::Tensorwise) {
            return Err(opt_err("--float8-all-gather", "torchao all-gathers float8 weights under tensorwise scaling only (its rowwise recipe gathers them in the param dtype)"));
        }
        if self.float8.is_some_and(|f| f.all_gather) && self.reshards_to_int() {
            return Err(opt_err("--float8-all-gather", "not with --reshard-after-forward N (the post-forward shards of float8 weights are not modelled)"));
        }
        if self.float8.is_some_and(|f| f.all_gather) && self.layout == Layout::Flat {
            return Err(opt_err("--float8-all-gather", "float8 all-gather is FSDP2's (torchao's fsdp_pre_all_gather extension): not with --layout flat"));
        }
        if self.offload == Offload::Cpu {
            // (what FSDP2-exact truth exists for: harness/fakegpu.py's offload cases)
            let refuse = |why: &str| Err(opt_err("--offload", format!("cpu: {why}")));
            if self.layout == Layout::Flat {
                return refuse("FSDP2's CPUOffloadPolicy (FSDP1's CPUOffload is not modelled): not with --layout flat");
            }
            if !matches!(self.strategy, Strategy::FullShard | Strategy::HybridShard { .. }) {
                return refuse("full-shard or hybrid-shard only (shard-grad-op and no-shard with offload are not modelled)");
            }
        }
        if let Some((pat, d)) = self.shard_dims.first() {
            // (what FSDP2-exact truth exists for: the harness's shard_dim cases)
            let refuse = |why: &str| Err(opt_err("--shard-dim", format!("{pat}={d}: {why}")));
            if self.layout == Layout::Flat {
                return refuse("FSDP2's shard_placement_fn: not with --layout flat (FSDP1 flattens each unit's params into one)");
            }
            if self.float8.is_some() || self.reshards_to_int() {
                return refuse("not with --float8 or --reshard-after-forward N yet (not modelled)");
            }
        }
        if let Some((pat, d)) = self.shard_dims.iter().find(|(p, _)| p.is_empty()) {
            return Err(opt_err("--shard-dim", format!("{pat}={d}: expected PARAM_PATTERN=DIM")));
        }
        if self.unit_group > 1 && self.layout == Layout::Flat {
            return Err(opt_err("--unit-group", "unit groups are FSDP2's (`fully_shard([m0, m1])`): not with --layout flat"));
        }
        if let (Layout::Flat, Policy::Modules(m)) = (self.layout, &self.policy) {
            if let Some(e) = m.iter().find(|e| e.contains('+')) {
                return Err(opt_err("--policy", format!("`{e}`: a unit of several modules (`a+b`) is FSDP2's `fully_shard([a, b])`: not with --layout flat")));
            }
        }
        // bounds far past any real job, so that byte counts (tokens × widths × layers) stay
        // well inside u64
        if self.world_size > MAX_WORLD_SIZE {
            return Err(opt_err("--world-size", format!("{} is more than {MAX_WORLD_SIZE} ranks", self.world_size)));
        }
        if self.seq > MAX_SEQ {
            return Err(opt_err("--seq", format!("{} is more than {MAX_SEQ} tokens", self.seq)));
        }
        if self.batch.checked_mul(self.seq).is_none_or(|t| t > MAX_TOKENS) {
            return Err(opt_err("--batch", format!("batch {} × seq {} is more than {MAX_TOKENS} tokens per micro-batch", self.batch, self.seq)));
        }
        if self.grad_sync == GradSync::Each {
            // (what FSDP1's flat gradient and NO_SHARD's all-reduce do on each micro-batch is
            // not modelled; offloaded, FSDP2-exact: harness/fakegpu.py's sync_each cases)
            let why = if self.layout == Layout::Flat {
                Some("FSDP1's (--layout flat) per-micro-batch reduction is not modelled: FSDP2 only")
            } else if matches!(self.strategy, Strategy::NoShard) {
                Some("not modelled under no-shard")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(opt_err("--grad-sync", format!("each: {why}")));
            }
        }
        if self.grad_accum > MAX_GRAD_ACCUM {
            return Err(opt_err("--grad-accum", format!("{} is more than {MAX_GRAD_ACCUM} micro-batches", self.grad_accum)));
        }
        if let Strategy::HybridShard { shard_size } = self.strategy {
            if shard_size == 0 || !self.world_size.is_multiple_of(shard_size) {
                return Err(opt_err(
                    "--shard-group-size",
                    format!("{shard_size} must divide the world size {}", self.world_size),
                ));
            }
        }
        // FSDP1's SHARD_GRAD_OP and NO_SHARD never free the params after forward: asking for
        // it is a contradiction, not a variant
        if let Some((u, _)) = self.unit_reshard.iter().find(|(_, r)| *r && matches!(self.strategy, Strategy::ShardGradOp | Strategy::NoShard)) {
            return Err(opt_err("--unit-reshard", format!("{u}=true contradicts --strategy {} (which keeps the params after forward)", self.strategy.name())));
        }
        if let (Strategy::ShardGradOp | Strategy::NoShard, Some(true)) = (self.strategy, self.reshard_after_forward) {
            return Err(opt_err(
                "--reshard-after-forward",
                format!("true contradicts --strategy {} (which keeps the params after forward); use --strategy full-shard", self.strategy.name()),
            ));
        }
        for (flag, d) in [("--param-dtype", self.param_dtype), ("--reduce-dtype", self.reduce_dtype), ("--master-dtype", self.master_dtype)] {
            if let Some(d) = d {
                if !d.is_float() {
                    return Err(opt_err(flag, format!("{d} is not a floating-point dtype")));
                }
            }
        }
        match (self.layout, self.backward_prefetch) {
            (Layout::Fsdp2, BackwardPrefetch::Pre | BackwardPrefetch::Post) => Err(opt_err(
                "--backward-prefetch",
                "pre/post are FSDP1 (--layout flat) settings; FSDP2 takes implicit, none or a depth",
            )),
            (Layout::Flat, BackwardPrefetch::Depth(_)) => Err(opt_err(
                "--backward-prefetch",
                "an explicit depth is an FSDP2 setting; FSDP1 (--layout flat) takes pre, post or none",
            )),
            _ => Ok(()),
        }
    }

    /// Size of the group a parameter is sharded over.
    pub fn shard_size(&self) -> u64 {
        match self.strategy {
            Strategy::HybridShard { shard_size } => shard_size,
            Strategy::NoShard => 1,
            _ => self.world_size,
        }
    }

    /// Size of the replicate group (gradients all-reduced across it).
    pub fn replicate_size(&self) -> u64 {
        self.world_size / self.shard_size().max(1)
    }
}

pub fn parse_dtype(flag: &str, s: &str) -> Result<DType, PlanError> {
    DType::parse(s).filter(|d| d.is_float()).ok_or_else(|| {
        opt_err(
            flag,
            format!("unknown dtype `{s}` (use bfloat16/bf16, float32/f32/fp32, float16/f16/fp16)"),
        )
    })
}
