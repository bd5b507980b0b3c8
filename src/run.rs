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
    /// The (peak) learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub(crate) lr: f64,
    /// constant | linear | cosine | wsd (torchtitan's warmup-stable-decay: --warmup-steps of
    /// linear warmup, then linear/cosine decay to --min-lr over --decay-steps; wsd holds the
    /// rate and decays over the last --decay-steps, default a tenth of the run).
    #[arg(long, default_value = "constant", value_parser = ["constant", "linear", "cosine", "wsd"])]
    pub(crate) lr_schedule: String,
    #[arg(long, default_value_t = 0)]
    pub(crate) warmup_steps: u64,
    /// Steps of the decay (default: linear/cosine every step after the warmup; wsd a tenth).
    #[arg(long)]
    pub(crate) decay_steps: Option<u64>,
    /// The learning rate the decay ends at.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) min_lr: f64,
    /// clip_grad_norm_ before each optimizer step: the global L2 norm over every rank's shards.
    #[arg(long)]
    pub(crate) clip_grad_norm: Option<f64>,
    /// AdamW's decoupled weight decay (default: torch's 0.01).
    #[arg(long)]
    pub(crate) weight_decay: Option<f64>,
    #[arg(long, default_value_t = 0.9)]
    pub(crate) beta1: f64,
    #[arg(long, default_value_t = 0.999)]
    pub(crate) beta2: f64,
    #[arg(long, default_value_t = 1e-8)]
    pub(crate) eps: f64,
    /// Skip a step whose loss or gradient norm is not finite (default: stop, exit 3).
    #[arg(long)]
    pub(crate) skip_nonfinite: bool,
    /// Keep only the newest N checkpoints (0: all).
    #[arg(long, default_value_t = 0)]
    pub(crate) keep_last: usize,
    /// Held-out token file (same formats as --data): the mean loss over its first
    /// --eval-batches global batches, without gradients, every --eval-every steps and at the end.
    #[arg(long)]
    pub(crate) eval_data: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub(crate) eval_every: usize,
    #[arg(long, default_value_t = 1)]
    pub(crate) eval_batches: usize,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: i64,
    /// Initial weights: an HF-named safetensors file (default: HF-style random init).
    #[arg(long)]
    pub(crate) weights: Option<PathBuf>,
    /// `synthetic` (random tokens) or a token file: raw uint16 (nanoGPT's `.bin`), raw
    /// uint32 (`.u32`) or `.npy`, read through a memory map one step at a time; step k reads
    /// the k-th window of global-batch × seq tokens, in order, starting over after the last
    /// whole one (an epoch).
    #[arg(long, default_value = "synthetic")]
    pub(crate) data: String,
    /// Text in: tokenize --data (and --eval-data) with this HF tokenizer.json into a cached
    /// token file beside it (reused while the text and tokenizer are the same).
    #[arg(long)]
    pub(crate) tokenizer: Option<PathBuf>,
    /// The token file's format: auto (by extension: .bin/.u16 uint16, .u32 uint32, .npy), u16,
    /// u32 or npy.
    #[arg(long, default_value = "auto", value_parser = ["auto", "u16", "u32", "npy"])]
    pub(crate) data_format: String,
    /// Stop after this many passes over the token file (default: run --steps, starting over
    /// at the end of the file as often as needed).
    #[arg(long)]
    pub(crate) epochs: Option<u64>,
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
    /// text: a progress bar on a terminal, else a line per step (stderr); json: one JSON line
    /// per step and a closing summary line (stdout).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
    /// The hardware profile MFU is reported against (default: cpu, or h100-sxm on cuda).
    #[arg(long)]
    pub(crate) hardware: Option<String>,
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
    if !(r.min_lr.is_finite() && (0.0..=r.lr).contains(&r.min_lr)) {
        bail!(UserError(format!("--min-lr {}: expected a rate between 0 and --lr {}", r.min_lr, r.lr)));
    }
    if r.warmup_steps >= r.steps as u64 && r.warmup_steps > 0 {
        bail!(UserError(format!("--warmup-steps {}: the run has only {} steps", r.warmup_steps, r.steps)));
    }
    if let Some(c) = r.clip_grad_norm.filter(|c| !(c.is_finite() && *c > 0.0)) {
        bail!(UserError(format!("--clip-grad-norm {c}: expected a positive max norm")));
    }
    for (flag, v, ok) in [("--beta1", r.beta1, (0.0..1.0).contains(&r.beta1)), ("--beta2", r.beta2, (0.0..1.0).contains(&r.beta2)), ("--eps", r.eps, r.eps.is_finite() && r.eps >= 0.0)] {
        if !ok {
            // torch.optim's own checks
            bail!(UserError(format!("{flag} {v}: torch.optim requires 0 <= beta < 1 and eps >= 0")));
        }
    }
    if let Some(w) = r.weight_decay {
        if !(w.is_finite() && w >= 0.0) {
            bail!(UserError(format!("--weight-decay {w}: expected a finite value >= 0")));
        }
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
    if r.weight_decay.is_some() && plan.options.optimizer != fsdp_planner::Optimizer::AdamW {
        bail!(UserError(format!("--weight-decay: the plan's optimizer is {} (decoupled weight decay is AdamW's; plan with --optimizer adamw)", plan.options.optimizer.name())));
    }
    match plan.options.float8 {
        Some(f) if f.recipe != fsdp_planner::Float8Recipe::Tensorwise => {
            bail!(UserError(format!("--float8 {}: the runtime runs torchao's tensorwise recipe only (libtorch's _scaled_mm takes per-tensor scales on the CPU); plan and time {} here, or run --float8 tensorwise", f.recipe.name(), f.recipe.name())));
        }
        Some(f) if f.all_gather && plan.options.offload == fsdp_planner::Offload::Cpu => {
            bail!(UserError("--float8-all-gather with --offload cpu: the runtime casts the float8 weights' shards on the device; plan and time it here, run without one of the two".into()));
        }
        _ => {}
    }
    if plan.options.train_loop != fsdp_planner::TrainLoop::Hf {
        bail!(UserError(format!("--train-loop {}: the runtime trains with HF's loss (labels shifted inside the model); that loop is planned, not run", plan.options.train_loop.name())));
    }
    if plan.options.compile {
        bail!(UserError("--compile: the runtime runs libtorch's eager kernels, and a --compile plan lays out what inductor's partitioner saves instead (plan and time it here; run the plan without --compile)".into()));
    }
    if plan.options.seq < 2 {
        bail!(UserError(format!("--seq {}: a causal-LM loss needs at least 2 tokens per sequence (it predicts token t+1 from token t)", plan.options.seq)));
    }
    Ok((plan, model))
}

