//! Predicted step time: simulates a plan's schedule on its streams with [`crate::cost`]'s
//! op times, and replays its memory events on the predicted clock.
//!
//! Semantics (one rank; rank 0):
//!
//! - Each [`Stream`] runs its ops one at a time, in schedule order. An op starts when its
//!   stream is free and every op it depends on has finished; the step starts at 0 and ends
//!   when the last op ends.
//! - Dependencies are the schedule's `deps` plus the waits FSDP2 inserts between its
//!   streams (torch 2.11 `_fsdp_param_group.py` / `_fsdp_state.py`), which the schedule
//!   leaves implicit:
//!   1. an all-gather of a unit waits for that unit's last reshard (the all-gather streams
//!      wait on `_reshard_after_forward_event`);
//!   2. forward: an all-gather waits for the copy-out two copy-outs back in the same forward
//!      pass (implicit prefetch keeps one all-gather output alive and the all-gather streams
//!      wait on the previous copy-out's event), and the first all-gathers of a forward pass
//!      wait for the compute op before the pass (the root pre-forward's `wait_stream`);
//!      backward: an all-gather waits for the last copy-out before it (the all-gather
//!      streams wait on each copy-out's event in pre-backward);
//!   3. the compute op after a reduce-scatter waits for the previous reduce-scatter of the
//!      same backward pass (post-backward waits on `reduce_scatter_state.event`);
//!   4. `PhaseEnd` and the optimizer step wait for every collective issued before them (the
//!      final callback waits for the last reduce-scatter, `finalize_backward` for the
//!      post-reduce event).
//!
//!   FSDP1 (`--layout flat`) is simulated with the same rules (its `limit_all_gathers` rate
//!   limiter also allows two all-gathers in flight).
//! - Op times: compute ops from the model op they name ([`crate::cost::CostModel`]; forward
//!   and recompute alike); collectives by the ring formulas of [`crate::cost`] over their
//!   group; copy-out reads and writes the unit's unsharded bytes (FSDP1 gathers in place: no
//!   copy); the optimizer step is memory-bound over the shard; reshard, keep-grads, setup,
//!   phase end, zero_grad and schedule-only compute ops (`post-forward`, freeing the causal
//!   mask) take `op_overhead_s`.
//!
//! - On a GPU profile two costs more ([`gpu_spans`]): the CPU launches every kernel in
//!   schedule order (an op starts no earlier than its launch, and lasts at least as long as
//!   launching its kernels takes), and a compute op runs `comm_sm_share` slower while a
//!   collective runs beside it. The CPU never waits for the GPU but where FSDP2 blocks it:
//!   under `--offload cpu --grad-sync each`, each reduction past the step's first
//!   micro-batch, whose copy to the host is a blocking one followed by the CPU's add into the
//!   host's grads ([`cost::host_accumulate_s`]), and the first micro-batch's end of backward
//!   (`finalize_backward` waits for its non-blocking copies): nothing more is launched until
//!   they are done.
//!
//! Metrics: `compute_s` = busy time of the compute stream; `comm_s` = summed collective
//! time; `exposed_comm_s` = time some collective runs while the compute stream is idle;
//! model FLOPs per step = `grad_accum · 3 · Σ forward model FLOPs` =
//! `6·N·T + 12·L·h·hd·s·T` for a dense transformer (`N` GEMM parameters — embedding
//! gathers excluded, LM head included —, `T` local tokens; attention without the causal
//! discount, as torchtitan and PaLM count it); MFU = model FLOPs / (step time · peak bf16
//! FLOP/s); tokens/s/GPU = `batch · seq · grad_accum` / step time.

use crate::cost::{self, Coll, CostModel};
use crate::hardware::Hardware;
use crate::ids::{OpId, UnitId};
use crate::options::Layout;
use crate::plan::*;
use fsdp_ir::Model;
use serde::Serialize;
use std::fmt::Write;

/// When one op of the schedule runs on the predicted clock (seconds from step start).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OpSpan {
    pub op: OpId,
    pub stream: Stream,
    pub start: f64,
    pub end: f64,
}

/// The predicted time of one training step of a plan on one hardware profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeReport {
    pub hardware: String,
    pub step_time_s: f64,
    /// Busy time of the compute stream.
    pub compute_s: f64,
    /// Time some collective runs while the compute stream is idle.
    pub exposed_comm_s: f64,
    /// Sum of the collectives' times (all communication streams).
    pub comm_s: f64,
    pub mfu: f64,
    /// Model FLOPs of the step on this rank (see the module docs).
    pub model_flops: f64,
    /// Tokens this rank trains on per step (`batch · seq · grad_accum`).
    pub tokens_per_step: u64,
    pub tokens_per_s_per_gpu: f64,
    /// Every op, in schedule order.
    pub ops: Vec<OpSpan>,
}

fn stream_index(s: Stream) -> usize {
    match s {
        Stream::Compute => 0,
        Stream::AllGather => 1,
        Stream::ReduceScatter => 2,
        Stream::AllReduce => 3,
    }
}

fn is_collective(k: &OpKind) -> bool {
    matches!(k, OpKind::AllGather { .. } | OpKind::ReduceScatter { .. } | OpKind::AllReduce { .. })
}

