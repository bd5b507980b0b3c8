//! `fsdp-plan run`: trains a compiled plan for N steps on CPU rank threads (one thread per
//! rank, collectives through [`crate::comm::CpuGroup`]).

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

pub struct RunConfig {
    pub steps: usize,
    pub lr: f64,
    pub seed: i64,
    /// HF-named safetensors with the initial weights; `None` = HF-style random init.
    pub weights: Option<PathBuf>,
    /// Raw little-endian u32 token ids; `None` = synthetic random tokens.
    pub data: Option<PathBuf>,
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
    pub arena: bool,
}

impl RunConfig {
    pub fn new(steps: usize) -> RunConfig {
        RunConfig {
            steps,
            lr: 1e-3,
            seed: 0,
            weights: None,
            data: None,
            save: None,
            save_every: 0,
            resume: None,
            stop_after: None,
            trace: None,
            arena: true,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StepReport {
    pub step: usize,
    /// Mean over ranks of each rank's mean micro-batch loss.
    pub loss: f64,
    /// Tokens of the global batch per second of wall time (all ranks).
    pub tokens_per_s: f64,
    /// Rank 0's measured peak ([`crate::exec::StepStats`]: persistent state + counted allocations).
    pub peak_bytes: u64,
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

fn load_tokens(path: &PathBuf) -> Result<Tensor, RtError> {
    let bytes = std::fs::read(path).map_err(|e| RtError::File {
        file: path.display().to_string(),
        message: e.to_string(),
    })?;
    if bytes.len() % 4 != 0 || bytes.is_empty() {
        return Err(RtError::File {
            file: path.display().to_string(),
            message: "expected little-endian u32 token ids".into(),
        });
    }
    let ids: Vec<i64> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect();
    Ok(Tensor::from_slice(&ids))
}

/// Trains; returns one report per step.
pub fn run_cpu(plan: &Plan, model: &Model, cfg: &RunConfig, mut on_step: impl FnMut(&StepReport)) -> Result<Vec<StepReport>, RtError> {
    if fsdp_planner::model_hash(model) != plan.model_hash {
        return Err(RtError::Plan(format!("plan {} was compiled for another model (hash mismatch)", plan.model_name)));
    }
    let ws = plan.options.world_size as usize;
    let (b, s) = (plan.options.batch as i64, plan.options.seq as i64);
    let k = plan.options.grad_accum as i64;
    let vocab = model.params.first().map(|p| p.shape[0] as i64).unwrap_or(2);
    let full = match &cfg.weights {
        Some(w) => crate::reference::Params::from_safetensors(model, w)?.tensors.into_iter().map(|(n, t)| (n, t.detach())).collect(),
        None => init(model, cfg.seed),
    };
    let tokens = match &cfg.data {
        Some(p) => Some(load_tokens(p)?),
        None => None,
    };
    let per_step = ws as i64 * k * b * s;
    // step -> rank -> micro-batch -> ids [b, s]
    let mut rng = Rng(cfg.seed as u64 ^ 0xDA7A);
    let mut batches: Vec<Vec<Vec<Tensor>>> = vec![];
    for st in 0..cfg.steps as i64 {
        let global = match &tokens {
            Some(t) => {
                let n = t.size()[0];
                let start = (st * per_step) % (n - per_step).max(1);
                if n < per_step {
                    return Err(RtError::Plan(format!("data has {n} tokens, a step needs {per_step}")));
                }
                t.narrow(0, start, per_step).clamp(0, vocab - 1)
            }
            None => {
                let ids: Vec<i64> = (0..per_step).map(|_| (rng.next() % vocab as u64) as i64).collect();
                Tensor::from_slice(&ids)
            }
        };
        let g = global.reshape([ws as i64, k, b, s]);
        batches.push((0..ws as i64).map(|r| (0..k).map(|m| g.get(r).get(m).copy()).collect()).collect());
    }
    // the optimizer the plan names (its state is in the plan's memory)
    let opt = Optim::of_plan(plan.options.optimizer, cfg.lr);
    // world, shard and replicate groups (the latter two differ from the world for hybrid
    // sharding and no-shard)
    let groups = crate::comm::cpu_mesh(ws, plan.options.shard_size() as usize);
    let start = Instant::now();
    // Tensors are Send but not Sync: each rank thread gets its own handles.
    type Mesh = (CpuGroup, CpuGroup, CpuGroup);
    let per_rank: Vec<(Mesh, HashMap<String, Tensor>, Vec<Vec<Tensor>>)> = groups
        .into_iter()
        .map(|m| {
            let w: HashMap<String, Tensor> = full.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
            let mine: Vec<Vec<Tensor>> = batches.iter().map(|st| st[m.0.rank()].iter().map(|t| t.shallow_clone()).collect()).collect();
            (m, w, mine)
        })
        .collect();
    let last_spans: std::sync::Mutex<Vec<(f64, f64)>> = std::sync::Mutex::new(vec![]);
    let last_spans = &last_spans;
    let last_mem: std::sync::Mutex<Option<crate::exec::StepStats>> = std::sync::Mutex::new(None);
    let last_mem = &last_mem;
    let results: Vec<Result<Vec<(usize, f64, f64, u64)>, RtError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = per_rank
            .into_iter()
            .map(|((g, shard, replicate), full, mine_all)| {
                sc.spawn(move || -> Result<Vec<(usize, f64, f64, u64)>, RtError> {
                    tch::set_num_threads(1);
                    let mesh = crate::comm::Groups { world: &g, shard: &shard, replicate: &replicate };
                    let setup = match &cfg.resume {
                        Some(dir) => crate::checkpoint::latest(dir).and_then(|c| crate::checkpoint::load_rank(&c, plan, g.rank())),
                        None => Rank::from_full(plan, &full, g.rank()).map(|r| (r, 0)),
                    };
                    // Every rank learns whether every rank could start, so that one rank's
                    // bad checkpoint ends all of them instead of leaving them in a collective.
                    let ok = g.all_reduce_avg(&Tensor::from(if setup.is_ok() { 1.0 } else { 0.0 })).double_value(&[]);
                    let (mut rank, done) = match setup {
                        Err(e) => return Err(e),
                        Ok(_) if ok < 1.0 => return Err(RtError::Plan("another rank failed to start".into())),
                        Ok(x) => x,
                    };
                    let cx0 = OpCx {
                        attn: if plan.attn_implementation == "eager" { Attn::Eager } else { Attn::Sdpa },
                        kind: plan.options.param_dtype.map(crate::exec::kind_of).unwrap_or(Kind::Float),
                        train: Some(Noise { seed: cfg.seed as u64, step: 0, micro: 0, row0: (g.rank() as i64 * b) as u64 }),
                    };
                    let last = cfg.stop_after.unwrap_or(cfg.steps).min(cfg.steps);
                    let mut out = vec![];
                    for (i, st) in mine_all.iter().enumerate().take(last).skip(done) {
                        let mine: Vec<HashMap<String, Tensor>> = st
                            .iter()
                            .map(|ids| HashMap::from([("input_ids".to_string(), ids.shallow_clone()), ("labels".to_string(), ids.copy())]))
                            .collect();
                        let cx = OpCx { train: cx0.train.map(|n| Noise { step: i as u64, ..n }), ..cx0 };
                        let mut spans = vec![];
                        let mut stats = crate::exec::StepStats { arena: cfg.arena.then(Default::default), ..Default::default() };
                        let l = crate::exec::step_timed(plan, model, &mesh, &mut rank, &mine, &cx, opt, Some(&mut spans), Some(&mut stats))?;
                        let peak = g.all_reduce_avg(&Tensor::from(if g.rank() == 0 { stats.peak_bytes as f64 * g.size() as f64 } else { 0.0 })).double_value(&[]) as u64;
                        if g.rank() == 0 {
                            *last_spans.lock().unwrap_or_else(|e| e.into_inner()) = spans;
                            *last_mem.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
                        }
                        let avg = g.all_reduce_avg(&Tensor::from(l)).double_value(&[]);
                        out.push((i + 1, avg, start.elapsed().as_secs_f64(), peak));
                        let n = i + 1;
                        if let Some(dir) = &cfg.save {
                            if (cfg.save_every > 0 && n % cfg.save_every == 0) || n == cfg.steps {
                                crate::checkpoint::save_rank(dir, plan, g.rank(), &rank, n)?;
                                let _ = g.all_reduce_avg(&Tensor::from(0.0)); // every rank has written
                                if g.rank() == 0 {
                                    crate::checkpoint::commit(dir, plan, n)?;
                                }
                                let _ = g.all_reduce_avg(&Tensor::from(0.0));
                            }
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(RtError::Plan("a rank thread panicked".into())))).collect()
    });
    let mut reports = vec![];
    // report the root cause, not a rank that only heard another one failed
    let mut oks = vec![];
    let mut first_err = None;
    for r in results {
        match r {
            Ok(v) => oks.push(v),
            Err(e) => {
                let secondary = matches!(&e, RtError::Plan(m) if m == "another rank failed to start");
                if first_err.is_none() || (!secondary && matches!(&first_err, Some(RtError::Plan(m)) if m == "another rank failed to start")) {
                    first_err = Some(e);
                }
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let r0 = oks.into_iter().next().unwrap_or_default();
    if let Some(path) = &cfg.trace {
        let spans = std::mem::take(&mut *last_spans.lock().unwrap_or_else(|e| e.into_inner()));
        write_trace(plan, &spans, path)?;
    }
    let mut prev = 0.0;
    let steps = r0.len();
    let mut mem = last_mem.lock().unwrap_or_else(|e| e.into_inner()).take();
    for (i, (n, loss, t, peak)) in r0.into_iter().enumerate() {
        let rep = StepReport {
            memory: if i + 1 == steps { mem.take() } else { None },
            peak_bytes: peak,
            step: n,
            loss,
            tokens_per_s: per_step as f64 / (t - prev).max(1e-9),
        };
        prev = t;
        on_step(&rep);
        reports.push(rep);
    }
    Ok(reports)
}

/// The measured timeline of rank 0's last step as a [`fsdp_planner::timeline::TimeReport`]
/// (collectives run on the calling thread here, so all communication is exposed).
pub fn measured_report(plan: &Plan, spans: &[(f64, f64)]) -> fsdp_planner::timeline::TimeReport {
    use fsdp_planner::timeline::{OpSpan, TimeReport};
    use fsdp_planner::Stream;
    let ops: Vec<OpSpan> = plan
        .schedule
        .iter()
        .zip(spans)
        .map(|(o, &(start, end))| OpSpan { op: o.id, stream: o.stream, start, end })
        .collect();
    let step = spans.last().map(|s| s.1).unwrap_or(0.0);
    let comm: f64 = ops.iter().filter(|o| o.stream != Stream::Compute).map(|o| o.end - o.start).sum();
    let tokens = plan.options.batch * plan.options.seq * plan.options.grad_accum as u64;
    TimeReport {
        hardware: "measured: fsdp-plan CPU runtime, rank 0".into(),
        step_time_s: step,
        compute_s: step - comm,
        exposed_comm_s: comm,
        comm_s: comm,
        mfu: 0.0,
        model_flops: 0.0,
        tokens_per_step: tokens,
        tokens_per_s_per_gpu: tokens as f64 / step.max(1e-12),
        ops,
    }
}

fn write_trace(plan: &Plan, spans: &[(f64, f64)], path: &std::path::Path) -> Result<(), RtError> {
    let report = measured_report(plan, spans);
    let doc = fsdp_planner::trace::chrome_trace(plan, &report, &[]);
    let text = serde_json::to_string(&doc).map_err(|e| RtError::File { file: path.display().to_string(), message: e.to_string() })?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| RtError::File { file: tmp.display().to_string(), message: e.to_string() })?;
    std::fs::rename(&tmp, path).map_err(|e| RtError::File { file: path.display().to_string(), message: e.to_string() })
}