/// `--resume`: the schedule, clipping, optimizer and seed options the checkpoint recorded,
/// for every one not given on this command line (torchtitan restores its scheduler's state
/// from the checkpoint the same way); returns the names taken.
#[cfg(feature = "runtime")]
fn restore_options(r: &mut RunArgs, m: Option<&clap::ArgMatches>) -> Result<Vec<&'static str>> {
    let Some(dir) = r.resume.clone() else { return Ok(vec![]) };
    let Ok(ckpt) = fsdp_runtime::checkpoint::latest(&dir) else { return Ok(vec![]) }; // (the run says why)
    let Ok(text) = std::fs::read_to_string(ckpt.join("rank-0.json")) else { return Ok(vec![]) };
    let Ok(meta) = serde_json::from_str::<fsdp_runtime::checkpoint::RankMeta>(&text) else { return Ok(vec![]) };
    let Some(run) = meta.run else { return Ok(vec![]) };
    let given = |id: &str| m.is_some_and(|m| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine));
    let mut taken = vec![];
    let f = |k: &str| run.get(k).and_then(|v| v.as_f64());
    let h = &run["hyper"];
    macro_rules! take {
        ($id:literal, $flag:literal, $field:expr, $val:expr) => {
            if !given($id) {
                if let Some(v) = $val {
                    if $field != v {
                        $field = v;
                        taken.push($flag);
                    }
                }
            }
        };
    }
    take!("lr", "--lr", r.lr, f("lr"));
    take!("lr_schedule", "--lr-schedule", r.lr_schedule, run["lr_schedule"].as_str().map(String::from));
    take!("warmup_steps", "--warmup-steps", r.warmup_steps, run["warmup_steps"].as_u64());
    take!("decay_steps", "--decay-steps", r.decay_steps, Some(run["decay_steps"].as_u64()));
    take!("min_lr", "--min-lr", r.min_lr, f("min_lr"));
    take!("clip_grad_norm", "--clip-grad-norm", r.clip_grad_norm, Some(f("clip_grad_norm")));
    take!("weight_decay", "--weight-decay", r.weight_decay, Some(h["weight_decay"].as_f64()));
    take!("beta1", "--beta1", r.beta1, h["beta1"].as_f64());
    take!("beta2", "--beta2", r.beta2, h["beta2"].as_f64());
    take!("eps", "--eps", r.eps, h["eps"].as_f64());
    take!("seed", "--seed", r.seed, run["seed"].as_i64());
    Ok(taken)
}

