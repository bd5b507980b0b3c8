//! The `fsdp-plan` command line: plan (default), compile, diff, trace, plot, sweep, import hf.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use fsdp_ir::Model;
use fsdp_planner::{
    parse_dtype, AttnImpl, BackwardPrefetch, Device, Layout, Optimizer, Options, Plan, PlanError, Policy, Strategy,
};
use fsdp_planner::hardware::Hardware;
use fsdp_planner::timeline::{self, TimeReport};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "fsdp-plan", version, about = "Compiler-style planner for FSDP / ZeRO-3 training")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
    Diff(DiffArgs),
    /// Write the predicted step as a Chrome/Perfetto trace (JSON): `trace PLAN|MODEL -o trace.json`.
    Trace(ViewArgs),
    /// Plot memory over the predicted step by category (SVG): `plot PLAN|MODEL -o memory.svg`.
    Plot(ViewArgs),
    /// Plan a model over world sizes and policies: fits?, peak, step time, tokens/s/GPU.
    Sweep(SweepArgs),
    /// Train on CPU rank threads: `run MODEL [plan options]` or `run PLAN.ron --model MODEL`.
    Run(RunArgs),
    /// Start N local ranks like torchrun: `launch --nproc-per-node N MODEL|PLAN [run options]`
    /// runs `fsdp-plan run …` N times with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    /// MASTER_ADDR=127.0.0.1 and MASTER_PORT set, output prefixed `[rank k]`.
    Launch(LaunchArgs),
    /// Rendezvous with the launcher's variables (torchrun, SLURM, Open MPI), check that every
    /// rank got the same id, barrier and exit (a check for `launch`).
    #[command(hide = true)]
    RendezvousSelftest(SelftestArgs),
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
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Import a model from a Hugging Face config.json.
    Import {
        #[command(subcommand)]
        from: ImportCmd,
    },
}

#[derive(Args)]
struct RunArgs {
    /// A model (.ron / config.json, planned with the options below) or a compiled plan.
    file: PathBuf,
    #[command(flatten)]
    o: PlanOpts,
    /// The model a compiled plan was made for (checked against the plan's model hash).
    #[arg(long)]
    model: Option<PathBuf>,
    /// `cpu`: every rank a thread of this process, or under a launcher (WORLD_SIZE > 1) this
    /// process is one rank and collectives go over the rendezvous sockets. `cuda`: this
    /// process is one rank on GPU LOCAL_RANK, NCCL collectives (feature `cuda`); run one per
    /// GPU with `fsdp-plan launch`, torchrun or srun.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    backend: String,
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// Initial weights: an HF-named safetensors file (default: HF-style random init).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// `synthetic` (random tokens) or a file of little-endian u32 token ids.
    #[arg(long, default_value = "synthetic")]
    data: String,
    /// Write sharded checkpoints (safetensors per rank + metadata + plan) into this directory.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Checkpoint every N steps (and always after the last).
    #[arg(long, default_value_t = 0)]
    save_every: usize,
    /// Continue from the latest checkpoint in this directory (same plan; losses continue
    /// bit-identically).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Write the measured timeline of the last step (Chrome/Perfetto JSON, as `trace`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Allocate from the heap instead of the plan's arena. By default each step runs in one
    /// block of the plan's arena size: every allocation that is one of the plan's buffers at
    /// that buffer's offset, kernel temporaries in the space the plan leaves free at their op
    /// (the first step records what each op allocates; the next ones replay it).
    #[arg(long)]
    no_arena: bool,
    /// Seconds a rank waits for a peer (the rendezvous, each collective between processes)
    /// before it ends the run with an error naming the peer.
    #[arg(long, default_value_t = 600.0)]
    timeout_s: f64,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    format: String,
}

#[derive(Args)]
struct LaunchArgs {
    /// Ranks to start on this machine.
    #[arg(long)]
    nproc_per_node: usize,
    /// Rank 0's rendezvous port (0: pick a free one).
    #[arg(long, default_value_t = 29500)]
    master_port: u16,
    /// What each rank runs: `MODEL|PLAN [run options]` (= `run MODEL|PLAN …`), or
    /// `rendezvous-selftest [options]`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "PLAN_OR_MODEL [RUN ARGS]")]
    args: Vec<std::ffi::OsString>,
}

#[derive(Args)]
struct SelftestArgs {
    /// Seconds rank 0 waits for every rank (and the others for rank 0).
    #[arg(long, default_value_t = 30.0)]
    timeout_s: f64,
    /// Also check all-gather / reduce-scatter / all-reduce over this backend (`tcp`: CPU
    /// tensors through rank 0's sockets; `nccl`: one GPU per rank, LOCAL_RANK's; needs the
    /// `cuda` feature).
    #[arg(long, default_value = "none", value_parser = ["none", "tcp", "nccl"])]
    collectives: String,
    /// This rank exits with code 3 after the rendezvous (tests `launch`'s failure handling).
    #[arg(long)]
    fail_rank: Option<usize>,
}

#[derive(Subcommand)]
enum ImportCmd {
    /// `import hf CONFIG.json -o MODEL.ron`
    Hf {
        config: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Model name (default: the file stem).
        #[arg(long)]
        name: Option<String>,
        /// Parameter dtype (default: the config's torch_dtype, as HF's from_config).
        #[arg(long)]
        dtype: Option<String>,
    },
}

#[derive(Args, Clone)]
struct PlanOpts {
    #[arg(long, default_value_t = 8)]
    world_size: u64,
    /// transformer:<Class>[,…] | size:<min_num_params> | modules:<path>[,…] | none | auto
    #[arg(long, default_value = "auto")]
    policy: String,
    #[command(flatten)]
    k: Knobs,
}

