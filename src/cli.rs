//! The command line's shape: the subcommands, the option groups several commands share
//! (`PlanOpts`, `Knobs`, `HwOpt`) and their conversion to the planner's [`Options`], and
//! refusing planning options beside a compiled plan.

use crate::io::{is_plan_file, UserError};
use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use fsdp_ir::{DType, Model};
use fsdp_planner::{parse_dtype, AttnImpl, BackwardPrefetch, Device, Layout, Optimizer, Options, PlanError, Policy, Strategy};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "fsdp-plan", version, about = "Compiler-style planner for FSDP / ZeRO-3 training")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Print the schedule, units, communication, predicted peak memory and step time (the default).
    Plan {
        #[command(flatten)]
        p: PlanArgs,
        #[command(flatten)]
        hw: HwOpt,
    },
    /// Write the compiled plan with a format version and model/options hashes: RON, or JSON
    /// with `--format json` (every command that reads a plan reads either).
    Compile {
        #[command(flatten)]
        p: PlanArgs,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare two plans: `diff MODEL --policy A --policy B`, or `diff PLAN1 PLAN2`.
    Diff(crate::diff::DiffArgs),
    /// Write the predicted step as a Chrome/Perfetto trace (JSON): `trace PLAN|MODEL -o trace.json`.
    Trace(crate::trace::ViewArgs),
    /// Plot memory over the predicted step by category (SVG): `plot PLAN|MODEL -o memory.svg`.
    Plot(crate::trace::ViewArgs),
    /// Plan a model over world sizes and policies: fits?, peak, step time, tokens/s/GPU.
    Sweep(crate::sweep::SweepArgs),
    /// Train on CPU rank threads: `run MODEL [plan options]` or `run PLAN.ron --model MODEL`.
    Run(Box<crate::run::RunArgs>),
    /// Start N local ranks like torchrun: `launch --nproc-per-node N MODEL|PLAN [run options]`
    /// runs `fsdp-plan run …` N times with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    /// MASTER_ADDR=127.0.0.1 and MASTER_PORT set, output prefixed `[rank k]`.
    Launch(crate::launch::LaunchArgs),
    /// Rendezvous with the launcher's variables (torchrun, SLURM, Open MPI), check that every
    /// rank got the same id, barrier and exit (a check for `launch`).
    #[command(hide = true)]
    RendezvousSelftest(crate::launch::SelftestArgs),
    /// The fastest configuration that fits: `tune MODEL --world-size N --global-batch B --seq S
    /// --hardware H [--memory-limit 75GiB]` searches shard groups, micro-batch × accumulation,
    /// prefetch, reshard and per-block checkpointing, and prints the `plan` command to run.
    Tune(crate::tune::TuneArgs),
    /// The largest micro-batch (or `--seq-len`: sequence) that fits a configuration, with the
    /// global batches gradient accumulation makes of it.
    Fit(crate::tune::FitArgs),
    /// The shipped models (models/*.ron): architecture, parameters and one configuration's
    /// peak per GPU.
    Models(crate::models::ModelsArgs),
    /// Plan every row of a published-measurements file (bench/data/published-rows.json's
    /// schema) and print measured against predicted tokens/s/GPU and memory, with the error.
    Rows(crate::rows::RowsArgs),
    /// Fit a hardware profile to a measured timeline (`run --trace`) of the same plan.
    Calibrate {
        #[command(flatten)]
        p: PlanArgs,
        /// The measured trace (Chrome JSON from `fsdp-plan run --trace`).
        #[arg(long)]
        trace: PathBuf,
        /// Profile to start from.
        #[arg(long, default_value = "cpu")]
        hardware: String,
        /// Where to write the fitted profile (RON).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Write a full HF-named safetensors file from a sharded checkpoint directory.
    Consolidate {
        /// A checkpoint directory (its `latest`) or one `step-N` directory.
        dir: PathBuf,
        /// One safetensors file of HF-named parameters.
        #[arg(short, long, required_unless_present = "hf", conflicts_with = "hf")]
        output: Option<PathBuf>,
        /// A directory transformers loads (`AutoModelForCausalLM.from_pretrained(DIR)`):
        /// config.json, model.safetensors, generation_config.json.
        #[arg(long)]
        hf: Option<PathBuf>,
        /// The model's HF config.json (default: models/<model>.config.json).
        #[arg(long, requires = "hf")]
        config: Option<PathBuf>,
    },
    /// Import a model from a Hugging Face config.json.
    Import {
        #[command(subcommand)]
        from: crate::import::ImportCmd,
    },
}

#[derive(Args, Clone)]
pub(crate) struct PlanOpts {
    #[arg(long, default_value_t = 8)]
    pub(crate) world_size: u64,
    /// transformer:<Class>[,…] | size:<min_num_params> | modules:<path>[,…] | none | auto;
    /// a `modules:` path may be a pattern: `*` within a component, `{a..b}` numbers
    /// (`modules:model.layers.*.mlp.experts,model.layers.*`: MoE experts as their own units);
    /// `a+b`: one unit of several modules, FSDP2's `fully_shard([a, b])` (torchtitan's
    /// `modules:model.embed_tokens,model.layers.*,model.norm+lm_head`)
    #[arg(long, default_value = "auto")]
    pub(crate) policy: String,
    #[command(flatten)]
    pub(crate) k: Knobs,
}

/// The options besides the world size and the policy.
#[derive(Args, Clone)]
pub(crate) struct Knobs {
    #[command(flatten)]
    pub(crate) fixed: Fixed,
    #[command(flatten)]
    pub(crate) each: Each,
}

/// The options `sweep` takes one value of.
#[derive(Args, Clone)]
pub(crate) struct Fixed {
    #[arg(long, default_value = "fsdp2", value_parser = ["fsdp2", "flat"])]
    pub(crate) layout: String,
    #[arg(long, default_value = "full-shard", value_parser = ["full-shard", "shard-grad-op", "no-shard", "hybrid-shard"])]
    pub(crate) strategy: String,
    /// Shard group size for hybrid-shard (default: 8, one node).
    #[arg(long)]
    pub(crate) shard_group_size: Option<u64>,
    /// The root unit's `reshard_after_forward` (default: false, FSDP2's).
    #[arg(long)]
    pub(crate) root_reshard_after_forward: Option<bool>,
    /// One unit's `reshard_after_forward`: UNIT=true|false|N, UNIT a module path (or a
    /// pattern of them: `model.layers.{24..31}`, `*` within a component — every unit it
    /// matches), `root` or `last` (the last unit in forward order: torchtitan's
    /// `--unit-reshard last=false`). N (FSDP2's int: a 1/N slice kept after forward, gathered
    /// back over N consecutive ranks in backward) on non-root units, each unit its own N
    /// (FSDP2 builds a post-forward mesh per int), applied over the true/false ones.
    /// Repeatable.
    #[arg(long, value_name = "UNIT=BOOL|N")]
    pub(crate) unit_reshard: Vec<String>,
    /// FSDP2's `shard_placement_fn`: the params matching PARAM_PATTERN (`*` a component,
    /// `{a..b}` a range: `model.layers.*.mlp.experts.*`) sharded on DIM (`Shard(DIM)`) instead
    /// of dim 0 — torchtitan shards MoE experts on dim 1 where the shard group outnumbers the
    /// experts. Dims other than 0 must divide evenly by the shard group. Repeatable; the last
    /// matching entry wins.
    #[arg(long, value_name = "PARAM_PATTERN=DIM")]
    pub(crate) shard_dim: Vec<String>,
    /// Explicit forward prefetch depth (0: FSDP2's implicit behaviour; flat: 1 = forward_prefetch=True).
    #[arg(long, default_value_t = 0)]
    pub(crate) forward_prefetch: u32,
    /// implicit | none | <depth> (fsdp2); pre | post | none (flat). Default: implicit / pre.
    #[arg(long)]
    pub(crate) backward_prefetch: Option<String>,
    /// torch.optim's AdamW (weight decay 0.01; torchtitan's and accelerate's choice), Adam,
    /// SGD (no momentum: no state) or none.
    #[arg(long, default_value = "adamw", value_parser = ["adamw", "adam", "sgd", "none"])]
    pub(crate) optimizer: String,
    /// sdpa | eager | flash_attention_2 (default: the model file's, else sdpa)
    #[arg(long)]
    pub(crate) attn_implementation: Option<String>,
    /// cuda | cpu: kernel choices and allocator rounding.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
    pub(crate) device: String,
    /// The caching allocator runs with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
    /// (torchtitan's launch script): changes the predicted reserved memory only.
    #[arg(long)]
    pub(crate) expandable_segments: bool,
    /// Where the blocks' FSDP hooks sit relative to their checkpoints: `hf` (HF's
    /// gradient_checkpointing_enable: hooks inside, run again in the recompute) or `torchtitan`
    /// (checkpoint_wrapper before fully_shard: hooks outside). FSDPMemTracker's category of the
    /// recompute's tensors; with --float8-all-gather, op-level SAC needs `torchtitan`.
    #[arg(long, default_value = "hf", value_parser = ["hf", "torchtitan"])]
    pub(crate) ac_wrapper: String,
    /// The training loop around the model: `hf` (`loss = model(ids, labels=labels).loss`) or
    /// `torchtitan-2024` (torchtitan before it freed the logits, e.g. the PR #165 runs: float32
    /// logits out of the model kept by the loop until the next step's forward).
    #[arg(long, default_value = "hf", value_parser = ["hf", "torchtitan-2024"])]
    pub(crate) train_loop: String,
    /// Which micro-batches of --grad-accum reduce their gradients: `last` (FSDP2's
    /// `set_requires_gradient_sync(False)` on the others, accelerate's `no_sync`: one
    /// reduce-scatter per step, the unsharded gradients kept between micro-batches) or `each`
    /// (torchtitan's loop: every backward reduce-scatters and adds into the sharded gradients;
    /// more collectives, no unsharded gradient kept). FSDP2 layout, offloaded too
    #[arg(long, default_value = "last", value_parser = ["last", "each"])]
    pub(crate) grad_sync: String,
    /// FSDP2's offload policy: `cpu` is `CPUOffloadPolicy()` on every unit (sharded params,
    /// grads and the optimizer on the host; each all-gather copies the shards to the device,
    /// each reduce-scatter's output goes back), `none` keeps them on the device.
    #[arg(long, default_value = "none", value_parser = ["none", "cpu"])]
    pub(crate) offload: String,
    /// Unit groups: K consecutive decoder blocks per FSDP unit (FSDP2's
    /// `fully_shard([block_i, …, block_i+K-1])`: one all-gather and one reduce-scatter for the
    /// K; fewer, larger collectives for more memory).
    #[arg(long, default_value_t = 1)]
    pub(crate) unit_group: u32,
    /// torchtitan's --compile: each decoder block under torch.compile (inductor fuses the
    /// element-wise ops: norms, rotary, SwiGLU). Changes the predicted time and what the blocks
    /// save (inductor's partitioner, float8 linears included); no HF KV cache
    /// (torchtitan's model has none).
    #[arg(long)]
    pub(crate) compile: bool,
    #[command(flatten)]
    pub(crate) float8: Float8Opt,
}

/// torchao float8 training (shared by `plan`, `sweep` and `tune`).
#[derive(Args, Clone, Default)]
pub(crate) struct Float8Opt {
    /// torchao float8 training (torchtitan's --float8): every nn.Linear but the LM head whose
    /// dims are multiples of 16 a Float8Linear with this recipe's scaling (tensorwise: one
    /// scale per tensor; rowwise: per row / column, powers of 2); its GEMMs in float8
    /// (H100/H200)
    #[arg(long, value_parser = ["tensorwise", "rowwise"])]
    pub(crate) float8: Option<String>,
    /// torchao's enable_fsdp_float8_all_gather: the float8 linears' weights all-gathered in
    /// float8 (half the bytes of bf16); needs --float8 tensorwise
    #[arg(long, requires = "float8")]
    pub(crate) float8_all_gather: bool,
}

impl Float8Opt {
    /// The plan option.
    pub(crate) fn get(&self) -> Option<fsdp_planner::options::Float8> {
        let recipe = fsdp_planner::options::Float8Recipe::parse(self.float8.as_deref()?)?;
        Some(fsdp_planner::options::Float8 { recipe, all_gather: self.float8_all_gather })
    }
    /// The `plan` flags that say the same.
    pub(crate) fn flags(&self) -> Vec<String> {
        let mut v = vec![];
        if let Some(r) = &self.float8 {
            v.extend(["--float8".to_string(), r.clone()]);
            if self.float8_all_gather {
                v.push("--float8-all-gather".into());
            }
        }
        v
    }
}

/// The dtypes of FSDP2's `MixedPrecisionPolicy` and of the sharded params (shared by `plan`,
/// `sweep` and `tune`).
#[derive(Args, Clone, Default)]
pub(crate) struct Precision {
    /// MixedPrecisionPolicy.param_dtype: the dtype params are all-gathered and computed in
    /// (bf16, f32, f16; default: the master dtype, no mixed precision).
    #[arg(long)]
    pub(crate) param_dtype: Option<String>,
    /// MixedPrecisionPolicy.reduce_dtype: the dtype gradients are reduce-scattered in
    /// (default: the param dtype).
    #[arg(long)]
    pub(crate) reduce_dtype: Option<String>,
    /// The dtype of the sharded (master) params, their grads and the optimizer state
    /// (default: the model file's, HF's torch_dtype; torchtitan keeps float32 masters).
    #[arg(long)]
    pub(crate) master_dtype: Option<String>,
}

/// The dtypes of [`Precision`] parsed: (param, reduce, master); `None` is the default.
pub(crate) type Dtypes = (Option<DType>, Option<DType>, Option<DType>);

impl Precision {
    /// (param, reduce, master) parsed; a bad name is an error naming its flag.
    pub(crate) fn parse(&self) -> Result<Dtypes, PlanError> {
        let one = |flag: &str, v: &Option<String>| v.as_deref().map(|s| parse_dtype(flag, s)).transpose();
        Ok((one("--param-dtype", &self.param_dtype)?, one("--reduce-dtype", &self.reduce_dtype)?, one("--master-dtype", &self.master_dtype)?))
    }

    /// The flags that give these dtypes, for a printed command.
    pub(crate) fn flags(&self) -> Vec<String> {
        [("--param-dtype", &self.param_dtype), ("--reduce-dtype", &self.reduce_dtype), ("--master-dtype", &self.master_dtype)]
            .into_iter()
            .filter_map(|(f, v)| v.as_ref().map(|v| [f.to_string(), v.clone()]))
            .flatten()
            .collect()
    }
}

/// FSDP2's `reshard_after_forward`: a bool, or an int N (reshard to groups of N ranks).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub(crate) enum Raf {
    Bool(bool),
    To(u64),
}