#[cfg(feature = "runtime")]
pub(crate) fn train(mut r: RunArgs, m: Option<&clap::ArgMatches>) -> Result<()> {
    let restored = restore_options(&mut r, m)?;
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
    // text in: tokenized once into a cached token file
    let vocab = fsdp_runtime::train::vocab_size(&model) as u64;
    let tokens_of = |p: PathBuf| -> Result<PathBuf> {
        match &r.tokenizer {
            Some(t) if crate::tokenize::is_text(&p) => Ok(crate::tokenize::tokenized(&p, t, vocab)?.0),
            _ => Ok(p),
        }
    };
    let data_file = if r.data == "synthetic" { None } else { Some(tokens_of(PathBuf::from(&r.data))?) };
    let eval_file = r.eval_data.clone().map(tokens_of).transpose()?;
    let cfg = fsdp_runtime::train::RunConfig {
        lr: r.lr,
        seed: r.seed,
        weights: r.weights.clone(),
        data: data_file,
        data_format: fsdp_runtime::data::Format::parse(&r.data_format).unwrap_or(fsdp_runtime::data::Format::Auto),
        lr_schedule: fsdp_runtime::lr::Kind::parse(&r.lr_schedule).unwrap_or(fsdp_runtime::lr::Kind::Constant),
        warmup_steps: r.warmup_steps,
        decay_steps: r.decay_steps,
        min_lr: r.min_lr,
        clip_grad_norm: r.clip_grad_norm,
        hyper: fsdp_runtime::optim::Hyper { beta1: r.beta1, beta2: r.beta2, eps: r.eps, weight_decay: r.weight_decay },
        skip_nonfinite: r.skip_nonfinite,
        keep_last: r.keep_last,
        eval_data: eval_file,
        eval_every: r.eval_every,
        eval_batches: r.eval_batches,
        save: r.save.clone(),
        save_every: r.save_every,
        resume: r.resume.clone(),
        trace: r.trace.clone(),
        arena: !r.no_arena,
        exit_after: test_exit_after()?,
        ..fsdp_runtime::train::RunConfig::new(r.steps)
    };
    // the data: its format and size checked before any rank starts; --epochs caps the steps
    let data = fsdp_runtime::train::data_of(&plan, &model, &cfg).map_err(user)?;
    let mut cfg = cfg;
    if let (Some(e), Some(w)) = (r.epochs, data.windows()) {
        if e == 0 {
            bail!(UserError("--epochs 0: expected at least 1".into()));
        }
        if e.saturating_mul(w) < cfg.steps as u64 {
            if env.rank == 0 {
                eprintln!("data: --epochs {e} of {w} steps each ends the run after step {} (of --steps {})", e * w, cfg.steps);
            }
            cfg.steps = (e * w) as usize;
        }
    }
    drop(data);
    if !restored.is_empty() && env.rank == 0 {
        eprintln!("resume: {} as the checkpoint recorded them (not given here)", restored.join(", "));
    }
    if let Some(e) = &cfg.eval_data {
        // its format and size, and every id it will be asked for, before training
        let eval = fsdp_runtime::train::data_of(&plan, &model, &fsdp_runtime::train::RunConfig { data: Some(e.clone()), ..cfg.clone() }).map_err(user)?;
        let windows = eval.windows().unwrap_or(0) as usize;
        if windows < cfg.eval_batches.max(1) {
            bail!(UserError(format!("--eval-data {}: {windows} global batch(es) of {} tokens, --eval-batches asks for {}", e.display(), eval.per_step, cfg.eval_batches)));
        }
        for w in 0..cfg.eval_batches.max(1) {
            eval.read(w as u64, 0, eval.per_step).map_err(user)?;
        }
    }
    let epoch_said = std::sync::atomic::AtomicU64::new(0);
    let text = r.format == "text";
    let hw = load_hardware(r.hardware.as_deref().unwrap_or(if cuda { "h100-sxm" } else { "cpu" }))?;
    let progress = std::sync::Mutex::new(Progress::new(&plan, &model, &hw, cfg.steps, text && std::io::IsTerminal::is_terminal(&std::io::stderr())));
    // every rank computes the same reports: rank 0 prints them
    let print = |s: &fsdp_runtime::train::StepReport| {
        if env.rank != 0 {
            return;
        }
        let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
        if s.epoch > epoch_said.load(std::sync::atomic::Ordering::Relaxed) {
            epoch_said.store(s.epoch, std::sync::atomic::Ordering::Relaxed);
            p.note(&format!("data: {} read in full {} time(s); step {} starts over at its first token", r.data, s.epoch, s.step));
        }
        p.step(s, text);
        if let Some(e) = s.eval_loss {
            p.note(&format!("eval after step {}: loss {e:.6}", s.step));
        }
        for n in &s.notes {
            p.note(n);
        }
        if s.skipped {
            p.note(&format!("step {}: loss {} / gradient norm {}: not finite, update skipped (--skip-nonfinite)", s.step, s.loss, s.grad_norm.unwrap_or(f64::NAN)));
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
            fsdp_runtime::RtError::NonFinite(m) => anyhow!(NonFinite(m)),
            e => user(e),
        })?
    } else {
        fsdp_runtime::train::run_cpu(&plan, &model, &cfg, print).map_err(|e| match e {
            fsdp_runtime::RtError::NonFinite(m) => anyhow!(NonFinite(m)),
            e => user(e),
        })?
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
    let p = progress.into_inner().unwrap_or_else(|e| e.into_inner());
    let summary = p.summary(&plan, &reports);
    if text {
        eprintln!("{}", summary.0);
    } else {
        let doc = serde_json::json!({
            "summary": {
                "arena": arena,
                "model": plan.model_name,
                "plan_hash": plan.plan_hash,
                "world_size": plan.options.world_size,
                "backend": r.backend,
                "processes": if per_process { env.world_size } else { 1 },
                "steps": reports.len(),
                "final_loss": reports.last().map(|s| s.loss),
                "measured_peak_bytes": reports.iter().map(|s| s.peak_bytes).max(),
                "predicted_peak_bytes": plan.memory.peak_bytes,
                "measured_host_peak_bytes": reports.iter().filter_map(|s| s.host_peak_bytes).max(),
                "predicted_host_peak_bytes": plan.memory.host.as_ref().map(|h| h.peak_bytes),
                "mean_tokens_per_s": summary.1,
            }
        });
        outln!("{}", serde_json::to_string(&doc)?);
    }
    Ok(())
}

