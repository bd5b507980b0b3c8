//! `fsdp-plan run`: trains a plan with the runtime (CPU rank threads, or one rank of a
//! launched job), checkpoints and resumes; `consolidate` writes a checkpoint as one file.

use crate::cli::PlanOpts;
use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use std::path::{Path, PathBuf};
#[cfg(feature = "runtime")]
use {
    crate::cli::options,
    anyhow::anyhow,
    fsdp_ir::Model,
    fsdp_planner::{Device, Plan},
};

#[derive(Args)]
pub(crate) struct RunArgs {
    /// A model (.ron / config.json, planned with the options below) or a compiled plan.
    pub(crate) file: PathBuf,
    #[command(flatten)]
    pub(crate) o: PlanOpts,
    /// The model a compiled plan was made for (checked against the plan's model hash).
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// `cpu`: every rank a thread of this process, or under a launcher (WORLD_SIZE > 1) this
    /// process is one rank and collectives go over the rendezvous sockets. `cuda`: this
    /// process is one rank on GPU LOCAL_RANK, NCCL collectives (feature `cuda`); run one per
    /// GPU with `fsdp-plan launch`, torchrun or srun.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub(crate) backend: String,
    #[arg(long, default_value_t = 10)]
    pub(crate) steps: usize,
    #[arg(long, default_value_t = 1e-3)]
    pub(crate) lr: f64,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: i64,
    /// Initial weights: an HF-named safetensors file (default: HF-style random init).
    #[arg(long)]
    pub(crate) weights: Option<PathBuf>,
    /// `synthetic` (random tokens) or a file of little-endian u32 token ids.
    #[arg(long, default_value = "synthetic")]
    pub(crate) data: String,
    /// Write sharded checkpoints (safetensors per rank + metadata + plan) into this directory.
    #[arg(long)]
    pub(crate) save: Option<PathBuf>,
    /// Checkpoint every N steps (and always after the last).
    #[arg(long, default_value_t = 0)]
    pub(crate) save_every: usize,
    /// Continue from the latest checkpoint in this directory (same plan; losses continue
    /// bit-identically).
    #[arg(long)]
    pub(crate) resume: Option<PathBuf>,
    /// Write the measured timeline of the last step (Chrome/Perfetto JSON, as `trace`).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Allocate from the heap instead of the plan's arena. By default each step runs in one
    /// block of the plan's arena size: every allocation that is one of the plan's buffers at
    /// that buffer's offset, kernel temporaries in the space the plan leaves free at their op
    /// (the first step records what each op allocates; the next ones replay it).
    #[arg(long)]
    pub(crate) no_arena: bool,
    /// Seconds a rank waits for a peer (the rendezvous, each collective between processes)
    /// before it ends the run with an error naming the peer.
    #[arg(long, default_value_t = 600.0)]
    pub(crate) timeout_s: f64,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
}

/// `--timeout-s`: a positive number of seconds, at most 10⁹ (a `Duration`).
#[cfg(feature = "runtime")]
pub(crate) fn timeout_secs(t: f64) -> Result<std::time::Duration> {
    match t > 0.0 && t <= 1e9 {
        true => Ok(std::time::Duration::from_secs_f64(t)),
        false => bail!(UserError(format!("--timeout-s {t}: expected a positive number of seconds (at most 1e9)"))),
    }
}

/// What `run` trains, checked before anything starts: the plan (planned from a model, or a
/// compiled plan verified against its model) and the run options.
#[cfg(feature = "runtime")]
pub(crate) fn run_inputs(r: &RunArgs) -> Result<(Plan, Model)> {
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
            let mut opts = options(&r.o, &r.o.policy, &model).map_err(user)?;
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
pub(crate) fn train(r: RunArgs) -> Result<()> {
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
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}

/// `FSDP_PLAN_TEST_EXIT_AFTER=RANK:STEP`: that rank aborts after that step (fault injection
/// for the failure tests).
#[cfg(feature = "runtime")]
pub(crate) fn test_exit_after() -> Result<Option<(usize, usize)>> {
    let Ok(v) = std::env::var("FSDP_PLAN_TEST_EXIT_AFTER") else { return Ok(None) };
    let parsed = v.split_once(':').and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
    match parsed {
        Some(x) => Ok(Some(x)),
        None => bail!(UserError(format!("FSDP_PLAN_TEST_EXIT_AFTER={v}: expected RANK:STEP"))),
    }
}

#[cfg(feature = "runtime")]
pub(crate) fn consolidate(dir: &Path, out: &Path) -> Result<()> {
    not_an_input(out, &[dir])?;
    let ckpt = if dir.join("latest").exists() { fsdp_runtime::checkpoint::latest(dir).map_err(user)? } else { dir.to_path_buf() };
    let n = fsdp_runtime::checkpoint::consolidate(&ckpt, out).map_err(user)?;
    eprintln!("wrote {} ({n} tensors, HF names) from {}", out.display(), ckpt.display());
    Ok(())
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn consolidate(_: &Path, _: &Path) -> Result<()> {
    train_missing()
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn train(_: RunArgs) -> Result<()> {
    train_missing()
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn train_missing() -> Result<()> {
    bail!(UserError(
        "this fsdp-plan was built without the runtime: build with `cargo build --features runtime` after `bash scripts/setup-venv.sh && source scripts/env.sh` (libtorch from the project venv)".into()
    ))
}