/// The options besides the world size and the policy (`sweep` takes lists of those).
#[derive(Args, Clone)]
struct Knobs {
    #[arg(long, default_value = "fsdp2", value_parser = ["fsdp2", "flat"])]
    layout: String,
    #[arg(long, default_value = "full-shard", value_parser = ["full-shard", "shard-grad-op", "no-shard", "hybrid-shard"])]
    strategy: String,
    /// Shard group size for hybrid-shard (default: 8, one node).
    #[arg(long)]
    shard_group_size: Option<u64>,
    #[arg(long)]
    reshard_after_forward: Option<bool>,
    #[arg(long)]
    root_reshard_after_forward: Option<bool>,
    #[arg(long)]
    param_dtype: Option<String>,
    #[arg(long)]
    reduce_dtype: Option<String>,
    /// Explicit forward prefetch depth (0: FSDP2's implicit behaviour; flat: 1 = forward_prefetch=True).
    #[arg(long, default_value_t = 0)]
    forward_prefetch: u32,
    /// implicit | none | <depth> (fsdp2); pre | post | none (flat). Default: implicit / pre.
    #[arg(long)]
    backward_prefetch: Option<String>,
    #[arg(long, default_value_t = 1)]
    grad_accum: u32,
    /// Module class run under activation checkpointing (repeatable).
    #[arg(long)]
    checkpoint: Vec<String>,
    #[arg(long, default_value = "adam", value_parser = ["adam", "adamw", "sgd", "none"])]
    optimizer: String,
    #[arg(long, default_value_t = 1)]
    batch: u64,
    #[arg(long, default_value_t = 2048)]
    seq: u64,
    /// sdpa | eager | flash_attention_2 (default: the model file's, else sdpa)
    #[arg(long)]
    attn_implementation: Option<String>,
    /// cuda | cpu: kernel choices and allocator rounding.
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
    device: String,
}

#[derive(Args)]
struct PlanArgs {
    /// Model file (.ron, or an HF config.json imported on the fly).
    model: PathBuf,
    #[command(flatten)]
    o: PlanOpts,
    #[arg(long, default_value = "text", value_parser = ["text", "json", "ron"])]
    format: String,
    /// Print every compute op instead of folding them per unit.
    #[arg(long)]
    full_schedule: bool,
}

#[derive(Args)]
struct DiffArgs {
    /// A model and two --policy values, or two compiled plans.
    files: Vec<PathBuf>,
    #[command(flatten)]
    o: PlanOpts,
    /// Policies to compare (with a model): give exactly two.
    #[arg(long = "vs-policy")]
    vs_policy: Vec<String>,
    #[command(flatten)]
    hw: HwOpt,
    /// The model of compiled plans, for the time rows (default: models/<model name>.ron).
    #[arg(long)]
    model: Option<PathBuf>,
}

#[derive(Args)]
struct HwOpt {
    /// Hardware profile for the time prediction: NAME (models/hardware/NAME.ron; a unique
    /// prefix such as `h100` will do) or a .ron FILE.
    #[arg(long, default_value = "h100-sxm")]
    hardware: String,
}

#[derive(Args)]
struct ViewArgs {
    /// A compiled plan (`compile -o PLAN.ron`) or a model file (planned with the options).
    input: PathBuf,
    #[command(flatten)]
    o: PlanOpts,
    #[command(flatten)]
    hw: HwOpt,
    /// The model of a compiled plan (default: models/<model name>.ron, checked by hash).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Args)]
struct SweepArgs {
    /// Model file (.ron, or an HF config.json).
    model: PathBuf,
    /// World sizes, comma-separated: 8,64,512.
    #[arg(long = "world-size", value_delimiter = ',', default_value = "8")]
    world_sizes: Vec<u64>,
    /// A wrap policy; repeat the flag or separate policies with `;` (a comma belongs to one
    /// policy: `transformer:A,B` is one policy with two classes). Default: auto.
    #[arg(long = "policy")]
    policies: Vec<String>,
    #[command(flatten)]
    k: Knobs,
    #[command(flatten)]
    hw: HwOpt,
    /// Memory per GPU a plan must fit in (default: the hardware's), e.g. 80GiB, 75GB, 8e10.
    #[arg(long)]
    memory_limit: Option<String>,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    format: String,
}

fn options(o: &PlanOpts, policy: &str) -> Result<Options, PlanError> {
    options_for(&o.k, o.world_size, policy)
}

fn options_for(o: &Knobs, world_size: u64, policy: &str) -> Result<Options, PlanError> {
    let layout = if o.layout == "flat" { Layout::Flat } else { Layout::Fsdp2 };
    let strategy = match o.strategy.as_str() {
        "shard-grad-op" => Strategy::ShardGradOp,
        "no-shard" => Strategy::NoShard,
        "hybrid-shard" => Strategy::HybridShard {
            shard_size: o.shard_group_size.unwrap_or(8.min(world_size)),
        },
        _ => Strategy::FullShard,
    };
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
    let opts = Options {
        world_size,
        policy: Policy::parse(policy)?,
        layout,
        strategy,
        reshard_after_forward: o.reshard_after_forward,
        root_reshard_after_forward: o.root_reshard_after_forward,
        param_dtype: o.param_dtype.as_deref().map(|s| parse_dtype("--param-dtype", s)).transpose()?,
        reduce_dtype: o.reduce_dtype.as_deref().map(|s| parse_dtype("--reduce-dtype", s)).transpose()?,
        forward_prefetch: o.forward_prefetch,
        backward_prefetch,
        grad_accum: o.grad_accum,
        checkpoint: o.checkpoint.clone(),
        optimizer: match o.optimizer.as_str() {
            "adamw" => Optimizer::AdamW,
            "sgd" => Optimizer::Sgd,
            "none" => Optimizer::None,
            _ => Optimizer::Adam,
        },
        batch: o.batch,
        seq: o.seq,
        attn_implementation: attn,
        device: Device::parse(&o.device).unwrap_or(Device::Cuda),
    };
    opts.check()?;
    Ok(opts)
}

/// A user error: reported with exit code 2.
#[derive(Debug)]
struct UserError(String);
impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UserError {}

fn user<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!(UserError(e.to_string()))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| user(format!("{}: {e}", path.display())))
}