impl std::fmt::Display for Raf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Raf::Bool(b) => write!(f, "{b}"),
            Raf::To(n) => write!(f, "{n}"),
        }
    }
}

fn parse_raf(s: &str) -> Result<Raf, String> {
    match s {
        "true" => Ok(Raf::Bool(true)),
        "false" => Ok(Raf::Bool(false)),
        n => n.parse().map(Raf::To).map_err(|_| format!("`{s}`: expected true, false or a number of ranks (FSDP2's reshard_after_forward=int)")),
    }
}

/// The options `sweep` takes lists of (`--batch 1,2,4`).
#[derive(Args, Clone, Default)]
pub(crate) struct Each {
    /// FSDP2's `reshard_after_forward` of the non-root units: true, false, or N — reshard to
    /// groups of N consecutive ranks (keep a 1/N slice after forward, gather it back over
    /// those N in backward; e.g. a node's 8 GPUs). Default: true for full-shard and
    /// hybrid-shard, false for shard-grad-op and no-shard.
    #[arg(long, value_parser = parse_raf)]
    pub(crate) reshard_after_forward: Option<Raf>,
    #[command(flatten)]
    pub(crate) precision: Precision,
    /// Micro-batches per optimizer step (gradient accumulation; the gradient sync runs in the
    /// last, or in each with --grad-sync each).
    #[arg(long, default_value_t = 1)]
    pub(crate) grad_accum: u32,
    /// Activation checkpointing of a module class (every instance) or of one module by its
    /// path (`model.layers.3`; a range `model.layers.{0..7}`: any subset of the blocks), with
    /// its own mode after `=` (`model.layers.{8..23}=selective-op`; default: --ac-mode).
    /// Repeatable.
    #[arg(long)]
    pub(crate) checkpoint: Vec<String>,
    /// What checkpointed regions keep: `full` (only their inputs) or `selective-op`
    /// (torchtitan's op-level SAC: every other matmul's output and SDPA's).
    #[arg(long, default_value = "full", value_parser = ["full", "selective-op"])]
    pub(crate) ac_mode: String,
    /// Sequences per micro-batch on each rank (torchtitan's local batch size).
    #[arg(long, default_value_t = 1)]
    pub(crate) batch: u64,
    /// Tokens per sequence (default: 2048, or the model's learned positions if fewer: GPT-2's 1024).
    #[arg(long)]
    pub(crate) seq: Option<u64>,
}

