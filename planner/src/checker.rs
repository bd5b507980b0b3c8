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

/// Checks a finished plan: the schedule's rules and memory ([`check_schedule`]) and the
/// arena ([`check_arena`]).
pub fn check(model: &Model, plan: &Plan) -> Result<(), PlanError> {
    check_schedule(model, &plan.schedule, &plan.buffers, &plan.units, &plan.options, &plan.memory)?;
    let offsets: Vec<u64> = plan.buffers.iter().map(|b| b.offset).collect();
    let spans = crate::buffers::spans(&plan.options, &plan.units, &plan.buffers);
    check_arena(&plan.schedule, &spans, &offsets, plan.options.device.alignment())
}

/// Live buffers never overlap in the arena and every one starts on the device's alignment,
/// with `offsets[b]` the offset of buffer `b` and `spans[b]` the bytes it occupies.
pub fn check_arena(ops: &[ScheduleOp], spans: &[u64], offsets: &[u64], alignment: u64) -> Result<(), PlanError> {
    let nb = spans.len().min(offsets.len());
    let mut arena: BTreeMap<u64, (u64, BufferId)> = BTreeMap::new();
    for op in ops {
        let mut evs = op.events.iter().peekable();
        let mut transient = None;
        while let Some(ev) = evs.next() {
            match *ev {
                Event::Alloc(b) => {
                    let k = b.index();
                    if k >= nb {
                        return Err(fail(format!("{} allocates unknown {b}", op.id)));
                    }
                    let bytes = spans[k];
                    if bytes == 0 {
                        continue;
                    }
                    if !offsets[k].is_multiple_of(alignment.max(1)) {
                        return Err(fail(format!("{b} starts at {} in the arena, off the device's {alignment}-byte alignment", offsets[k])));
                    }
                    let (s, e) = (offsets[k], offsets[k] + bytes);
                    if let Some((&o, &(end, other))) = arena.range(..e).next_back() {
                        if end > s && o < e {
                            return Err(fail(format!("{} overlaps live {} in the arena at {}", b, other, op.id)));
                        }
                    }
                    // a transient (freed right away) is checked but never enters the map
                    if evs.peek() == Some(&&Event::Free(b)) {
                        transient = Some(b);
                    } else {
                        arena.insert(s, (e, b));
                    }
                }
                Event::Free(b) => {
                    let k = b.index();
                    if k < nb && spans[k] > 0 && transient.take() != Some(b) {
                        arena.remove(&offsets[k]);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Everything but the arena: op order, liveness, params gathered before use, reduce-scatter
/// after the last gradient write, nothing transient outlives the step, simulated peak and
/// breakdown = `memory`.
pub fn check_schedule(
    model: &Model,
    schedule: &[ScheduleOp],
    buffers: &[BufferInfo],
    units: &[crate::units::Unit],
    options: &crate::options::Options,
    memory: &Memory,
) -> Result<(), PlanError> {
    let nb = buffers.len();
    let mut alive = vec![false; nb];
    let mut seen = vec![false; nb];
    let mut freed = vec![false; nb];
    let mut live = 0u64;
    let mut cats = [0u64; 11];
    let mut peak = 0u64;
    let mut peak_cats = [0u64; 11];
    let owner: HashMap<&str, usize> = units.iter().enumerate().flat_map(|(i, u)| u.params.iter().map(move |p| (p.name.as_str(), i))).collect();
    // params of each model op, mapped to their owning units (by model op index)
    let op_params: Vec<Vec<usize>> = model
        .ops
        .iter()
        .map(|o| {
            let mut us: Vec<usize> = o.params.iter().filter_map(|p| owner.get(model.primary_of(p)).copied()).collect();
            us.sort_unstable();
            us.dedup();
            us
        })
        .collect();
    let op_index: HashMap<&str, usize> = model.ops.iter().enumerate().map(|(i, o)| (o.name.as_str(), i)).collect();
    // Resolves a schedule op's model-op name; schedules name ops in (reverse) model order, so
    // the neighbours of the last hit are tried before the hash lookup.
    let (mut hint, mut step) = (0usize, 1isize);
    let mut resolve = |name: &str| -> Option<usize> {
        let ahead = hint.wrapping_add_signed(step);
        let found = [ahead, hint, hint.wrapping_add_signed(-step)]
            .into_iter()
            .find(|&c| model.ops.get(c).is_some_and(|o| o.name == name))
            .or_else(|| op_index.get(name).copied());
        if let Some(k) = found {
            if k != hint {
                step = if k > hint { 1 } else { -1 };
            }
            hint = k;
        }
        found
    };
    let no_shard = matches!(options.strategy, crate::options::Strategy::NoShard);
    // unsharded buffers live per unit
    let mut unsharded_live = vec![0u32; units.len()];
    // last backward op index touching each unit per micro-batch
    let mut last_bwd: HashMap<(usize, u32), usize> = HashMap::default();
    for (i, op) in schedule.iter().enumerate() {
        if op.id.index() != i {
            return Err(fail(format!("op at position {i} has id {}", op.id)));
        }
        if let OpKind::Backward { op: name, .. } = &op.kind {
            for &u in resolve(name).map(|k| op_params[k].as_slice()).unwrap_or(&[]) {
                last_bwd.insert((u, op.micro_batch), i);
            }
        }
    }
    for (i, op) in schedule.iter().enumerate() {
        for d in &op.deps {
            if d.index() >= i {
                return Err(fail(format!("{} depends on later {}", op.id, d)));
            }
        }
        match &op.kind {
            OpKind::Forward { op: name, .. } | OpKind::Backward { op: name, .. } | OpKind::Recompute { op: name, .. } if !no_shard => {
                for &u in resolve(name).map(|k| op_params[k].as_slice()).unwrap_or(&[]) {
                    if unsharded_live[u] == 0 {
                        return Err(fail(format!(
                            "{} reads params of {} while it is sharded (not gathered before use)",
                            op.id,
                            units[u].label()
                        )));
                    }
                }
            }
            OpKind::ReduceScatter { unit, .. } => {
                if let Some(&lb) = last_bwd.get(&(unit.index(), op.micro_batch)) {
                    if lb > i {
                        return Err(fail(format!(
                            "{} reduce-scatters {} before its last gradient write op{lb}",
                            op.id,
                            units[unit.index()].label()
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
                    let buf = &buffers[k];
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
                    let buf = &buffers[k];
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
    for (k, buf) in buffers.iter().enumerate() {
        let persistent = matches!(
            buf.category,
            Category::ShardedParam | Category::Optstate | Category::Buffer | Category::Inputs
        ) || (no_shard && buf.category == Category::UnshardedParam);
        if alive[k] && !persistent {
            return Err(fail(format!("{} ({}) is still live at the end of the step", buf.id, buf.name)));
        }
    }
    if peak != memory.peak_bytes {
        return Err(fail(format!("simulated peak {peak} B != predicted {} B", memory.peak_bytes)));
    }
    for c in Category::ALL {
        let a = peak_cats[c.index()];
        let b = memory.breakdown.get(&c).copied().unwrap_or(0);
        if a != b {
            return Err(fail(format!("{}: simulated {a} B != predicted {b} B at the peak", c.name())));
        }
    }
    Ok(())
}