fn load_model(path: &Path) -> Result<Model> {
    let text = read(path)?;
    let file = path.display().to_string();
    let is_json = path.extension().is_some_and(|e| e == "json");
    let m = if is_json {
        let name = stem(path);
        fsdp_ir::hf::import_hf(&text, &file, &name)
    } else {
        fsdp_ir::parse_model(&text, &file)
    };
    m.map_err(|e| match looks_like_plan(&text) {
        true => user(format!("{file}: this is a compiled plan, not a model: give it as the plan (`trace`, `plot`, `diff`, `run`), with --model MODEL if its model is not models/<name>.ron")),
        false => user(e),
    })
}

fn stem(path: &Path) -> String {
    let s = path.file_name().and_then(|s| s.to_str()).unwrap_or("model");
    s.trim_end_matches(".json").trim_end_matches(".config").trim_end_matches(".ron").to_string()
}

/// Whether two paths name the same existing file or directory.
#[cfg(feature = "runtime")]
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// Refuses an output path that is one of the command's inputs (or inside an input directory),
/// which the write would replace.
fn not_an_input(out: &Path, inputs: &[&Path]) -> Result<()> {
    let o = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).canonicalize().ok().map(|d| d.join(out.file_name().unwrap_or_default()));
    for i in inputs {
        if let (Some(o), Ok(i)) = (&o, i.canonicalize()) {
            if *o == i || (i.is_dir() && o.starts_with(&i)) {
                bail!(UserError(format!("-o {}: that is the input {}; write the output elsewhere", out.display(), i.display())));
            }
        }
    }
    Ok(())
}

/// Writes via a temp file in the same directory, then renames.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = fsdp_ir::tmp_sibling(path);
    std::fs::write(&tmp, text).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        user(format!("{}: {e}", path.display()))
    })?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        user(format!("{}: {e}", path.display()))
    })
}

fn load_plan(path: &Path) -> Result<Plan> {
    let text = read(path)?;
    let file = path.display();
    if !looks_like_plan(&text) {
        bail!(UserError(format!("{file}: not a compiled plan (`fsdp-plan compile MODEL -o PLAN.ron` makes one; `diff MODEL --policy A --policy B` compares two policies of a model)")));
    }
    let plan: Plan = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| json_error(path, &text, "not a valid plan: ", e))?
    } else {
        ron::from_str::<ron::Value>(&text).map_err(|e| user(format!("{file}:{}:{}: not a plan file: {}", e.position.line, e.position.col, e.code)))?;
        ron::from_str(&text).map_err(|e| user(format!("{file}:{}:{}: not a valid plan: {}", e.position.line, e.position.col, e.code)))?
    };
    if plan.format_version != fsdp_planner::FORMAT_VERSION {
        bail!(UserError(format!("{file}: plan format version {} is not supported (this build reads {})", plan.format_version, fsdp_planner::FORMAT_VERSION)));
    }
    Ok(plan)
}

/// A JSON file's error at its line:column ([`fsdp_ir::error::json_position`]).
fn json_error(path: &Path, text: &str, what: &str, e: serde_json::Error) -> anyhow::Error {
    if text.trim().is_empty() {
        return user(format!("{}: empty file (expected JSON)", path.display()));
    }
    let (line, col, msg) = fsdp_ir::error::json_position(&e);
    user(format!("{}:{line}:{col}: {what}{msg}", path.display()))
}

/// `--timeout-s`: a positive number of seconds, at most 10⁹ (a `Duration`).
#[cfg(feature = "runtime")]
fn timeout_secs(t: f64) -> Result<std::time::Duration> {
    match t > 0.0 && t <= 1e9 {
        true => Ok(std::time::Duration::from_secs_f64(t)),
        false => bail!(UserError(format!("--timeout-s {t}: expected a positive number of seconds (at most 1e9)"))),
    }
}

/// What `run` trains, checked before anything starts: the plan (planned from a model, or a
/// compiled plan verified against its model) and the run options.
#[cfg(feature = "runtime")]
fn run_inputs(r: &RunArgs) -> Result<(Plan, Model)> {
    timeout_secs(r.timeout_s)?;
    if r.steps == 0 {
        bail!(UserError("--steps 0: expected at least 1 step".into()));
    }
    if !(r.lr.is_finite() && r.lr >= 0.0) {
        // torch.optim raises "Invalid learning rate" for these too
        bail!(UserError(format!("--lr {}: expected a finite learning rate >= 0", r.lr)));
    }
    let cuda = r.backend == "cuda";
    let (plan, model) = match &r.model {
        Some(m) => load_plan_and_model(&r.file, Some(m))?,
        None if is_plan_file(&r.file) => load_plan_and_model(&r.file, None)?,
        None => {
            let model = load_model(&r.file)?;
            let mut opts = options(&r.o, &r.o.policy).map_err(user)?;
            opts.device = if cuda { Device::Cuda } else { Device::Cpu };
            (fsdp_planner::plan(&model, &opts).map_err(user)?, model)
        }
    };
    if let Some(dir) = &r.save {
        let resumes_it = r.resume.as_ref().is_some_and(|d| same_file(d, dir));
        if dir.join("latest").exists() && !resumes_it {
            bail!(UserError(format!(
                "--save {}: already holds a checkpoint (latest: {}); continue it with --resume {}, or save to another directory",
                dir.display(),
                std::fs::read_to_string(dir.join("latest")).unwrap_or_default().trim(),
                dir.display()
            )));
        }
    }
    if let Some(t) = &r.trace {
        not_an_input(t, &[&r.file])?;
    }
    if plan.options.seq < 2 {
        bail!(UserError(format!("--seq {}: a causal-LM loss needs at least 2 tokens per sequence (it predicts token t+1 from token t)", plan.options.seq)));
    }
    Ok((plan, model))
}

