//! `fsdp-plan run`: trains a compiled plan for N steps, every rank a thread of one process
//! ([`run_cpu`]: CPU, collectives through [`crate::comm::CpuGroup`]), or one rank per process
//! under a launcher ([`run_process`]: CPU over the rendezvous sockets, or a GPU with NCCL).
//! Both run the same per-rank loop.

pub mod checkpoint;
pub mod data;
pub mod lr;
pub mod st_file;

use crate::comm::{Collective, CpuGroup};
use crate::error::RtError;
use crate::exec::Rank;
use crate::ops::{Attn, Noise, OpCx};
use crate::optim::Optim;
use fsdp_ir::Model;
use fsdp_planner::Plan;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;
use tch::{Kind, Tensor};

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub steps: usize,
    /// The (peak) learning rate.
    pub lr: f64,
    /// `--lr-schedule`, `--warmup-steps`, `--decay-steps`, `--min-lr` ([`crate::lr`]).
    pub lr_schedule: crate::lr::Kind,
    pub warmup_steps: u64,
    pub decay_steps: Option<u64>,
    pub min_lr: f64,
    /// `--clip-grad-norm`: FSDP2's `clip_grad_norm_` before each optimizer step.
    pub clip_grad_norm: Option<f64>,
    /// `--weight-decay --beta1 --beta2 --eps`.
    pub hyper: crate::optim::Hyper,
    /// A non-finite loss or gradient norm skips the step instead of stopping the run.
    pub skip_nonfinite: bool,
    /// Keep only the newest N checkpoints (0: all).
    pub keep_last: usize,
    /// `--eval-data`: held-out tokens (same formats as `data`), evaluated every
    /// `eval_every` steps (and after the last) over its first `eval_batches` windows.
    pub eval_data: Option<PathBuf>,
    pub eval_every: usize,
    pub eval_batches: usize,
    pub seed: i64,
    /// HF-named safetensors with the initial weights; `None` = HF-style random init.
    pub weights: Option<PathBuf>,
    /// A token file ([`crate::data`]); `None` = synthetic tokens.
    pub data: Option<PathBuf>,
    pub data_format: crate::data::Format,
    /// Write sharded checkpoints here (every `save_every` steps and at the end).
    pub save: Option<PathBuf>,
    pub save_every: usize,
    /// Continue from the latest checkpoint in this directory.
    pub resume: Option<PathBuf>,
    /// Stop after this many steps in total (simulates a run killed there).
    pub stop_after: Option<usize>,
    /// Write rank 0's measured timeline of the last step here (Chrome/Perfetto JSON, the
    /// same format as `fsdp-plan trace`).
    pub trace: Option<PathBuf>,
    /// Run every step in the plan's arena (`exec::StepStats::arena`); `false`: on the heap.
    /// (CPU only: a GPU rank runs in libtorch's CUDA caching allocator.)
    pub arena: bool,
    /// Fault injection for the failure tests: (rank, step) — that rank aborts right after
    /// finishing that step (and its checkpoint), as a crashed process.
    pub exit_after: Option<(usize, usize)>,
}

impl RunConfig {
    /// The learning-rate schedule over the run's steps.
    pub fn schedule(&self) -> crate::lr::Schedule {
        crate::lr::Schedule { kind: self.lr_schedule, lr: self.lr, warmup: self.warmup_steps, decay: self.decay_steps, min_lr: self.min_lr, steps: self.steps as u64 }
    }

    /// The options a checkpoint records and a resume compares (what changes the training).
    pub fn recorded(&self) -> serde_json::Value {
        serde_json::json!({
            "lr": self.lr,
            "lr_schedule": self.lr_schedule,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "min_lr": self.min_lr,
            "steps": self.steps,
            "clip_grad_norm": self.clip_grad_norm,
            "hyper": self.hyper,
            "seed": self.seed,
        })
    }