/// The waits FSDP2 adds between streams (rules 1–4 of the module docs), per op: indices of
/// earlier ops.
pub fn implicit_deps(ops: &[ScheduleOp]) -> Vec<Vec<usize>> {
    let mut deps = vec![vec![]; ops.len()];
    let mut last_reshard: rustc_hash::FxHashMap<crate::ids::UnitId, usize> = Default::default();
    let mut copyouts: Vec<usize> = vec![]; // copy-outs of the current pass
    let mut pass: Option<(Phase, u32)> = None;
    let mut before_pass: Option<usize> = None; // last compute op before the current pass
    let mut last_compute: Option<usize> = None;
    let mut last_rs: Option<usize> = None; // last reduce-scatter of this backward pass
    let mut pending_wait: Option<usize> = None; // rule 3: the next compute op waits for this
    let mut last_coll: [Option<usize>; 4] = [None; 4]; // last collective per stream
    for (i, op) in ops.iter().enumerate() {
        let key = (op.phase, op.micro_batch);
        if pass != Some(key) {
            pass = Some(key);
            copyouts.clear();
            before_pass = last_compute;
            last_rs = None;
        }
        match &op.kind {
            OpKind::AllGather { unit, .. } => {
                if let Some(&r) = last_reshard.get(unit) {
                    deps[i].push(r);
                }
                match op.phase {
                    Phase::Forward => match copyouts.len() {
                        0 | 1 => deps[i].extend(before_pass),
                        n => deps[i].push(copyouts[n - 2]),
                    },
                    _ => deps[i].extend(copyouts.last().copied()),
                }
            }
            OpKind::ReduceScatter { .. } => pending_wait = last_rs.replace(i),
            // the streams run in order: waiting for the last op of each waits for all
            OpKind::PhaseEnd | OpKind::OptimizerStep { .. } => deps[i].extend(last_coll.iter().flatten().copied()),
            _ => {}
        }
        if op.stream == Stream::Compute {
            if let Some(w) = pending_wait.take() {
                deps[i].push(w);
            }
            match op.kind {
                OpKind::CopyOut { .. } => copyouts.push(i),
                OpKind::Reshard { unit } => {
                    last_reshard.insert(unit, i);
                }
                _ => {}
            }
            last_compute = Some(i);
        }
        if is_collective(&op.kind) {
            last_coll[stream_index(op.stream)] = Some(i);
        }
    }
    deps
}

/// Runs ops on their streams: each stream in schedule order; an op starts when its stream
/// is free and its `deps` (the op's own and `extra[i]`) have ended. A dependency on a later
/// op of the same schedule is honoured too; a cycle is broken by ignoring the unfinished
/// dependencies of the earliest blocked op.
pub fn simulate(ops: &[ScheduleOp], extra: &[Vec<usize>], dur: &[f64]) -> Vec<OpSpan> {
    run_streams(ops, &Deps::new(ops, extra), dur, &[])
}

/// What each op waits for (its schedule deps and `extra`, by index; not itself), made once
/// for the rounds of a simulation: `list[at[i]..at[i + 1]]`.
struct Deps {
    at: Vec<usize>,
    list: Vec<usize>,
}

impl Deps {
    fn new(ops: &[ScheduleOp], extra: &[Vec<usize>]) -> Deps {
        let index_of: rustc_hash::FxHashMap<OpId, usize> = ops.iter().enumerate().map(|(i, o)| (o.id, i)).collect();
        let mut at = Vec::with_capacity(ops.len() + 1);
        let mut list = Vec::with_capacity(2 * ops.len());
        for (i, op) in ops.iter().enumerate() {
            at.push(list.len());
            list.extend(op.deps.iter().filter_map(|d| index_of.get(d).copied()).chain(extra.get(i).into_iter().flatten().copied()).filter(|&d| d != i));
        }
        at.push(list.len());
        Deps { at, list }
    }

    fn of(&self, i: usize) -> &[usize] {
        &self.list[self.at[i]..self.at[i + 1]]
    }
}

/// [`simulate`], op `i` also waiting until `release[i]` (when given: the CPU's launch).
fn run_streams(ops: &[ScheduleOp], deps: &Deps, dur: &[f64], release: &[f64]) -> Vec<OpSpan> {
    let n = ops.len();
    let mut end: Vec<Option<f64>> = vec![None; n];
    let mut start = vec![0.0; n];
    let mut queues: [Vec<usize>; 4] = Default::default();
    for (i, op) in ops.iter().enumerate() {
        queues[stream_index(op.stream)].push(i);
    }
    let mut head = [0usize; 4];
    let mut free = [0.0f64; 4];
    let deps_of = |i: usize| deps.of(i);
    let released = |i: usize| release.get(i).copied().unwrap_or(0.0);
    let mut done = 0;
    while done < n {
        let mut progressed = false;
        for s in 0..4 {
            while let Some(&i) = queues[s].get(head[s]) {
                let ds = deps_of(i);
                if ds.iter().any(|&d| end[d].is_none()) {
                    break;
                }
                let ready = ds.iter().filter_map(|&d| end[d]).fold(released(i), f64::max);
                start[i] = free[s].max(ready);
                let e = start[i] + dur[i];
                end[i] = Some(e);
                free[s] = e;
                head[s] += 1;
                done += 1;
                progressed = true;
            }
        }
        if !progressed {
            // a cycle: run the earliest blocked head now
            let Some((s, i)) = (0..4).filter_map(|s| queues[s].get(head[s]).map(|&i| (s, i))).min_by_key(|x| x.1) else {
                break;
            };
            let ready = deps_of(i).iter().filter_map(|&d| end[d]).fold(released(i), f64::max);
            start[i] = free[s].max(ready);
            let e = start[i] + dur[i];
            end[i] = Some(e);
            free[s] = e;
            head[s] += 1;
            done += 1;
        }
    }
    ops.iter()
        .enumerate()
        .map(|(i, o)| OpSpan {
            op: o.id,
            stream: o.stream,
            start: start[i],
            end: end[i].unwrap_or(start[i]),
        })
        .collect()
}

