//! Pass 5, memory: replays the schedule's events to find the per-rank peak, where it is
//! reached and FSDPMemTracker's breakdown at that moment; lists the collectives.

use crate::error::PlanError;
use crate::plan::*;
use crate::units::Unit;

pub fn describe(op: &ScheduleOp, units: Option<&[Unit]>) -> String {
    let label = |u: crate::ids::UnitId| -> String {
        units.map(|us| us[u.index()].label().to_string()).unwrap_or_else(|| u.to_string())
    };
    let s = match &op.kind {
        OpKind::Setup => "setup".to_string(),
        OpKind::AllGather { unit, prefetch, .. } => format!("all-gather {}{}", label(*unit), if *prefetch { " (prefetch)" } else { "" }),
        OpKind::CopyOut { unit } => format!("copy-out {}", label(*unit)),
        OpKind::Forward { op, .. } => format!("forward {op}"),
        OpKind::Recompute { op, .. } => format!("recompute {op}"),
        OpKind::Backward { op, .. } => format!("backward {op}"),
        OpKind::Reshard { unit } => format!("reshard {}", label(*unit)),
        OpKind::ReduceScatter { unit, .. } => format!("reduce-scatter {}", label(*unit)),
        OpKind::AllReduce { unit, .. } => format!("all-reduce {}", label(*unit)),
        OpKind::KeepGrads { unit } => format!("keep grads {}", label(*unit)),
        OpKind::AccumulateGrads { unit } => format!("accumulate grads {}", label(*unit)),
        OpKind::OptimizerStep { unit } => format!("optimizer step {}", label(*unit)),
        OpKind::ZeroGrad => "zero_grad".to_string(),
        OpKind::PhaseEnd => "end of backward".to_string(),
    };
    format!("{} {s}", op.id)
}

/// Replays the events; the peak is checked after every allocation. It reads no offsets:
/// `arena_bytes` is left 0 for the caller to fill in with [`arena_bytes`] once offsets exist.
pub fn simulate(ops: &[ScheduleOp], buffers: &[BufferInfo], units: &[Unit]) -> Result<Memory, PlanError> {
    let mut live = 0u64;
    let mut by_cat = [0u64; 11];
    let mut peak = 0u64;
    let mut peak_op = crate::ids::OpId(0);
    let mut breakdown = by_cat;
    for op in ops {
        for ev in &op.events {
            match *ev {
                Event::Alloc(b) => {
                    let buf = &buffers[b.index()];
                    live += buf.bytes;
                    by_cat[buf.category.index()] += buf.bytes;
                    if live > peak {
                        peak = live;
                        peak_op = op.id;
                        breakdown = by_cat;
                    }
                }
                Event::Free(b) => {
                    let buf = &buffers[b.index()];
                    live = live.checked_sub(buf.bytes).ok_or_else(|| PlanError::Verify(format!("{} freed more than allocated", buf.id)))?;
                    let c = &mut by_cat[buf.category.index()];
                    *c = c.saturating_sub(buf.bytes);
                }
            }
        }
    }
    Ok(Memory {
        peak_bytes: peak,
        peak_at: ops.get(peak_op.index()).map(|o| describe(o, Some(units))).unwrap_or_default(),
        peak_op,
        breakdown: Category::ALL.iter().map(|&c| (c, breakdown[c.index()])).collect(),
        arena_bytes: 0,
        rank: 0,
        host: None,
    })
}

/// What FSDP2's CPUOffloadPolicy keeps on rank 0's host (`None` without offload): every
/// parameter's padded shard in its own dtype (`_sharded_param_data`), its unpadded sharded
/// grad (copied back after each reduce-scatter), and the optimizer's state and float32 step
/// counter per parameter — all alive when the optimizer steps on the host, where single-tensor
/// Adam adds its two temporaries of the largest parameter (sqrt, denom; measured on CPU, the
/// rule the device plan uses). Bytes exact: the host allocator does not round them (as
/// FSDPMemTracker counts the CPU).
pub fn host(units: &[Unit], opts: &crate::options::Options) -> Option<HostMemory> {
    if opts.offload != crate::options::Offload::Cpu {
        return None;
    }
    let ws = opts.shard_size();
    let params = || units.iter().flat_map(|u| &u.params);
    let sharded_param: u64 = params().map(|p| p.shard_numel * p.dtype.size()).sum();
    let sharded_grad: u64 = params().map(|p| p.grad_shard_bytes(ws)).sum();
    let (optstate, optimizer_temp) = if opts.optimizer.keeps_state() {
        let steps = 4 * params().filter(|p| p.requires_grad).count() as u64;
        (2 * sharded_grad + steps, 2 * params().map(|p| p.grad_shard_bytes(ws)).max().unwrap_or(0))
    } else {
        (0, 0)
    };
    Some(HostMemory { peak_bytes: sharded_param + sharded_grad + optstate + optimizer_temp, sharded_param, sharded_grad, optstate, optimizer_temp })
}