#[derive(Args)]
pub(crate) struct PlanArgs {
    /// Model file (.ron, or an HF config.json imported on the fly).
    pub(crate) model: PathBuf,
    #[command(flatten)]
    pub(crate) o: PlanOpts,
    #[arg(long, default_value = "text", value_parser = ["text", "json", "ron"])]
    pub(crate) format: String,
    /// Print every compute op instead of folding them per unit.
    #[arg(long)]
    pub(crate) full_schedule: bool,
    /// One screen: the options, units by class, communication, the peak, whether it fits and
    /// the step time (no schedule).
    #[arg(long, conflicts_with = "full_schedule")]
    pub(crate) summary: bool,
    /// Memory per GPU the plan must fit in (default: the hardware profile's), e.g. 80GiB, 80G,
    /// 75GB, 8e10.
    #[arg(long)]
    pub(crate) memory_limit: Option<String>,
    /// Judge the fit by the tensor peak plus this reserve (e.g. 4GiB, 0) instead of the
    /// caching allocator model's reserved memory plus the CUDA context and NCCL buffers
    /// (`tune --reserve`).
    #[arg(long)]
    pub(crate) reserve: Option<String>,
    /// List every buffer live at the peak (largest first): what binds memory.
    #[arg(long)]
    pub(crate) peak_buffers: bool,
}