/// [`op_cost`] of each of `ops`: durations and kernels.
fn op_costs(plan: &Plan, cm: &CostModel, hw: &Hardware, ops: &[ScheduleOp]) -> (Vec<f64>, Vec<u32>) {
    cm.with_times(hw, |times| ops.iter().map(|op| op_cost(plan, times, hw, op)).unzip())
}

/// One schedule op's duration on `hw` and the kernels the CPU launches for it (a model op's
/// times from `times`).
fn op_cost(plan: &Plan, times: &mut dyn FnMut(&OpName) -> cost::OpTime, hw: &Hardware, op: &ScheduleOp) -> (f64, u32) {
    // (a model op's launches, forward or backward; any other op's one)
    match &op.kind {
        // (FSDP2 does not run a cached recompute: selective AC's kept output, the early stop)
        OpKind::Recompute { cached: true, .. } => (0.0, 0),
        OpKind::Forward { op: name, .. } | OpKind::Recompute { op: name, .. } => {
            let t = times(name);
            (if t.fused { 0.0 } else { t.forward.map_or(hw.op_overhead_s, |f| f + hw.forward_op_overhead_s) }, t.launches.0)
        }
        OpKind::Backward { op: name, .. } => {
            let t = times(name);
            (if t.fused { 0.0 } else { t.backward.map_or(hw.op_overhead_s, |b| b + hw.backward_op_overhead_s) }, t.launches.1)
        }
        _ => (other_duration(plan, hw, op), 1),
    }
}

/// The duration ([`op_cost`]) of an op that runs no model op.
fn other_duration(plan: &Plan, hw: &Hardware, op: &ScheduleOp) -> f64 {
    let o = &plan.options;
    // (a post-forward group is its unit's: `reshard_after_forward=N` may differ per unit)
    let shape = |group: Group, unit: UnitId| cost::group_shape(o, group, plan.unit(unit).reshard_to, hw.gpus_per_node);
    let coll = |kind: Coll, numel: u64, dtype: fsdp_ir::DType, group: Group, unit: UnitId| {
        let (n, per) = shape(group, unit);
        cost::collective_time(hw, kind, (numel * dtype.size()) as f64, n, per)
    };
    // FSDP2 copies the shards into the all-gather input (copy-in) and the gradients into the
    // reduce-scatter input (chunk_cat) on the collective's stream: read + write, memory-bound
    let copy = |bytes: u64| 2.0 * bytes as f64 / (hw.hbm_bandwidth * hw.efficiency.memory) + hw.op_overhead_s;
    let flat = o.layout == Layout::Flat;
    match &op.kind {
        OpKind::AllGather { unit, numel, dtype, group, .. } => {
            let (n, _) = shape(*group, *unit);
            let copy_in = if flat { 0.0 } else { copy(numel * dtype.size() / n.max(1)) };
            // --offload cpu: each parameter's shard up from the host first (then cast)
            cost::offload_copy_s(hw, plan.unit(*unit), o, true) + coll(Coll::AllGather, *numel, *dtype, *group, *unit) + copy_in
        }
        OpKind::ReduceScatter { unit, numel, dtype, group, .. } => {
            let chunk_cat = if flat { 0.0 } else { copy(numel * dtype.size()) };
            // --offload cpu: the reduced shards down to the host after it (after the replicas'
            // all-reduce under HSDP)
            let d2h = if o.replicate_size() > 1 { 0.0 } else { cost::offload_copy_s(hw, plan.unit(*unit), o, false) };
            coll(Coll::ReduceScatter, *numel, *dtype, *group, *unit) + chunk_cat + d2h
        }
        OpKind::AllReduce { unit, numel, dtype, group: group @ Group::Replicate } => coll(Coll::AllReduce, *numel, *dtype, *group, *unit) + cost::offload_copy_s(hw, plan.unit(*unit), o, false),
        OpKind::AllReduce { unit, numel, dtype, group } => coll(Coll::AllReduce, *numel, *dtype, *group, *unit),
        // (model ops: [`op_cost`])
        OpKind::Forward { .. } | OpKind::Recompute { .. } | OpKind::Backward { .. } => 0.0,
        OpKind::CopyOut { unit } => {
            if o.layout == Layout::Flat {
                hw.op_overhead_s
            } else {
                let b = cost::unsharded_bytes(plan.unit(*unit), o) as f64;
                2.0 * b / (hw.hbm_bandwidth * hw.efficiency.memory) + hw.op_overhead_s
            }
        }
        OpKind::OptimizerStep { unit } if o.offload == crate::options::Offload::Cpu && hw.host.is_some() => {
            cost::host_optimizer_s(hw, plan.unit(*unit), o).unwrap_or(0.0)
        }
        OpKind::OptimizerStep { unit } => {
            let (k, launches) = cost::optimizer_kernels(plan.unit(*unit), o);
            k.iter().map(|k| k.time(hw)).sum::<f64>() + launches.max(1) as f64 * hw.op_overhead_s
        }
        OpKind::Setup | OpKind::Reshard { .. } | OpKind::KeepGrads { .. } | OpKind::AccumulateGrads { .. } | OpKind::ZeroGrad | OpKind::PhaseEnd => hw.op_overhead_s,
    }
}