#[cfg(feature = "runtime")]
fn train(r: RunArgs) -> Result<()> {
    use fsdp_runtime::launch_env;
    // Under a launcher (WORLD_SIZE > 1), or on a GPU, this process is one rank of the job;
    // otherwise every rank is a thread of this process.
    let env = launch_env::from_process_env_or_single().map_err(user)?;
    let cuda = r.backend == "cuda";
    if cuda && !cfg!(feature = "cuda") {
        bail!(UserError(format!("--backend cuda: {}", fsdp_runtime::cuda::CudaError::NotBuilt)));
    }
    let per_process = cuda || env.world_size > 1;
    let (plan, model) = run_inputs(&r)?;
    let cfg = fsdp_runtime::train::RunConfig {
        lr: r.lr,
        seed: r.seed,
        weights: r.weights.clone(),
        data: if r.data == "synthetic" { None } else { Some(PathBuf::from(&r.data)) },
        save: r.save.clone(),
        save_every: r.save_every,
        resume: r.resume.clone(),
        trace: r.trace.clone(),
        arena: !r.no_arena,
        exit_after: test_exit_after()?,
        ..fsdp_runtime::train::RunConfig::new(r.steps)
    };
    let text = r.format == "text";
    // every rank computes the same reports: rank 0 prints them
    let print = |s: &fsdp_runtime::train::StepReport| {
        if text && env.rank == 0 {
            eprintln!("step {:>4}  loss {:.6}  {:>10.1} tokens/s  peak {} (rank 0, measured)", s.step, s.loss, s.tokens_per_s, fsdp_planner::print::bytes(s.peak_bytes));
        }
    };
    let reports = if per_process {
        let backend = if cuda { fsdp_runtime::train::Backend::Cuda } else { fsdp_runtime::train::Backend::Cpu };
        let mut env = env.clone();
        if env.launcher == launch_env::Launcher::Single {
            env.master_port = 0; // a job of one: any free port
        }
        fsdp_runtime::train::run_process(&plan, &model, &cfg, &env, backend, timeout_secs(r.timeout_s)?, print).map_err(|e| match e {
            // a peer that died or hung is not bad input: exit 1, not 2
            fsdp_runtime::RtError::Comm(m) => anyhow!(m),
            e => user(e),
        })?
    } else {
        fsdp_runtime::train::run_cpu(&plan, &model, &cfg, print).map_err(user)?
    };
    if env.rank != 0 {
        return Ok(());
    }
    let arena = reports.last().and_then(|r| r.memory.as_ref()).and_then(|m| m.arena);
    if let (Some(a), true) = (arena, text) {
        eprintln!(
            "arena {}: in the last step {} of allocations were placed in the plan's arena ({} allocations), {} went to the heap ({} allocations, {} refused a region still in use)",
            fsdp_planner::print::bytes(plan.memory.arena_bytes),
            fsdp_planner::print::bytes(a.placed_bytes),
            a.placed,
            fsdp_planner::print::bytes(a.heap_bytes),
            a.heap,
            a.overlaps
        );
    }
    if !text {
        let doc = serde_json::json!({
            "arena": arena,
            "model": plan.model_name,
            "plan_hash": plan.plan_hash,
            "world_size": plan.options.world_size,
            "backend": r.backend,
            "processes": if per_process { env.world_size } else { 1 },
            "steps": reports,
            "predicted_peak_bytes": plan.memory.peak_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}

/// `FSDP_PLAN_TEST_EXIT_AFTER=RANK:STEP`: that rank aborts after that step (fault injection
/// for the failure tests).
#[cfg(feature = "runtime")]
fn test_exit_after() -> Result<Option<(usize, usize)>> {
    let Ok(v) = std::env::var("FSDP_PLAN_TEST_EXIT_AFTER") else { return Ok(None) };
    let parsed = v.split_once(':').and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
    match parsed {
        Some(x) => Ok(Some(x)),
        None => bail!(UserError(format!("FSDP_PLAN_TEST_EXIT_AFTER={v}: expected RANK:STEP"))),
    }
}

#[cfg(feature = "runtime")]
fn consolidate(dir: &Path, out: &Path) -> Result<()> {
    not_an_input(out, &[dir])?;
    let ckpt = if dir.join("latest").exists() { fsdp_runtime::checkpoint::latest(dir).map_err(user)? } else { dir.to_path_buf() };
    let n = fsdp_runtime::checkpoint::consolidate(&ckpt, out).map_err(user)?;
    eprintln!("wrote {} ({n} tensors, HF names) from {}", out.display(), ckpt.display());
    Ok(())
}

#[cfg(not(feature = "runtime"))]
fn consolidate(_: &Path, _: &Path) -> Result<()> {
    train_missing()
}

#[cfg(not(feature = "runtime"))]
fn train(_: RunArgs) -> Result<()> {
    train_missing()
}

#[cfg(not(feature = "runtime"))]
fn train_missing() -> Result<()> {
    bail!(UserError(
        "this fsdp-plan was built without the runtime: build with `cargo build --features runtime` after `bash scripts/setup-venv.sh && source scripts/env.sh` (libtorch from the project venv)".into()
    ))
}

/// The most processes `launch` starts on one node.
#[cfg(feature = "runtime")]
const MAX_LOCAL_RANKS: usize = 1024;

/// `fsdp-plan launch`: the child runs `fsdp-plan run ARGS…` (or the subcommand given first).
#[cfg(feature = "runtime")]
fn launch(a: LaunchArgs) -> Result<()> {
    let mut args = a.args;
    if !args.first().is_some_and(|f| f == "run" || f == "rendezvous-selftest") {
        args.insert(0, "run".into());
    }
    if a.nproc_per_node > MAX_LOCAL_RANKS {
        bail!(UserError(format!("launch: --nproc-per-node {}: at most {MAX_LOCAL_RANKS} ranks on one node", a.nproc_per_node)));
    }
    // every rank would fail on bad arguments: say so once, before starting any
    if args[0] == "run" {
        let argv = std::iter::once(std::ffi::OsString::from("fsdp-plan")).chain(args.iter().cloned());
        let r = match parse_cli(argv) {
            Ok((cli, m)) => {
                refuse_plan_options(&cli, &m)?;
                match cli.cmd {
                    Cmd::Run(r) => r,
                    _ => unreachable!("the first argument is `run`"),
                }
            }
            Err(e) => bail!(UserError(format!("launch: the ranks' arguments: {}", e.render().to_string().trim_end()))),
        };
        let (plan, _) = run_inputs(&r)?;
        if plan.options.world_size != a.nproc_per_node as u64 {
            bail!(UserError(format!(
                "launch: the plan is for world size {}, but --nproc-per-node {} starts {} ranks: plan with --world-size {}",
                plan.options.world_size, a.nproc_per_node, a.nproc_per_node, a.nproc_per_node
            )));
        }
    }
    let spec = fsdp_runtime::launch::LaunchSpec {
        nproc: a.nproc_per_node,
        master_addr: "127.0.0.1".into(),
        master_port: a.master_port,
        program: std::env::current_exe().context("finding this executable")?,
        args,
        // as torchrun: one intra-op thread per rank unless the user says otherwise
        env: if a.nproc_per_node > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() { vec![("OMP_NUM_THREADS".into(), "1".into())] } else { vec![] },
    };
    fsdp_runtime::launch::launch(&spec).map_err(|e| match e {
        // a rank that refused its input (exit 2, its message above) is bad input of the job
        fsdp_runtime::launch::LaunchError::NoProcs | fsdp_runtime::launch::LaunchError::RankFailed { code: Some(2), .. } => user(e),
        e => anyhow!(e),
    })
}

#[cfg(feature = "runtime")]
fn rendezvous_selftest(a: SelftestArgs) -> Result<()> {
    use fsdp_runtime::{launch_env, nccl, rendezvous, selftest};
    let env = launch_env::from_process_env_or_single().map_err(user)?;
    let cfg = rendezvous::Config::from_env(&env, timeout_secs(a.timeout_s)?);
    match a.collectives.as_str() {
        "nccl" => {
            let rz = nccl::rendezvous(&cfg).map_err(|e| anyhow!(e))?;
            let ordinal = fsdp_runtime::train::gpu_ordinal(env.local_rank, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
            let group = nccl::NcclGroup::from_rendezvous(&rz, ordinal).map_err(|e| anyhow!("rank {}: {e}", env.rank))?;
            println!("rank {}/{}: NCCL communicator on cuda:{ordinal}", rz.rank, rz.world_size);
            println!("{}", selftest::check_collectives(&group, group.device()).map_err(|e| anyhow!("rank {}: {e}", env.rank))?);
            rz.barrier(Some(cfg.timeout)).map_err(|e| anyhow!(e))?;
        }
        "tcp" => {
            let rz = rendezvous::rendezvous(&cfg, || Ok(rendezvous::random_id())).map_err(|e| anyhow!(e))?;
            let group = fsdp_runtime::comm_tcp::TcpGroup::new(rz, Some(cfg.timeout));
            println!("{}", selftest::check_collectives(&group, selftest::cpu()).map_err(|e| anyhow!("rank {}: {e}", env.rank))?);
            group.rendezvous().barrier(Some(cfg.timeout)).map_err(|e| anyhow!(e))?;
        }
        _ => println!("{}", rendezvous::selftest(&cfg).map_err(|e| anyhow!(e))?),
    }
    if a.fail_rank == Some(env.rank) {
        eprintln!("rank {}: failing on purpose (--fail-rank)", env.rank);
        std::process::exit(3);
    }
    Ok(())
}

#[cfg(not(feature = "runtime"))]
fn launch(_: LaunchArgs) -> Result<()> {
    bail!(UserError(NO_RUNTIME.into()))
}

#[cfg(not(feature = "runtime"))]
fn rendezvous_selftest(_: SelftestArgs) -> Result<()> {
    bail!(UserError(NO_RUNTIME.into()))
}

#[cfg(not(feature = "runtime"))]
const NO_RUNTIME: &str = "this fsdp-plan was built without the runtime: build with `cargo build --features runtime` after `bash scripts/setup-venv.sh && source scripts/env.sh` (libtorch from the project venv)";

/// A measured Chrome trace (`run --trace`) and the device it was measured on (its
/// `otherData.device`; traces written before that field were all of the CPU runtime).
fn read_trace(path: &Path) -> Result<(serde_json::Value, Device)> {
    let text = read(path)?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| json_error(path, &text, "", e))?;
    let device = match doc["otherData"]["device"].as_str() {
        None => Device::Cpu,
        Some(d) => Device::parse(d).ok_or_else(|| user(format!("{}: otherData.device: unknown device `{d}` (cpu or cuda)", path.display())))?,
    };
    Ok((doc, device))
}

/// (start, end) in seconds per schedule op of `plan`, from a trace [`read_trace`] read: a
/// measured one (`run --trace`, not `trace`'s prediction) of this very plan.
fn read_measured(path: &Path, doc: &serde_json::Value, plan: &Plan) -> Result<Vec<(f64, f64)>> {
    let file = path.display();
    let hw = doc["otherData"]["hardware"].as_str().unwrap_or("");
    if !hw.starts_with("measured") {
        bail!(UserError(format!("{file}: a predicted trace (hardware `{hw}`), not a measured one: calibrate from `run --trace`")));
    }
    match doc["otherData"]["plan_hash"].as_str() {
        Some(h) if h == plan.plan_hash => {}
        h => bail!(UserError(format!(
            "{file}: measured for plan {}, but the model and options given plan {}: give the options of the run that wrote it",
            h.unwrap_or("(none)"),
            plan.plan_hash
        ))),
    }
    fsdp_planner::trace::spans_from_trace(doc, plan).map_err(|e| user(format!("{file}: {e}")))
}

/// Parses a command line into the commands and their matches (which say where each value came
/// from: [`refuse_plan_options`] needs to know what the user typed).
fn parse_cli<I: IntoIterator<Item = T>, T: Into<std::ffi::OsString> + Clone>(args: I) -> Result<(Cli, clap::ArgMatches), clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let m = Cli::command().try_get_matches_from(args)?;
    Ok((Cli::from_arg_matches(&m)?, m))
}

/// A compiled plan carries its own options: `--world-size`, `--policy` or another planning
/// option typed beside one would be silently ignored, so it is refused, naming them.
fn refuse_plan_options(cli: &Cli, m: &clap::ArgMatches) -> Result<()> {
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
    let Some((_, sub)) = m.subcommand() else { return Ok(()) };
    let opts = <PlanOpts as Args>::augment_args(clap::Command::new("plan options"));
    let given: Vec<String> = opts
        .get_arguments()
        .filter(|a| sub.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
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

fn run(cli: Cli, m: &clap::ArgMatches) -> Result<()> {
    refuse_plan_options(&cli, m)?;
    match cli.cmd {
        Cmd::Run(r) => train(r)?,
        Cmd::Launch(a) => launch(a)?,
        Cmd::RendezvousSelftest(a) => rendezvous_selftest(a)?,
        Cmd::Consolidate { dir, output } => consolidate(&dir, &output)?,
        Cmd::Calibrate { p, trace, hardware, output } => {
            let model = load_model(&p.model)?;
            let mut opts = options(&p.o, &p.o.policy).map_err(user)?;
            // the plan the run executed: on the device the trace was measured on
            not_an_input(&output, &[&p.model, &trace])?;
            let (doc, device) = read_trace(&trace)?;
            opts.device = device;
            let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
            let hw = load_hardware(&hardware)?;
            let measured = read_measured(&trace, &doc, &plan)?;
            let c = fsdp_planner::calibrate::calibrate(&plan, &model, &hw, &measured);
            let cfg = ron::ser::PrettyConfig::new().struct_names(false);
            let text = ron::ser::to_string_pretty(&c.hardware, cfg).context("serializing the profile")?;
            write_atomic(&output, &text)?;
            println!(
                "measured step {:.3} ms · predicted with {} {:.3} ms ({:+.1}%) · calibrated {:.3} ms ({:+.1}%) → {}",
                c.measured_step_s * 1e3,
                hw.name,
                c.predicted_before_s * 1e3,
                100.0 * c.error_before(),
                c.predicted_after_s * 1e3,
                100.0 * c.error_after(),
                output.display()
            );
        }
        Cmd::Plan { p: a, hw } => {
            let model = load_model(&a.model)?;
            let opts = options(&a.o, &a.o.policy).map_err(user)?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
            match a.format.as_str() {
                "json" => {
                    let hw = load_hardware(&hw.hardware)?;
                    let t = timeline::predict(&plan, &model, &hw);
                    let mut v = fsdp_planner::print::json(&plan);
                    v["time"] = timeline::json(&t);
                    println!("{}", serde_json::to_string_pretty(&v)?)
                }
                "ron" => println!("{}", plan_ron(&plan)?),
                _ => {
                    let hw = load_hardware(&hw.hardware)?;
                    let t = timeline::predict(&plan, &model, &hw);
                    print!("{}", fsdp_planner::print::render(&plan, a.full_schedule));
                    print!("{}", timeline::render(&t));
                }
            }
        }
        Cmd::Compile { p, output } => {
            not_an_input(&output, &[&p.model])?;
            let model = load_model(&p.model)?;
            let opts = options(&p.o, &p.o.policy).map_err(user)?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
            let text = match p.format.as_str() {
                "json" => serde_json::to_string_pretty(&plan).context("serializing the plan")?,
                _ => plan_ron(&plan)?,
            };
            write_atomic(&output, &text)?;
            eprintln!(
                "wrote {} ({} ops, {} buffers, predicted peak {})",
                output.display(),
                plan.schedule.len(),
                plan.buffers.len(),
                fsdp_planner::print::bytes(plan.memory.peak_bytes)
            );
        }
        Cmd::Diff(d) => {
            let hw = load_hardware(&d.hw.hardware)?;
            let (a, an, b, bn, models) = match (d.files.len(), d.vs_policy.len()) {
                (1, 2) => {
                    let model = load_model(&d.files[0])?;
                    let pa = fsdp_planner::plan(&model, &options(&d.o, &d.vs_policy[0]).map_err(user)?).map_err(user)?;
                    let pb = fsdp_planner::plan(&model, &options(&d.o, &d.vs_policy[1]).map_err(user)?).map_err(user)?;
                    (pa, d.vs_policy[0].clone(), pb, d.vs_policy[1].clone(), (model.clone(), model))
                }
                (2, 0) => {
                    let (pa, ma) = load_plan_and_model(&d.files[0], d.model.as_deref())?;
                    let (pb, mb) = load_plan_and_model(&d.files[1], d.model.as_deref())?;
                    (pa, d.files[0].display().to_string(), pb, d.files[1].display().to_string(), (ma, mb))
                }
                _ => bail!(UserError("diff takes MODEL --policy A --policy B, or PLAN1 PLAN2".into())),
            };
            // the time rows go with the table, before the lists of units
            let table = fsdp_planner::diff::render(&a, &an, &b, &bn);
            let (rows, rest) = table.split_at(table.find("\nunits only in").unwrap_or(table.len()));
            let (ma, mb) = models;
            let time = timeline::diff_rows(&timeline::predict(&a, &ma, &hw), &timeline::predict(&b, &mb, &hw));
            print!("{rows}{time}{rest}");
        }
        Cmd::Trace(v) => {
            not_an_input(&v.output, &[&v.input])?;
            let (plan, hw, t) = view(&v)?;
            let mem = timeline::memory_timeline(&plan, &t);
            let doc = fsdp_planner::trace::chrome_trace(&plan, &t, &mem);
            write_atomic(&v.output, &serde_json::to_string(&doc)?)?;
            eprintln!(
                "wrote {} ({} ops, predicted step {} on {}; open it in https://ui.perfetto.dev or chrome://tracing)",
                v.output.display(),
                plan.schedule.len(),
                timeline::secs(t.step_time_s),
                hw.name
            );
        }
        Cmd::Plot(v) => {
            not_an_input(&v.output, &[&v.input])?;
            let (plan, hw, t) = view(&v)?;
            let mem = timeline::memory_timeline(&plan, &t);
            let svg = fsdp_planner::plot::memory_svg(&plan, &t, &mem, Some((&hw.name, hw.memory_bytes)));
            write_atomic(&v.output, &svg)?;
            eprintln!(
                "wrote {} (peak {} at {}; step {} on {})",
                v.output.display(),
                fsdp_planner::print::bytes(plan.memory.peak_bytes),
                plan.memory.peak_at,
                timeline::secs(t.step_time_s),
                hw.name
            );
        }
        Cmd::Sweep(s) => sweep(&s)?,
        Cmd::Import { from: ImportCmd::Hf { config, output, name, dtype } } => {
            not_an_input(&output, &[&config])?;
            let text = read(&config)?;
            let name = name.unwrap_or_else(|| stem(&config));
            let dtype = dtype.as_deref().map(|d| parse_dtype("--dtype", d)).transpose().map_err(user)?;
            let model = fsdp_ir::hf::import_hf_with(&text, &config.display().to_string(), &name, dtype).map_err(user)?;
            write_atomic(&output, &fsdp_ir::to_ron(&model))?;
            eprintln!(
                "wrote {} ({}, {} params, {} ops, {} parameters in total)",
                output.display(),
                model.architecture,
                model.params.len(),
                model.ops.len(),
                model.total_numel()
            );
        }
    }
    Ok(())
}

/// Directories searched for `--hardware NAME` and for the model of a compiled plan: the
/// current directory's, then this repository's.
fn search_dirs(sub: &str) -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from(sub)];
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(sub);
    if std::fs::canonicalize(&repo).ok() != std::fs::canonicalize(&v[0]).ok() {
        v.push(repo);
    }
    v
}

/// `--hardware NAME|FILE`: a path (has a `/` or ends in `.ron`), else models/hardware/NAME.ron,
/// else the one profile whose name starts with NAME.
fn load_hardware(spec: &str) -> Result<Hardware> {
    let path = if spec.contains('/') || spec.ends_with(".ron") {
        PathBuf::from(spec)
    } else {
        let dirs = search_dirs("models/hardware");
        match dirs.iter().map(|d| d.join(format!("{spec}.ron"))).find(|p| p.is_file()) {
            Some(p) => p,
            None => {
                let mut known: Vec<(String, PathBuf)> = vec![];
                for d in &dirs {
                    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                        let p = e.path();
                        if let Some(n) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".ron")) {
                            if !known.iter().any(|k| k.0 == n) {
                                known.push((n.to_string(), p.clone()));
                            }
                        }
                    }
                }
                known.sort();
                let hits: Vec<&(String, PathBuf)> = known.iter().filter(|k| k.0.starts_with(spec)).collect();
                match hits.as_slice() {
                    [one] => one.1.clone(),
                    _ => bail!(UserError(format!(
                        "--hardware `{spec}`: {} (known: {}; or give a .ron file)",
                        if hits.is_empty() { "no such profile in models/hardware/" } else { "ambiguous" },
                        known.iter().map(|k| k.0.as_str()).collect::<Vec<_>>().join(", ")
                    ))),
                }
            }
        }
    };
    let text = read(&path)?;
    ron::from_str::<Hardware>(&text)
        .map_err(|e| user(format!("{}:{}:{}: not a valid hardware profile: {}", path.display(), e.position.line, e.position.col, e.code)))
}

