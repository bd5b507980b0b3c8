//! The `fsdp-plan` command line: plan (default), compile, diff, import hf.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use fsdp_ir::Model;
use fsdp_planner::{
    parse_dtype, AttnImpl, BackwardPrefetch, Device, Layout, Optimizer, Options, Plan, PlanError, Policy, Strategy,
};
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
    /// Print the schedule, units, communication and predicted peak memory (the default).
    Plan(PlanArgs),
    /// Write the compiled plan (RON) with a format version and model/options hashes.
    Compile {
        #[command(flatten)]
        p: PlanArgs,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare two plans: `diff MODEL --policy A --policy B`, or `diff PLAN1 PLAN2`.
    Diff(DiffArgs),
    /// Import a model from a Hugging Face config.json.
    Import {
        #[command(subcommand)]
        from: ImportCmd,
    },
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
}

fn options(o: &PlanOpts, policy: &str) -> Result<Options, PlanError> {
    let layout = if o.layout == "flat" { Layout::Flat } else { Layout::Fsdp2 };
    let strategy = match o.strategy.as_str() {
        "shard-grad-op" => Strategy::ShardGradOp,
        "no-shard" => Strategy::NoShard,
        "hybrid-shard" => Strategy::HybridShard {
            shard_size: o.shard_group_size.unwrap_or(8.min(o.world_size)),
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
        world_size: o.world_size,
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
        device: if o.device == "cpu" { Device::Cpu } else { Device::Cuda },
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
    m.map_err(user)
}

fn stem(path: &Path) -> String {
    let s = path.file_name().and_then(|s| s.to_str()).unwrap_or("model");
    s.trim_end_matches(".json").trim_end_matches(".config").trim_end_matches(".ron").to_string()
}

/// Writes via a temp file in the same directory, then renames.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|s| s.to_str()).unwrap_or("out");
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| user(format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        user(format!("{}: {e}", path.display()))
    })
}

fn load_plan(path: &Path) -> Result<Plan> {
    let text = read(path)?;
    let v: ron::Value = ron::from_str(&text).map_err(|e| user(format!("{}:{}:{}: not a plan file: {}", path.display(), e.position.line, e.position.col, e.code)))?;
    let _ = v;
    let plan: Plan = ron::from_str(&text).map_err(|e| user(format!("{}:{}:{}: not a valid plan: {}", path.display(), e.position.line, e.position.col, e.code)))?;
    if plan.format_version != fsdp_planner::FORMAT_VERSION {
        bail!(UserError(format!(
            "{}: plan format version {} is not supported (this build reads {})",
            path.display(),
            plan.format_version,
            fsdp_planner::FORMAT_VERSION
        )));
    }
    Ok(plan)
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Plan(a) => {
            let model = load_model(&a.model)?;
            let opts = options(&a.o, &a.o.policy).map_err(user)?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
            match a.format.as_str() {
                "json" => println!("{}", serde_json::to_string_pretty(&fsdp_planner::print::json(&plan))?),
                "ron" => println!("{}", plan_ron(&plan)?),
                _ => print!("{}", fsdp_planner::print::render(&plan, a.full_schedule)),
            }
        }
        Cmd::Compile { p, output } => {
            let model = load_model(&p.model)?;
            let opts = options(&p.o, &p.o.policy).map_err(user)?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
            write_atomic(&output, &plan_ron(&plan)?)?;
            eprintln!(
                "wrote {} ({} ops, {} buffers, predicted peak {})",
                output.display(),
                plan.schedule.len(),
                plan.buffers.len(),
                fsdp_planner::print::bytes(plan.memory.peak_bytes)
            );
        }
        Cmd::Diff(d) => {
            let (a, an, b, bn) = match (d.files.len(), d.vs_policy.len()) {
                (1, 2) => {
                    let model = load_model(&d.files[0])?;
                    let pa = fsdp_planner::plan(&model, &options(&d.o, &d.vs_policy[0]).map_err(user)?).map_err(user)?;
                    let pb = fsdp_planner::plan(&model, &options(&d.o, &d.vs_policy[1]).map_err(user)?).map_err(user)?;
                    (pa, d.vs_policy[0].clone(), pb, d.vs_policy[1].clone())
                }
                (2, 0) => (
                    load_plan(&d.files[0])?,
                    d.files[0].display().to_string(),
                    load_plan(&d.files[1])?,
                    d.files[1].display().to_string(),
                ),
                _ => bail!(UserError("diff takes MODEL --policy A --policy B, or PLAN1 PLAN2".into())),
            };
            print!("{}", fsdp_planner::diff::render(&a, &an, &b, &bn));
        }
        Cmd::Import { from: ImportCmd::Hf { config, output, name, dtype } } => {
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

fn plan_ron(plan: &Plan) -> Result<String> {
    let cfg = ron::ser::PrettyConfig::new().depth_limit(2).struct_names(false);
    ron::ser::to_string_pretty(plan, cfg).context("serializing the plan")
}

const SUBCOMMANDS: [&str; 9] = ["plan", "compile", "diff", "import", "help", "--help", "-h", "--version", "-V"];

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
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
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