/// Rank 0's view of a run: a progress bar on a terminal, else a line (text) or a JSON line
/// (`--format json`) per step; notes (checkpoints, epochs) on their own lines.
#[cfg(feature = "runtime")]
struct Progress {
    steps: usize,
    flops_per_token: f64,
    peak_flops: f64,
    planned_peak: u64,
    bar: bool,
    started: std::time::Instant,
    first_step: Option<usize>,
    line_open: bool,
}

#[cfg(feature = "runtime")]
impl Progress {
    fn new(plan: &Plan, model: &Model, hw: &fsdp_planner::hardware::Hardware, steps: usize, bar: bool) -> Progress {
        let o = &plan.options;
        let attn = fsdp_planner::AttnImpl::parse(&plan.attn_implementation).unwrap_or(fsdp_planner::AttnImpl::Sdpa);
        let tokens = (o.batch * o.seq) as f64;
        let dtype = o.param_dtype.or(o.master_dtype).unwrap_or(fsdp_ir::DType::Float32);
        Progress {
            steps,
            flops_per_token: fsdp_planner::cost::model_flops(model, o, attn) / tokens.max(1.0),
            peak_flops: hw.peak(dtype) * o.world_size as f64,
            planned_peak: plan.memory.peak_bytes,
            bar,
            started: std::time::Instant::now(),
            first_step: None,
            line_open: false,
        }
    }