/// The model a compiled plan was made from: `--model FILE`, else models/<model name>.ron;
/// its hash must equal the plan's.
fn model_of_plan(plan: &Plan, explicit: Option<&Path>) -> Result<Model> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if plan.model_name.is_empty() || plan.model_name.contains(['/', '\\']) || plan.model_name.starts_with('.') => {
            bail!(UserError(format!("the plan's model name `{}` is not a file name in models/; pass --model FILE", plan.model_name)))
        }
        None => search_dirs("models")
            .into_iter()
            .map(|d| d.join(format!("{}.ron", plan.model_name)))
            .find(|p| p.is_file())
            .ok_or_else(|| user(format!("the plan's model `{}` is not in models/; pass --model FILE", plan.model_name)))?,
    };
    let model = load_model(&path)?;
    if fsdp_planner::model_hash(&model) != plan.model_hash {
        bail!(UserError(format!("{}: not the model the plan was compiled from (model hash differs)", path.display())));
    }
    Ok(model)
}

/// A compiled plan must be what `compile` makes of its model and options: its hash, and then
/// the whole plan, replanned and compared. An edited plan (offsets, sizes, ids, options) is
/// refused at the first line that differs, rather than run or drawn.
fn verify_plan(path: &Path, plan: &Plan, model: &Model) -> Result<()> {
    let file = path.display();
    let fresh = fsdp_planner::plan(model, &plan.options).map_err(|e| user(format!("{file}: the plan's options: {e}")))?;
    if fresh.plan_hash != plan.plan_hash {
        bail!(UserError(format!("{file}: plan_hash {} is not the hash of its model and options ({}): edited, or compiled by another version", plan.plan_hash, fresh.plan_hash)));
    }
    if fresh == *plan {
        return Ok(());
    }
    // the text of both only to name where they differ
    let (want, got) = (plan_ron(&fresh)?, plan_ron(plan)?);
    if want != got {
        let (i, (g, w)) = got.lines().zip(want.lines()).enumerate().find(|(_, (g, w))| g != w).unwrap_or((got.lines().count().min(want.lines().count()), ("(end of plan)", "(more)")));
        // the lines around their first difference (a unit's line lists all its params)
        let at = g.char_indices().zip(w.chars()).find(|((_, a), b)| a != b).map_or(g.len().min(w.len()), |((k, _), _)| k);
        let around = |l: &str| {
            let from = l.char_indices().map(|(k, _)| k).rfind(|&k| k <= at.saturating_sub(40)).unwrap_or(0);
            let t: String = l[from..].chars().take(100).collect();
            format!("{}{}{}", if from > 0 { "…" } else { "" }, t.trim(), if l[from..].chars().count() > 100 { "…" } else { "" })
        };
        bail!(UserError(format!(
            "{file}:{}: `{}` where `compile` makes `{}` of the same model and options: the plan was edited (recompile it)",
            i + 1,
            around(g),
            around(w)
        )));
    }
    Ok(())
}

