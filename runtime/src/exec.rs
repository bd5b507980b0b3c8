//! The sharded executor: runs a compiled plan's schedule on one rank, op by op, in the
//! plan's order — all-gathers into the unit's gathered buffer, copy-out into unsharded
//! params, compute, reshard, reduce-scatter into the local shard, AdamW on the shard.
//!
//! Backward is per op: each backward op re-runs its forward from the inputs the forward
//! kept, with autograd on leaf copies, and pulls `(out · grad_out).sum()` back to its inputs
//! and params (tch's `run_backward` takes no upstream gradient). Params exist only between
//! a unit's copy-out and its reshard, as the plan says.

use crate::comm::Collective;
use crate::error::RtError;
use crate::ops::{forward, OpCx};
use crate::optim::{AdamW, State};
use fsdp_ir::Model;
use fsdp_planner::{Layout, OpKind, Plan};
use std::collections::HashMap;
use tch::{Kind, Tensor};

/// One rank's persistent state: the local shards and their optimizer state.
pub struct Rank {
    /// Per unit: the flat local shard (padded; fsdp2: per-param padded chunks back to back).
    pub shards: Vec<Tensor>,
    pub opt: Vec<State>,
}

fn err(m: impl Into<String>) -> RtError {
    RtError::Plan(m.into())
}

impl Rank {
    /// Cuts this rank's shards out of full (HF-named, primary) weights.
    pub fn from_full(plan: &Plan, full: &HashMap<String, Tensor>, rank: usize) -> Result<Rank, RtError> {
        let ws = plan.options.shard_size() as i64;
        let r = rank as i64;
        let mut shards = vec![];
        for u in &plan.units {
            let get = |n: &str| full.get(n).ok_or_else(|| err(format!("weights lack `{n}`")));
            let shard = tch::no_grad(|| -> Result<Tensor, RtError> {
                Ok(match plan.options.layout {
                    Layout::Fsdp2 => {
                        let mut parts = vec![];
                        for p in &u.params {
                            let w = get(&p.name)?.detach();
                            let d0 = p.shape[0] as i64;
                            let rest = (p.numel / p.shape[0]) as i64;
                            let c = (d0 + ws - 1) / ws;
                            let rows = (d0 - r * c).clamp(0, c);
                            let w2 = w.reshape([d0, rest]);
                            let mine = if rows > 0 { w2.narrow(0, r * c, rows) } else { w2.narrow(0, 0, 0) };
                            let pad = Tensor::zeros([c - rows, rest], (w.kind(), w.device()));
                            parts.push(Tensor::cat(&[mine, pad], 0).reshape([-1]));
                        }
                        if parts.is_empty() {
                            Tensor::zeros([0], tch::kind::FLOAT_CPU)
                        } else {
                            Tensor::cat(&parts, 0)
                        }
                    }
                    Layout::Flat => {
                        let parts: Vec<Tensor> = u
                            .params
                            .iter()
                            .map(|p| get(&p.name).map(|w| w.detach().reshape([-1])))
                            .collect::<Result<_, _>>()?;
                        let flat = if parts.is_empty() { Tensor::zeros([0], tch::kind::FLOAT_CPU) } else { Tensor::cat(&parts, 0) };
                        let c = u.shard_numel as i64;
                        let padded = flat.pad([0, c * ws - u.numel as i64], "constant", 0.0);
                        padded.narrow(0, r * c, c).copy()
                    }
                })
            })?;
            shards.push(shard);
        }
        let opt = shards.iter().map(State::new).collect();
        Ok(Rank { shards, opt })
    }
}

/// torch kind of an IR dtype.
pub fn kind_of(d: fsdp_ir::DType) -> Kind {
    match d {
        fsdp_ir::DType::Float32 => Kind::Float,
        fsdp_ir::DType::Bfloat16 => Kind::BFloat16,
        fsdp_ir::DType::Float16 => Kind::Half,
        fsdp_ir::DType::Int64 => Kind::Int64,
        fsdp_ir::DType::Int32 => Kind::Int,
        fsdp_ir::DType::Uint8 => Kind::Uint8,
        fsdp_ir::DType::Bool => Kind::Bool,
    }
}