/// Total length of the union of intervals.
fn union(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.retain(|x| x.1 > x.0);
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = vec![];
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Length of `a` (disjoint, sorted) not covered by `b` (disjoint, sorted).
fn uncovered(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    let mut total = 0.0;
    for &(s, e) in a {
        let mut t = s;
        let mut len = 0.0;
        for &(bs, be) in b {
            if be <= t {
                continue;
            }
            if bs >= e {
                break;
            }
            if bs > t {
                len += bs - t;
            }
            t = t.max(be);
            if t >= e {
                break;
            }
        }
        if t < e {
            len += e - t;
        }
        total += len;
    }
    total
}

/// Predicts the step time of `plan` for `model` on `hw` (see the module docs).
pub fn predict(plan: &Plan, model: &Model, hw: &Hardware) -> TimeReport {
    predict_with(plan, hw, &CostModel::new(plan, model))
}

/// [`predict`] with the plan's cost model made already (`tune` makes one per micro-batch and
/// per whether anything is checkpointed: of the options a configuration changes, the cost
/// model reads only those), its op times kept for `hw` ([`CostModel::times`]).
pub fn predict_with(plan: &Plan, hw: &Hardware, cm: &CostModel) -> TimeReport {
    let (dur, kernels) = op_costs(plan, cm, hw, &plan.schedule);
    let spans = if let Some(g) = &hw.gpu {
        gpu_spans(plan, hw, &kernels, g, &dur)
    } else if hw.serial_streams {
        // one thread runs every op in schedule order (our CPU runtime)
        let mut t = 0.0;
        plan.schedule
            .iter()
            .zip(&dur)
            .map(|(op, d)| {
                let s = OpSpan { op: op.id, stream: op.stream, start: t, end: t + d };
                t += d;
                s
            })
            .collect()
    } else {
        let extra = implicit_deps(&plan.schedule);
        simulate(&plan.schedule, &extra, &dur)
    };
    report(plan, hw, cm.model_flops * plan.options.grad_accum as f64, spans)
}

/// The step time [`predict_with`] gives the same plan with `n` micro-batches accumulated,
/// from this plan of `k` (6 ≤ k < n) whose builder reached a steady state
/// ([`Plan::steady`]: the plan of `n` is this one with micro-batch `k − 2` repeated `n − k`
/// times, each copy's ops and buffers as many later): `None` where that cannot be shown
/// from this plan's simulation (`tune` then plans the `n` micro-batches).
///
/// What is shown, in every round the simulation runs (one on a CPU profile; on a GPU the
/// first and the three stretched ones of `gpu_spans`), with `Q`, `T` and `L` micro-batches
/// `k − 3`, `k − 2` and the last (with the optimizer's ops after it):
/// - `T` runs as `Q` did, every op `P` later (start and end), `P` the round's period;
/// - nothing waits for an op of a later micro-batch, and no collective of `T` (of `L`) runs
///   beside a compute op before `T` (before `L`): what runs before an op never depends on
///   what comes after its micro-batch — the `k` plan's micro-batches before `L` are the `n`
///   plan's first `k − 1`;
/// - what an op of `T` waits for (its dependencies, the op before it on its stream) is in `Q`
///   or `T`, or is of micro-batch 0 or the setup and ends before the op starts; an op of `L`
///   the same with `L` too; where the CPU's launches do not keep the period `P`
///   (GPU-bound: the CPU gets further ahead every micro-batch), no op of `T` or `L` waits
///   for its launch;
/// - a compute op of `T` runs beside collectives of `Q` and `T` only (in the round before:
///   its stretch), of `L` beside those of `Q`, `T` and `L`.
///
/// Then by induction each copy runs as the one before, `P` later, and `L` as here,
/// `(n − k) · P` later: the step takes that much longer (to float rounding, within 10⁻⁹ of
/// the step; `planner/tests/accum.rs` holds it to the plan of `n`).
pub fn predict_longer(plan: &Plan, hw: &Hardware, cm: &CostModel, n: u32) -> Option<f64> {
    let k = plan.options.grad_accum as usize;
    let ops = &plan.schedule;
    if !plan.steady || k < 6 || n as usize <= k {
        return None;
    }
    // each micro-batch's first op (the setup's ops are micro-batch 0's; the optimizer's the
    // last's)
    let mut first = vec![usize::MAX; k + 1];
    let mut last = 0;
    for (i, op) in ops.iter().enumerate() {
        let m = op.micro_batch as usize;
        if m < last || m >= k {
            return None;
        }
        last = m;
        if first[m] == usize::MAX {
            first[m] = i;
        }
    }
    first[k] = ops.len();
    if first.contains(&usize::MAX) {
        return None;
    }
    let block: Vec<usize> = ops.iter().map(|o| o.micro_batch as usize).collect();
    let (q, t, l) = (first[k - 3], first[k - 2], first[k - 1]);
    let w = t - q;
    if l - t != w {
        return None;
    }
    let (dur, kernels) = op_costs(plan, cm, hw, ops);
    if hw.gpu.is_none() && hw.serial_streams {
        // one thread, every op in order: each copy adds T's ops' time (T's ops as Q's)
        if dur[t..l] != dur[q..t] {
            return None;
        }
        let each: f64 = dur[t..l].iter().sum();
        let total: f64 = dur.iter().sum();
        return Some(total + (n as usize - k) as f64 * each);
    }
    // (a CPU held back by the GPU, `--offload cpu --grad-sync each`: its launches no longer
    // run on a clock of their own, which the argument below takes)
    if cpu_blocks(plan, hw).is_some() {
        return None;
    }
    let deps = Deps::new(ops, &implicit_deps(ops));
    // nothing waits for a later micro-batch's op
    if (0..ops.len()).any(|i| deps.of(i).iter().any(|&d| block[d] > block[i])) {
        return None;
    }
    let (rounds, release) = match &hw.gpu {
        Some(g) => gpu_rounds(plan, &kernels, g, &dur, &deps, None),
        None => (vec![run_streams(ops, &deps, &dur, &[])], vec![]),
    };
    let fin = rounds.last()?;
    let step = fin.iter().map(|s| s.end).fold(0.0, f64::max);
    let tol = 1e-9 * step;
    let fixed = first[1];
    let comm_of = |s: &[OpSpan], r: std::ops::Range<usize>| union(s[r].iter().filter(|x| x.stream != Stream::Compute).map(|x| (x.start, x.end)).collect());
    let mut period = 0.0;
    for (r, s) in rounds.iter().enumerate() {
        let p = s[t].start - s[q].start;
        if p <= 0.0 || (t..l).any(|i| (s[i].start - s[i - w].start - p).abs() > tol || (s[i].end - s[i - w].end - p).abs() > tol) {
            return None;
        }
        // no collective of T (of L) beside a compute op before it
        for (from, to) in [(t, l), (l, ops.len())] {
            let later = comm_of(s, from..to);
            if (0..from).any(|i| s[i].stream == Stream::Compute && covered(s[i].start, s[i].end, &later) > tol) {
                return None;
            }
        }
        // the CPU's launches: a period of their own (the CPU's time per micro-batch)
        let cpu = release.get(t).zip(release.get(q)).map(|(a, b)| a - b);
        let launches_keep_up = cpu.is_none_or(|c| (c - p).abs() <= tol);
        if cpu.is_some_and(|c| c > p + tol) {
            return None;
        }
        let mut prev: [Option<usize>; 4] = [None; 4];
        for i in 0..ops.len() {
            let si = stream_index(ops[i].stream);
            if i >= t {
                let hi = if i < l { l } else { ops.len() };
                let mut other = 0.0f64;
                for d in deps.of(i).iter().copied().chain(prev[si]) {
                    if (q..hi).contains(&d) {
                        other = other.max(s[d].end);
                    } else if d < fixed {
                        if s[d].end + tol >= s[i].start {
                            return None;
                        }
                    } else {
                        return None;
                    }
                }
                if !launches_keep_up && release.get(i).is_some_and(|&rel| rel > other + tol) {
                    return None;
                }
            }
            prev[si] = Some(i);
        }
        // the stretch of T's and L's compute ops came from the round before's collectives
        if r > 0 {
            let before = &rounds[r - 1];
            let outside_t: Vec<(f64, f64)> = before.iter().enumerate().filter(|(j, x)| x.stream != Stream::Compute && !(q..l).contains(j)).map(|(_, x)| (x.start, x.end)).collect();
            let outside_l: Vec<(f64, f64)> = before[..q].iter().filter(|x| x.stream != Stream::Compute).map(|x| (x.start, x.end)).collect();
            let (outside_t, outside_l) = (union(outside_t), union(outside_l));
            for (i, x) in before.iter().enumerate().skip(t) {
                let outside = if i < l { &outside_t } else { &outside_l };
                if x.stream == Stream::Compute && covered(x.start, x.end, outside) > tol {
                    return None;
                }
            }
        }
        period = p;
    }
    // (the step ends in L)
    if fin[..l].iter().any(|x| x.end > step - tol) && fin[l..].iter().all(|x| x.end < step) {
        return None;
    }
    Some(step + (n as usize - k) as f64 * period)
}

/// The ops on a GPU: the streams as [`simulate`] runs them, with two costs a GPU adds.
///
/// - **The CPU issues every kernel.** Eager PyTorch dispatches an op's kernels one after the
///   other (`launches · cpu_launch_s`; an all-gather also costs FSDP2's hooks,
///   `fsdp_cpu_per_unshard_s`), in schedule order, never waiting for the GPU but where FSDP2
///   blocks it ([`cpu_blocks`]): an op starts no earlier than its first kernel's launch and
///   ends no earlier than its last.
/// - **Communication slows concurrent compute.** A running NCCL collective holds
///   `comm_sm_share` of the SMs: the part of a compute op that overlaps communication runs
///   at `1 − comm_sm_share` of its speed. The streams are simulated again with the
///   stretched times until they settle (three rounds).
fn gpu_spans(plan: &Plan, hw: &Hardware, kernels: &[u32], g: &crate::hardware::Gpu, dur: &[f64]) -> Vec<OpSpan> {
    let deps = Deps::new(&plan.schedule, &implicit_deps(&plan.schedule));
    let blocks = cpu_blocks(plan, hw);
    gpu_rounds(plan, kernels, g, dur, &deps, blocks.as_deref()).0.pop().unwrap_or_default()
}

/// Per op, how long the CPU works once the op has ended before it launches anything more,
/// where some op holds it back (`None` where none does): under `--offload cpu --grad-sync
/// each` (FSDP2 2.11), the reduction of each micro-batch past the step's first (the
/// reduce-scatter, or under HSDP the replicas' all-reduce after it, which the copy to the
/// host follows) — a blocking copy, then the CPU's add into the host's grads
/// ([`cost::host_accumulate_s`]) — and the first micro-batch's end of backward, where
/// `finalize_backward` waits on each param's `grad_offload_event` (its copies were
/// non-blocking) before the next micro-batch is launched (the phase end waits for every
/// collective: rule 4).
fn cpu_blocks(plan: &Plan, hw: &Hardware) -> Option<Vec<Option<f64>>> {
    let o = &plan.options;
    if o.offload != crate::options::Offload::Cpu || o.grad_sync != crate::options::GradSync::Each || hw.host.is_none() {
        return None;
    }
    let hsdp = o.replicate_size() > 1;
    let blocks: Vec<Option<f64>> = plan
        .schedule
        .iter()
        .map(|op| {
            let reduced = match op.kind {
                OpKind::ReduceScatter { unit, .. } if !hsdp => Some(unit),
                OpKind::AllReduce { unit, group: Group::Replicate, .. } if hsdp => Some(unit),
                OpKind::PhaseEnd if op.phase == Phase::Backward && op.micro_batch == 0 => return Some(0.0),
                _ => None,
            };
            reduced.filter(|_| op.micro_batch > 0).and_then(|u| cost::host_accumulate_s(hw, plan.unit(u), o))
        })
        .collect();
    blocks.iter().any(Option::is_some).then_some(blocks)
}

/// [`run_streams`] where some ops hold the CPU back (`blocks`, [`cpu_blocks`]): the ops run
/// in schedule order, each launched on the CPU's clock as [`gpu_rounds`] issues them
/// (`issue`: its first kernel's launch and the last's, from the CPU's time so far), and
/// after a holding op the clock waits for the op's end and the CPU's work after it. An op
/// starts when its stream is free, its dependencies have ended and it is launched (every
/// dependency is on an earlier op: the schedule's name ops made before, the implicit ones
/// earlier ops; where nothing blocks, the same spans as [`run_streams`]). The ops' releases
/// beside the spans.
fn run_in_order(ops: &[ScheduleOp], deps: &Deps, dur: &[f64], issue: &[(f64, f64)], blocks: &[Option<f64>]) -> (Vec<OpSpan>, Vec<f64>) {
    let mut end = vec![0.0f64; ops.len()];
    let mut release = Vec::with_capacity(ops.len());
    let mut free = [0.0f64; 4];
    // (how far the CPU's clock is behind: what it waited for so far)
    let mut behind = 0.0f64;
    let mut spans = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let rel = issue[i].0 + behind;
        release.push(rel);
        let s = stream_index(op.stream);
        debug_assert!(deps.of(i).iter().all(|&d| d < i), "op{i} waits for a later op");
        let ready = deps.of(i).iter().filter(|&&d| d < i).map(|&d| end[d]).fold(rel, f64::max);
        let start = free[s].max(ready);
        end[i] = start + dur[i];
        free[s] = end[i];
        spans.push(OpSpan { op: op.id, stream: op.stream, start, end: end[i] });
        if let Some(work) = blocks.get(i).copied().flatten() {
            // the CPU, past this op's launches at `issue[i].1 + behind`, waits for its end
            behind += (end[i] - (issue[i].1 + behind)).max(0.0) + work;
        }
    }
    (spans, release)
}