    pub fn new(steps: usize) -> RunConfig {
        RunConfig {
            steps,
            lr: 1e-3,
            lr_schedule: crate::lr::Kind::Constant,
            warmup_steps: 0,
            decay_steps: None,
            min_lr: 0.0,
            clip_grad_norm: None,
            hyper: crate::optim::Hyper::default(),
            skip_nonfinite: false,
            keep_last: 0,
            eval_data: None,
            eval_every: 0,
            eval_batches: 1,
            seed: 0,
            weights: None,
            data: None,
            data_format: crate::data::Format::Auto,
            save: None,
            save_every: 0,
            resume: None,
            stop_after: None,
            trace: None,
            arena: true,
            exit_after: None,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StepReport {
    pub step: usize,
    /// The data epoch the step read from (0-based; a token file's windows start over each).
    pub epoch: u64,
    /// The learning rate the step's update used.
    pub lr: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: Option<f64>,
    /// The mean loss over the held-out batches, on the steps that evaluate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// The update was skipped (non-finite, `--skip-nonfinite`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// What happened besides the step: a checkpoint saved, options that differ from the
    /// resumed checkpoint's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Mean over ranks of each rank's mean micro-batch loss.
    pub loss: f64,
    /// Tokens of the global batch per second of wall time (all ranks).
    pub tokens_per_s: f64,
    /// Rank 0's measured peak ([`crate::exec::StepStats`]: persistent state + counted allocations).
    pub peak_bytes: u64,
    /// Under `--offload cpu` on the CPU: rank 0's measured host peak (the shards, grads and
    /// optimizer state FSDP2's CPUOffloadPolicy keeps there), beside the plan's `host`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_peak_bytes: Option<u64>,
    /// Rank 0's memory by schedule op, on the last step's report only (for
    /// [`crate::exec::memory_report`]).
    #[serde(skip)]
    pub memory: Option<crate::exec::StepStats>,
}

/// SplitMix64: a small deterministic generator owned by the run (the global torch RNG is
/// shared by every thread of the process, so runs would not be reproducible).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let r = crate::ops::mix(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        r
    }
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// HF-like init (normal(0, 0.02) matrices, ones for norm weights, zeros for biases).
fn init(model: &Model, seed: i64) -> HashMap<String, Tensor> {
    let mut rng = Rng(seed as u64);
    model
        .primary_params()
        .map(|p| {
            let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
            let t = if p.name.ends_with(".bias") {
                Tensor::zeros(shape.as_slice(), tch::kind::FLOAT_CPU)
            } else if p.shape.len() == 1 {
                Tensor::ones(shape.as_slice(), tch::kind::FLOAT_CPU)
            } else {
                let v: Vec<f32> = (0..p.numel()).map(|_| (0.02 * rng.normal()) as f32).collect();
                Tensor::from_slice(&v).reshape(shape.as_slice())
            };
            (p.name.clone(), t)
        })
        .collect()
}

/// The first token of step `step`'s window in a file of `n` tokens, `per_step` tokens a step:
/// the file's whole windows in order, back to the first after the last (an epoch); `None`
/// when not even one window fits.
pub fn window_start(n: u64, per_step: u64, step: u64) -> Option<u64> {
    let windows = n.checked_div(per_step).filter(|&w| w > 0)?;
    Some(step % windows * per_step)
}

/// The run's data ([`crate::data`]): the token file mapped, or synthetic tokens.
pub fn data_of(plan: &Plan, model: &Model, cfg: &RunConfig) -> Result<crate::data::Data, RtError> {
    let o = &plan.options;
    let per_step = o.world_size * o.grad_accum as u64 * o.batch * o.seq;
    let vocab = vocab_size(model);
    let source = match &cfg.data {
        Some(p) => {
            let f = crate::data::TokenFile::open(p, cfg.data_format)?;
            if f.len < per_step {
                return Err(RtError::File { file: p.display().to_string(), message: format!("{} tokens, but a step needs {per_step} (world size × grad accum × batch × seq)", f.len) });
            }
            crate::data::Source::File(f)
        }
        None => crate::data::Source::Synthetic { seed: cfg.seed as u64 ^ 0xDA7A },
    };
    Ok(crate::data::Data { source, per_step, vocab })
}

/// Rank `r`'s micro-batches of step `step` (0-based): each `[batch, seq]` ids (the labels
/// are the ids: the model shifts them). Every rank reads (and checks) the whole window, so
/// that a bad id stops every rank alike.
fn rank_batches(plan: &Plan, data: &crate::data::Data, step: u64, r: usize) -> Result<Vec<Tensor>, RtError> {
    let o = &plan.options;
    let (k, b, s) = (o.grad_accum as i64, o.batch as i64, o.seq as i64);
    let all = data.read(step, 0, data.per_step)?;
    let per_rank = (k * b * s) as usize;
    let mine = Tensor::from_slice(&all[r * per_rank..(r + 1) * per_rank]).reshape([k, b, s]);
    Ok((0..k).map(|m| mine.get(m).copy()).collect())
}

/// The mean loss of the model as it stands over the first `n` windows of `eval` (each split
/// over the ranks as a training step's is): every unit's parameters gathered in full, the
/// forward run without gradients (in the plan's compute dtype), the loss averaged over ranks
/// and windows.
fn evaluate(plan: &Plan, model: &Model, mesh: &crate::comm::Groups, rank: &Rank, eval: &crate::data::Data, n: usize, cx: &OpCx) -> Result<f64, RtError> {
    let device = rank.device;
    // weights gathered in float8 are cast from the sharded (master) values, not from their
    // copies in the param dtype: kept as they are for the float8 linears' casts
    let from_master = match plan.options.float8 {
        Some(f) if f.all_gather => fsdp_planner::float8::float8_weights(model),
        _ => Default::default(),
    };
    let mut full = HashMap::new();
    for (u, shard) in rank.shards.iter().enumerate() {
        // (an offloaded shard is gathered from a device copy)
        let gathered = mesh.shard.all_gather(&shard.to_device(device))?;
        for (name, t) in crate::exec::copy_out(plan, u, &gathered) {
            let t = if from_master.contains(&name) { t } else { t.to_kind(cx.kind) };
            full.insert(name, t);
        }
    }
    let params = crate::reference::Params { tensors: full };
    let ecx = OpCx { train: None, ..*cx };
    let mut sum = 0.0;
    for w in 0..n {
        let mbs = rank_batches(plan, eval, w as u64, mesh.world.rank())?;
        let mut local = 0.0;
        for ids in &mbs {
            let ids = ids.to_device(device);
            let inputs = HashMap::from([("input_ids".to_string(), ids.shallow_clone()), ("labels".to_string(), ids)]);
            local += tch::no_grad(|| crate::reference::forward_loss(model, &params, &inputs, &ecx))?.double_value(&[]);
        }
        sum += world_avg(mesh.world, local / mbs.len().max(1) as f64, device)?;
    }
    Ok(sum / n.max(1) as f64)
}

/// The ids a batch may hold: below the rows of every embedding the ids index and the classes
/// of the loss (the labels are the ids).
pub fn vocab_size(model: &Model) -> i64 {
    let rows = model.ops.iter().filter_map(|o| match &o.kind {
        fsdp_ir::OpKind::Embedding => o.params.first().and_then(|n| model.params.iter().find(|p| &p.name == n)).and_then(|p| p.shape.first().copied()),
        fsdp_ir::OpKind::CrossEntropy { vocab } => Some(*vocab),
        _ => None,
    });
    rows.min().unwrap_or(2) as i64
}

/// The run's initial full weights (HF names, on the host).
fn initial_weights(model: &Model, cfg: &RunConfig) -> Result<HashMap<String, Tensor>, RtError> {
    Ok(match &cfg.weights {
        Some(w) => crate::reference::Params::from_safetensors(model, w)?.tensors.into_iter().map(|(n, t)| (n, t.detach())).collect(),
        None => init(model, cfg.seed),
    })
}

fn check_model(plan: &Plan, model: &Model) -> Result<(), RtError> {
    if fsdp_planner::model_hash(model) != plan.model_hash {
        return Err(RtError::Plan(format!("plan {} was compiled for another model (hash mismatch)", plan.model_name)));
    }
    Ok(())
}

/// Rank 0's last step (its timeline and memory), for the trace and the memory report.
#[derive(Default)]
struct LastStep {
    spans: Vec<(f64, f64)>,
    mem: Option<crate::exec::StepStats>,
}

const OTHER_FAILED: &str = "another rank failed to start";

/// The average over the world of one number per rank (on the rank's device: NCCL reduces
/// device memory).
fn world_avg(g: &dyn Collective, x: f64, device: tch::Device) -> Result<f64, RtError> {
    Ok(g.all_reduce_avg(&Tensor::from(x).to_device(device))?.double_value(&[]))
}

/// One rank's training loop, on its thread (CPU rank threads) or in its own process (a job
/// under `fsdp-plan launch`, torchrun or SLURM): start from the full weights or the latest
/// checkpoint, run the steps on `device`, checkpoint, and agree with every rank on the loss
/// and rank 0's peak.
/// `progress`, when given, hears each step as it ends (the reports have no memory breakdown:
/// [`finish`] adds rank 0's to the last).
#[allow(clippy::too_many_arguments)]
fn rank_loop(
    plan: &Plan,
    model: &Model,
    cfg: &RunConfig,
    mesh: &crate::comm::Groups,
    device: tch::Device,
    full: &HashMap<String, Tensor>,
    data: &crate::data::Data,
    start: Instant,
    last: &std::sync::Mutex<LastStep>,
    mut progress: Option<&mut dyn FnMut(&StepReport)>,
) -> Result<Vec<StepReport>, RtError> {
    let g = mesh.world;
    let b = plan.options.batch as i64;
    let schedule = cfg.schedule();
    let mut notes = vec![];
    let setup = match &cfg.resume {
        Some(dir) => crate::checkpoint::latest(dir).and_then(|c| {
            let (r, step, meta) = crate::checkpoint::load_any(&c, plan, g.rank())?;
            if let Some(n) = meta.resharded_from {
                notes.push(format!("checkpoint: {} was saved by world size {n} (or another wrap): resharded on load", c.display()));
            }
            let now = cfg.recorded();
            if let Some(then) = meta.run.as_ref().and_then(|v| v.as_object()) {
                let differ: Vec<String> = then.iter().filter(|(k, v)| now.get(k.as_str()) != Some(v)).map(|(k, v)| format!("{k} {v} → {}", now.get(k.as_str()).cloned().unwrap_or_default())).collect();
                if !differ.is_empty() {
                    notes.push(format!("resuming with options that differ from the checkpoint's: {}", differ.join(", ")));
                }
            }
            Ok((r, step))
        }),
        None => Rank::from_full(plan, full, g.rank()).map(|r| (r, 0)),
    };
    // Every rank learns whether every rank could start, so that one rank's bad checkpoint
    // ends all of them instead of leaving them in a collective.
    let ok = world_avg(g, if setup.is_ok() { 1.0 } else { 0.0 }, device)?;
    let (rank, done) = match setup {
        Err(e) => return Err(e),
        // not this rank's input: a peer's (exit 1 under `run`, so that a launcher
        // names the rank whose input it was)
        Ok(_) if ok < 1.0 => return Err(RtError::Comm(OTHER_FAILED.into())),
        Ok(x) => x,
    };
    if done >= cfg.steps {
        // (every rank read the same step)
        return Err(RtError::Plan(format!("the checkpoint is at step {done}, and --steps {} counts from the start: nothing left to run (give more steps)", cfg.steps)));
    }
    let mut rank = rank.to_device(device, plan.options.offload == fsdp_planner::Offload::Cpu);
    let cx0 = OpCx {
        attn: if plan.attn_implementation == "eager" { Attn::Eager } else { Attn::Sdpa },
        kind: plan.options.param_dtype.or(plan.options.master_dtype).map(crate::exec::kind_of).unwrap_or(Kind::Float),
        train: Some(Noise { seed: cfg.seed as u64, step: 0, micro: 0, row0: (g.rank() as i64 * b) as u64 }),
        float8: plan.options.float8.is_some(),
    };
    // the plan's arena: on the CPU placed by the counting allocator, on a GPU by the allocator
    // the shim puts in front of libtorch's CUDA caching allocator (when the build has it)
    let arena = cfg.arena && (device == tch::Device::Cpu || crate::shim::cuda_arena_built());
    if device != tch::Device::Cpu {
        // cuBLAS makes a workspace per thread at its first matmul (this thread's forward,
        // autograd's device thread's backward) and keeps it: made here, before the first
        // step, it is neither in that step's arena records nor in its peak
        for kind in [Kind::Float, cx0.kind] {
            let a = Tensor::f_ones([8, 8], (kind, device))?.set_requires_grad(true);
            a.f_matmul(&a)?.f_sum(Kind::Float)?.f_backward()?;
        }
    }
    let last_step = cfg.stop_after.unwrap_or(cfg.steps).min(cfg.steps);
    let eval = match &cfg.eval_data {
        Some(p) => Some(crate::data::Data { source: crate::data::Source::File(crate::data::TokenFile::open(p, cfg.data_format)?), per_step: data.per_step, vocab: data.vocab }),
        None => None,
    };
    let eval = eval.as_ref();
    let mut out = vec![];
    let mut prev = 0.0;
    for i in done..last_step {
        let st = rank_batches(plan, data, i as u64, g.rank())?;
        let mine: Vec<HashMap<String, Tensor>> = st
            .iter()
            .map(|ids| {
                let ids = ids.to_device(device);
                HashMap::from([("input_ids".to_string(), ids.shallow_clone()), ("labels".to_string(), ids.copy())])
            })
            .collect();
        let cx = OpCx { train: cx0.train.map(|n| Noise { step: i as u64, ..n }), ..cx0 };
        let mut spans = vec![];
        let mut stats = crate::exec::StepStats { arena: arena.then(Default::default), ..Default::default() };
        // the op timeline is only written as rank 0's `--trace` (on a GPU it costs an event
        // per op and a synchronization per step)
        let timed = cfg.trace.is_some() && g.rank() == 0;
        let lr = schedule.lr_at(i as u64);
        let update = crate::exec::Update { opt: Optim::with(plan.options.optimizer, lr, &cfg.hyper), clip: cfg.clip_grad_norm, skip_nonfinite: cfg.skip_nonfinite };
        let l = crate::exec::step_timed(plan, model, mesh, &mut rank, &mine, &cx, update, timed.then_some(&mut spans), Some(&mut stats)).map_err(|e| match e {
            RtError::NonFinite(m) => RtError::NonFinite(format!("step {}: {m}; the last good checkpoint is kept (--skip-nonfinite skips such steps)", i + 1)),
            e => e,
        })?;
        let peak = world_avg(g, if g.rank() == 0 { stats.peak_bytes as f64 * g.size() as f64 } else { 0.0 }, device)? as u64;
        // (the host's is only measured on the CPU; every rank knows whether it was)
        let host_peak = match stats.host_peak_bytes {
            Some(h) => Some(world_avg(g, if g.rank() == 0 { h as f64 * g.size() as f64 } else { 0.0 }, device)? as u64),
            None => None,
        };
        if g.rank() == 0 {
            *last.lock().unwrap_or_else(|e| e.into_inner()) = LastStep { spans, mem: Some(stats) };
        }
        let avg = world_avg(g, l, device)?;
        if !avg.is_finite() && !cfg.skip_nonfinite {
            return Err(RtError::NonFinite(format!("step {}: the loss is {avg}; the last good checkpoint is kept (--skip-nonfinite skips such steps)", i + 1)));
        }
        let now = start.elapsed().as_secs_f64();
        let n = i + 1;
        if let Some(dir) = &cfg.save {
            if (cfg.save_every > 0 && n % cfg.save_every == 0) || n == cfg.steps {
                crate::checkpoint::save_rank(dir, plan, g.rank(), &rank, n, &cfg.recorded())?;
                world_avg(g, 0.0, device)?; // every rank has written
                if g.rank() == 0 {
                    crate::checkpoint::commit(dir, plan, n)?;
                    let gone = crate::checkpoint::keep_last(dir, cfg.keep_last)?;
                    notes.push(format!("checkpoint: saved step {n} to {}{}", crate::checkpoint::step_dir(dir, n).display(), if gone.is_empty() { String::new() } else { format!(" (removed {})", gone.join(", ")) }));
                }
                world_avg(g, 0.0, device)?;
            }
        }
        let eval_loss = match eval {
            Some(e) if (cfg.eval_every > 0 && n % cfg.eval_every == 0) || n == cfg.steps => Some(evaluate(plan, model, mesh, &rank, e, cfg.eval_batches.max(1), &cx)?),
            _ => None,
        };
        let rep = StepReport {
            step: n,
            epoch: data.epoch(i as u64),
            lr,
            grad_norm: rank.last_grad_norm,
            eval_loss,
            skipped: rank.skipped || !avg.is_finite(),
            notes: std::mem::take(&mut notes),
            loss: avg,
            tokens_per_s: tokens_per_step(plan) / (now - prev).max(1e-9),
            peak_bytes: peak,
            host_peak_bytes: host_peak,
            memory: None,
        };
        prev = now;
        if let Some(p) = progress.as_mut() {
            p(&rep);
        }
        out.push(rep);
        if cfg.exit_after == Some((g.rank(), n)) {
            // fault injection for the failure tests: this rank dies here, as a crashed one
            eprintln!("rank {}: exiting after step {n} (FSDP_PLAN_TEST_EXIT_AFTER)", g.rank());
            std::process::abort();
        }
    }
    Ok(out)
}

/// Tokens of the global batch of one step.
fn tokens_per_step(plan: &Plan) -> f64 {
    let o = &plan.options;
    (o.world_size * o.grad_accum as u64 * o.batch * o.seq) as f64
}

/// The run's reports with rank 0's memory breakdown on the last; writes the trace of the
/// last step to `trace`.
fn finish(plan: &Plan, trace: Option<&std::path::Path>, mut reps: Vec<StepReport>, last: LastStep) -> Result<Vec<StepReport>, RtError> {
    if let Some(path) = trace {
        write_trace(plan, &last.spans, path)?;
    }
    if let Some(r) = reps.last_mut() {
        r.memory = last.mem;
    }
    Ok(reps)
}

/// Trains with every rank a thread of this process (collectives through
/// [`crate::comm::CpuGroup`]); returns one report per step.
pub fn run_cpu(plan: &Plan, model: &Model, cfg: &RunConfig, mut on_step: impl FnMut(&StepReport) + Send) -> Result<Vec<StepReport>, RtError> {
    check_model(plan, model)?;
    let ws = plan.options.world_size as usize;
    let full = initial_weights(model, cfg)?;
    let data = data_of(plan, model, cfg)?;
    let data = &data;
    // world, shard and replicate groups (the latter two differ from the world for hybrid
    // sharding and no-shard)
    let groups = crate::comm::cpu_mesh(ws, plan.options.shard_size() as usize);
    // (and reshard_after_forward=N's post-forward groups, by N)
    let sizes = crate::comm::post_forward_sizes(plan);
    let mut runs: Vec<std::vec::IntoIter<CpuGroup>> = sizes.iter().map(|&n| crate::comm::cpu_runs(ws, n).map(Vec::into_iter)).collect::<Result<_, _>>()?;
    let start = Instant::now();
    // Tensors are Send but not Sync: each rank thread gets its own handles.
    type Mesh = (CpuGroup, CpuGroup, CpuGroup);
    type RankInput = (Mesh, Vec<(usize, CpuGroup)>, HashMap<String, Tensor>);
    let per_rank: Vec<RankInput> = groups
        .into_iter()
        .map(|m| {
            let w: HashMap<String, Tensor> = full.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
            let post: Vec<(usize, CpuGroup)> = sizes.iter().zip(runs.iter_mut()).filter_map(|(&n, r)| r.next().map(|g| (n, g))).collect();
            (m, post, w)
        })
        .collect();
    let last = std::sync::Mutex::new(LastStep::default());
    let last = &last;
    // rank 0 reports each step as it ends
    let mut hear: Option<&mut (dyn FnMut(&StepReport) + Send)> = Some(&mut on_step);
    let results: Vec<Result<Vec<StepReport>, RtError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = per_rank
            .into_iter()
            .map(|((g, shard, replicate), post, full)| {
                let progress = if g.rank() == 0 { hear.take() } else { None };
                sc.spawn(move || -> Result<Vec<StepReport>, RtError> {
                    // rank threads share the cores; one rank has them all
                    if ws > 1 {
                        tch::set_num_threads(1);
                    }
                    let post: Vec<(usize, &dyn crate::comm::Collective)> = post.iter().map(|(n, g)| (*n, g as &dyn crate::comm::Collective)).collect();
                    let mesh = crate::comm::Groups { world: &g, shard: &shard, replicate: &replicate, post: &post };
                    let progress = progress.map(|p| p as &mut dyn FnMut(&StepReport));
                    rank_loop(plan, model, cfg, &mesh, tch::Device::Cpu, &full, data, start, last, progress)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|p| {
                    let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                    Err(RtError::Plan(format!("a rank thread panicked: {}", msg.lines().next().unwrap_or(""))))
                })
            })
            .collect()
    });
    // report the root cause, not a rank that only heard another one failed
    let mut oks = vec![];
    let mut first_err = None;
    for r in results {
        match r {
            Ok(v) => oks.push(v),
            Err(e) => {
                let secondary = matches!(&e, RtError::Comm(m) if m == OTHER_FAILED);
                if first_err.is_none() || (!secondary && matches!(&first_err, Some(RtError::Comm(m)) if m == OTHER_FAILED)) {
                    first_err = Some(e);
                }
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let r0 = oks.into_iter().next().unwrap_or_default();
    let last = std::mem::take(&mut *last.lock().unwrap_or_else(|e| e.into_inner()));
    finish(plan, cfg.trace.as_deref(), r0, last)
}

/// The device and collectives of a rank that runs in its own process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CPU tensors, collectives over the rendezvous sockets ([`crate::comm_tcp::TcpGroup`]).
    Cpu,
    /// GPU `LOCAL_RANK`, NCCL collectives ([`crate::nccl::NcclGroup`]; feature `cuda`).
    Cuda,
}

/// Trains as rank `env.rank` of a job whose other ranks are other processes (started by
/// `fsdp-plan launch`, torchrun, SLURM or mpirun: `env` is what they set): rendezvous at
/// MASTER_ADDR:MASTER_PORT, then the same loop as [`run_cpu`]'s rank threads, on the CPU with
/// collectives over the rendezvous sockets, or on GPU `LOCAL_RANK` with NCCL. Every rank
/// returns the same reports (losses averaged over the world; rank 0's peak and timeline) and
/// hands each to `on_step` as its step ends.
/// A collective that fails — a rank that died, a peer silent for `timeout` — ends this rank
/// with an error naming the peer.
pub fn run_process(plan: &Plan, model: &Model, cfg: &RunConfig, env: &crate::launch_env::LaunchEnv, backend: Backend, timeout: std::time::Duration, mut on_step: impl FnMut(&StepReport)) -> Result<Vec<StepReport>, RtError> {
    check_model(plan, model)?;
    let ws = plan.options.world_size as usize;
    if ws != env.world_size {
        return Err(RtError::Plan(format!(
            "the plan is for world size {ws}, but {} started {} ranks (WORLD_SIZE={}): plan with --world-size {}",
            env.launcher, env.world_size, env.world_size, env.world_size
        )));
    }
    let full = initial_weights(model, cfg)?;
    let data = data_of(plan, model, cfg)?;
    let rcfg = crate::rendezvous::Config::from_env(env, timeout);
    let last = std::sync::Mutex::new(LastStep::default());
    let start = Instant::now();
    let shard_size = plan.options.shard_size() as usize;
    let rows = match backend {
        Backend::Cpu => {
            let rz = crate::rendezvous::rendezvous(&rcfg, || Ok(crate::rendezvous::random_id())).map_err(|e| RtError::Comm(e.to_string()))?;
            rz.agree(&job_key(plan, cfg, backend), Some(timeout)).map_err(|e| RtError::Comm(e.to_string()))?;
            let world = crate::comm_tcp::TcpGroup::new(rz, Some(timeout));
            let (shard, replicate) = crate::comm::SubGroup::mesh(&world, shard_size);
            let mesh = crate::comm::Groups { world: &world, shard: &shard, replicate: &replicate, post: &[] };
            rank_loop(plan, model, cfg, &mesh, tch::Device::Cpu, &full, &data, start, &last, Some(&mut on_step))?
        }
        Backend::Cuda => {
            let rz = crate::nccl::rendezvous(&rcfg).map_err(RtError::Comm)?;
            rz.agree(&job_key(plan, cfg, backend), Some(timeout)).map_err(|e| RtError::Comm(e.to_string()))?;
            let ordinal = gpu_ordinal(env.local_rank, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref());
            let world = crate::nccl::NcclGroup::from_rendezvous(&rz, ordinal).map_err(|e| RtError::Comm(format!("rank {}: {e}", env.rank)))?;
            let device = world.device();
            let (replica, index, s) = crate::comm::mesh_position(env.rank, ws, shard_size);
            let split = |color, key| world.split(color, key).map_err(|e| RtError::Comm(format!("rank {}: {e}", env.rank)));
            // hybrid sharding: the mesh's shard and replicate groups are communicators of their
            // own, split off the world's: a shard group per replica, a replicate group per
            // shard index, each ordered by the other coordinate
            let hybrid = match s > 1 && s < ws {
                true => Some((split(replica, index)?, split(s + index, replica)?)),
                false => None,
            };
            let (sub_shard, sub_replicate) = crate::comm::SubGroup::mesh(&world, shard_size);
            let (shard, replicate): (&dyn crate::comm::Collective, &dyn crate::comm::Collective) = match &hybrid {
                Some((a, b)) => (a, b),
                None => (&sub_shard, &sub_replicate),
            };
            // reshard_after_forward=N: a communicator per post-forward group of N consecutive
            // ranks (FSDP2's post-forward mesh), so that the backward's all-gather of the
            // slices runs among them alone
            let post: Vec<(usize, crate::nccl::NcclGroup)> = crate::comm::post_forward_sizes(plan).into_iter().map(|n| split(env.rank / n, env.rank % n).map(|g| (n, g))).collect::<Result<_, _>>()?;
            let mut watched = vec![&world];
            watched.extend(hybrid.iter().flat_map(|(a, b)| [a, b]));
            watched.extend(post.iter().map(|(_, g)| g));
            // a collective stuck on a dead or hung peer, or an NCCL error, ends this process
            // (the launcher then stops the others; checkpoints are whole files)
            let r = env.rank;
            let _watchdog = crate::nccl::watchdog(&watched, timeout, move |msg| {
                eprintln!("error: rank {r}: {msg}; aborted the NCCL communicators");
                // at once, as torch's watchdog: no exit handlers or destructors while the main
                // thread may still be inside CUDA
                extern "C" {
                    fn _exit(code: i32) -> !;
                }
                unsafe { _exit(1) }
            })
            .map_err(|e| RtError::Comm(format!("rank {}: {e}", env.rank)))?;
            let post: Vec<(usize, &dyn crate::comm::Collective)> = post.iter().map(|(n, g)| (*n, g as &dyn crate::comm::Collective)).collect();
            let mesh = crate::comm::Groups { world: &world, shard, replicate, post: &post };
            rank_loop(plan, model, cfg, &mesh, device, &full, &data, start, &last, Some(&mut on_step))?
        }
    };
    let last = last.into_inner().unwrap_or_else(|e| e.into_inner());
    // (only rank 0 wrote `last`; each step was reported as it ended)
    finish(plan, cfg.trace.as_deref().filter(|_| env.rank == 0), rows, last)
}

/// What every rank of a job must have been started with alike ([`Rendezvous::agree`]): the
/// plan (its hash covers the model and every option: world size, layout, dtypes, optimizer…)
/// and the run options that change what is trained. Paths are compared by whether one is
/// given, not by name (nodes may mount files at other paths).
///
/// [`Rendezvous::agree`]: crate::rendezvous::Rendezvous::agree
fn job_key(plan: &Plan, cfg: &RunConfig, backend: Backend) -> Vec<(&'static str, String)> {
    let given = |p: &Option<PathBuf>, none: &str| p.as_ref().map_or(none.to_string(), |_| "a file".to_string());
    vec![
        ("plan", plan.plan_hash.clone()),
        ("backend", format!("{backend:?}").to_lowercase()),
        ("steps", cfg.steps.to_string()),
        ("lr", cfg.lr.to_string()),
        ("schedule, clipping and optimizer options", {
            let mut r = cfg.recorded();
            if let Some(o) = r.as_object_mut() {
                for k in ["steps", "lr", "seed"] {
                    o.remove(k); // (their own entries)
                }
            }
            r.to_string()
        }),
        ("seed", cfg.seed.to_string()),
        ("weights", given(&cfg.weights, "random init")),
        ("data", given(&cfg.data, "synthetic tokens")),
        ("resume", given(&cfg.resume, "no")),
    ]
}

/// The GPU of a rank: `LOCAL_RANK` among the visible devices (torchrun, `launch`), or device 0
/// when the launcher made a single device visible to each task (SLURM's
/// `--gpus-per-task=1`: CUDA_VISIBLE_DEVICES names one device per task).
pub fn gpu_ordinal(local_rank: usize, cuda_visible_devices: Option<&str>) -> usize {
    match cuda_visible_devices.map(|v| v.split(',').filter(|d| !d.trim().is_empty()).count()) {
        Some(1) => 0,
        _ => local_rank,
    }
}

/// The measured timeline of rank 0's last step as a [`fsdp_planner::timeline::TimeReport`].
/// On the CPU collectives run on the calling thread, so all communication is exposed; on a
/// GPU the spans are device timestamps and a collective's is where it ran on NCCL's stream,
/// so the exposed part is what no compute-stream op covers.
pub fn measured_report(plan: &Plan, spans: &[(f64, f64)]) -> fsdp_planner::timeline::TimeReport {
    use fsdp_planner::timeline::OpSpan;
    let ops: Vec<OpSpan> = plan
        .schedule
        .iter()
        .zip(spans)
        .map(|(o, &(start, end))| OpSpan { op: o.id, stream: o.stream, start, end })
        .collect();
    let hardware = match plan.options.device {
        fsdp_planner::Device::Cpu => "measured: fsdp-plan CPU runtime, rank 0",
        fsdp_planner::Device::Cuda => "measured: fsdp-plan CUDA runtime (device timestamps), rank 0",
    };
    fsdp_planner::timeline::measured(plan, hardware.into(), ops)
}

fn write_trace(plan: &Plan, spans: &[(f64, f64)], path: &std::path::Path) -> Result<(), RtError> {
    let report = measured_report(plan, spans);
    let doc = fsdp_planner::trace::chrome_trace(plan, &report, &[]);
    let text = serde_json::to_string(&doc).map_err(|e| RtError::File { file: path.display().to_string(), message: e.to_string() })?;
    crate::checkpoint::write_via_tmp(path, |t| std::fs::write(t, text).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_of_exactly_n_steps_gives_each_window_once_in_order() {
        use super::window_start;
        // 4 steps of 6 tokens in a file of exactly 24: windows 0, 6, 12, 18, then the epoch wraps
        let got: Vec<u64> = (0..6).map(|st| window_start(24, 6, st).unwrap()).collect();
        assert_eq!(got, [0, 6, 12, 18, 0, 6]);
        // a partial last window is never read; a file shorter than a step has none
        let got: Vec<u64> = (0..4).map(|st| window_start(23, 6, st).unwrap()).collect();
        assert_eq!(got, [0, 6, 12, 0]);
        assert_eq!(window_start(5, 6, 0), None);
        assert_eq!(window_start(6, 0, 0), None);
    }

    #[test]
    fn a_rank_uses_its_local_gpu_or_the_only_one_it_sees() {
        use super::gpu_ordinal;
        assert_eq!(gpu_ordinal(3, None), 3);
        assert_eq!(gpu_ordinal(3, Some("0,1,2,3")), 3);
        // one device per task (SLURM --gpus-per-task=1)
        assert_eq!(gpu_ordinal(3, Some("5")), 0);
        // more ranks than devices: LOCAL_RANK is kept, and Device::new names the mismatch
        assert_eq!(gpu_ordinal(5, Some("0,1")), 5);
    }
}