/// Unsharded params of a unit from its all-gather output (the copy-out): every rank's
/// shard, concatenated in rank order.
pub fn copy_out(plan: &Plan, u: usize, gathered: &Tensor) -> HashMap<String, Tensor> {
    let unit = &plan.units[u];
    let ws = plan.options.shard_size() as i64;
    let mut out = HashMap::new();
    match plan.options.layout {
        Layout::Fsdp2 => {
            let rows = gathered.reshape([ws, unit.shard_numel as i64]);
            for p in &unit.params {
                let d0 = p.shape[0] as i64;
                let rest = (p.numel / p.shape[0]) as i64;
                let s = p.shard_numel as i64;
                let full = rows.narrow(1, p.offset as i64, s).reshape([-1, rest]).narrow(0, 0, d0);
                let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                out.insert(p.name.clone(), full.reshape(shape.as_slice()).copy());
            }
        }
        Layout::Flat => {
            for p in &unit.params {
                let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                out.insert(p.name.clone(), gathered.narrow(0, p.offset as i64, p.numel as i64).reshape(shape.as_slice()).copy());
            }
        }
    }
    out
}

/// The reduce-scatter input of a unit: its grads laid out like the all-gather output.
fn rs_input(plan: &Plan, u: usize, grads: &HashMap<String, Tensor>, kind: Kind) -> Tensor {
    let unit = &plan.units[u];
    let ws = plan.options.shard_size() as i64;
    let g = |p: &fsdp_planner::units::UnitParam| -> Tensor {
        let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
        grads.get(&p.name).map(|t| t.shallow_clone()).unwrap_or_else(|| Tensor::zeros(shape.as_slice(), (kind, tch::Device::Cpu)))
    };
    match plan.options.layout {
        Layout::Fsdp2 => {
            let cols: Vec<Tensor> = unit
                .params
                .iter()
                .map(|p| {
                    let d0 = p.shape[0] as i64;
                    let rest = (p.numel / p.shape[0]) as i64;
                    let c = (d0 + ws - 1) / ws;
                    g(p).reshape([d0, rest]).pad([0, 0, 0, c * ws - d0], "constant", 0.0).reshape([ws, c * rest])
                })
                .collect();
            Tensor::cat(&cols, 1).reshape([-1])
        }
        Layout::Flat => {
            let parts: Vec<Tensor> = unit.params.iter().map(|p| g(p).reshape([-1])).collect();
            Tensor::cat(&parts, 0).pad([0, unit.padded_numel as i64 - unit.numel as i64], "constant", 0.0)
        }
    }
}

/// Runs one training step of `plan` on this rank. `batches[k]` holds micro-batch k's model
/// inputs (`input_ids`, `labels`). Returns the mean loss of this rank's micro-batches.
pub fn step(plan: &Plan, model: &Model, comm: &dyn Collective, rank: &mut Rank, batches: &[HashMap<String, Tensor>], cx: &OpCx, opt: &AdamW) -> Result<f64, RtError> {
    step_timed(plan, model, comm, rank, batches, cx, opt, None, None)
}

/// What the executor itself holds, measured after every schedule op: bytes of the distinct
/// tensor storages it references (shards, optimizer state, gathered buffers, unsharded
/// params, forward values kept for the per-op backward, gradients).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepStats {
    pub peak_bytes: u64,
}

fn held_bytes<'a>(ts: impl Iterator<Item = &'a Tensor>) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for t in ts {
        if !t.defined() {
            continue;
        }
        let p = t.data_ptr() as usize;
        if p != 0 && seen.insert(p) {
            total += (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        }
    }
    total
}