/// A compiled plan and its model (`--model`, else found by name), verified ([`verify_plan`]).
fn load_plan_and_model(path: &Path, model: Option<&Path>) -> Result<(Plan, Model)> {
    let plan = load_plan(path)?;
    let model = model_of_plan(&plan, model)?;
    verify_plan(path, &plan, &model)?;
    Ok((plan, model))
}

/// A compiled plan (RON or JSON, as `compile` writes it) rather than a model or HF config.
fn is_plan_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "ron" || e == "json") && std::fs::read_to_string(path).is_ok_and(|t| looks_like_plan(&t))
}

/// Whether a file's text has a plan's fields (which no model or HF config has).
fn looks_like_plan(text: &str) -> bool {
    text.contains("plan_hash") && text.contains("format_version")
}

/// The plan, hardware and predicted time of `trace` / `plot`.
fn view(v: &ViewArgs) -> Result<(Plan, Hardware, TimeReport)> {
    let hw = load_hardware(&v.hw.hardware)?;
    let (plan, model) = if is_plan_file(&v.input) {
        load_plan_and_model(&v.input, v.model.as_deref())?
    } else {
        let model = load_model(&v.input)?;
        let opts = options(&v.o, &v.o.policy).map_err(user)?;
        (fsdp_planner::plan(&model, &opts).map_err(user)?, model)
    };
    let t = timeline::predict(&plan, &model, &hw);
    Ok((plan, hw, t))
}