/// [`gpu_spans`]' every round (the first unstretched, the last the prediction) and each op's
/// release (its first kernel's launch).
fn gpu_rounds(plan: &Plan, kernels: &[u32], g: &crate::hardware::Gpu, dur: &[f64], deps: &Deps, blocks: Option<&[Option<f64>]>) -> (Vec<Vec<OpSpan>>, Vec<f64>) {
    let ops = &plan.schedule;
    let mut clock = 0.0;
    let issue: Vec<(f64, f64)> = ops
        .iter()
        .zip(kernels)
        .map(|(op, &kernels)| {
            let kernels = f64::from(kernels);
            let cpu = kernels * g.cpu_launch_s + if matches!(op.kind, OpKind::AllGather { .. }) { g.fsdp_cpu_per_unshard_s } else { 0.0 };
            let first = clock + cpu.min(g.cpu_launch_s);
            clock += cpu;
            (first, clock)
        })
        .collect();
    let mut release: Vec<f64> = issue.iter().map(|x| x.0).collect();
    // an op whose kernels take less GPU time than the CPU takes to launch them lasts that long
    let dur: Vec<f64> = dur.iter().zip(&issue).map(|(d, (first, last))| d.max(last - first)).collect();
    // (a CPU held back by some ops, whose clock then depends on the GPU's: in order, the
    // releases returned the last round's)
    let mut run = |stretched: &[f64]| match blocks {
        Some(b) => {
            let (spans, r) = run_in_order(ops, deps, stretched, &issue, b);
            release = r;
            spans
        }
        None => run_streams(ops, deps, stretched, &release),
    };
    let mut stretched = dur.clone();
    let mut rounds = vec![run(&stretched)];
    for _ in 0..3 {
        let Some(spans) = rounds.last() else { break };
        let comm = union(spans.iter().filter(|s| s.stream != Stream::Compute).map(|s| (s.start, s.end)).collect());
        let s = g.comm_sm_share;
        for (i, sp) in spans.iter().enumerate() {
            if sp.stream == Stream::Compute && dur[i] > 0.0 {
                let overlapped = covered(sp.start, sp.end, &comm);
                // the overlapped part ran at (1 − s): it needed `overlapped·(1 − s)` of the
                // op's work; the rest runs at full speed
                let done_slow = overlapped * (1.0 - s);
                stretched[i] = if done_slow >= dur[i] { dur[i] / (1.0 - s) } else { overlapped + (dur[i] - done_slow) };
            }
        }
        rounds.push(run(&stretched));
    }
    (rounds, release)
}