/// What `--offload cpu` keeps on a node's host: every rank of the node its share
/// ([`HostMemory::peak_bytes`]: shards, grads, optimizer state and the step's temporaries;
/// the OS, the data loader and CUDA's own pinned buffers take more), against the node's host
/// memory where the profile knows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostNeed {
    pub per_rank: u64,
    /// The job's ranks on one node: a node's GPUs, or the whole job where it is smaller.
    pub ranks: u64,
    /// The node's host memory ([`crate::hardware::Host::memory_bytes`]).
    pub has: Option<u64>,
}

impl HostNeed {
    /// `per_rank` bytes on each rank of a `world_size` job on `hw`.
    pub fn of(per_rank: u64, world_size: u64, hw: &crate::hardware::Hardware) -> HostNeed {
        HostNeed { per_rank, ranks: world_size.min(hw.gpus_per_node.max(1)), has: hw.host.as_ref().and_then(|h| h.memory_bytes) }
    }

    /// What the node's ranks keep on its host together.
    pub fn bytes(&self) -> u64 {
        self.per_rank.saturating_mul(self.ranks)
    }

    /// Whether the node's host holds it (an unknown memory is not checked).
    pub fn fits(&self) -> bool {
        self.has.is_none_or(|h| self.bytes() <= h)
    }

    /// `757.92 GiB per rank × 8 ranks = 5.92 TiB`.
    pub fn describe(&self) -> String {
        format!("{} per rank × {} ranks = {}", crate::print::bytes(self.per_rank), self.ranks, crate::print::bytes(self.bytes()))
    }
}

/// [`HostNeed`] of an offloaded plan (`None` without offload).
pub fn host_need(plan: &crate::plan::Plan, hw: &crate::hardware::Hardware) -> Option<HostNeed> {
    plan.memory.host.as_ref().map(|h| HostNeed::of(h.peak_bytes, plan.options.world_size, hw))
}

/// Per schedule op: (bytes live after it, peak bytes while it ran), replayed like
/// [`simulate`]; what a runtime compares its measured memory with, op by op.
pub fn per_op(ops: &[ScheduleOp], buffers: &[BufferInfo]) -> Vec<(u64, u64)> {
    let mut live = 0u64;
    ops.iter()
        .map(|op| {
            let mut peak = live;
            for ev in &op.events {
                match *ev {
                    Event::Alloc(b) => {
                        live += buffers[b.index()].bytes;
                        peak = peak.max(live);
                    }
                    Event::Free(b) => live = live.saturating_sub(buffers[b.index()].bytes),
                }
            }
            (live, peak)
        })
        .collect()
}

/// The buffers live at the plan's peak (the binding constraint on memory), largest first:
/// replays the events up to the peak op's allocation that reaches the peak.
pub fn live_at_peak(plan: &crate::plan::Plan) -> Vec<&BufferInfo> {
    let mut live: std::collections::BTreeSet<usize> = Default::default();
    let mut cur = 0u64;
    'ops: for op in &plan.schedule {
        for e in &op.events {
            match *e {
                crate::plan::Event::Alloc(b) => {
                    live.insert(b.index());
                    cur += plan.buffers[b.index()].bytes;
                }
                crate::plan::Event::Free(b) => {
                    if live.remove(&b.index()) {
                        cur -= plan.buffers[b.index()].bytes;
                    }
                }
            }
            if op.id == plan.memory.peak_op && cur == plan.memory.peak_bytes {
                break 'ops;
            }
        }
    }
    let mut v: Vec<&BufferInfo> = live.into_iter().map(|i| &plan.buffers[i]).filter(|b| b.bytes > 0).collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.bytes));
    v
}

/// Size of the per-rank arena: the largest offset + size.
pub fn arena_bytes(buffers: &[BufferInfo], spans: &[u64]) -> u64 {
    buffers.iter().zip(spans).map(|(b, s)| b.offset + s).max().unwrap_or(0)
}

/// The collectives of the step, in issue order.
pub fn collectives(ops: &[ScheduleOp], units: &[Unit]) -> Vec<Collective> {
    ops.iter()
        .filter_map(|op| {
            let (kind, unit, numel, dtype) = match &op.kind {
                OpKind::AllGather { unit, numel, dtype, .. } => ("all_gather", unit, numel, dtype),
                OpKind::ReduceScatter { unit, numel, dtype, .. } => ("reduce_scatter", unit, numel, dtype),
                OpKind::AllReduce { unit, numel, dtype, .. } => ("all_reduce", unit, numel, dtype),
                _ => return None,
            };
            Some(Collective {
                kind: kind.to_string(),
                unit: units[unit.index()].modules_joined(),
                numel: *numel,
                dtype: dtype.torch_name().to_string(),
                op: op.id,
            })
        })
        .collect()
}
