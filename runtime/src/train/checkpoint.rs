//! Sharded checkpoints: per rank a safetensors file (its shards and AdamW state) and a JSON
//! of metadata, plus the compiled plan, under `DIR/step-NNNNNNNN/`; `DIR/latest` names the
//! newest complete one. Every file is written to a temp name and renamed, and a step
//! directory becomes visible (renamed from `.tmp-…`) only once every rank has written, so a
//! killed run leaves its last checkpoint intact.

use crate::error::RtError;
use crate::exec::Rank;
use crate::optim::State;
use fsdp_planner::Plan;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const FORMAT: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankMeta {
    pub format: u32,
    pub plan_hash: String,
    pub model_hash: String,
    pub world_size: u64,
    pub rank: usize,
    /// Steps completed.
    pub step: usize,
    pub adam_steps: Vec<i64>,
    /// The run options that shape training (learning-rate schedule, clipping, optimizer
    /// hyper-parameters, seed): a resume that differs is told ([`crate::train::RunConfig::recorded`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<serde_json::Value>,
}

/// What [`load_any`] learned besides the state.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The checkpoint's world size when it was saved under another plan (resharded on load).
    pub resharded_from: Option<u64>,
    pub run: Option<serde_json::Value>,
}

fn io(file: &Path, e: impl std::fmt::Display) -> RtError {
    RtError::File {
        file: file.display().to_string(),
        message: e.to_string(),
    }
}

/// Writes `path` through [`fsdp_ir::tmp_sibling`] and a rename; `write` makes the temp file. On an
/// error the temp file is removed and the error names `path`.
pub fn write_via_tmp(path: &Path, write: impl FnOnce(&Path) -> Result<(), String>) -> Result<(), RtError> {
    let tmp = fsdp_ir::tmp_sibling(path);
    let r = write(&tmp).and_then(|()| std::fs::rename(&tmp, path).map_err(|e| e.to_string()));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.map_err(|e| io(path, e))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RtError> {
    write_via_tmp(path, |t| std::fs::write(t, bytes).map_err(|e| e.to_string()))
}

pub fn step_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

fn tmp_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!(".tmp-step-{step:08}"))
}

/// Every rank: write this rank's files into the step's temp directory.
pub fn save_rank(dir: &Path, plan: &Plan, rank_idx: usize, rank: &Rank, step: usize, run: &serde_json::Value) -> Result<(), RtError> {
    let tmp = tmp_dir(dir, step);
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    let mut named: Vec<(String, Tensor)> = vec![];
    for (u, s) in rank.shards.iter().enumerate() {
        // (a GPU rank's state is copied to the host to be written)
        let host = |t: &Tensor| t.to_device(tch::Device::Cpu);
        named.push((format!("shard.{u}"), host(s)));
        if plan.options.optimizer.keeps_state() {
            named.push((format!("exp_avg.{u}"), host(&rank.opt[u].m)));
            named.push((format!("exp_avg_sq.{u}"), host(&rank.opt[u].v)));
        }
    }
    let st = tmp.join(format!("rank-{rank_idx}.safetensors"));
    write_via_tmp(&st, |t| Tensor::write_safetensors(&named, t).map_err(|e| e.to_string()))?;
    let meta = RankMeta {
        format: FORMAT,
        plan_hash: plan.plan_hash.clone(),
        model_hash: plan.model_hash.clone(),
        world_size: plan.options.world_size,
        rank: rank_idx,
        step,
        adam_steps: rank.opt.iter().map(|s| s.step).collect(),
        run: Some(run.clone()),
    };
    let json = serde_json::to_vec_pretty(&meta).map_err(|e| io(&st, e))?;
    write_atomic(&tmp.join(format!("rank-{rank_idx}.json")), &json)
}

/// Rank 0, after every rank saved: add the plan, publish the directory, point `latest` at it.
pub fn commit(dir: &Path, plan: &Plan, step: usize) -> Result<(), RtError> {
    let tmp = tmp_dir(dir, step);
    let ron = ron::ser::to_string(plan).map_err(|e| io(&tmp, e))?;
    write_atomic(&tmp.join("plan.ron"), ron.as_bytes())?;
    let fin = step_dir(dir, step);
    if fin.exists() {
        std::fs::remove_dir_all(&fin).map_err(|e| io(&fin, e))?;
    }
    std::fs::rename(&tmp, &fin).map_err(|e| io(&fin, e))?;
    write_atomic(&dir.join("latest"), format!("step-{step:08}\n").as_bytes())
}

/// The newest complete checkpoint directory.
pub fn latest(dir: &Path) -> Result<PathBuf, RtError> {
    let l = dir.join("latest");
    if !dir.is_dir() {
        return Err(io(dir, "no such checkpoint directory"));
    }
    let name = std::fs::read_to_string(&l).map_err(|e| io(&l, format!("{e} (not a checkpoint directory of `run --save`?)")))?;
    let name = name.trim();
    // only a name as save writes it is followed
    if step_of(name).is_none() {
        return Err(io(&l, format!("names `{name}`, not a step directory (step-NNNNNNNN)")));
    }
    Ok(dir.join(name))
}