/// `80GiB`, `80 GiB`, `75GB`, `81559MiB`, `8e10` (bytes).
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        "tib" => 1099511627776.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => bail!(UserError(format!("--memory-limit `{s}`: unknown unit `{u}` (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"))),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok((v * mult) as u64),
        _ => bail!(UserError(format!("--memory-limit `{s}`: expected a size such as 80GiB"))),
    }
}

fn sweep(a: &SweepArgs) -> Result<()> {
    let model = load_model(&a.model)?;
    let hw = load_hardware(&a.hw.hardware)?;
    let limit = match &a.memory_limit {
        Some(s) => parse_size(s)?,
        None => hw.memory_bytes,
    };
    let mut policies: Vec<String> = a.policies.iter().flat_map(|p| p.split(';')).map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if policies.is_empty() {
        policies.push("auto".into());
    }
    for p in &policies {
        // `transformer:A,size:1e8` would be one policy whose second class is `size:1e8`
        if let Some((kind, rest)) = p.split_once(':') {
            if matches!(kind, "transformer" | "modules") && rest.split(',').any(|x| x.contains(':')) {
                bail!(UserError(format!(
                    "--policy `{p}`: a comma separates the classes or modules of one policy; separate policies with `;` or repeat --policy"
                )));
            }
        }
    }
    if a.world_sizes.is_empty() {
        bail!(UserError("--world-size: give at least one world size".into()));
    }
    let mut rows = vec![];
    for &ws in &a.world_sizes {
        for p in &policies {
            let what = |e: PlanError| user(format!("world size {ws}, policy {p}: {e}"));
            let opts = options_for(&a.k, ws, p).map_err(what)?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(what)?;
            let t = timeline::predict(&plan, &model, &hw);
            rows.push((ws, plan.policy.clone(), plan.memory.peak_bytes, t));
        }
    }
    if a.format == "json" {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(ws, policy, peak, t)| {
                serde_json::json!({
                    "world_size": ws,
                    "policy": policy,
                    "fits": *peak <= limit,
                    "peak_bytes": peak,
                    "step_time_s": t.step_time_s,
                    "exposed_comm_s": t.exposed_comm_s,
                    "mfu": t.mfu,
                    "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "model": model.name,
            "hardware": hw.name,
            "memory_limit_bytes": limit,
            "batch": a.k.batch,
            "seq": a.k.seq,
            "rows": v,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "sweep {} on {} · memory limit {} · batch {} × seq {} · param dtype {} · reduce dtype {}",
        model.name,
        hw.name,
        fsdp_planner::print::bytes(limit),
        a.k.batch,
        a.k.seq,
        a.k.param_dtype.as_deref().unwrap_or("(param's)"),
        a.k.reduce_dtype.as_deref().unwrap_or("(param dtype)")
    );
    let pw = rows.iter().map(|r| r.1.len()).max().unwrap_or(6).max(6);
    println!(
        "{:>10}  {:<pw$}  {:<5} {:>12} {:>11} {:>13} {:>6} {:>13}",
        "world size", "policy", "fits?", "peak", "step time", "tokens/s/GPU", "MFU", "exposed comm"
    );
    for (ws, policy, peak, t) in &rows {
        println!(
            "{:>10}  {:<pw$}  {:<5} {:>12} {:>11} {:>13} {:>6} {:>13}",
            ws,
            policy,
            if *peak <= limit { "yes" } else { "no" },
            fsdp_planner::print::bytes(*peak),
            timeline::secs(t.step_time_s),
            timeline::thousands(t.tokens_per_s_per_gpu),
            timeline::pct(t.mfu),
            timeline::secs(t.exposed_comm_s)
        );
    }
    Ok(())
}

fn plan_ron(plan: &Plan) -> Result<String> {
    let cfg = ron::ser::PrettyConfig::new().depth_limit(2).struct_names(false);
    ron::ser::to_string_pretty(plan, cfg).context("serializing the plan")
}

const SUBCOMMANDS: &[&str] = &["plan", "compile", "diff", "trace", "plot", "sweep", "run", "launch", "rendezvous-selftest", "consolidate", "calibrate", "import", "help", "--help", "-h", "--version", "-V"];

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    // `fsdp-plan MODEL [opts]` = `fsdp-plan plan MODEL [opts]`; `diff` takes `--policy` twice.
    if args.len() > 1 && !SUBCOMMANDS.contains(&args[1].as_str()) {
        args.insert(1, "plan".into());
    }
    if args.get(1).is_some_and(|a| a == "diff") {
        let n = args.iter().filter(|a| *a == "--policy").count();
        if n == 2 {
            for a in args.iter_mut() {
                if a == "--policy" {
                    *a = "--vs-policy".into();
                }
            }
        }
    }
    let (cli, matches) = match parse_cli(&args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli, &matches) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UserError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