    fn mfu(&self, tokens_per_s: f64) -> f64 {
        tokens_per_s * self.flops_per_token / self.peak_flops.max(1.0)
    }

    fn note(&mut self, n: &str) {
        if self.line_open {
            eprintln!();
            self.line_open = false;
        }
        eprintln!("{n}");
    }

    fn step(&mut self, s: &fsdp_runtime::train::StepReport, text: bool) {
        let first = *self.first_step.get_or_insert(s.step);
        let mfu = self.mfu(s.tokens_per_s);
        if !text {
            let line = serde_json::json!({
                "step": s.step, "epoch": s.epoch, "loss": s.loss, "lr": s.lr, "grad_norm": s.grad_norm,
                "tokens_per_s": s.tokens_per_s, "mfu": mfu, "peak_bytes": s.peak_bytes, "eval_loss": s.eval_loss,
                "planned_peak_bytes": self.planned_peak, "skipped": s.skipped,
            });
            outln!("{line}");
            return;
        }
        let norm = s.grad_norm.map_or("-".into(), |g| format!("{g:.3}"));
        if !self.bar {
            eprintln!("step {:>4}  loss {:.6}  lr {:.3e}  grad norm {norm}  {:>10.1} tokens/s  MFU {:.2}%  peak {} (rank 0, measured)", s.step, s.loss, s.lr, s.tokens_per_s, 100.0 * mfu, fsdp_planner::print::bytes(s.peak_bytes));
            return;
        }
        let done = (s.step + 1 - first) as f64;
        let per = self.started.elapsed().as_secs_f64() / done.max(1.0);
        let left = per * (self.steps - s.step) as f64;
        let width = 24;
        let filled = (width as f64 * s.step as f64 / self.steps.max(1) as f64).round() as usize;
        eprint!(
            "\r[{}{}] {}/{}  loss {:.4}  lr {:.2e}  |g| {norm}  {:.0} tok/s  MFU {:.1}%  left {}   ",
            "=".repeat(filled.min(width)),
            " ".repeat(width - filled.min(width)),
            s.step,
            self.steps,
            s.loss,
            s.lr,
            s.tokens_per_s,
            100.0 * mfu,
            fsdp_planner::timeline::secs(left)
        );
        self.line_open = true;
    }