/// The step of a step directory's name as [`step_dir`] writes it: `step-` and 8 digits.
fn step_of(name: &str) -> Option<usize> {
    name.strip_prefix("step-").filter(|d| d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit())).and_then(|d| d.parse().ok())
}

/// Loads this rank's state from a checkpoint directory, refusing another plan or world size.
pub fn load_rank(ckpt: &Path, plan: &Plan, rank_idx: usize) -> Result<(Rank, usize), RtError> {
    let mp = ckpt.join(format!("rank-{rank_idx}.json"));
    let text = std::fs::read_to_string(&mp).map_err(|e| io(&mp, e))?;
    let meta: RankMeta = serde_json::from_str(&text).map_err(|e| io(&mp, format!("corrupted metadata: {e}")))?;
    if meta.format != FORMAT {
        return Err(io(&mp, format!("checkpoint format {} (this build reads {FORMAT})", meta.format)));
    }
    if meta.plan_hash != plan.plan_hash {
        return Err(io(&mp, format!("saved for plan {} but this run's plan is {} (another model, world size or options)", meta.plan_hash, plan.plan_hash)));
    }
    if meta.world_size != plan.options.world_size || meta.rank != rank_idx {
        return Err(io(&mp, format!("rank {} of world size {}; this is rank {rank_idx} of {}", meta.rank, meta.world_size, plan.options.world_size)));
    }
    // a rank's files copied in from another step would mix two points of training
    if let Some(dir_step) = ckpt.file_name().and_then(|n| n.to_str()).and_then(step_of) {
        if meta.step != dir_step {
            return Err(io(&mp, format!("saved after step {}, but it is in the directory of step {dir_step}", meta.step)));
        }
    }
    let sp = ckpt.join(format!("rank-{rank_idx}.safetensors"));
    let tensors: std::collections::HashMap<String, Tensor> = crate::st_file::read(&sp)?.into_iter().collect();
    let n = plan.units.len();
    let get = |k: &str| tensors.get(k).map(|t| t.shallow_clone()).ok_or_else(|| io(&sp, format!("missing tensor `{k}`")));
    let mut shards = vec![];
    let mut opt = vec![];
    for u in 0..n {
        let s = get(&format!("shard.{u}"))?;
        if s.size() != [plan.units[u].shard_numel as i64] || !s.is_floating_point() {
            return Err(io(&sp, format!("shard.{u} is {:?} of shape {:?}, the plan says {} floating-point elements", s.kind(), s.size(), plan.units[u].shard_numel)));
        }
        let steps = meta.adam_steps.get(u).copied().unwrap_or(0);
        opt.push(if plan.options.optimizer.keeps_state() {
            State { m: get(&format!("exp_avg.{u}"))?, v: get(&format!("exp_avg_sq.{u}"))?, step: steps }
        } else {
            State { step: steps, ..State::for_optim(plan.options.optimizer, &s) }
        });
        shards.push(s);
    }
    Ok((Rank { shards, opt, device: tch::Device::Cpu, arena: None, last_grad_norm: None, skipped: false }, meta.step))
}

/// Removes all but the newest `keep` step directories (0: keeps all); returns their names.
pub fn keep_last(dir: &Path, keep: usize) -> Result<Vec<String>, RtError> {
    if keep == 0 {
        return Ok(vec![]);
    }
    let mut steps: Vec<(usize, String)> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| step_of(n).map(|s| (s, n.to_string()))))
        .collect();
    steps.sort();
    let drop = steps.len().saturating_sub(keep);
    let mut gone = vec![];
    for (_, name) in steps.into_iter().take(drop) {
        let p = dir.join(&name);
        std::fs::remove_dir_all(&p).map_err(|e| io(&p, e))?;
        gone.push(name);
    }
    Ok(gone)
}