/// Length of `[s, e]` covered by the sorted, disjoint intervals `v` (from the first
/// interval ending after `s`, found by bisection, to the last starting before `e`).
fn covered(s: f64, e: f64, v: &[(f64, f64)]) -> f64 {
    let first = v.partition_point(|&(_, b)| b <= s);
    v[first..].iter().take_while(|&&(a, _)| a < e).map(|&(a, b)| (b.min(e) - a.max(s)).max(0.0)).sum()
}

/// (step time, compute-stream busy time, summed collective time, exposed communication) of
/// a step's spans, simulated or measured.
fn stream_times(spans: &[OpSpan]) -> (f64, f64, f64, f64) {
    let step = spans.iter().map(|s| s.end).fold(0.0, f64::max);
    let compute: Vec<(f64, f64)> = spans.iter().filter(|s| s.stream == Stream::Compute).map(|s| (s.start, s.end)).collect();
    let comm: Vec<(f64, f64)> = spans.iter().filter(|s| s.stream != Stream::Compute).map(|s| (s.start, s.end)).collect();
    let compute_s = compute.iter().map(|x| x.1 - x.0).sum();
    let comm_s = comm.iter().map(|x| x.1 - x.0).sum();
    (step, compute_s, comm_s, uncovered(&union(comm), &union(compute)))
}