/// [`step`], recording each schedule op's wall-clock (start, end) in seconds from the start
/// of the step into `spans` (one entry per schedule op, in schedule order).
#[allow(clippy::too_many_arguments)]
pub fn step_timed(
    plan: &Plan,
    model: &Model,
    comm: &dyn Collective,
    rank: &mut Rank,
    batches: &[HashMap<String, Tensor>],
    cx: &OpCx,
    opt: &AdamW,
    mut spans: Option<&mut Vec<(f64, f64)>>,
    mut stats: Option<&mut StepStats>,
) -> Result<f64, RtError> {
    let t0 = std::time::Instant::now();
    let nu = plan.units.len();
    let param_kind = plan.options.param_dtype.map(kind_of);
    let reduce_kind = plan.options.reduce_dtype.map(kind_of);
    let owner = plan.param_owners();
    let ops: HashMap<&str, &fsdp_ir::Op> = model.ops.iter().map(|o| (o.name.as_str(), o)).collect();
    let loss_op = model.ops.last().map(|o| o.name.as_str()).unwrap_or("");
    let mut gathered: Vec<Option<Tensor>> = (0..nu).map(|_| None).collect();
    let mut unsharded: Vec<Option<HashMap<String, Tensor>>> = (0..nu).map(|_| None).collect();
    let mut pgrads: Vec<HashMap<String, Tensor>> = (0..nu).map(|_| HashMap::new()).collect();
    let mut sgrads: Vec<Option<Tensor>> = (0..nu).map(|_| None).collect();
    let mut env: HashMap<String, Tensor> = HashMap::new();
    let mut grads: HashMap<String, Tensor> = HashMap::new();
    let mut losses = vec![];
    let mut mb = u32::MAX;
    let param = |unsharded: &[Option<HashMap<String, Tensor>>], name: &str| -> Result<Tensor, RtError> {
        let prim = model.primary_of(name);
        let u = *owner.get(prim).ok_or_else(|| err(format!("param `{prim}` has no unit")))?;
        unsharded[u]
            .as_ref()
            .and_then(|m| m.get(prim))
            .map(|t| t.shallow_clone())
            .ok_or_else(|| err(format!("param `{prim}` used while {} is sharded", plan.units[u].label())))
    };
    for sop in &plan.schedule {
        if let Some(st) = stats.as_deref_mut() {
            let all = rank
                .shards
                .iter()
                .chain(rank.opt.iter().flat_map(|o| [&o.m, &o.v]))
                .chain(env.values())
                .chain(grads.values())
                .chain(gathered.iter().flatten())
                .chain(unsharded.iter().flatten().flat_map(|m| m.values()))
                .chain(pgrads.iter().flat_map(|m| m.values()))
                .chain(sgrads.iter().flatten());
            st.peak_bytes = st.peak_bytes.max(held_bytes(all));
        }
        let started = t0.elapsed().as_secs_f64();
        if let Some(sp) = spans.as_deref_mut() {
            // closes the previous op: ops run one after the other on this thread
            if let Some(last) = sp.last_mut() {
                last.1 = started;
            }
            sp.push((started, started));
        }
        if sop.micro_batch != mb && matches!(sop.kind, OpKind::Forward { .. } | OpKind::AllGather { .. }) && sop.phase == fsdp_planner::Phase::Forward {
            mb = sop.micro_batch;
            env.clear();
            grads.clear();
            let b = batches.get(mb as usize).ok_or_else(|| err(format!("no data for micro-batch {mb}")))?;
            for (k, v) in b {
                env.insert(k.clone(), v.shallow_clone());
            }
        }
        match &sop.kind {
            OpKind::Setup | OpKind::PhaseEnd | OpKind::KeepGrads { .. } => {}
            OpKind::AllGather { unit, .. } => {
                // mixed precision: the shard is cast to param_dtype, then gathered
                let u = unit.index();
                let s = match param_kind {
                    Some(k) => rank.shards[u].to_kind(k),
                    None => rank.shards[u].shallow_clone(),
                };
                gathered[u] = Some(comm.all_gather(&s));
            }
            OpKind::CopyOut { unit } => {
                let u = unit.index();
                let g = gathered[u].take().ok_or_else(|| err(format!("{}: copy-out without all-gather", sop.id)))?;
                unsharded[u] = Some(tch::no_grad(|| copy_out(plan, u, &g)));
            }
            OpKind::Reshard { unit } => {
                unsharded[unit.index()] = None;
            }
            OpKind::Forward { op, .. } | OpKind::Recompute { op, .. } => {
                let Some(o) = ops.get(op.as_str()) else { continue };
                let ins: Vec<Tensor> = o.inputs.iter().map(|n| env.get(n).map(|t| t.shallow_clone()).ok_or_else(|| err(format!("{op}: input `{n}` missing")))).collect::<Result<_, _>>()?;
                let ps: Vec<Tensor> = o.params.iter().map(|p| param(&unsharded, p)).collect::<Result<_, _>>()?;
                let out = tch::no_grad(|| forward(cx, o, &ins.iter().collect::<Vec<_>>(), &ps.iter().collect::<Vec<_>>()))?;
                if o.name == loss_op {
                    losses.push(out.double_value(&[]));
                }
                env.insert(o.name.clone(), out);
            }
            OpKind::Backward { op, .. } => {
                let Some(o) = ops.get(op.as_str()) else { continue };
                let gout = if o.name == loss_op { None } else {
                    match grads.remove(&o.name) {
                        Some(g) => Some(g),
                        None => continue, // no gradient reaches this op
                    }
                };
                let ins: Vec<Tensor> = o
                    .inputs
                    .iter()
                    .map(|n| {
                        let t = env.get(n).ok_or_else(|| err(format!("{op}: input `{n}` missing in backward")))?;
                        Ok(if t.is_floating_point() { t.detach().set_requires_grad(true) } else { t.shallow_clone() })
                    })
                    .collect::<Result<_, RtError>>()?;
                let ps: Vec<Tensor> = o.params.iter().map(|p| param(&unsharded, p).map(|t| t.detach().set_requires_grad(true))).collect::<Result<_, _>>()?;
                let out = forward(cx, o, &ins.iter().collect::<Vec<_>>(), &ps.iter().collect::<Vec<_>>())?;
                if !out.requires_grad() {
                    continue;
                }
                let target = match gout {
                    None => out,
                    Some(g) => {
                        let k = out.kind();
                        (out * g).sum(k)
                    }
                };
                let leaves: Vec<&Tensor> = ins.iter().filter(|t| t.requires_grad()).chain(ps.iter()).collect();
                let gs = Tensor::f_run_backward(&[&target], &leaves, false, false)?;
                let mut gi = gs.into_iter();
                for (n, t) in o.inputs.iter().zip(&ins) {
                    if !t.requires_grad() {
                        continue;
                    }
                    let Some(g) = gi.next() else { break };
                    if !g.defined() {
                        continue;
                    }
                    match grads.get_mut(n) {
                        Some(acc) => *acc += g,
                        None => {
                            grads.insert(n.clone(), g);
                        }
                    }
                }
                for pn in &o.params {
                    let Some(g) = gi.next() else { break };
                    if !g.defined() {
                        continue;
                    }
                    let prim = model.primary_of(pn);
                    let u = owner[prim];
                    match pgrads[u].get_mut(prim) {
                        Some(acc) => *acc += g,
                        None => {
                            pgrads[u].insert(prim.to_string(), g);
                        }
                    }
                }
            }
            OpKind::ReduceScatter { unit, .. } => {
                let u = unit.index();
                // grads are reduced in reduce_dtype (else their own dtype), then kept in the
                // shard's (master) dtype
                let gk = reduce_kind.or(param_kind).unwrap_or(rank.shards[u].kind());
                let input = tch::no_grad(|| {
                    let grads: HashMap<String, Tensor> = pgrads[u].iter().map(|(n, g)| (n.clone(), g.to_kind(gk))).collect();
                    rs_input(plan, u, &grads, gk)
                });
                pgrads[u].clear();
                let out = comm.reduce_scatter_avg(&input).to_kind(rank.shards[u].kind());
                sgrads[u] = Some(match sgrads[u].take() {
                    Some(acc) => acc + out,
                    None => out,
                });
            }
            OpKind::AllReduce { .. } => {
                return Err(err("all-reduce (no-shard / hybrid-shard) is not supported by the CPU runtime yet"));
            }
            OpKind::OptimizerStep { unit } => {
                let u = unit.index();
                if let Some(g) = &sgrads[u] {
                    opt.step(&rank.shards[u], g, &mut rank.opt[u]);
                }
            }
            OpKind::ZeroGrad => {
                for g in sgrads.iter_mut() {
                    *g = None;
                }
            }
        }
    }
    if let Some(sp) = spans {
        if let Some(last) = sp.last_mut() {
            last.1 = t0.elapsed().as_secs_f64();
        }
    }
    Ok(losses.iter().sum::<f64>() / losses.len().max(1) as f64)
}