/// Loads this rank's state for `plan` from a checkpoint: directly when it was saved under the
/// same plan; when saved under another plan of the same model (another world size, wrap or
/// layout), by reassembling every full parameter and optimizer state from the saved ranks'
/// shards and sharding them for `plan`, as PyTorch DCP reshards on load.
pub fn load_any(ckpt: &Path, plan: &Plan, rank_idx: usize) -> Result<(Rank, usize, Loaded), RtError> {
    let mp = ckpt.join(format!("rank-{rank_idx}.json"));
    let m0 = ckpt.join("rank-0.json");
    let text = std::fs::read_to_string(&m0).map_err(|e| io(&m0, e))?;
    let meta: RankMeta = serde_json::from_str(&text).map_err(|e| io(&m0, format!("corrupted metadata: {e}")))?;
    if meta.plan_hash == plan.plan_hash {
        let run = meta.run.clone();
        let (r, step) = load_rank(ckpt, plan, rank_idx)?;
        return Ok((r, step, Loaded { resharded_from: None, run }));
    }
    if meta.model_hash != plan.model_hash {
        return Err(io(&mp, "saved for another model (its hash differs): nothing to reshard from"));
    }
    let pp = ckpt.join("plan.ron");
    let text = std::fs::read_to_string(&pp).map_err(|e| io(&pp, e))?;
    let old: Plan = ron::from_str(&text).map_err(|e| io(&pp, format!("corrupted plan: {e}")))?;
    if old.options.optimizer.keeps_state() != plan.options.optimizer.keeps_state() {
        return Err(io(&pp, format!("saved with optimizer {}, this run's is {}: the optimizer state does not carry over", old.options.optimizer.name(), plan.options.optimizer.name())));
    }
    let (full, m, v, step, adam) = gather_full(ckpt, &old)?;
    let mut rank = Rank::from_full(plan, &full, rank_idx)?;
    if plan.options.optimizer.keeps_state() {
        let ms = Rank::from_full(plan, &m, rank_idx)?;
        let vs = Rank::from_full(plan, &v, rank_idx)?;
        for (u, st) in rank.opt.iter_mut().enumerate() {
            st.m = ms.shards[u].shallow_clone();
            st.v = vs.shards[u].shallow_clone();
            st.step = adam;
        }
    } else {
        for st in rank.opt.iter_mut() {
            st.step = adam;
        }
    }
    Ok((rank, step, Loaded { resharded_from: Some(old.options.world_size), run: meta.run }))
}

type Full = std::collections::HashMap<String, Tensor>;

/// Every parameter of a checkpoint saved under `plan` in full (and AdamW's two states), with
/// the step and the optimizer's step count.
fn gather_full(ckpt: &Path, plan: &Plan) -> Result<(Full, Full, Full, usize, i64), RtError> {
    let ws = plan.options.shard_size() as usize;
    let mut per_rank = vec![];
    let mut step0 = None;
    for r in 0..ws {
        let (rank, step) = load_rank(ckpt, plan, r)?;
        let s0 = *step0.get_or_insert(step);
        if step != s0 {
            return Err(io(&ckpt.join(format!("rank-{r}.json")), format!("saved after step {step}, rank 0's after step {s0}: the ranks' files are of different steps")));
        }
        per_rank.push(rank);
    }
    let adam = per_rank.first().and_then(|r| r.opt.iter().map(|s| s.step).max()).unwrap_or(0);
    let (mut full, mut m, mut v) = (Full::new(), Full::new(), Full::new());
    let keeps = plan.options.optimizer.keeps_state();
    for (u, unit) in plan.units.iter().enumerate() {
        let cat = |f: &dyn Fn(&Rank) -> Tensor| Tensor::cat(&per_rank.iter().map(f).collect::<Vec<_>>(), 0);
        let pw = crate::exec::copy_out(plan, u, &cat(&|r| r.shards[u].shallow_clone()));
        let (pm, pv) = match keeps {
            true => (crate::exec::copy_out(plan, u, &cat(&|r| r.opt[u].m.shallow_clone())), crate::exec::copy_out(plan, u, &cat(&|r| r.opt[u].v.shallow_clone()))),
            false => (Full::new(), Full::new()),
        };
        for p in &unit.params {
            if let Some(t) = pw.get(&p.name) {
                full.insert(p.name.clone(), t.shallow_clone());
            }
            if let (Some(a), Some(b)) = (pm.get(&p.name), pv.get(&p.name)) {
                m.insert(p.name.clone(), a.shallow_clone());
                v.insert(p.name.clone(), b.shallow_clone());
            }
        }
    }
    Ok((full, m, v, step0.unwrap_or(0), adam))
}

/// Reassembles full HF-named parameters from every rank's shards (`consolidate`).
pub fn consolidate(ckpt: &Path, out: &Path) -> Result<usize, RtError> {
    let pp = ckpt.join("plan.ron");
    let text = std::fs::read_to_string(&pp).map_err(|e| io(&pp, e))?;
    let plan: Plan = ron::from_str(&text).map_err(|e| io(&pp, format!("corrupted plan: {e}")))?;
    let ws = plan.options.shard_size() as usize;
    let mut per_rank = vec![];
    let mut step0 = None;
    for r in 0..ws {
        let (rank, step) = load_rank(ckpt, &plan, r)?;
        let s0 = *step0.get_or_insert(step);
        if step != s0 {
            return Err(io(&ckpt.join(format!("rank-{r}.json")), format!("saved after step {step}, rank 0's after step {s0}: the ranks' files are of different steps")));
        }
        per_rank.push(rank);
    }
    let mut named: Vec<(String, Tensor)> = vec![];
    for (u, unit) in plan.units.iter().enumerate() {
        let all = Tensor::cat(&per_rank.iter().map(|r| r.shards[u].shallow_clone()).collect::<Vec<_>>(), 0);
        let full = crate::exec::copy_out(&plan, u, &all);
        for p in &unit.params {
            if let Some(t) = full.get(&p.name) {
                named.push((p.name.clone(), t.shallow_clone()));
            }
        }
    }
    write_via_tmp(out, |t| Tensor::write_safetensors(&named, t).map_err(|e| e.to_string()))?;
    Ok(named.len())
}