#[derive(Args)]
pub(crate) struct HwOpt {
    /// Hardware profile for the time prediction: NAME (models/hardware/NAME.ron; a unique
    /// prefix such as `h100` will do) or a .ron FILE.
    #[arg(long, default_value = "h100-sxm")]
    pub(crate) hardware: String,
    /// The node's host memory that `--offload cpu` keeps every rank's shards, grads and
    /// optimizer state in (80GiB, 1TiB, 2e12; default: the profile's, 2 TiB for an H100 node).
    #[arg(long, value_name = "SIZE")]
    pub(crate) host_memory: Option<String>,
}

impl HwOpt {
    /// The profile, with `--host-memory` in place of its node's host memory.
    pub(crate) fn load(&self) -> anyhow::Result<fsdp_planner::hardware::Hardware> {
        let mut hw = crate::io::load_hardware(&self.hardware)?;
        if let Some(s) = &self.host_memory {
            let bytes = crate::io::parse_size("--host-memory", s)?;
            match hw.host.as_mut() {
                Some(h) => h.memory_bytes = Some(bytes),
                None => anyhow::bail!(crate::io::UserError(format!("--host-memory: the profile `{}` has no host behind a device to offload to", hw.name))),
            }
        }
        Ok(hw)
    }
}

pub(crate) fn options(o: &PlanOpts, policy: &str, model: &Model) -> Result<Options, PlanError> {
    options_for(&o.k, o.world_size, policy, model)
}

