//! The checker (in the style of regalloc2's): replays a finished plan and proves its
//! schedule sound, independently of how the passes built it.
//!
//! - every buffer is allocated once, freed at most once, after its allocation;
//! - live buffers never overlap in the arena;
//! - every compute op that reads a unit's params runs while that unit is unsharded;
//! - each reduce-scatter comes after the last backward op writing that unit's grads
//!   (in its micro-batch), and every all-gather before the first use;
//! - dependencies point backwards;
//! - nothing but persistent state outlives the step;
//! - the simulated peak and breakdown equal the plan's prediction.

use crate::error::PlanError;
use crate::ids::BufferId;
use crate::plan::*;
use fsdp_ir::Model;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

fn fail(m: String) -> PlanError {
    PlanError::Check(m)
}

pub fn check(model: &Model, plan: &Plan) -> Result<(), PlanError> {
    let nb = plan.buffers.len();
    let mut alive = vec![false; nb];
    let mut seen = vec![false; nb];
    let mut freed = vec![false; nb];
    let mut arena: BTreeMap<u64, (u64, BufferId)> = BTreeMap::new();
    let mut live = 0u64;
    let mut cats = [0u64; 11];
    let mut peak = 0u64;
    let mut peak_cats = [0u64; 11];
    // params of each model op, mapped to their owning unit
    let owner = plan.param_owners();
    let op_params: HashMap<&str, Vec<usize>> = model
        .ops
        .iter()
        .map(|o| {
            let mut us: Vec<usize> = o.params.iter().filter_map(|p| owner.get(model.primary_of(p)).copied()).collect();
            us.sort_unstable();
            us.dedup();
            (o.name.as_str(), us)
        })
        .collect();
    let no_shard = matches!(plan.options.strategy, crate::options::Strategy::NoShard);
    // unsharded buffers live per unit
    let mut unsharded_live = vec![0u32; plan.units.len()];
    // last backward op index touching each unit per micro-batch
    let mut last_bwd: HashMap<(usize, u32), usize> = HashMap::default();
    for (i, op) in plan.schedule.iter().enumerate() {
        if op.id.index() != i {
            return Err(fail(format!("op at position {i} has id {}", op.id)));
        }
        if let OpKind::Backward { op: name, .. } = &op.kind {
            for &u in op_params.get(name.as_str()).into_iter().flatten() {
                last_bwd.insert((u, op.micro_batch), i);
            }
        }
    }
    for (i, op) in plan.schedule.iter().enumerate() {
        for d in &op.deps {
            if d.index() >= i {
                return Err(fail(format!("{} depends on later {}", op.id, d)));
            }
        }
        match &op.kind {
            OpKind::Forward { op: name, .. } | OpKind::Backward { op: name, .. } | OpKind::Recompute { op: name, .. } => {
                if !no_shard {
                    for &u in op_params.get(name.as_str()).into_iter().flatten() {
                        if unsharded_live[u] == 0 {
                            return Err(fail(format!(
                                "{} reads params of {} while it is sharded (not gathered before use)",
                                op.id,
                                plan.units[u].label()
                            )));
                        }
                    }
                }
            }
            OpKind::ReduceScatter { unit, .. } => {
                if let Some(&lb) = last_bwd.get(&(unit.index(), op.micro_batch)) {
                    if lb > i {
                        return Err(fail(format!(
                            "{} reduce-scatters {} before its last gradient write op{lb}",
                            op.id,
                            plan.units[unit.index()].label()
                        )));
                    }
                }
            }
            _ => {}
        }
        for ev in &op.events {
            match *ev {
                Event::Alloc(b) => {
                    let k = b.index();
                    if k >= nb || seen[k] {
                        return Err(fail(format!("{} allocates {b} twice or unknown", op.id)));
                    }
                    seen[k] = true;
                    alive[k] = true;
                    let buf = &plan.buffers[k];
                    if buf.bytes > 0 {
                        let (s, e) = (buf.offset, buf.offset + buf.bytes);
                        if let Some((&o, &(end, other))) = arena.range(..e).next_back() {
                            if end > s && o < e {
                                return Err(fail(format!("{} overlaps live {} in the arena at {}", b, other, op.id)));
                            }
                        }
                        arena.insert(s, (e, b));
                    }
                    live += buf.bytes;
                    cats[buf.category.index()] += buf.bytes;
                    if buf.category == Category::UnshardedParam {
                        if let Some(u) = buf.unit {
                            unsharded_live[u.index()] += 1;
                        }
                    }
                    if live > peak {
                        peak = live;
                        peak_cats = cats;
                    }
                }
                Event::Free(b) => {
                    let k = b.index();
                    if k >= nb || !alive[k] || freed[k] {
                        return Err(fail(format!("{} frees {b}, which is not live", op.id)));
                    }
                    alive[k] = false;
                    freed[k] = true;
                    let buf = &plan.buffers[k];
                    if buf.bytes > 0 {
                        arena.remove(&buf.offset);
                    }
                    live -= buf.bytes;
                    cats[buf.category.index()] -= buf.bytes;
                    if buf.category == Category::UnshardedParam {
                        if let Some(u) = buf.unit {
                            unsharded_live[u.index()] -= 1;
                        }
                    }
                }
            }
        }
    }
    for (k, buf) in plan.buffers.iter().enumerate() {
        let persistent = matches!(
            buf.category,
            Category::ShardedParam | Category::Optstate | Category::Buffer | Category::Inputs
        ) || (no_shard && buf.category == Category::UnshardedParam);
        if alive[k] && !persistent {
            return Err(fail(format!("{} ({}) is still live at the end of the step", buf.id, buf.name)));
        }
    }
    if peak != plan.memory.peak_bytes {
        return Err(fail(format!("simulated peak {peak} B != predicted {} B", plan.memory.peak_bytes)));
    }
    for c in Category::ALL {
        let a = peak_cats[c.index()];
        let b = plan.memory.breakdown.get(&c).copied().unwrap_or(0);
        if a != b {
            return Err(fail(format!("{}: simulated {a} B != predicted {b} B at the peak", c.name())));
        }
    }
    Ok(())
}