/// A measured step (the runtime's timeline of one rank) as a report: the same figures as a
/// prediction's, without FLOPs or MFU; `hardware` says what measured it.
pub fn measured(plan: &Plan, hardware: String, spans: Vec<OpSpan>) -> TimeReport {
    let (step, compute_s, comm_s, exposed) = stream_times(&spans);
    let o = &plan.options;
    let tokens = o.batch * o.seq * o.grad_accum as u64;
    TimeReport {
        hardware,
        step_time_s: step,
        compute_s,
        exposed_comm_s: exposed,
        comm_s,
        mfu: 0.0,
        model_flops: 0.0,
        tokens_per_step: tokens,
        tokens_per_s_per_gpu: tokens as f64 / step.max(1e-12),
        ops: spans,
    }
}

/// Metrics of simulated spans.
pub fn report(plan: &Plan, hw: &Hardware, model_flops: f64, spans: Vec<OpSpan>) -> TimeReport {
    let (step, compute_s, comm_s, exposed) = stream_times(&spans);
    let o = &plan.options;
    let tokens = o.batch * o.seq * o.grad_accum as u64;
    let (mfu, tps) = if step > 0.0 {
        (model_flops / (step * hw.peak_flops.bf16), tokens as f64 / step)
    } else {
        (0.0, 0.0)
    };
    TimeReport {
        hardware: hw.name.clone(),
        step_time_s: step,
        compute_s,
        exposed_comm_s: exposed,
        comm_s,
        mfu,
        model_flops,
        tokens_per_step: tokens,
        tokens_per_s_per_gpu: tps,
        ops: spans,
    }
}

/// Memory in use while one op runs, by category ([`Category::ALL`] order).
#[derive(Debug, Clone, PartialEq)]
pub struct MemSample {
    /// Seconds from step start.
    pub t: f64,
    /// The op (None: the end of the step).
    pub op: Option<OpId>,
    pub bytes: [u64; 11],
}