/// `--seq`'s default: 2048, or the model's learned positions if fewer (GPT-2's 1024).
pub(crate) fn default_seq(model: &Model) -> u64 {
    let positions = model.ops.iter().filter(|o| matches!(o.kind, fsdp_ir::OpKind::PositionEmbedding)).filter_map(|o| o.params.first()).filter_map(|n| model.params.iter().find(|p| &p.name == n)).filter_map(|p| p.shape.first().copied()).min();
    positions.map_or(2048, |n| n.min(2048))
}

pub(crate) fn options_for(k: &Knobs, world_size: u64, policy: &str, model: &Model) -> Result<Options, PlanError> {
    let (o, e) = (&k.fixed, &k.each);
    let layout = if o.layout == "flat" { Layout::Flat } else { Layout::Fsdp2 };
    let strategy = match o.strategy.as_str() {
        "shard-grad-op" => Strategy::ShardGradOp,
        "no-shard" => Strategy::NoShard,
        "hybrid-shard" => Strategy::HybridShard {
            shard_size: o.shard_group_size.unwrap_or(8.min(world_size)),
        },
        _ => Strategy::FullShard,
    };
    let (param_dtype, reduce_dtype, master_dtype) = e.precision.parse()?;
    let backward_prefetch = match o.backward_prefetch.as_deref() {
        None => match layout {
            Layout::Fsdp2 => BackwardPrefetch::Implicit,
            Layout::Flat => BackwardPrefetch::Pre,
        },
        Some("implicit") => BackwardPrefetch::Implicit,
        Some("none") => BackwardPrefetch::None,
        Some("pre") => BackwardPrefetch::Pre,
        Some("post") => BackwardPrefetch::Post,
        Some(x) => BackwardPrefetch::Depth(x.parse().map_err(|_| {
            fsdp_planner::error::opt_err("--backward-prefetch", format!("`{x}`: expected implicit, none, pre, post or a depth"))
        })?),
    };
    let attn = match &o.attn_implementation {
        None => None,
        Some(s) => Some(AttnImpl::parse(s).ok_or_else(|| {
            fsdp_planner::error::opt_err("--attn-implementation", format!("`{s}`: expected sdpa, eager or flash_attention_2"))
        })?),
    };
    let unit_reshards: Vec<(String, Raf)> = o
        .unit_reshard
        .iter()
        .map(|s| match s.rsplit_once('=').map(|(u, v)| (u.trim(), parse_raf(v.trim()))) {
            Some((u, Ok(v))) if !u.is_empty() => Ok((u.to_string(), v)),
            _ => Err(fsdp_planner::error::opt_err("--unit-reshard", format!("`{s}`: expected UNIT=true, UNIT=false or UNIT=N (UNIT a module path or pattern, root or last)"))),
        })
        .collect::<Result<_, _>>()?;
    let shard_dims: Vec<(String, u32)> = o
        .shard_dim
        .iter()
        .map(|s| match s.rsplit_once('=').map(|(p, d)| (p.trim(), d.trim().parse::<u32>())) {
            Some((p, Ok(d))) if !p.is_empty() => Ok((p.to_string(), d)),
            _ => Err(fsdp_planner::error::opt_err("--shard-dim", format!("`{s}`: expected PARAM_PATTERN=DIM (e.g. model.layers.*.mlp.experts.*=1)"))),
        })
        .collect::<Result<_, _>>()?;
    let opts = Options {
        world_size,
        policy: Policy::parse(policy)?,
        layout,
        strategy,
        reshard_after_forward: e.reshard_after_forward.map(|r| r != Raf::Bool(false)),
        reshard_to: match e.reshard_after_forward {
            Some(Raf::To(n)) => Some(n),
            _ => None,
        },
        root_reshard_after_forward: o.root_reshard_after_forward,
        unit_reshard: unit_reshards.iter().filter_map(|(u, v)| match v {
            Raf::Bool(b) => Some((u.clone(), *b)),
            Raf::To(_) => None,
        }).collect(),
        unit_reshard_to: unit_reshards.iter().filter_map(|(u, v)| match v {
            Raf::To(n) => Some((u.clone(), *n)),
            Raf::Bool(_) => None,
        }).collect(),
        shard_dims,
        param_dtype,
        reduce_dtype,
        master_dtype,
        forward_prefetch: o.forward_prefetch,
        backward_prefetch,
        grad_accum: e.grad_accum,
        grad_sync: fsdp_planner::GradSync::parse(&o.grad_sync).unwrap_or_default(),
        checkpoint: e.checkpoint.clone(),
        ac_mode: fsdp_planner::AcMode::parse(&e.ac_mode).unwrap_or_default(),
        ac_wrapper: fsdp_planner::AcWrapper::parse(&o.ac_wrapper).unwrap_or_default(),
        train_loop: fsdp_planner::TrainLoop::parse(&o.train_loop).unwrap_or_default(),
        offload: fsdp_planner::Offload::parse(&o.offload).unwrap_or_default(),
        optimizer: match o.optimizer.as_str() {
            "adamw" => Optimizer::AdamW,
            "sgd" => Optimizer::Sgd,
            "none" => Optimizer::None,
            "adam" => Optimizer::Adam,
            _ => Optimizer::AdamW,
        },
        batch: e.batch,
        seq: e.seq.unwrap_or_else(|| default_seq(model)),
        attn_implementation: attn,
        device: Device::parse(&o.device).unwrap_or(Device::Cuda),
        expandable_segments: o.expandable_segments,
        compile: o.compile,
        unit_group: o.unit_group,
        float8: o.float8.get(),
    };
    opts.check()?;
    Ok(opts)
}