    /// The closing lines (text) and the mean tokens/s.
    fn summary(mut self, plan: &Plan, reps: &[fsdp_runtime::train::StepReport]) -> (String, f64) {
        if self.line_open {
            eprintln!();
            self.line_open = false;
        }
        // the first step records the arena and warms up: the mean is over the rest
        let later: Vec<f64> = reps.iter().skip(1).map(|s| s.tokens_per_s).collect();
        let tps = if later.is_empty() { reps.iter().map(|s| s.tokens_per_s).sum::<f64>() / reps.len().max(1) as f64 } else { later.iter().sum::<f64>() / later.len() as f64 };
        let measured = reps.iter().map(|s| s.peak_bytes).max().unwrap_or(0);
        // --offload cpu: the host's too
        let host = match (reps.iter().filter_map(|s| s.host_peak_bytes).max(), &plan.memory.host) {
            (Some(m), Some(h)) => format!("; host {} measured vs {} planned", fsdp_planner::print::bytes(m), fsdp_planner::print::bytes(h.peak_bytes)),
            _ => String::new(),
        };
        let text = format!(
            "done: {} steps in {}, final loss {:.6}; {:.1} tokens/s ({:.2}% MFU); peak {} measured (rank 0) vs {} planned{host}",
            reps.len(),
            fsdp_planner::timeline::secs(self.started.elapsed().as_secs_f64()),
            reps.last().map_or(f64::NAN, |s| s.loss),
            tps,
            100.0 * self.mfu(tps),
            fsdp_planner::print::bytes(measured),
            fsdp_planner::print::bytes(plan.memory.peak_bytes)
        );
        (text, tps)
    }
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
pub(crate) fn consolidate(dir: &Path, out: Option<&Path>, hf: Option<&Path>, config: Option<&Path>) -> Result<()> {
    let ckpt = if dir.join("latest").exists() { fsdp_runtime::checkpoint::latest(dir).map_err(user)? } else { dir.to_path_buf() };
    if let Some(out) = out {
        not_an_input(out, &[dir])?;
        let n = fsdp_runtime::checkpoint::consolidate(&ckpt, out).map_err(user)?;
        eprintln!("wrote {} ({n} tensors, HF names) from {}", out.display(), ckpt.display());
        return Ok(());
    }
    let Some(hf) = hf else { bail!(UserError("consolidate: give -o FILE or --hf DIR".into())) };
    not_an_input(hf, &[dir])?;
    // the model's HF config: given, or the shipped one beside models/<model>.ron
    let plan_text = read(&ckpt.join("plan.ron"))?;
    let plan: Plan = ron::from_str(&plan_text).map_err(|e| user(format!("{}: corrupted plan: {e}", ckpt.join("plan.ron").display())))?;
    let cfg_path = match config {
        Some(c) => c.to_path_buf(),
        None => search_dirs("models")
            .into_iter()
            .map(|d| d.join(format!("{}.config.json", plan.model_name)))
            .find(|p| p.exists())
            .ok_or_else(|| user(format!("no HF config.json for model `{}` in models/: give --config CONFIG.json (the one the model was imported from)", plan.model_name)))?,
    };
    let text = read(&cfg_path)?;
    let mut cfg: serde_json::Value = serde_json::from_str(&text).map_err(|e| json_error(&cfg_path, &text, "not a config.json: ", e))?;
    // the config must describe the model the checkpoint holds
    let model = fsdp_ir::hf::import_hf(&text, &cfg_path.display().to_string(), &plan.model_name).map_err(user)?;
    for p in plan.units.iter().flat_map(|u| &u.params) {
        if model.param(&p.name).is_none_or(|q| q.shape != p.shape) {
            bail!(UserError(format!("{}: describes another model than the checkpoint's `{}` (parameter `{}`)", cfg_path.display(), plan.model_name, p.name)));
        }
    }
    std::fs::create_dir_all(hf).map_err(|e| user(format!("{}: {e}", hf.display())))?;
    let weights = hf.join("model.safetensors");
    let n = fsdp_runtime::checkpoint::consolidate(&ckpt, &weights).map_err(user)?;
    // the weights are float32 as trained (the masters)
    cfg["torch_dtype"] = "float32".into();
    write_atomic(&hf.join("config.json"), &format!("{}\n", serde_json::to_string_pretty(&cfg)?))?;
    let mut gen = serde_json::json!({"_from_model_config": true});
    for k in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if let Some(v) = cfg.get(k).filter(|v| !v.is_null()) {
            gen[k] = v.clone();
        }
    }
    write_atomic(&hf.join("generation_config.json"), &format!("{}\n", serde_json::to_string_pretty(&gen)?))?;
    eprintln!("wrote {} (config.json, model.safetensors with {n} tensors, generation_config.json) from {}: AutoModelForCausalLM.from_pretrained loads it", hf.display(), ckpt.display());
    Ok(())
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn consolidate(_: &Path, _: Option<&Path>, _: Option<&Path>, _: Option<&Path>) -> Result<()> {
    train_missing()
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn train(_: RunArgs, _: Option<&clap::ArgMatches>) -> Result<()> {
    train_missing()
}

#[cfg(not(feature = "runtime"))]
pub(crate) fn train_missing() -> Result<()> {
    bail!(UserError(
        "this fsdp-plan was built without the runtime: build with `cargo build --features runtime` after `bash scripts/setup-venv.sh && source scripts/env.sh` (libtorch from the project venv)".into()
    ))
}