impl MemSample {
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

fn cat_index(c: Category) -> usize {
    Category::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

/// Replays the plan's alloc/free events on the predicted clock, in schedule order (the
/// CPU's issue order, which is what the caching allocator and FSDPMemTracker see): a
/// compute op's events happen at its start; a collective's when the op before it in the
/// schedule was issued. Each sample is the memory in use while its op runs: the larger of
/// the memory before it and after each of its allocations (so the largest sample equals the
/// plan's predicted peak, with the same breakdown). A last sample at the step's end holds
/// the persistent state.
pub fn memory_timeline(plan: &Plan, report: &TimeReport) -> Vec<MemSample> {
    let mut cur = [0u64; 11];
    let mut out = Vec::with_capacity(plan.schedule.len() + 1);
    let mut t = 0.0f64;
    for (i, op) in plan.schedule.iter().enumerate() {
        if op.stream == Stream::Compute {
            if let Some(s) = report.ops.get(i) {
                t = t.max(s.start);
            }
        }
        let mut best = cur;
        let mut best_total: u64 = cur.iter().sum();
        for ev in &op.events {
            match *ev {
                Event::Alloc(b) => {
                    let buf = &plan.buffers[b.index()];
                    cur[cat_index(buf.category)] += buf.bytes;
                    let tot: u64 = cur.iter().sum();
                    if tot > best_total {
                        best_total = tot;
                        best = cur;
                    }
                }
                Event::Free(b) => {
                    let buf = &plan.buffers[b.index()];
                    let c = &mut cur[cat_index(buf.category)];
                    *c = c.saturating_sub(buf.bytes);
                }
            }
        }
        out.push(MemSample { t, op: Some(op.id), bytes: best });
    }
    out.push(MemSample {
        t: report.step_time_s.max(t),
        op: None,
        bytes: cur,
    });
    out
}

/// One sample per instant: of several samples at the same time (ops that take no time),
/// the one with the most memory in use.
pub fn coalesce(mem: &[MemSample]) -> Vec<MemSample> {
    let mut out: Vec<MemSample> = Vec::with_capacity(mem.len());
    for m in mem {
        match out.last_mut() {
            Some(l) if l.t == m.t => {
                if m.total() > l.total() {
                    *l = m.clone();
                }
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// `1.23 s`, `45.6 ms`, `7.8 µs`.
pub fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// A share as a percentage: `43.2%`, small ones with more digits (`0.0213%`).
pub fn pct(x: f64) -> String {
    let v = 100.0 * x;
    if v != 0.0 && v.abs() < 0.1 {
        format!("{v:.2e}%")
    } else {
        format!("{v:.1}%")
    }
}

/// `12,345`.
pub fn thousands(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The time section of `plan`'s text output.
pub fn render(r: &TimeReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\npredicted step time on {} (rank 0): {} · {} tokens/s/GPU · MFU {}",
        r.hardware,
        secs(r.step_time_s),
        thousands(r.tokens_per_s_per_gpu),
        pct(r.mfu)
    );
    let _ = writeln!(s, "  compute          {:>12}  (compute stream busy)", secs(r.compute_s));
    let _ = writeln!(s, "  communication    {:>12}  (all collectives)", secs(r.comm_s));
    let _ = writeln!(s, "  exposed comm     {:>12}  (compute stream idle on communication)", secs(r.exposed_comm_s));
    let _ = writeln!(
        s,
        "  model FLOPs      {:>12}  per step, {} tokens (6·N·T + 12·L·h·hd·s·T)",
        format!("{:.3e}", r.model_flops),
        r.tokens_per_step
    );
    s
}

/// The `"time"` object of `plan --format json` (the report without the per-op spans).
pub fn json(r: &TimeReport) -> serde_json::Value {
    serde_json::json!({
        "hardware": r.hardware,
        "step_time_s": r.step_time_s,
        "compute_s": r.compute_s,
        "comm_s": r.comm_s,
        "exposed_comm_s": r.exposed_comm_s,
        "mfu": r.mfu,
        "model_flops": r.model_flops,
        "tokens_per_step": r.tokens_per_step,
        "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
    })
}

/// Time rows for `diff`, in [`crate::diff::render`]'s layout.
pub fn diff_rows(a: &TimeReport, b: &TimeReport) -> String {
    let mut s = String::new();
    let row = |s: &mut String, k: &str, x: String, y: String| {
        let mark = if x != y { " *" } else { "" };
        let _ = writeln!(s, "{k:<28} {x:>22} {y:>22}{mark}");
    };
    let hw = if a.hardware == b.hardware { format!("step time ({})", a.hardware) } else { "step time".to_string() };
    row(&mut s, &hw, secs(a.step_time_s), secs(b.step_time_s));
    row(&mut s, "  compute", secs(a.compute_s), secs(b.compute_s));
    row(&mut s, "  exposed comm", secs(a.exposed_comm_s), secs(b.exposed_comm_s));
    row(&mut s, "MFU", pct(a.mfu), pct(b.mfu));
    row(&mut s, "tokens/s/GPU", thousands(a.tokens_per_s_per_gpu), thousands(b.tokens_per_s_per_gpu));
    s
}

#[cfg(test)]
mod tests {
    use super::{union, uncovered};

    /// Exposed communication is what no compute span covers (hand-computed figures).
    #[test]
    fn exposed_communication_is_what_compute_does_not_cover() {
        let exposed = |comm: Vec<(f64, f64)>, compute: Vec<(f64, f64)>| uncovered(&union(comm), &union(compute));
        // serial (the CPU runtime): all of it
        assert_eq!(exposed(vec![(1.0, 2.0), (3.0, 4.0)], vec![(0.0, 1.0), (2.0, 3.0)]), 2.0);
        // a collective overlapped by compute for half its length, another wholly hidden
        assert_eq!(exposed(vec![(1.0, 3.0), (4.0, 5.0)], vec![(0.0, 2.0), (3.5, 6.0)]), 1.0);
        // overlapping collectives on two streams count once; empty spans count nothing
        assert_eq!(exposed(vec![(0.0, 2.0), (1.0, 3.0), (5.0, 5.0)], vec![(2.5, 2.75)]), 2.75);
        assert_eq!(exposed(vec![], vec![(0.0, 1.0)]), 0.0);
    }
}