/// Parses a command line into the commands and their matches (which say where each value came
/// from: [`refuse_plan_options`] needs to know what the user typed).
pub(crate) fn parse_cli<I: IntoIterator<Item = T>, T: Into<std::ffi::OsString> + Clone>(args: I) -> Result<(Cli, clap::ArgMatches), clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let m = Cli::command().try_get_matches_from(args)?;
    Ok((Cli::from_arg_matches(&m)?, m))
}

/// A compiled plan carries its own options: `--world-size`, `--policy` or another planning
/// option typed beside one would be silently ignored, so it is refused, naming them.
pub(crate) fn refuse_plan_options(cli: &Cli, m: &clap::ArgMatches) -> Result<()> {
    use clap::parser::ValueSource;
    let plan = match &cli.cmd {
        Cmd::Run(r) if r.model.is_some() || is_plan_file(&r.file) => &r.file,
        Cmd::Trace(v) | Cmd::Plot(v) if is_plan_file(&v.input) => &v.input,
        Cmd::Diff(d) if d.files.len() == 2 => match d.files.iter().find(|f| is_plan_file(f)) {
            Some(plan) => plan,
            None => return Ok(()),
        },
        _ => return Ok(()),
    };
    let Some((name, sub)) = m.subcommand() else { return Ok(()) };
    let opts = <PlanOpts as Args>::augment_args(clap::Command::new("plan options"));
    let given: Vec<String> = opts
        .get_arguments()
        .filter(|a| {
            // (diff's --policy is its list `policies`)
            let id = match a.get_id().as_str() {
                // (release builds do not validate ids: ask by the subcommand's name)
                "policy" if name == "diff" => "policies",
                id => id,
            };
            sub.try_contains_id(id).is_ok() && sub.value_source(id) == Some(ValueSource::CommandLine)
        })
        .map(|a| format!("--{}", a.get_long().unwrap_or(a.get_id().as_str())))
        .collect();
    if !given.is_empty() {
        bail!(UserError(format!(
            "{}: a compiled plan carries its own options, so {} would be ignored: recompile it with them (`fsdp-plan compile MODEL {} -o PLAN`), or give the model instead of the plan",
            plan.display(),
            given.join(", "),
            given.iter().map(|g| format!("{g} …")).collect::<Vec<_>>().join(" ")
        )));
    }
    Ok(())
}

pub(crate) const SUBCOMMANDS: &[&str] = &["plan", "compile", "diff", "trace", "plot", "sweep", "run", "launch", "rendezvous-selftest", "consolidate", "calibrate", "rows", "tune", "fit", "models", "import", "help", "--help", "-h", "--version", "-V"];
