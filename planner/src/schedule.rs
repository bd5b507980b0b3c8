//! Pass 3, schedule: one steady-state training step as a fixed list of ops with the
//! buffers each allocates and frees, following FSDP2's (or FSDP1's) hook order.
//!
//! Forward: pre-forward of a unit = unshard (all-gather) + wait (copy-out); post-forward =
//! reshard. Backward: pre-backward = unshard + implicit/explicit prefetch of the unit that
//! ran before it; post-backward = reshard + reduce-scatter (+ all-reduce for HSDP).
//! Activations are tracked per tensor with [`crate::activation`]'s specs.

use crate::activation::{op_mem, Ctx, OpMem, Step, F8_GEMM_RESULT};
use crate::ids::{BufferId, OpId, UnitId};
use crate::options::{AttnImpl, BackwardPrefetch, Device, GradSync, Layout, Offload, Optimizer, Options, Strategy};
use crate::plan::*;
use crate::units::Unit;
use fsdp_ir::{DType, Model};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::smallvec;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PState {
    Sharded,
    /// Resharded after forward to a smaller group (`reshard_after_forward=int`): each param
    /// keeps a 1/N slice of its unsharded tensor ([`B::post_fwd`]) until the backward gathers
    /// it again over that group.
    PostForward,
    Pending(BufferId, OpId),
    Unsharded,
}

pub struct Schedule {
    pub ops: Vec<ScheduleOp>,
    pub buffers: Vec<BufferInfo>,
    /// Gradient accumulation of 6 or more micro-batches whose last three start in one state
    /// (`B::snapshot`): with more micro-batches, every one between is built as these, and
    /// the last as this last, each with its ops and buffers as many later — the plan of more
    /// micro-batches is this one with micro-batch `k − 2` repeated.
    pub steady: bool,
}

struct B<'a> {
    /// Each unit's post-forward shards (`reshard_after_forward=int`), freed after the
    /// backward all-gather's copy-out.
    post_fwd: Vec<Vec<BufferId>>,
    /// Per unit, float8 all-gather (`--float8-all-gather`), one 4-byte scale per float8
    /// weight: the ones its pre-all-gather made, until the copy-out (`pending`); the ones its
    /// unsharded float8 params hold, kept across reshards (`held`).
    f8_pending: Vec<Vec<(String, BufferId)>>,
    f8_held: Vec<Vec<(String, BufferId)>>,
    /// Scales a backward copy-out replaced that a forward-saved weight (`weight_hp_t`, a
    /// float8 tensor holding its scale) still references: freed with that linear's backward.
    f8_old: HashMap<String, BufferId>,
    /// Per op, the grads its consumers made of the `torch.split` views they read of its
    /// output ([`split_read`]), held until its backward joins them.
    split_pieces: Vec<Vec<BufferId>>,
    /// The unit whose ops make each op's backward (its innermost).
    unit_of_op: &'a [UnitId],
    /// Per unit, the grads of its forward inputs that wait for its post-backward before they
    /// join their other consumers' grads or are cast back ([`crossing_grad`]): (tensor,
    /// buffer, whether the pre-forward cast it).
    through_post_backward: Vec<Vec<(usize, BufferId, bool)>>,
    /// The unit whose forward-input grad made each tensor's grad buffer.
    grad_made_in: HashMap<usize, UnitId>,
    /// Float8 weights whose linear runs inside a checkpointed region (saves nothing in forward).
    f8_recomputed: rustc_hash::FxHashSet<String>,
    /// What FSDPMemTracker calls a tensor the backward makes: temp, or activation while it
    /// believes a recompute is running (a unit group's checkpointed members: from the
    /// pre-forward of the first one recomputed to the post-forward of the last).
    bwd_temp: Category,
    model: &'a Model,
    opts: &'a Options,
    units: &'a [Unit],
    ops: Vec<ScheduleOp>,
    /// The last op's events so far, given to it (sized) when the next op starts or the
    /// schedule ends ([`B::flush`]): most ops have one to three, and a vector grown from
    /// empty per op reallocates.
    events: Vec<Event>,
    buffers: Vec<BufferInfo>,
    phase: Phase,
    mb: u32,
    state: Vec<PState>,
    unsharded: Vec<Option<BufferId>>,
    last_fwd_ag: Option<BufferId>,
    pending_rs: Option<BufferId>,
    post_forward_order: Vec<UnitId>,
    /// Param grad buffers per unit (kept across micro-batches without sync).
    grads: Vec<Vec<BufferId>>,
    /// Grad buffer of each primary param (index into `model.params`).
    grad_of_param: Vec<Option<BufferId>>,
    /// FSDP1 (flat): each unit's param grads of this backward, held apart (the autograd
    /// engine's input buffer of the flat param's `split` node) until its post-backward joins
    /// them into the flat grad; their dtype; each param's.
    split_grads: Vec<Vec<BufferId>>,
    split_dtype: Vec<Option<DType>>,
    split_of_param: Vec<Option<BufferId>>,
    sharded_grads: Vec<BufferId>,
    /// Per unit: its sharded grads exist this step (`--grad-sync each` adds into them).
    has_sharded_grads: Vec<bool>,
    last_ag_op: Vec<Option<OpId>>,
    /// Units whose pre-backward ran in this micro-batch (FSDP1 `_needs_pre_backward_unshard`).
    entered: Vec<bool>,
    /// Units covering each unit, outermost first (the prelude's, as the next three).
    chains: &'a [Vec<UnitId>],
    /// Per unit, the `model.params` index of each of its params (in unit order).
    unit_params: &'a [Vec<usize>],
    /// Per model op, its params that have an owner: (primary param index, owning unit).
    op_params: &'a [Vec<(usize, UnitId)>],
    /// Each model op's name ([`Prelude`]'s).
    op_names: &'a [OpName],
    device: Device,
    /// Per model op: a checkpointed op whose outputs selective AC keeps from the forward
    /// (the recompute is served them from its cache, without running the op).
    sac: Vec<bool>,
    /// Ops inside a region under op-level selective AC.
    sac_region: Vec<bool>,
    /// `--compile`: cached outputs the compiled backward never reads (inductor's partitioner
    /// keeps of SAC's MUST_SAVE outputs only those: not the block's last `down_proj`), freed
    /// in the forward as an unsaved output is; the recompute does not make them either.
    sac_unread: Vec<bool>,
    /// `--compile` with every checkpointed region inside a compiled block: the compiled
    /// checkpoints hold their graphs' inputs only (not HF's position ids).
    compiled_regions: bool,
    /// Float8 linears (`--float8`): a custom autograd Function each.
    f8_linear: &'a [bool],
    /// What op-level SAC keeps from inside an op's forward chain (a float8 cast's `abs` and
    /// `max`), by op index, until the op's recompute takes it.
    sac_kept: HashMap<usize, std::collections::VecDeque<BufferId>>,
    /// The loss the training loop holds (`loss = model(...).loss`): the previous step's or
    /// micro-batch's until the next forward returns, then that one's.
    held_loss: Option<BufferId>,
    /// `--train-loop torchtitan-2024`: the float32 logits the loop keeps (`pred`), the
    /// previous step's until this step's forward returns, then this step's.
    held_logits: Option<BufferId>,
    /// The loss: its op (the model's cross-entropy) and bytes.
    loss: Option<(usize, u64)>,
    /// FSDP2 without gradient sync under mixed precision: each unit's grads, accumulated in
    /// the reduce dtype (`unsharded_accumulated_grad`, temp to the tracker).
    accumulated: Vec<Vec<BufferId>>,
    /// HSDP under a reduce dtype other than the params': each unit's all-reduced flat
    /// grads, held by FSDP2 until its `finalize_backward`.
    all_reduce_held: Vec<Option<BufferId>>,
    /// CPUOffloadPolicy: the all-gather being issued's per-parameter device shards (H2D
    /// copies or their casts), freed once its output is allocated.
    offload_inputs: Vec<BufferId>,
}

/// The builder's state where a micro-batch starts, written out for comparing with another
/// micro-batch's start ([`Schedule::steady`]): every field that carries from one micro-batch
/// to the next (the destructuring names them all, so a new field must be placed here or
/// among the constants), the buffers and ops it names — those made from micro-batch 1 on
/// (`first`: its first buffer and op) by how far before this micro-batch's first they are,
/// earlier ones (the setup's and micro-batch 0's) by id — with every such buffer's size,
/// category, unit, whether it is freed and what it continues, and every buffer made from
/// `first` on that is still live. Two micro-batches whose starts write out alike are built
/// alike: the builder reads nothing else (`mb` only stamps the ops).
struct Snapshot {
    v: Vec<u64>,
    named: Vec<usize>,
}

impl B<'_> {
    fn snapshot(&self, first: (usize, usize)) -> Vec<u64> {
        let B {
            post_fwd,
            f8_pending,
            f8_held,
            f8_old,
            split_pieces,
            through_post_backward,
            grad_made_in,
            f8_recomputed,
            bwd_temp,
            events,
            phase,
            state,
            unsharded,
            last_fwd_ag,
            pending_rs,
            post_forward_order,
            grads,
            grad_of_param,
            split_grads,
            split_dtype,
            split_of_param,
            sharded_grads,
            has_sharded_grads,
            last_ag_op,
            entered,
            sac,
            sac_region,
            sac_unread,
            compiled_regions,
            sac_kept,
            held_loss,
            held_logits,
            accumulated,
            all_reduce_held,
            offload_inputs,
            // what the micro-batches only add to (the output), stamp (`mb`) or never change
            ops,
            buffers,
            mb: _,
            unit_of_op: _,
            model: _,
            opts: _,
            units: _,
            chains: _,
            unit_params: _,
            op_params: _,
            op_names: _,
            device: _,
            f8_linear: _,
            loss: _,
        } = self;
        let (fb, fo) = first;
        let (base_b, base_o) = (buffers.len(), ops.len());
        const REL: u64 = 1 << 63;
        const NONE: u64 = u64::MAX;
        let mut s = Snapshot { v: Vec::with_capacity(4096), named: vec![] };
        let buf = |s: &mut Snapshot, x: BufferId| {
            let i = x.index();
            s.named.push(i);
            s.v.push(if i >= fb { REL | (base_b - i) as u64 } else { i as u64 });
        };
        let op = |s: &mut Snapshot, x: OpId| {
            let i = x.index();
            s.v.push(if i >= fo { REL | (base_o - i) as u64 } else { i as u64 });
        };
        let bufs = |s: &mut Snapshot, xs: &[BufferId]| {
            s.v.push(xs.len() as u64);
            for &x in xs {
                buf(s, x);
            }
        };
        let opt = |s: &mut Snapshot, x: Option<BufferId>| match x {
            Some(x) => buf(s, x),
            None => s.v.push(NONE),
        };
        let text = |s: &mut Snapshot, t: &str| {
            s.v.push(t.len() as u64);
            s.v.extend(t.bytes().map(u64::from));
        };
        for v in [post_fwd, split_pieces, grads, split_grads, accumulated] {
            s.v.push(v.len() as u64);
            for xs in v {
                bufs(&mut s, xs);
            }
        }
        for v in [f8_pending, f8_held] {
            for xs in v {
                s.v.push(xs.len() as u64);
                for (n, x) in xs {
                    text(&mut s, n);
                    buf(&mut s, *x);
                }
            }
        }
        let mut old: Vec<(&String, &BufferId)> = f8_old.iter().collect();
        old.sort();
        for (n, x) in old {
            text(&mut s, n);
            buf(&mut s, *x);
        }
        for xs in through_post_backward {
            s.v.push(xs.len() as u64);
            for &(t, x, c) in xs {
                s.v.extend([t as u64, u64::from(c)]);
                buf(&mut s, x);
            }
        }
        let mut made: Vec<(usize, UnitId)> = grad_made_in.iter().map(|(&t, &u)| (t, u)).collect();
        made.sort();
        s.v.extend(made.iter().flat_map(|&(t, u)| [t as u64, u.index() as u64]));
        let mut recomputed: Vec<&String> = f8_recomputed.iter().collect();
        recomputed.sort();
        for n in recomputed {
            text(&mut s, n);
        }
        s.v.extend([*bwd_temp as u64, *phase as u64, u64::from(*compiled_regions), events.len() as u64]);
        for e in events {
            match *e {
                Event::Alloc(x) => {
                    s.v.push(0);
                    buf(&mut s, x);
                }
                Event::Free(x) => {
                    s.v.push(1);
                    buf(&mut s, x);
                }
            }
        }
        for st in state {
            match *st {
                PState::Sharded => s.v.push(0),
                PState::PostForward => s.v.push(1),
                PState::Unsharded => s.v.push(2),
                PState::Pending(x, o) => {
                    s.v.push(3);
                    buf(&mut s, x);
                    op(&mut s, o);
                }
            }
        }
        for &x in unsharded.iter().chain(grad_of_param).chain(split_of_param).chain(all_reduce_held).chain([last_fwd_ag, pending_rs, held_loss, held_logits]) {
            opt(&mut s, x);
        }
        s.v.extend(post_forward_order.iter().map(|u| u.index() as u64));
        s.v.push(NONE);
        s.v.extend(split_dtype.iter().map(|d| d.map_or(NONE, |d| d as u64)));
        bufs(&mut s, sharded_grads);
        bufs(&mut s, offload_inputs);
        for o in last_ag_op {
            match *o {
                Some(o) => op(&mut s, o),
                None => s.v.push(NONE),
            }
        }
        s.v.extend(entered.iter().chain(sac).chain(sac_region).chain(sac_unread).chain(has_sharded_grads).map(|&x| u64::from(x)));
        let mut kept: Vec<(&usize, &std::collections::VecDeque<BufferId>)> = sac_kept.iter().collect();
        kept.sort_by_key(|x| *x.0);
        for (i, xs) in kept {
            s.v.extend([*i as u64, xs.len() as u64]);
            for &x in xs {
                buf(&mut s, x);
            }
        }
        // (the last compute op, which a reduce-scatter waits for)
        match ops.iter().rev().find(|o| o.stream == Stream::Compute) {
            Some(o) => op(&mut s, o.id),
            None => s.v.push(NONE),
        }
        // the buffers named, and every buffer made from `first` on that is live
        s.v.push(NONE);
        let mut named = std::mem::take(&mut s.named);
        named.extend((fb..base_b).filter(|&i| buffers[i].free.is_none()));
        for i in named {
            let b = &buffers[i];
            s.v.extend([if i >= fb { REL | (base_b - i) as u64 } else { i as u64 }, b.bytes, b.category as u64, b.unit.map_or(NONE, |u| u.index() as u64), u64::from(b.free.is_some())]);
            for &c in &b.continues {
                buf(&mut s, c);
            }
            s.v.push(NONE);
        }
        s.v
    }
}

thread_local! {
    /// Whether this thread's schedules name their buffers (on unless [`without_names`]).
    static NAMES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Runs `f` with the buffers of the schedules it builds on this thread left unnamed (empty
/// names), and the plans made from them without their list of collectives (nothing else
/// changes) — `tune`'s searches, which print neither, build hundreds.
pub fn without_names<R>(f: impl FnOnce() -> R) -> R {
    let before = NAMES.with(|n| n.replace(false));
    let r = f();
    NAMES.with(|n| n.set(before));
    r
}

/// Whether plans built on this thread now are named ([`without_names`]).
pub(crate) fn naming() -> bool {
    NAMES.with(|n| n.get())
}

/// A buffer's name, `format!`ted — empty under [`without_names`], where it is not formatted.
macro_rules! name {
    ($($t:tt)*) => {
        if NAMES.with(|n| n.get()) { format!($($t)*) } else { String::new() }
    };
}

/// A buffer's name from its parts, concatenated (cheaper than `format!` for the ~10⁶ buffer
/// names of big models); empty under [`without_names`].
fn cat(parts: &[&str]) -> String {
    if !NAMES.with(|n| n.get()) {
        return String::new();
    }
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

impl B<'_> {
    fn op(&mut self, kind: OpKind, stream: Stream, deps: OpDeps) -> OpId {
        self.flush();
        let id = OpId::new(self.ops.len());
        self.ops.push(ScheduleOp {
            id,
            kind,
            stream,
            phase: self.phase,
            micro_batch: self.mb,
            deps,
            events: OpEvents::new(),
        });
        id
    }
    /// Gives the last op its events.
    fn flush(&mut self) {
        if let Some(o) = self.ops.last_mut() {
            o.events.extend_from_slice(&self.events);
            self.events.clear();
        }
    }
    /// The last op on the compute stream (what a reduce-scatter waits for).
    fn last_compute(&self) -> OpId {
        self.ops.iter().rev().find(|o| o.stream == Stream::Compute).map(|o| o.id).unwrap_or(OpId(0))
    }
    fn cur(&self) -> OpId {
        OpId::new(self.ops.len().saturating_sub(1))
    }
    fn alloc(&mut self, name: String, category: Category, bytes: u64, unit: Option<UnitId>) -> BufferId {
        let id = BufferId::new(self.buffers.len());
        let at = self.cur();
        self.buffers.push(BufferInfo {
            id,
            name,
            category,
            bytes: self.device.allocated_bytes(bytes),
            offset: 0,
            alloc: at,
            free: None,
            unit,
            continues: vec![],
        });
        if !self.ops.is_empty() {
            self.events.push(Event::Alloc(id));
        }
        id
    }
    fn free(&mut self, b: BufferId) {
        let at = self.cur();
        self.buffers[b.index()].free = Some(at);
        if !self.ops.is_empty() {
            self.events.push(Event::Free(b));
        }
    }
    /// Frees `from` and allocates their storage again under a new name and category: a
    /// relabeling of the same memory, which the allocator model does not re-allocate.
    fn relabel(&mut self, from: Vec<BufferId>, name: String, category: Category, unit: Option<UnitId>) -> BufferId {
        let bytes = from.iter().map(|b| self.buffers[b.index()].bytes).sum();
        for &b in &from {
            self.free(b);
        }
        let id = self.alloc(name, category, bytes, unit);
        self.buffers[id.index()].continues = from;
        id
    }
    /// The shard dim of model param `k` in unit `u` (`--shard-dim`; 0 by default).
    fn shard_dim_of(&self, u: &Unit, k: usize) -> u32 {
        let name = &self.model.params[k].name;
        u.params.iter().find(|p| &p.name == name || p.aliases.contains(name)).map_or(0, |p| p.shard_dim)
    }
    fn transient(&mut self, name: String, category: Category, bytes: u64) {
        let b = self.alloc(name, category, bytes, None);
        self.free(b);
    }

    fn param_dtype(&self, u: &Unit) -> DType {
        match self.opts.param_dtype {
            Some(d) if u.dtype.is_float() => d,
            _ => u.dtype,
        }
    }
    fn reduce_dtype(&self, u: &Unit) -> DType {
        self.opts.reduce_dtype.unwrap_or_else(|| self.param_dtype(u))
    }
    fn unsharded_bytes(&self, u: &Unit) -> u64 {
        crate::cost::unsharded_bytes(u, self.opts)
    }
    /// One tensor per parameter of `u` (FSDP2 keeps a storage per parameter: its shard, its
    /// unsharded copy, each Adam moment), `bytes` each, as the device's allocator takes them:
    /// on CUDA each rounded to whole 512 B blocks (measured on harness/fakegpu.py), so a
    /// unit's sum is not rounded once.
    fn per_param(&self, u: &Unit, bytes: impl Fn(&crate::units::UnitParam) -> u64) -> u64 {
        u.params.iter().map(|p| self.opts.device.allocated_bytes(bytes(p))).sum()
    }
    fn ag_numel_dtype(&self, u: &Unit) -> (u64, DType) {
        let d = self.param_dtype(u);
        if self.float8_gathered(u) {
            // float8 weights beside others: one uint8 buffer of their bytes (all float8: float8)
            let ds: Vec<DType> = u.params.iter().map(|p| self.opts.gathered_dtype_of(p)).collect();
            return match ds.first() {
                Some(&d) if ds.iter().all(|&x| x == d) => (u.padded_numel, d),
                _ => (self.unsharded_bytes(u), DType::Uint8),
            };
        }
        if d == DType::Uint8 {
            (self.unsharded_bytes(u), DType::Uint8)
        } else {
            (u.padded_numel, d)
        }
    }
    /// Float8 weights of `u` gathered in float8 (`--float8-all-gather`).
    fn float8_gathered(&self, u: &Unit) -> bool {
        self.opts.float8.is_some_and(|f| f.all_gather) && u.params.iter().any(|p| p.float8)
    }
    fn no_shard(&self) -> bool {
        matches!(self.opts.strategy, Strategy::NoShard)
    }

    /// Issue the all-gather of `u` (if not already unsharded or pending).
    fn unshard(&mut self, u: UnitId, prefetch: bool) {
        self.unshard_as(u, prefetch, Category::AllGather)
    }

    /// [`Self::unshard`], its buffers counted in `category`: FSDPMemTracker counts an
    /// all-gather's buffers as all-gather only when FSDP2 issues it from its forward or
    /// backward pre-hook of a param group; explicit backward prefetches
    /// (`set_modules_to_backward_prefetch`) come after that hook returned, and their buffers
    /// stay temp.
    fn unshard_as(&mut self, u: UnitId, prefetch: bool, category: Category) {
        let unit = &self.units[u.index()];
        let post_forward = self.state[u.index()] == PState::PostForward;
        if !(self.state[u.index()] == PState::Sharded || post_forward) || unit.params.is_empty() {
            return;
        }
        let (numel, dtype) = self.ag_numel_dtype(unit);
        let group = match self.opts.strategy {
            _ if post_forward => Group::PostForward,
            Strategy::HybridShard { .. } => Group::Shard,
            _ => Group::World,
        };
        let cast = self.opts.param_dtype.filter(|&d| d != unit.dtype && unit.dtype.is_float());
        let flat = self.opts.layout == Layout::Flat;
        let label = unit.label().to_string();
        let shard_numel = unit.shard_numel;
        let bytes = self.unsharded_bytes(unit);
        let deps = self.last_ag_op[u.index()].into_iter().collect();
        let op = self.op(
            OpKind::AllGather {
                unit: u,
                numel,
                dtype,
                group,
                prefetch,
            },
            Stream::AllGather,
            deps,
        );
        // (the post-forward shards are already in the param dtype)
        let f8 = self.float8_gathered(unit) && !post_forward;
        if f8 {
            // torchao's fsdp_pre_all_gather: each float8 weight's shard cast to float8 with its
            // scale (an f32 scalar, amax all-reduced), the others cast by FSDP2's MixedPrecision
            let bytes: u64 = unit
                .params
                .iter()
                .filter(|p| p.float8 || cast.is_some())
                .map(|p| p.shard_numel * self.opts.gathered_dtype_of(p).size())
                .sum();
            self.transient(name!("{label} float8/mp shard"), category, bytes);
            let names: Vec<String> = unit.params.iter().filter(|p| p.float8).map(|p| p.name.clone()).collect();
            let pending: Vec<(String, BufferId)> = names.into_iter().map(|n| {
                let b = self.alloc(name!("{n} float8 scale (pending)"), Category::Temp, DType::Float32.size(), None);
                (n, b)
            }).collect();
            self.f8_pending[u.index()] = pending;
        } else if self.opts.offload == Offload::Cpu && !post_forward {
            // CPUOffloadPolicy: no foreach fast path; per parameter, its padded host shard
            // copied to the device in its own dtype, then cast to the param dtype (the copy
            // dropped at once); the device shards live until the all-gather output is
            // allocated and copied into. FSDPMemTracker counts them as activation in forward,
            // temp in backward.
            let cat = if self.phase == Phase::Forward { Category::Activation } else { Category::Temp };
            for p in &unit.params {
                let h2d = self.alloc(name!("{} shard (H2D)", p.name), cat, p.shard_numel * p.dtype.size(), None);
                let d = self.opts.gathered_dtype_of(p);
                if d != p.dtype {
                    let c = self.alloc(name!("{} shard ({d})", p.name), cat, p.shard_numel * d.size(), None);
                    self.free(h2d);
                    self.offload_inputs.push(c);
                } else {
                    self.offload_inputs.push(h2d);
                }
            }
        } else if let Some(d) = cast.filter(|_| !post_forward) {
            self.transient(name!("{label} mp shard"), category, shard_numel * d.size());
        }
        let buf = if flat {
            // FSDP1 gathers straight into the persistent padded flat param (padded as a whole
            // to a multiple of the world size: the all-gather's numel)
            self.alloc(name!("{label} unsharded flat param"), Category::UnshardedParam, numel * dtype.size(), Some(u))
        } else {
            self.alloc(name!("{label} all-gather output"), category, bytes, Some(u))
        };
        for b in std::mem::take(&mut self.offload_inputs) {
            self.free(b);
        }
        self.last_ag_op[u.index()] = Some(op);
        self.state[u.index()] = PState::Pending(buf, op);
    }

    /// Wait for `u`'s all-gather and copy out.
    fn wait(&mut self, u: UnitId) {
        let PState::Pending(buf, ag) = self.state[u.index()] else {
            return;
        };
        let unit = &self.units[u.index()];
        let label = unit.label().to_string();
        self.op(OpKind::CopyOut { unit: u }, Stream::Compute, smallvec![ag]);
        // torchao's fsdp_post_all_gather: the unsharded float8 params take the new scales
        // (`out._scale = scale`). FSDPMemTracker counts a scale made in forward as unsharded
        // param (the pre-forward hook registers the unsharded params), one made in backward as
        // temp. The previous ones go, but in backward a scale the forward saved with its weight
        // (`weight_hp_t`) stays until that linear's backward has run
        let pending = std::mem::take(&mut self.f8_pending[u.index()]);
        if !pending.is_empty() {
            let old = std::mem::take(&mut self.f8_held[u.index()]);
            let held: Vec<(String, BufferId)> = if self.phase == Phase::Forward {
                pending.into_iter().map(|(n, b)| {
                    let name = name!("{n} float8 scale");
                    (n, self.relabel(vec![b], name, Category::UnshardedParam, None))
                }).collect()
            } else {
                pending
            };
            self.f8_held[u.index()] = held;
            for (n, b) in old {
                if self.phase == Phase::Forward || self.f8_recomputed.contains(&n) {
                    self.free(b);
                } else if let Some(prev) = self.f8_old.insert(n, b) {
                    self.free(prev);
                }
            }
        }
        // FSDPParam.to_unsharded: the post-forward shards go once copied out
        for s in std::mem::take(&mut self.post_fwd[u.index()]) {
            self.free(s);
        }
        if self.opts.layout == Layout::Flat {
            self.unsharded[u.index()] = Some(buf);
        } else {
            let bytes = self.per_param(unit, |p| p.padded_numel * self.opts.gathered_dtype_of(p).size());
            let p = self.alloc(name!("{label} unsharded params"), Category::UnshardedParam, bytes, Some(u));
            self.unsharded[u.index()] = Some(p);
            // Shard(dim > 0) params (`--shard-dim`): foreach_all_gather_copy_out copies each
            // one's rows of the all-gather output into a temporary of its unsharded size, then
            // chunk-cats that into the param along its dim; the temporaries go when it returns
            let tmp = unit.params.iter().filter(|q| q.shard_dim > 0).map(|q| self.opts.device.allocated_bytes(q.padded_numel * self.opts.gathered_dtype_of(q).size())).sum::<u64>();
            if tmp > 0 {
                let category = if self.phase == Phase::Forward { Category::Activation } else { self.bwd_temp };
                self.transient(name!("{label} Shard(dim) copy-out temporaries"), category, tmp);
            }
            if self.phase == Phase::Forward {
                // Sync forward all-gathers keep the previous flat buffer until this wait.
                if let Some(prev) = self.last_fwd_ag.replace(buf) {
                    self.free(prev);
                }
            } else {
                self.free(buf);
            }
        }
        self.state[u.index()] = PState::Unsharded;
    }

    /// FSDPMemTracker's pre-forward wrapper, which runs again where a recompute runs the
    /// unit's pre-forward hook: it registers the unit's unsharded params as unsharded param,
    /// the float8 ones' inner tensors with them — so the scales the backward's all-gather made
    /// (temp until then) count as unsharded param from there.
    fn register_scales(&mut self, u: UnitId) {
        let held = std::mem::take(&mut self.f8_held[u.index()]);
        self.f8_held[u.index()] = held
            .into_iter()
            .map(|(n, b)| match self.buffers[b.index()].category {
                Category::UnshardedParam => (n, b),
                _ => {
                    let name = name!("{n} float8 scale");
                    (n, self.relabel(vec![b], name, Category::UnshardedParam, None))
                }
            })
            .collect();
    }

    fn reshard(&mut self, u: UnitId) {
        if self.state[u.index()] != PState::Unsharded || self.no_shard() {
            return;
        }
        self.op(OpKind::Reshard { unit: u }, Stream::Compute, smallvec![]);
        // reshard_after_forward=int: each param's 1/N slice of its gathered tensor is cloned
        // (FSDPParam.to_sharded_post_forward) before the unsharded params go
        let to = self.units[u.index()].reshard_to.filter(|_| self.phase == Phase::Forward);
        if let Some(n) = to {
            let unit = &self.units[u.index()];
            let slices: Vec<(String, u64)> = unit.params.iter().map(|p| (name!("{} post-forward shard", p.name), p.padded_numel / n.max(1) * self.opts.gathered_dtype_of(p).size())).collect();
            for (name, bytes) in slices {
                let s = self.alloc(name, Category::Activation, bytes, Some(u));
                self.post_fwd[u.index()].push(s);
            }
        }
        if let Some(b) = self.unsharded[u.index()].take() {
            self.free(b);
        }
        self.state[u.index()] = if to.is_some() { PState::PostForward } else { PState::Sharded };
    }

    fn post_backward(&mut self, u: UnitId, sync: bool) {
        let unit = &self.units[u.index()];
        if unit.params.is_empty() {
            return;
        }
        let label = unit.label().to_string();
        // FSDP1: the split node's backward joins the param grads into the flat grad (the
        // unpadded flat param's numel; the views' grads freed after), which the flat param's
        // AccumulateGrad makes its grad (or, without sync, adds into the one kept)
        let pieces = std::mem::take(&mut self.split_grads[u.index()]);
        if let Some(gd) = self.split_dtype[u.index()].filter(|_| !pieces.is_empty()) {
            let f = self.alloc(name!("{label} flat grad"), self.bwd_temp, unit.numel * gd.size(), Some(u));
            for g in pieces {
                self.free(g);
            }
            for &k in &self.unit_params[u.index()] {
                self.split_of_param[k] = None;
            }
            if self.grads[u.index()].is_empty() {
                self.grads[u.index()].push(f);
            } else {
                self.free(f);
            }
        }
        let grads = std::mem::take(&mut self.grads[u.index()]);
        let rd = self.reduce_dtype(unit);
        // FSDP2 under mixed precision: grads not reduced are kept upcast to the reduce dtype
        // (`to_accumulated_grad_if_needed`), and the next backward's are added to them at
        // post-backward entry (`accumulate_unsharded_grad_if_needed`), freeing the new ones
        let upcast = self.opts.layout == Layout::Fsdp2 && rd != self.param_dtype(unit);
        let accumulated = std::mem::take(&mut self.accumulated[u.index()]);
        if upcast && !accumulated.is_empty() {
            self.op(OpKind::AccumulateGrads { unit: u }, Stream::Compute, smallvec![]);
            for g in &grads {
                self.free(*g);
            }
        }
        self.reshard(u);
        if self.opts.backward_prefetch == BackwardPrefetch::Post {
            // FSDP1 BACKWARD_POST: the post-backward hook reshards, then all-gathers the unit
            // that ran before this one in forward, then reduce-scatters.
            let order = &self.post_forward_order;
            if let Some(idx) = order.iter().rposition(|&x| x == u).filter(|&i| i > 0) {
                let prev = order[idx - 1];
                if !self.entered[prev.index()] {
                    self.unshard(prev, true);
                }
            }
        }
        if !sync && upcast {
            if accumulated.is_empty() {
                self.op(OpKind::KeepGrads { unit: u }, Stream::Compute, smallvec![]);
                for g in grads {
                    let name = name!("{} (accumulated, {rd})", self.buffers[g.index()].name);
                    // (from the param's numel: a buffer's bytes are rounded to the allocator's blocks)
                    let param = self.unit_params[u.index()].iter().find(|&&k| self.grad_of_param[k] == Some(g));
                    let bytes = param.map_or(0, |&k| self.model.params[k].numel() * rd.size());
                    let a = self.alloc(name, Category::Temp, bytes, Some(u));
                    self.free(g);
                    self.accumulated[u.index()].push(a);
                }
            } else {
                self.accumulated[u.index()] = accumulated;
            }
            self.rekey_grads(u);
            return;
        }
        if !sync {
            self.op(OpKind::KeepGrads { unit: u }, Stream::Compute, smallvec![]);
            for g in grads {
                let name = self.buffers[g.index()].name.clone();
                let k = self.relabel(vec![g], name, Category::UnshardedGrad, Some(u));
                self.grads[u.index()].push(k);
            }
            self.rekey_grads(u);
            return;
        }
        let ws = self.opts.shard_size();
        let flat = self.opts.layout == Layout::Flat;
        let numel = unit.grad_padded_numel;
        let orig = unit.dtype;
        let real_numel = unit.numel;
        let local: u64 = unit.params.iter().filter(|p| p.requires_grad).map(|p| p.local_numel(ws, 0)).sum();
        let (kind, numel_c, group) = if self.no_shard() {
            ("all_reduce", real_numel, Group::World)
        } else {
            ("reduce_scatter", numel, if matches!(self.opts.strategy, Strategy::HybridShard { .. }) { Group::Shard } else { Group::World })
        };
        let prev_rs = self.pending_rs.take();
        let op_kind = if kind == "all_reduce" {
            OpKind::AllReduce { unit: u, numel: numel_c, dtype: rd, group }
        } else {
            OpKind::ReduceScatter { unit: u, numel: numel_c, dtype: rd, group }
        };
        let stream = if kind == "all_reduce" { Stream::AllReduce } else { Stream::ReduceScatter };
        let bwd_dep = self.last_compute();
        self.op(op_kind, stream, smallvec![bwd_dep]);
        // FSDPMemTracker relabels param grads as "Unsharded Grad" at post-backward entry: the
        // unit's grads become one buffer of the same bytes. (Accumulated ones are no param's
        // grad: they stay temp, and this backward's grads were freed into them above.)
        // foreach_reduce first walks the (param, unsharded grad) pairs (world size > 1); its loop
        // variable keeps the unit's last parameter's grad until it returns, after the copy-in
        // freed the others (measured on harness/fakegpu.py: the peak at the reduced grads'
        // cast under --offload cpu)
        let mut grads = grads;
        let last = if accumulated.is_empty() && self.opts.layout == Layout::Fsdp2 && self.opts.shard_size() > 1 {
            let last = self.unit_params[u.index()].iter().rev().find_map(|&k| self.grad_of_param[k].filter(|b| grads.contains(b)));
            last.inspect(|b| grads.retain(|g| g != b))
        } else {
            // (under accumulation the list walked is of the kept upcast grads: not modelled)
            None
        };
        // Shard(dim > 0) params (`--shard-dim`): foreach_reduce first lays each one's grad out
        // rank by rank (`torch.cat(torch.chunk(grad, ws, dim), dim=0)`, a new tensor: temp to
        // FSDPMemTracker), the list's old grad going when the loop moves on (its variable holds
        // it till then; the last param's till foreach_reduce returns, as above)
        let shard_i: Vec<BufferId> = if self.opts.shard_dims.is_empty() || self.opts.shard_size() <= 1 || self.opts.layout != Layout::Fsdp2 {
            vec![]
        } else {
            let list: Vec<BufferId> = if accumulated.is_empty() {
                self.unit_params[u.index()].iter().filter_map(|&k| self.grad_of_param[k].filter(|b| grads.contains(b) || last == Some(*b)).map(|b| (k, b))).filter(|&(k, _)| self.shard_dim_of(unit, k) > 0).map(|(_, b)| b).collect()
            } else {
                // (the kept upcast grads, in the unit's param order)
                let dims: Vec<u32> = unit.params.iter().filter(|p| p.requires_grad).map(|p| p.shard_dim).collect();
                accumulated.iter().zip(dims).filter(|(_, d)| *d > 0).map(|(b, _)| *b).collect()
            };
            grads.retain(|g| !list.contains(g));
            list
        };
        let (kept_upcast, kept_last) = (!accumulated.is_empty(), accumulated.last().copied());
        let relabeled = match (accumulated.is_empty(), grads.is_empty() && last.is_some()) {
            (true, false) => vec![self.relabel(grads, name!("{label} unsharded grads"), Category::UnshardedGrad, Some(u))],
            // (the unit's one grad is the one held)
            (true, true) => vec![],
            (false, _) => accumulated,
        };
        let held = last;
        let last = last.map(|b| self.relabel(vec![b], name!("{label} last param's unsharded grad (held by foreach_reduce)"), Category::UnshardedGrad, Some(u)));
        let mut relabeled = relabeled;
        for g in shard_i {
            let (bytes, name) = (self.buffers[g.index()].bytes, self.buffers[g.index()].name.clone());
            // (the last param's old grad is the one held above; under accumulation the list's
            // last stays to the copy-in's end with the rest)
            let old = match (kept_upcast, held == Some(g)) {
                (false, true) => None,
                (false, false) => Some(self.relabel(vec![g], name.clone(), Category::UnshardedGrad, Some(u))),
                (true, _) => (kept_last != Some(g)).then_some(g),
            };
            let cat = self.alloc(name!("{name} (chunk-cat for Shard(dim))"), self.bwd_temp, bytes, Some(u));
            relabeled.push(cat);
            if let Some(old) = old {
                relabeled.retain(|x| *x != old);
                self.free(old);
            }
        }
        self.rekey_grads(u);
        if let Some(p) = prev_rs {
            self.free(p);
        }
        if self.no_shard() {
            // All-reduce in place on the gradients; they become the (replicated) grads.
            for g in relabeled {
                let bytes = self.buffers[g.index()].bytes;
                self.free(g);
                let s = self.alloc(name!("{label} grads (all-reduced)"), Category::ShardedGrad, bytes, Some(u));
                self.sharded_grads.push(s);
            }
            return;
        }
        let rs_bytes = if flat {
            if !real_numel.is_multiple_of(ws) || rd != orig {
                numel * rd.size()
            } else {
                0
            }
        } else {
            numel * rd.size()
        };
        // the reduce-scatter input is a plain allocation (temp to FSDPMemTracker) until the
        // collective is issued on it, after the copy-in and the reduce output's allocation
        let copy_in = if rs_bytes > 0 {
            Some(self.alloc(name!("{label} reduce-scatter input (copy-in)"), Category::Temp, rs_bytes, Some(u)))
        } else {
            None
        };
        for g in relabeled {
            self.free(g);
        }
        // reduce-scattered into a new flat buffer in the reduce dtype; the sharded grads are
        // views of it, or (orig dtype differs) copies made from it after the all-reduce
        let converted = rd != orig && !flat;
        // (offloaded: the grads are the host's copies; the device's output is temp; FSDP2's
        // output is a plain allocation — temp to FSDPMemTracker — until foreach_reduce makes
        // the sharded grads views of it as it returns)
        let out_category = if !flat || self.opts.offload == Offload::Cpu || self.has_sharded_grads[u.index()] { Category::Temp } else { Category::ShardedGrad };
        let out = self.alloc(name!("{label} sharded grads"), out_category, numel / ws * rd.size(), Some(u));
        let rs_in = copy_in.map(|t| self.relabel(vec![t], name!("{label} reduce-scatter input"), Category::ReduceScatter, Some(u)));
        let mut all_reduced = false;
        if let Strategy::HybridShard { .. } = self.opts.strategy {
            if self.opts.replicate_size() > 1 {
                all_reduced = true;
                let bwd_dep = self.cur();
                self.op(
                    OpKind::AllReduce {
                        unit: u,
                        numel: numel / ws,
                        dtype: rd,
                        group: Group::Replicate,
                    },
                    Stream::AllReduce,
                    smallvec![bwd_dep],
                );
            }
        }
        if self.opts.offload == Offload::Cpu {
            // CPUOffloadPolicy: the reduced shard (cast to the params' dtype first if the
            // reduce dtype differs: one flat copy) goes to the host parameter by parameter
            // (memory::host); the device copy is dropped without waiting for it
            if rd != orig {
                self.transient(name!("{label} reduced grads ({orig})"), Category::Temp, numel / ws * orig.size());
            }
            if all_reduced {
                // HSDP: the replicas' all-reduce ran on it; FSDP2 keeps that input
                // (`_all_reduce_state`) until the group's next post-backward or the end of
                // the backward
                self.all_reduce_held[u.index()] = Some(out);
            } else {
                self.free(out);
            }
            self.pending_rs = rs_in;
            if let Some(l) = last {
                self.free(l);
            }
            return;
        }
        // --grad-sync each, past the step's first micro-batch: foreach_reduce adds the new
        // shard into the sharded grads (`grad._local_tensor += new_sharded_grad`, in place);
        // the new one (a view of the reduce output, or its cast) goes when it returns, the
        // all-reduce's input kept as FSDP2 keeps it
        if self.has_sharded_grads[u.index()] {
            let g = converted.then(|| self.alloc(name!("{label} reduced grads ({orig})"), Category::Temp, local * orig.size(), Some(u)));
            if all_reduced {
                self.all_reduce_held[u.index()] = Some(out);
            } else {
                self.free(out);
            }
            if let Some(g) = g {
                self.free(g);
            }
            self.pending_rs = rs_in;
            if let Some(l) = last {
                self.free(l);
            }
            return;
        }
        self.has_sharded_grads[u.index()] = true;
        if converted {
            let g = self.alloc(name!("{label} sharded grads ({orig})"), Category::ShardedGrad, local * orig.size(), Some(u));
            if all_reduced {
                // FSDP2 keeps the all-reduce's input (`_all_reduce_state`) until the group's
                // next post-backward or the end of the backward (`finalize_backward`)
                self.all_reduce_held[u.index()] = Some(out);
            } else {
                self.free(out);
            }
            self.sharded_grads.push(g);
        } else if flat {
            self.sharded_grads.push(out);
        }
        if flat {
            if let Some(r) = rs_in {
                self.free(r);
            }
        } else {
            self.pending_rs = rs_in;
        }
        if !converted && !flat {
            let g = self.relabel(vec![out], name!("{label} sharded grads"), Category::ShardedGrad, Some(u));
            self.sharded_grads.push(g);
        }
        if let Some(l) = last {
            self.free(l);
        }
    }

    fn rekey_grads(&mut self, u: UnitId) {
        let ps = &self.unit_params[u.index()];
        let bufs = &self.grads[u.index()];
        if bufs.is_empty() {
            for &k in ps {
                self.grad_of_param[k] = None;
            }
        } else if self.opts.layout == Layout::Flat {
            for &k in ps {
                self.grad_of_param[k] = Some(bufs[0]);
            }
        } else {
            for (&k, &b) in ps.iter().zip(bufs) {
                self.grad_of_param[k] = Some(b);
            }
        }
    }
}

/// Per-tensor bookkeeping of the forward graph.
struct Tensors<'p> {
    /// Resolved tensor index (op index) of each op's output (identity ops alias).
    alias: &'p [usize],
    /// Forward consumers of each tensor.
    consumers: &'p [Vec<usize>],
    /// Ops that save each tensor for backward.
    saved_by: Vec<Vec<usize>>,
    /// The tensors each op saves (the transpose of `saved_by`, short lists).
    saves: Vec<Vec<usize>>,
    differentiable: &'p [bool],
    /// Each op's inputs that are op outputs: (input position, producing op before aliasing).
    inputs: &'p [Vec<(usize, usize)>],
    /// Per tensor: the last op of the module frames it was passed to (`0`: none) — a module's
    /// forward holds its arguments until it returns (`self.mlp(x)`: `x` lives through
    /// `down_proj`, after `up_proj`, its last reader, ran).
    frame_hold: &'p [usize],
}

/// The tensor graph of the forward, whatever is checkpointed: [`Tensors`] but for what the
/// backward saves.
struct Graph {
    alias: Vec<usize>,
    consumers: Vec<Vec<usize>>,
    differentiable: Vec<bool>,
    inputs: Vec<Vec<(usize, usize)>>,
    frame_hold: Vec<usize>,
}

impl Graph {
    fn new(model: &Model, mems: &[OpMem]) -> Graph {
        let op_index: HashMap<&str, usize> = model.ops.iter().enumerate().map(|(i, o)| (o.name.as_str(), i)).collect();
        let nops = model.ops.len();
        let inputs: Vec<Vec<(usize, usize)>> = model
            .ops
            .iter()
            .map(|o| o.inputs.iter().enumerate().filter_map(|(k, n)| op_index.get(n.as_str()).map(|&j| (k, j))).collect())
            .collect();
        let ends = module_ends(model);
        let mut g = Graph { alias: (0..nops).collect(), consumers: vec![vec![]; nops], differentiable: vec![false; nops], inputs, frame_hold: vec![0; nops] };
        // (an op's inputs come before it: validated, so each alias is final when read)
        for (i, op) in model.ops.iter().enumerate() {
            if mems[i].out.is_none() {
                if let Some(&(0, j)) = g.inputs[i].first() {
                    g.alias[i] = g.alias[j];
                }
            }
            let mut diff = !op.params.is_empty() && mems[i].differentiable;
            for ki in 0..g.inputs[i].len() {
                let (_, j) = g.inputs[i][ki];
                if let Some(&end) = frame_of(&model.ops[j].module, &op.module).and_then(|m| ends.get(m)) {
                    let h = &mut g.frame_hold[g.alias[j]];
                    *h = (*h).max(end);
                }
                let j = g.alias[j];
                g.consumers[j].push(i);
                diff |= g.differentiable[j] && mems[i].differentiable;
            }
            g.differentiable[i] = diff;
        }
        g
    }

    /// With what the backward saves of each tensor for these checkpointed `region`s.
    fn tensors<'p>(&'p self, model: &Model, mems: &[OpMem], region: &[Option<usize>]) -> Tensors<'p> {
        let nops = model.ops.len();
        let mut saved_by = vec![vec![]; nops];
        let mut saves = vec![vec![]; nops];
        for i in 0..nops {
            for &(k, j) in &self.inputs[i] {
                let j = self.alias[j];
                let saved = mems[i].saves_inputs.get(k).copied().unwrap_or(false);
                // Inside a checkpointed region only the region's inputs are saved.
                let in_region = region[i].is_some() && region[j] == region[i];
                if (saved && !(region[i].is_some() && in_region)) || (region[i].is_some() && !in_region) {
                    saved_by[j].push(i);
                    saves[i].push(j);
                }
            }
            if mems[i].saves_output && region[i].is_none() {
                saved_by[self.alias[i]].push(i);
                saves[i].push(self.alias[i]);
            }
        }
        Tensors { alias: &self.alias, consumers: &self.consumers, saved_by, saves, differentiable: &self.differentiable, inputs: &self.inputs, frame_hold: &self.frame_hold }
    }
}

/// What [`build`] makes of the model, its units and the options before it reads which
/// modules are checkpointed (beyond whether any is: HF's forward keeps its cache only
/// without): each op's memory, the tensor graph, each op's params and their units, the
/// modules each op runs in. `tune` plans an outer point's configurations, which differ only
/// in what they checkpoint, from one ([`crate::Prepared`]).
pub struct Prelude {
    /// `--compile`: the compiled block of each op.
    compiled: Vec<Option<usize>>,
    mems: Vec<OpMem>,
    graph: Graph,
    unit_modules: Vec<String>,
    unit_params: Vec<Vec<usize>>,
    op_params: Vec<Vec<(usize, UnitId)>>,
    chains: Vec<Vec<UnitId>>,
    f8_linear: Vec<bool>,
    loss: Option<(usize, u64)>,
    /// Per op, the modules on its path (indices in the module list), innermost first.
    ancestors: Vec<Vec<usize>>,
    /// Each op's name, shared by the schedule ops that run it.
    op_names: Vec<OpName>,
}

impl Prelude {
    pub fn new(model: &Model, opts: &Options, units: &[Unit], attn: AttnImpl) -> Prelude {
        let mut cx = Ctx::new(model, opts, attn);
        cx.unit_modules = units.iter().filter(|u| !u.is_root()).map(|u| u.module.clone()).collect();
        let mut mems: Vec<OpMem> = model.ops.iter().map(|o| op_mem(&cx, o)).collect();
        // (--compile: the ops whose memory is inductor's partitioner's)
        let compiled = if opts.compile { crate::activation::compiled_ops(&cx, model) } else { vec![] };
        if opts.compile {
            crate::activation::compiled(&cx, model, &mut mems, &compiled);
        }
        let graph = Graph::new(model, &mems);
        let param_index: HashMap<&str, usize> = model.params.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect();
        let owner: HashMap<&str, UnitId> = units.iter().flat_map(|u| u.params.iter().map(move |p| (p.name.as_str(), u.id))).collect();
        let ancestors = op_ancestors(model);
        Prelude {
            op_names: model.ops.iter().map(|o| OpName::from(o.name.as_str())).collect(),
            unit_modules: std::mem::take(&mut cx.unit_modules),
            unit_params: units.iter().map(|u| u.params.iter().filter_map(|p| param_index.get(p.name.as_str()).copied()).collect()).collect(),
            op_params: model
                .ops
                .iter()
                .map(|o| {
                    o.params
                        .iter()
                        .filter_map(|pn| {
                            let prim = model.primary_of(pn);
                            Some((*param_index.get(prim)?, *owner.get(prim)?))
                        })
                        .collect()
                })
                .collect(),
            chains: chains(units),
            f8_linear: model.ops.iter().map(|o| opts.float8.is_some() && crate::float8::is_float8_linear(model, o)).collect(),
            loss: model
                .ops
                .iter()
                .position(|o| matches!(o.kind, fsdp_ir::OpKind::CrossEntropy { .. }))
                .and_then(|i| Some((i, mems[i].out?.bytes()))),
            compiled,
            mems,
            graph,
            ancestors,
        }
    }

    /// [`checkpoint_regions`] for these modes ([`region_modes`]).
    fn regions(&self, modes: &HashMap<usize, crate::options::AcMode>) -> Vec<Option<usize>> {
        regions(&self.ancestors, modes)
    }
}

/// The op index where each module's forward returns (its last op, descendants' included).
fn module_ends(model: &Model) -> HashMap<&str, usize> {
    let mut ends: HashMap<&str, usize> = HashMap::default();
    for (i, op) in model.ops.iter().enumerate() {
        let m = op.module.as_str();
        let mut cut = m.len();
        while cut > 0 {
            ends.insert(&m[..cut], i);
            cut = m[..cut].rfind('.').unwrap_or(0);
        }
    }
    ends
}

/// The module a tensor made in module `made` is passed to when an op of module `read` reads
/// it: the child, on the reader's side, of the two modules' closest common ancestor (`None`:
/// the reader runs in that ancestor's own frame).
fn frame_of<'a>(made: &str, read: &'a str) -> Option<&'a str> {
    if read.is_empty() {
        return None;
    }
    let mut made = made.split('.').filter(|c| !c.is_empty());
    let mut end = 0;
    for (k, c) in read.split('.').enumerate() {
        let next = if k == 0 { c.len() } else { end + 1 + c.len() };
        if made.next() != Some(c) {
            return Some(&read[..next]);
        }
        end = next;
    }
    None
}

/// The checkpointed ops whose outputs torchtitan's op-level selective AC keeps: per region
/// call, every other `aten.mm` (the 1st, 3rd, … linear without bias; a bias makes it
/// `addmm`, GPT-2's Conv1D too) and SDPA's kernel (eager attention's matmuls are `bmm`).
pub fn sac_saved_ops(model: &Model, opts: &Options, attn: AttnImpl) -> Vec<bool> {
    sac_saved(model, opts, &checkpoint_regions(model, opts), &region_modes(model, opts), attn)
}

/// The AC mode of each checkpointed module (by index in the module list): the mode of the
/// `--checkpoint` entry naming its path, else of the one naming its class.
pub fn region_modes(model: &Model, opts: &Options) -> HashMap<usize, crate::options::AcMode> {
    let specs = opts.checkpoints();
    if specs.is_empty() {
        return HashMap::default();
    }
    // (a name's first entry decides, as a search of the list in order would)
    let mut by_name: HashMap<&str, crate::options::AcMode> = HashMap::default();
    for (c, mode) in &specs {
        by_name.entry(c.as_str()).or_insert(*mode);
    }
    model
        .modules
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.path.is_empty())
        .filter_map(|(i, m)| by_name.get(m.path.as_str()).or_else(|| by_name.get(m.class.as_str())).map(|&mode| (i, mode)))
        .collect()
}

/// The checkpointed region of each model op: the outermost module on its path whose class
/// or path `--checkpoint` names (its index in the module list), if any.
pub fn checkpoint_regions(model: &Model, opts: &Options) -> Vec<Option<usize>> {
    regions(&op_ancestors(model), &region_modes(model, opts))
}

/// Per op, the modules on its path (indices in the module list), innermost first.
fn op_ancestors(model: &Model) -> Vec<Vec<usize>> {
    let module_index: HashMap<&str, usize> = model.modules.iter().enumerate().map(|(i, m)| (m.path.as_str(), i)).collect();
    model
        .ops
        .iter()
        .map(|o| {
            let mut v = vec![];
            let mut path = Some(o.module.as_str());
            while let Some(p) = path {
                v.extend(module_index.get(p).copied());
                path = fsdp_ir::parent_path(p);
            }
            v
        })
        .collect()
}

/// [`checkpoint_regions`] from each op's modules ([`op_ancestors`]) and the checkpointed
/// modules' modes ([`region_modes`]): the outermost checkpointed module on each op's path
/// (a module is its path's: the IR's validation refuses a path declared twice).
fn regions(ancestors: &[Vec<usize>], modes: &HashMap<usize, crate::options::AcMode>) -> Vec<Option<usize>> {
    ancestors.iter().map(|a| a.iter().rev().copied().find(|m| modes.contains_key(m))).collect()
}

/// `--compile`'s checkpointed blocks (inductor's partitioner, measured in fake mode:
/// tests/fixtures/fsdp2_compile/): of op-level SAC's MUST_SAVE outputs the forward keeps only
/// those the backward reads — an op in the block saves it, or a point-wise op whose output
/// is read does (Llama's last `down_proj` feeds only the residual add: not kept), a float8
/// linear's casts keep what [`crate::activation::compiled_float8_sac`] says; and when
/// every checkpointed region lies in a compiled block, the checkpoints hold their graphs'
/// inputs, not HF's position ids.
fn compiled_checkpoints(b: &mut B, model: &Model, compiled: &[Option<usize>], mems: &mut [OpMem], tz: &Tensors, region: &[Option<usize>]) {
    b.compiled_regions = region.iter().any(|r| r.is_some()) && region.iter().zip(compiled).all(|(r, c)| r.is_none() || c.is_some());
    // (consumers come after their producers: one pass from the end)
    let mut read = vec![false; model.ops.len()];
    for j in (0..model.ops.len()).rev() {
        if region[j].is_none() || compiled[j].is_none() {
            continue;
        }
        read[j] = mems[j].saves_output
            || tz.consumers[j].iter().any(|&c| {
                let saves = tz.inputs[c].iter().any(|&(p, x)| tz.alias[x] == j && mems[c].saves_inputs.get(p).copied().unwrap_or(false));
                region[c] == region[j] && (saves || (crate::activation::pointwise(&model.ops[c]) && read[c]))
            });
        b.sac_unread[j] = b.sac[j] && !read[j];
        if b.f8_linear[j] && b.sac_region[j] {
            let weight_cast = b.opts.float8.is_some_and(|f| !f.all_gather);
            crate::activation::compiled_float8_sac(&mut mems[j], b.sac[j] && read[j], weight_cast);
        }
    }
}

fn sac_saved(model: &Model, opts: &Options, region: &[Option<usize>], modes: &HashMap<usize, crate::options::AcMode>, attn: AttnImpl) -> Vec<bool> {
    let mut out = vec![false; model.ops.len()];
    if !modes.values().any(|&m| m == crate::options::AcMode::SelectiveOp) {
        return out;
    }
    let mut mm_count: HashMap<usize, u32> = HashMap::default();
    for (i, op) in model.ops.iter().enumerate() {
        let Some(r) = region[i] else { continue };
        if modes.get(&r) != Some(&crate::options::AcMode::SelectiveOp) {
            continue;
        }
        // (a float8 linear's GEMM is `torch.mm` whatever its bias, added after)
        let mm = matches!(op.kind, fsdp_ir::OpKind::Linear { bias: false, transposed: false, .. }) || (opts.float8.is_some() && crate::float8::is_float8_linear(model, op));
        out[i] = match op.kind {
            fsdp_ir::OpKind::Linear { .. } if mm => {
                let c = mm_count.entry(r).or_default();
                *c += 1;
                *c % 2 == 1
            }
            // (DeepSeek's latent attention has no fused kernel on the CPU: SDPA's math path
            // is plain aten ops, none of them saved)
            fsdp_ir::OpKind::Attention { mla: Some(_), .. } if opts.device == crate::options::Device::Cpu => false,
            fsdp_ir::OpKind::Attention { .. } => attn != AttnImpl::Eager,
            _ => false,
        };
    }
    out
}

pub fn build(model: &Model, opts: &Options, units: &[Unit], unit_of_op: &[UnitId], attn: AttnImpl) -> Schedule {
    build_with(&Prelude::new(model, opts, units, attn), model, opts, units, unit_of_op, attn)
}

/// [`build`] from `pre`, made of the same model, units and options but for the checkpointed
/// modules (with or without any, as these).
pub fn build_with(pre: &Prelude, model: &Model, opts: &Options, units: &[Unit], unit_of_op: &[UnitId], attn: AttnImpl) -> Schedule {
    // activations in param_dtype under MP, else in the model's parameter dtype
    let mut cx = Ctx::new(model, opts, attn);
    cx.unit_modules = pre.unit_modules.clone();
    // Checkpointed ops: inside a module of a checkpointed class or path (region = that
    // module's index in the module list)
    let modes = region_modes(model, opts);
    let region = pre.regions(&modes);
    // (--compile: what a float8 linear outside the checkpoints keeps, and which outputs the
    // partitioner drops, depend on the regions: the memory is this plan's own)
    let compiled = &pre.compiled;
    let mut mems: std::borrow::Cow<[OpMem]> = std::borrow::Cow::Borrowed(&pre.mems);
    if opts.compile {
        let unchecked: Vec<Option<usize>> = compiled.iter().zip(&region).map(|(&c, r)| c.filter(|_| r.is_none())).collect();
        crate::activation::compiled_float8(&cx, model, mems.to_mut(), &unchecked);
    }
    let own_graph = opts.compile.then(|| Graph::new(model, &mems));
    let graph = own_graph.as_ref().unwrap_or(&pre.graph);
    let tz = graph.tensors(model, &mems, &region);
    let mut b = B {
        post_fwd: vec![vec![]; units.len()],
        f8_pending: vec![vec![]; units.len()],
        f8_held: vec![vec![]; units.len()],
        f8_old: HashMap::default(),
        split_pieces: vec![vec![]; model.ops.len()],
        unit_of_op,
        through_post_backward: vec![vec![]; units.len()],
        grad_made_in: HashMap::default(),
        f8_recomputed: model
            .ops
            .iter()
            .enumerate()
            .filter(|(i, o)| region[*i].is_some() && opts.float8.is_some() && crate::float8::is_float8_linear(model, o))
            .filter_map(|(_, o)| o.params.first().map(|w| model.primary_of(w).to_string()))
            .collect(),
        bwd_temp: Category::Temp,
        model,
        opts,
        units,
        ops: Vec::with_capacity(model.ops.len() * 4 * opts.grad_accum.max(1) as usize + units.len() * 8),
        events: vec![],
        // (7–9 buffers per model op and micro-batch on Llama and Gemma, 10–12 on Mixtral and
        // DeepSeek: a vector grown past its capacity copies every buffer)
        buffers: Vec::with_capacity(model.ops.len() * 12 * opts.grad_accum.max(1) as usize + units.len() * 8),
        phase: Phase::Setup,
        mb: 0,
        state: vec![PState::Sharded; units.len()],
        unsharded: vec![None; units.len()],
        last_fwd_ag: None,
        pending_rs: None,
        post_forward_order: vec![],
        grads: vec![vec![]; units.len()],
        grad_of_param: vec![None; model.params.len()],
        split_grads: vec![vec![]; units.len()],
        split_dtype: vec![None; units.len()],
        split_of_param: vec![None; model.params.len()],
        sharded_grads: vec![],
        has_sharded_grads: vec![false; units.len()],
        last_ag_op: vec![None; units.len()],
        entered: vec![false; units.len()],
        chains: &pre.chains,
        unit_params: &pre.unit_params,
        op_params: &pre.op_params,
        op_names: &pre.op_names,
        device: opts.device,
        sac: sac_saved(model, opts, &region, &modes, attn),
        sac_region: region.iter().map(|r| r.is_some_and(|r| modes.get(&r) == Some(&crate::options::AcMode::SelectiveOp))).collect(),
        sac_kept: HashMap::default(),
        sac_unread: vec![false; model.ops.len()],
        compiled_regions: false,
        f8_linear: &pre.f8_linear,
        held_loss: None,
        held_logits: None,
        loss: pre.loss,
        accumulated: vec![vec![]; units.len()],
        all_reduce_held: vec![None; units.len()],
        offload_inputs: vec![],
    };
    if opts.compile {
        compiled_checkpoints(&mut b, model, compiled, mems.to_mut(), &tz, &region);
    }
    // (an output copied from the kernel's is not what SAC caches: it goes as the forward's
    // other tensors, and the recompute makes it again — Phi-3's partial-rotary SDPA)
    for (j, m) in mems.iter().enumerate() {
        if b.sac[j] && m.out_copy {
            b.sac_unread[j] = true;
        }
    }
    // (a float8 linear with a bias whose GEMM SAC keeps: the cache holds the GEMM's result,
    // before the bias — kept from the forward like the casts' abs and max — and the output
    // goes as an unsaved one; the recompute adds the bias to the cached result anew)
    if !opts.compile {
        let biased: Vec<usize> = (0..mems.len()).filter(|&j| b.sac[j] && b.f8_linear[j] && mems[j].fwd_chain.iter().any(|s| matches!(s, Step::Make(t) if t.what == F8_GEMM_RESULT))).collect();
        if !biased.is_empty() {
            let ms = mems.to_mut();
            for j in biased {
                for step in &mut ms[j].fwd_chain {
                    if let Step::Make(t) = *step {
                        if t.what == F8_GEMM_RESULT {
                            *step = Step::MakeSaved(t);
                        }
                    }
                }
                b.sac_unread[j] = true;
            }
        }
    }
    setup(&mut b, &cx);
    let k = opts.grad_accum;
    // (where micro-batch 1 starts; the states where the last three start)
    let mut first = (0, 0);
    let mut starts: Vec<Vec<u64>> = vec![];
    for mb in 0..k {
        b.mb = mb;
        if mb == 1 {
            first = (b.buffers.len(), b.ops.len());
        }
        if k >= 6 && mb + 3 >= k {
            starts.push(b.snapshot(first));
        }
        let fs = forward(&mut b, &cx, &mems, &tz, unit_of_op, &region);
        let sync = mb + 1 == k || opts.grad_sync == GradSync::Each;
        backward(&mut b, &cx, &mems, &tz, unit_of_op, &region, fs, sync);
    }
    b.phase = Phase::Optimizer;
    // On a GPU torch.optim's Adam takes its foreach path (every parameter of the device and
    // dtype at once): `_foreach_sqrt(exp_avg_sqs)` copies every exp_avg_sq, one tensor per
    // parameter, and the copy lives until the step ends (measured on harness/fakegpu.py:
    // Llama-3-8B, f32 masters, ws 2, the peak at `_foreach_sqrt`); on the CPU the
    // single-tensor loop's two temporaries of one parameter.
    let foreach = opts.device == Device::Cuda && opts.optimizer.keeps_state() && opts.offload == Offload::None;
    // one tensor per parameter (per flat parameter under FSDP1), as the caching allocator is
    // asked for them: they fit the blocks the backward freed; made at the first unit's step
    let ws = opts.shard_size();
    let mut sqrt_sizes: Option<Vec<u64>> = foreach.then(|| {
        units
            .iter()
            .flat_map(|u| match opts.layout {
                Layout::Fsdp2 => u.params.iter().map(|p| p.grad_shard_bytes(ws)).collect::<Vec<_>>(),
                Layout::Flat if u.params.is_empty() => vec![],
                Layout::Flat => vec![u.shard_numel * u.dtype.size()],
            })
            .filter(|&x| x > 0)
            .collect()
    });
    let mut sqrt_all: Vec<BufferId> = vec![];
    for u in units {
        if u.params.is_empty() || opts.optimizer == Optimizer::None {
            continue;
        }
        b.op(OpKind::OptimizerStep { unit: u.id }, Stream::Compute, smallvec![]);
        if foreach {
            for bytes in sqrt_sizes.take().into_iter().flatten() {
                sqrt_all.push(b.alloc("adam foreach sqrt (an exp_avg_sq's copy)".into(), Category::Optstate, bytes, None));
            }
        } else if opts.optimizer.keeps_state() && opts.offload == Offload::None {
            // Single-tensor Adam: denom = exp_avg_sq.sqrt() / bc2 makes two shard-sized temps.
            let big = u.params.iter().map(|p| p.local_numel(ws, 0) * p.dtype.size()).max().unwrap_or(0);
            let big = if opts.layout == Layout::Flat { u.shard_numel * u.dtype.size() } else { big };
            let t1 = b.alloc(name!("{} adam sqrt", u.label()), Category::Optstate, big, None);
            b.transient(name!("{} adam denom", u.label()), Category::Optstate, big);
            b.free(t1);
        }
    }
    for t in sqrt_all {
        b.free(t);
    }
    b.op(OpKind::ZeroGrad, Stream::Compute, smallvec![]);
    for g in std::mem::take(&mut b.sharded_grads) {
        b.free(g);
    }
    b.has_sharded_grads.fill(false);
    // (the step's loss goes once the next step's forward returns: the setup's buffer; so do
    // the logits a torchtitan-2024 loop keeps)
    if let Some(l) = b.held_loss.take() {
        b.free(l);
    }
    if let Some(l) = b.held_logits.take() {
        b.free(l);
    }
    // (so do the float8 scales the unsharded params hold: the setup's stand for them)
    for (_, x) in std::mem::take(&mut b.f8_held).into_iter().flatten() {
        b.free(x);
    }
    b.flush();
    Schedule {
        ops: b.ops,
        buffers: b.buffers,
        steady: starts.len() == 3 && starts.windows(2).all(|w| w[0] == w[1]),
    }
}

fn setup(b: &mut B, cx: &Ctx) {
    let opts = b.opts;
    b.op(OpKind::Setup, Stream::Compute, smallvec![]);
    // the previous step's loss, still held by the training loop until this step's forward
    // returns (FSDPMemTracker counts it as activation)
    if let Some((ce, bytes)) = b.loss {
        b.held_loss = Some(b.alloc("loss of the previous step (held by the training loop)".into(), Category::Activation, bytes, None));
        if let (crate::options::TrainLoop::Torchtitan2024, fsdp_ir::OpKind::CrossEntropy { vocab }) = (opts.train_loop, &b.model.ops[ce].kind) {
            let bytes = cx.tokens() * vocab * DType::Float32.size();
            b.held_logits = Some(b.alloc("logits of the previous step (float32, held by the training loop)".into(), Category::Activation, bytes, None));
        }
    }
    let ws = opts.shard_size();
    for u in b.units {
        if u.params.is_empty() {
            continue;
        }
        let label = u.label().to_string();
        let sharded: u64 = match opts.layout {
            Layout::Fsdp2 => b.per_param(u, |p| p.shard_numel * p.dtype.size()),
            Layout::Flat => u.shard_numel * u.dtype.size(),
        };
        if opts.offload == Offload::None {
            b.alloc(name!("{label} sharded params"), Category::ShardedParam, sharded, Some(u.id));
        }
        if b.no_shard() {
            // Never sharded: the full params stay resident.
            let bytes = b.unsharded_bytes(u);
            if opts.param_dtype.is_some_and(|d| d != u.dtype) {
                b.alloc(name!("{label} unsharded params"), Category::UnshardedParam, bytes, Some(u.id));
            }
            b.state[u.id.index()] = PState::Unsharded;
        }
        if opts.optimizer.keeps_state() && opts.offload == Offload::None {
            // exp_avg + exp_avg_sq: zeros_like(unpadded local shard); plus a float32 `step` per
            // param, a host tensor beside a GPU's params (torch.optim keeps `step` on the CPU
            // unless capturable or fused: measured on harness/fakegpu.py), on a CPU run in the
            // same memory as the rest.
            let local: u64 = match opts.layout {
                Layout::Fsdp2 => b.per_param(u, |p| p.grad_shard_bytes(ws)),
                Layout::Flat => u.shard_numel * u.dtype.size(),
            };
            let nparams = match (opts.layout, opts.device) {
                (_, Device::Cuda) => 0,
                (Layout::Fsdp2, Device::Cpu) => u.params.iter().filter(|p| p.requires_grad).count() as u64,
                (Layout::Flat, Device::Cpu) => 1,
            };
            // (FSDP1's two moments of the flat shard: two tensors, each in whole 512 B blocks on
            // CUDA — measured on harness/fakegpu.py)
            let moments = match opts.layout {
                Layout::Fsdp2 => 2 * local,
                Layout::Flat => 2 * opts.device.allocated_bytes(local),
            };
            b.alloc(name!("{label} adam state"), Category::Optstate, moments + 4 * nparams, Some(u.id));
        }
        if b.float8_gathered(u) && !b.no_shard() && u.reshard_to.is_none() {
            // the scales the unsharded float8 params kept from the previous step's last gather:
            // its backward's (temp) when the unit is gathered again in backward
            let cat = if u.reshard_after_forward { Category::Temp } else { Category::UnshardedParam };
            let held = u.params.iter().filter(|p| p.float8).map(|p| (p.name.clone(), b.alloc(name!("{} float8 scale (previous step)", p.name), cat, DType::Float32.size(), None))).collect();
            b.f8_held[u.id.index()] = held;
        }
    }
    for buf in &b.model.buffers {
        b.alloc(buf.name.clone(), Category::Buffer, buf.shape.iter().product::<u64>() * buf.dtype.size(), None);
    }
    for inp in &b.model.inputs {
        let n = fsdp_ir::numel(&inp.shape, cx.dims).unwrap_or(0);
        b.alloc(inp.name.clone(), Category::Inputs, n * inp.dtype.size(), None);
    }
}

/// For each unit, the chain of units covering it, outermost first.
fn chains(units: &[Unit]) -> Vec<Vec<UnitId>> {
    let by_module: HashMap<&str, UnitId> = units.iter().flat_map(|u| std::iter::once(&u.module).chain(&u.group).map(move |m| (m.as_str(), u.id))).collect();
    units
        .iter()
        .map(|u| {
            let mut v = vec![u.id];
            let mut path = u.module.as_str();
            while let Some(p) = fsdp_ir::parent_path(path) {
                if let Some(&x) = by_module.get(p) {
                    v.push(x);
                }
                path = p;
            }
            v.reverse();
            v
        })
        .collect()
}

/// What the forward leaves for the backward: saved tensors per op, and live outputs.
struct FwdState {
    saved: Vec<Vec<BufferId>>,
    out_buf: Vec<Option<BufferId>>,
}

fn forward(b: &mut B, cx: &Ctx, mems: &[OpMem], tz: &Tensors, unit_of_op: &[UnitId], region: &[Option<usize>]) -> FwdState {
    let mut saved_map: Vec<Vec<BufferId>> = vec![vec![]; mems.len()];
    b.phase = Phase::Forward;
    b.post_forward_order.clear();
    let units = b.units;
    let model = b.model;
    let mut active: Vec<UnitId> = vec![];
    let mut out_buf: Vec<Option<BufferId>> = vec![None; mems.len()];
    let mut remaining: Vec<usize> = tz.consumers.iter().map(|c| c.len()).collect();
    // the attention masks (by kind: `None` causal, `Some(w)` a sliding window), made at the
    // first attention op
    let mut masks: Vec<(Option<u64>, BufferId)> = vec![];
    let mask_kinds = hf_mask_kinds(model);
    let mut positions: Option<BufferId> = None;
    let checkpointed = region.iter().position(|r| r.is_some());
    let mut first_attn: Option<usize> = None;
    let fwd_prefetch = b.opts.forward_prefetch as usize;
    // HF makes a DynamicCache in training unless gradient checkpointing is on: each layer's
    // k and v go through it (`torch.cat` copies) and it holds them until the model's output
    // is dropped. Where attention saves repeat_kv copies instead (eager GQA, SDPA GQA with a
    // sliding-window mask), the cache is what keeps them: the k and v inputs stay alive
    // until the forward returns.
    let use_cache = cx.use_cache;
    // the base model (`model`, `transformer`: the first path component of the attention ops)
    // ends at its last op (`model.norm`); its forward's locals (position ids, the attention
    // mask) go when it returns
    let base_end = model
        .ops
        .iter()
        .find(|o| matches!(o.kind, fsdp_ir::OpKind::Attention { .. }))
        .and_then(|a| a.name.split_once('.'))
        .and_then(|(base, _)| model.ops.iter().rposition(|o| o.name.strip_prefix(base).is_some_and(|r| r.starts_with('.'))))
        .unwrap_or(usize::MAX);
    let mut cache_held: Vec<BufferId> = vec![];
    // tensors no op reads any more, held by the module frame they were passed to: (its last op, buffer)
    let mut frame_held: Vec<(usize, BufferId)> = vec![];
    // Forward order of non-root units (first op of each).
    let mut order: Vec<UnitId> = vec![];
    let mut seen = vec![false; units.len()];
    for &u in unit_of_op {
        for &c in &b.chains[u.index()] {
            if !std::mem::replace(&mut seen[c.index()], true) {
                order.push(c);
            }
        }
    }
    let flat = b.opts.layout == Layout::Flat;
    let chains = b.chains;
    for (i, op) in model.ops.iter().enumerate() {
        let want = &chains[unit_of_op[i].index()];
        // post-forward of units we leave (innermost first)
        while let Some(&top) = active.last() {
            if want.contains(&top) {
                break;
            }
            active.pop();
            post_forward(b, top);
        }
        for &u in want {
            if !active.contains(&u) {
                active.push(u);
                b.unshard(u, false);
                b.wait(u);
                if fwd_prefetch > 0 || (flat && b.opts.forward_prefetch > 0) {
                    if let Some(pos) = order.iter().position(|&x| x == u) {
                        for &nx in order.iter().skip(pos + 1).take(fwd_prefetch.max(1)) {
                            if !units[nx.index()].is_root() {
                                b.unshard(nx, true);
                            }
                        }
                    }
                }
            }
        }
        let dep = b.last_ag_op[unit_of_op[i].index()].into_iter().collect();
        b.op(
            OpKind::Forward {
                op: b.op_names[i].clone(),
                unit: unit_of_op[i],
            },
            Stream::Compute,
            dep,
        );
        if matches!(op.kind, fsdp_ir::OpKind::Attention { .. }) && first_attn.is_none() {
            // create_causal_mask / create_sliding_window_causal_mask, each kind the model
            // makes: a [batch, 1, seq, seq] float mask for eager, alive during the forward;
            // for SDPA only with a sliding window shorter than the sequence, a bool
            // [1, 1, seq, seq] (each layer then saves a float copy of it)
            let s = cx.dims.seq;
            for &kind in &mask_kinds {
                if cx.attn == AttnImpl::Eager {
                    let n = cx.dims.batch * s * s;
                    let what = if kind.is_some() { "sliding-window mask" } else { "causal mask" };
                    masks.push((kind, b.alloc(what.into(), Category::Activation, n * cx.cd.size(), None)));
                } else if cx.attn == AttnImpl::Sdpa && cx.window_masks(kind) {
                    masks.push((kind, b.alloc("sliding-window mask (bool)".into(), Category::Activation, s * s * DType::Bool.size(), None)));
                }
            }
            first_attn = Some(i);
        }
        if let fsdp_ir::OpKind::RotaryEmbedding { .. } = &op.kind {
            // HF's decoder models make position_ids (arange(seq) + past, int64) before the
            // rotary embedding; it lives for the model's forward and, as an input of every
            // checkpointed layer, until the first one's backward
            if positions.is_none() {
                // (made after the KV cache: on the CPU its sliding-window layers each hold a
                // scalar int64 tensor of the window; on CUDA a device copy is made at the
                // layer's first update)
                if use_cache && cx.device == Device::Cpu {
                    for o in model.ops.iter().filter(|o| sliding_cache_layer(o)) {
                        cache_held.push(b.alloc(cat(&[&o.name, " kv cache window size"]), Category::Activation, DType::Int64.size(), None));
                    }
                }
                positions = Some(b.alloc(cat(&[&op.name, " position ids"]), Category::Activation, cx.dims.seq * DType::Int64.size(), None));
            }
        }
        if use_cache && cx.device == Device::Cuda && sliding_cache_layer(op) {
            cache_held.push(b.alloc(cat(&[&op.name, " kv cache window size"]), Category::Activation, DType::Int64.size(), None));
        }
        if use_cache {
            // the cache's copies of k and v (`torch.cat` onto the empty cache), held until the
            // forward returns where the attention saves other tensors
            // (DeepSeek's latent cache: the normed latent, which kv_b_proj then reads and
            // saves, and the rotated key, which only the cache holds)
            if let fsdp_ir::OpKind::Attention { mla: Some(m), head_dim, .. } = &op.kind {
                let n = cx.dims.batch * cx.dims.seq * head_dim.saturating_sub(m.nope) * cx.cd.size();
                cache_held.push(b.alloc(cat(&[&op.name, " kv cache rotary key"]), Category::Activation, n, None));
            }
            if let Some(n) = kv_cache_copies(cx, op) {
                for what in [" kv cache keys", " kv cache values"] {
                    cache_held.push(b.alloc(cat(&[&op.name, what]), Category::Activation, n, None));
                }
            }
        }
        let m = &mems[i];
        let in_region = region[i].is_some();
        if let (crate::options::TrainLoop::Torchtitan2024, fsdp_ir::OpKind::CrossEntropy { vocab }) = (b.opts.train_loop, &op.kind) {
            // `pred = model(input_ids)`: the output layer's logits made float32 (a copy under
            // mixed precision, the low-precision ones dropped); the previous step's `pred` goes
            // as the forward returns, before the loss
            let logits = tz.inputs[i].first().map(|&(_, j)| tz.alias[j]);
            let pred = if cx.cd != DType::Float32 {
                let p = b.alloc(cat(&[&op.name, " logits (float32, held by the training loop)"]), Category::Activation, cx.tokens() * vocab * DType::Float32.size(), None);
                if let Some(x) = logits.and_then(|j| out_buf[j].take()) {
                    b.free(x);
                }
                Some(p)
            } else {
                logits.and_then(|j| out_buf[j].take())
            };
            if let Some(old) = std::mem::replace(&mut b.held_logits, pred) {
                b.free(old);
            }
        }
        if !m.fwd_chain.is_empty() {
            let sac = b.sac_region[i];
            out_buf[i] = forward_chain(b, i, &op.name, m, "", Category::Activation, ChainRun::Forward { sac });
        } else if let Some(o) = m.out {
            out_buf[i] = Some(b.alloc(cat(&[&op.name, " ", o.what]), Category::Activation, o.bytes(), None));
        }
        let mut saved_now = vec![];
        for s in &m.saved {
            saved_now.push(b.alloc(cat(&[&op.name, " ", s.what]), Category::Activation, s.bytes(), None));
        }
        fwd_scratch(b, &op.name, m, "", Category::Activation);
        // extra saved tensors of checkpointed ops are dropped right away (selective AC keeps
        // the outputs of the ops it saves: SDPA's logsumexp with its output)
        if in_region && !b.sac[i] {
            for s in saved_now.drain(..) {
                b.free(s);
            }
        } else if in_region {
            // (selective AC caches the kernel's outputs, not the copies of its inputs)
            for s in saved_now.drain(saved_now.len() - m.input_copies..) {
                b.free(s);
            }
            saved_map[i] = saved_now;
        } else {
            saved_map[i] = saved_now;
        }
        // free inputs whose last forward use this was and that nobody saves (but the cache)
        let cached = use_cache && kv_cache_holds(cx, op);
        for &(pos, j) in &tz.inputs[i] {
            {
                let j = tz.alias[j];
                remaining[j] = remaining[j].saturating_sub(1);
                if remaining[j] == 0 && tz.saved_by[j].is_empty() && (!b.sac[j] || b.sac_unread[j]) {
                    if let Some(buf) = out_buf[j].take() {
                        if cached && (pos == 1 || pos == 2) {
                            cache_held.push(buf);
                        } else if tz.frame_hold[j] > i {
                            frame_held.push((tz.frame_hold[j], buf));
                        } else {
                            b.free(buf);
                        }
                    }
                }
            }
        }
        // the module frames that return with this op let go of their arguments
        frame_held.retain(|&(end, buf)| {
            if end > i {
                return true;
            }
            b.free(buf);
            false
        });
        if i == base_end && (checkpointed.is_none() || b.compiled_regions) {
            // the base model returns: its locals go (position ids, the attention mask)
            if let Some(p) = positions.take() {
                b.free(p);
            }
        }
        if i == base_end && checkpointed.is_none() {
            for (_, m) in masks.drain(..) {
                b.free(m);
            }
        }
        // outputs nobody reads and nobody saves (but the loss) die at once
        if tz.alias[i] == i && tz.consumers[i].is_empty() && tz.saved_by[i].is_empty() && (!b.sac[i] || b.sac_unread[i]) && !matches!(op.kind, fsdp_ir::OpKind::CrossEntropy { .. }) {
            if let Some(buf) = out_buf[i].take() {
                b.free(buf);
            }
        }
    }
    // With checkpointed layers the mask is an input of every checkpoint and is kept until
    // the backward of the first checkpointed attention op (the last checkpoint to let go).
    // (each mask by the layers of its kind)
    masks.retain(|&(kind, m)| {
        let first_ckpt_attn = first_attn.and_then(|f| (f..model.ops.len()).find(|&i| region[i].is_some() && mask_of(&mask_kinds, &model.ops[i]) == Some(kind)));
        match first_ckpt_attn {
            Some(i) => {
                saved_map[i].push(m);
                false
            }
            None => true,
        }
    });
    if let (Some(p), Some(first)) = (positions.take(), checkpointed) {
        saved_map[first].push(p);
    }
    while let Some(top) = active.pop() {
        if units[top.index()].is_root() {
            for (kind, m) in masks.drain(..) {
                let what = if kind.is_some() { "free sliding-window mask" } else { "free causal mask" };
                b.op(OpKind::Forward { op: what.into(), unit: top }, Stream::Compute, smallvec![]);
                b.free(m);
            }
        }
        post_forward(b, top);
    }
    // `loss = model(...).loss` returns: the loss held so far goes, this one is held (through
    // the backward and the optimizer step)
    if let Some(l) = b.held_loss.take() {
        b.free(l);
    }
    if let Some((ce, _)) = b.loss {
        b.held_loss = out_buf[tz.alias[ce]].take();
    }
    // ... and the output, with the cache, is dropped
    for buf in cache_held {
        b.free(buf);
    }
    FwdState {
        saved: saved_map,
        out_buf,
    }
}

fn post_forward(b: &mut B, u: UnitId) {
    let unit = &b.units[u.index()];
    if unit.is_root() {
        b.op(OpKind::Forward { op: "post-forward".into(), unit: u }, Stream::Compute, smallvec![]);
        if let Some(ag) = b.last_fwd_ag.take() {
            b.free(ag);
        }
    }
    if unit.reshard_after_forward {
        b.reshard(u);
    }
    if !unit.params.is_empty() {
        b.post_forward_order.push(u);
    }
}

/// The attention masks HF's base model makes before its layers, by kind (`None` the causal
/// mask, `Some(w)` a sliding window of `w`): Mistral, Mixtral and Phi-3 one, of their config's kind,
/// for every layer; the others (Qwen2/3, Gemma 3) the causal mask and, when a layer slides,
/// a sliding-window mask as well (`causal_mask_mapping`).
fn hf_mask_kinds(model: &fsdp_ir::Model) -> Vec<Option<u64>> {
    let windows = model.ops.iter().filter_map(|o| match o.kind {
        fsdp_ir::OpKind::Attention { sliding_window, .. } => Some(sliding_window),
        _ => None,
    });
    if matches!(model.architecture.as_str(), "MistralForCausalLM" | "MixtralForCausalLM" | "Phi3ForCausalLM") {
        return windows.take(1).collect();
    }
    let mut kinds = vec![None];
    for w in windows.flatten() {
        if !kinds.contains(&Some(w)) {
            kinds.push(Some(w));
        }
    }
    kinds
}

/// The mask kind an attention op reads ([`hf_mask_kinds`]); `None` for other ops.
fn mask_of(kinds: &[Option<u64>], op: &fsdp_ir::Op) -> Option<Option<u64>> {
    match op.kind {
        fsdp_ir::OpKind::Attention { sliding_window, .. } => Some(if kinds.len() == 1 { kinds[0] } else { sliding_window }),
        _ => None,
    }
}

/// An attention layer with a sliding window: HF's DynamicCache gives it a
/// DynamicSlidingWindowLayer.
fn sliding_cache_layer(op: &fsdp_ir::Op) -> bool {
    matches!(op.kind, fsdp_ir::OpKind::Attention { sliding_window: Some(_), .. })
}

/// Does the KV cache keep this attention op's k and v alive beyond what the op saves? Only
/// where the op saves repeat_kv copies of them instead: eager attention with grouped kv heads,
/// and SDPA with grouped kv heads under a sliding-window mask (SDPA's GQA path saves k and v
/// themselves; GPT-2's fused qkv saves the cache's copies).
fn kv_cache_holds(cx: &Ctx, op: &fsdp_ir::Op) -> bool {
    let fsdp_ir::OpKind::Attention { heads, kv_heads, sliding_window, .. } = &op.kind else { return false };
    if op.inputs.len() != 3 || heads == kv_heads {
        return false;
    }
    let masked = cx.window_masks(*sliding_window);
    match cx.attn {
        AttnImpl::Eager => true,
        AttnImpl::Sdpa => masked,
        AttnImpl::FlashAttention2 => false,
    }
}

/// The bytes of each of the KV cache's own k and v copies that outlive an attention op's
/// forward, where the op does not save them: GPT-2's fused qkv split into heads and
/// concatenated onto the cache, under SDPA's f32 math kernel (measured: GPT-2 XL bf16 with
/// dropout, harness case `gpt2_xl_bf16_ws16`: two `cat` copies per layer at the loss).
fn kv_cache_copies(cx: &Ctx, op: &fsdp_ir::Op) -> Option<u64> {
    let fsdp_ir::OpKind::Attention { kv_heads, head_dim, dropout, .. } = &op.kind else { return None };
    (op.inputs.len() == 1 && crate::activation::sdpa_math_upcast(cx, *dropout))
        .then(|| cx.dims.batch * cx.dims.seq * kv_heads * head_dim * cx.cd.size())
}

/// How an op's forward chain runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ChainRun {
    /// The forward; under op-level SAC, what SAC keeps (`Step::MakeSaved`) stays.
    Forward { sac: bool },
    /// A checkpoint's recompute: SAC's kept tensors are taken, not made again; with `cached`,
    /// the output comes from SAC's cache (the GEMM is not run).
    Recompute { cached: bool },
}

/// An op's [`OpMem::fwd_chain`] (op index `i`): what it makes and drops around its output,
/// which it returns; what it made and kept goes when the forward returns, but what op-level
/// SAC keeps, which stays for the recompute ([`B::sac_kept`]) — a float8 linear's with a bias
/// its GEMM's result too, to which the cached recompute adds the bias anew: the output it
/// then returns.
fn forward_chain(b: &mut B, i: usize, op: &str, m: &OpMem, suffix: &str, category: Category, run: ChainRun) -> Option<BufferId> {
    let mut made: Vec<Option<BufferId>> = vec![];
    let mut kept: Vec<usize> = vec![];
    let mut out = None;
    let mut add_after_served = false;
    for step in &m.fwd_chain {
        match *step {
            Step::Make(t) => made.push(Some(b.alloc(cat(&[op, " ", t.what, suffix]), category, t.bytes(), None))),
            Step::MakeSaved(t) => {
                let served = match run {
                    ChainRun::Recompute { .. } => b.sac_kept.get_mut(&i).and_then(|q| q.pop_front()),
                    ChainRun::Forward { .. } => None,
                };
                add_after_served |= served.is_some() && t.what == F8_GEMM_RESULT;
                let x = served.unwrap_or_else(|| b.alloc(cat(&[op, " ", t.what, suffix]), category, t.bytes(), None));
                if run == (ChainRun::Forward { sac: true }) {
                    kept.push(made.len());
                    b.sac_kept.entry(i).or_default().push_back(x);
                }
                made.push(Some(x));
            }
            Step::Drop(k) if !kept.contains(&k) => {
                if let Some(x) = made.get_mut(k).and_then(Option::take) {
                    b.free(x);
                }
            }
            Step::Output => {
                if let (Some(o), false) = (m.out, run == ChainRun::Recompute { cached: true } && !add_after_served) {
                    out = Some(b.alloc(cat(&[op, " ", o.what, suffix]), category, o.bytes(), None));
                }
            }
            _ => {}
        }
    }
    for (k, x) in made.into_iter().enumerate() {
        if let (Some(x), false) = (x, kept.contains(&k)) {
            b.free(x);
        }
    }
    out
}

/// An op's forward scratch: one after the other (the largest is the op's high-water mark),
/// or alive together.
fn fwd_scratch(b: &mut B, op: &str, m: &OpMem, suffix: &str, category: Category) {
    if m.fwd_scratch_together {
        let bufs: Vec<BufferId> = m.fwd_scratch.iter().map(|s| b.alloc(cat(&[op, " ", s.what, suffix]), category, s.bytes(), None)).collect();
        for x in bufs {
            b.free(x);
        }
    } else if let Some(big) = m.fwd_scratch.iter().max_by_key(|s| s.bytes()) {
        b.transient(cat(&[op, " ", big.what, suffix]), category, big.bytes());
    }
}

/// The bytes of the grad of the slice op `op` reads of its input `pos` (a view of a fused
/// projection: Phi-3's q, k — as wide as the op's output — and v), or `None`.
fn slice_read(op: &fsdp_ir::Op, pos: usize, out_bytes: u64) -> Option<u64> {
    match op.kind {
        fsdp_ir::OpKind::Rope { offset: Some(_), .. } if pos == 0 => Some(out_bytes),
        fsdp_ir::OpKind::Attention { v_offset: Some(_), kv_heads, heads, .. } if pos == 2 => Some(out_bytes / heads.max(1) * kv_heads),
        _ => None,
    }
}

/// The bytes of the grad op `op` makes of input `pos` when it reads a `torch.split` view of
/// it (DeepSeek's latent attention: `kv_a_layernorm` and k's RoPE read the two parts of
/// `kv_a_proj_with_mqa`'s output, q's RoPE and the attention's `cat` the two parts of each
/// head of q's): SplitWithSizesBackward holds the pieces until the last arrives and
/// concatenates them ([`join_split`]). The attention's q grad is the storage both q pieces
/// view: the whole q for `q_pass`, nothing more for the rotated part.
fn split_read(op: &fsdp_ir::Op, pos: usize, out_bytes: u64) -> Option<u64> {
    use fsdp_ir::OpKind;
    match &op.kind {
        OpKind::RmsNorm { input_width: Some(_), .. } if pos == 0 => Some(out_bytes),
        OpKind::Rope { offset: Some(_), pass_through: false, .. } if pos == 0 => Some(out_bytes),
        OpKind::Attention { mla: Some(m), heads, head_dim, .. } if pos <= 1 => Some(if pos == 0 { out_bytes / (heads * m.v_head_dim).max(1) * heads * head_dim } else { 0 }),
        _ => None,
    }
}

/// Op `i`'s backward begins: the grads of the split views its consumers read
/// ([`split_read`]) are concatenated into its output's grad (SplitWithSizesBackward's `cat`),
/// reshaped once more when the views were of its heads transposed (`view(…).transpose(1,
/// 2)`: the joined grad is laid out `[b, h, s, d]`, ViewBackward's reshape copies it).
fn join_split(b: &mut B, tz: &Tensors, mems: &[OpMem], grad: &mut [Option<BufferId>], grad_refs: &mut HashMap<BufferId, u32>, i: usize) {
    let pieces = std::mem::take(&mut b.split_pieces[i]);
    if pieces.is_empty() {
        return;
    }
    let model = b.model;
    let bytes = mems[i].out.map_or(0, |o| o.bytes());
    let name = &model.ops[i].name;
    let mut joined = b.alloc(cat(&[name, " grad (split joined)"]), b.bwd_temp, bytes, None);
    for x in pieces {
        b.free(x);
    }
    let per_head = tz.consumers[i].iter().any(|&c| matches!(model.ops[c].kind, fsdp_ir::OpKind::Rope { head_stride: Some(_), .. }));
    if per_head {
        let r = b.alloc(cat(&[name, " grad (heads reshaped)"]), b.bwd_temp, bytes, None);
        b.free(joined);
        joined = r;
    }
    let me = tz.alias[i];
    match grad[me] {
        None => {
            grad[me] = Some(joined);
            grad_refs.insert(joined, 1);
        }
        Some(_) => {
            b.transient(cat(&[name, " grad (accumulate)"]), b.bwd_temp, bytes);
            b.free(joined);
        }
    }
}

/// Op `i`'s grad of its input `j` (already resolved), when `j` is a forward input of op `i`'s
/// (non-root) unit: FSDP2's pre-forward cast it (a float32 tensor under a lower `param_dtype`)
/// and ran it through RegisterPostBackwardFunction, whose backward is the unit's
/// post-backward. The grad (in the cast dtype) waits there: it is cast back and joins the
/// grads of `j`'s consumers outside the unit only after the post-backward
/// ([`after_post_backward`]) — measured: DeepSeek-V3 with its experts as units, whose input's
/// grad from the shared experts is made first. Returns false where nothing waits (the first
/// grad of an uncast input is the tensor's grad itself).
/// Whether tensor `j`'s grad, as op `i` (a reader of it) would pass it on, already has a part:
/// the grad an earlier reader gave, or one held for the post-backward hook of `i`'s unit where
/// the grad crosses into it ([`crossing_grad`]).
fn has_grad_now(b: &B, grad: &[Option<BufferId>], i: usize, j: usize) -> bool {
    grad[j].is_some() || b.through_post_backward[b.unit_of_op[i].index()].iter().any(|x| x.0 == j)
}

fn crossing_grad(b: &mut B, mems: &[OpMem], grad: &[Option<BufferId>], i: usize, j: usize) -> bool {
    let u = b.unit_of_op[i];
    // (FSDP2's hook; FSDP1 runs its post-backward from its params' grad hooks)
    if b.opts.layout != Layout::Fsdp2 || b.units[u.index()].is_root() || b.chains[b.unit_of_op[j].index()].contains(&u) {
        return false;
    }
    let Some(out) = mems[j].out else { return false };
    let cd = b.opts.param_dtype;
    let cast = cd.is_some_and(|d| out.dtype.is_float() && out.dtype != d);
    let bytes = match (cast, cd) {
        (true, Some(d)) => out.numel * d.size(),
        _ => out.bytes(),
    };
    let name = &b.model.ops[j].name;
    if b.through_post_backward[u.index()].iter().any(|x| x.0 == j) {
        // another of the unit's ops reads it: the grads add up inside, before the hook
        b.transient(cat(&[name, " grad (accumulate)"]), b.bwd_temp, bytes);
        return true;
    }
    let outside = grad[j].is_some() && b.grad_made_in.get(&j) != Some(&u);
    if !cast && !outside {
        if grad[j].is_none() {
            b.grad_made_in.insert(j, u);
        }
        return false;
    }
    let g = b.alloc(cat(&[name, " grad (through the unit's post-backward)"]), b.bwd_temp, bytes, None);
    b.through_post_backward[u.index()].push((j, g, cast));
    true
}

/// Unit `u`'s post-backward has run: its forward inputs' grads go on ([`crossing_grad`]):
/// cast back to the tensor's dtype, added to (or becoming) the tensor's grad.
fn after_post_backward(b: &mut B, mems: &[OpMem], grad: &mut [Option<BufferId>], grad_refs: &mut HashMap<BufferId, u32>, u: UnitId) {
    for (j, g, cast) in std::mem::take(&mut b.through_post_backward[u.index()]) {
        let bytes = mems[j].out.map_or(0, |o| o.bytes());
        let name = &b.model.ops[j].name;
        match (grad[j], cast) {
            (None, true) => {
                let n = b.alloc(cat(&[name, " grad"]), b.bwd_temp, bytes, None);
                b.free(g);
                grad[j] = Some(n);
                grad_refs.insert(n, 1);
            }
            (None, false) => {
                grad[j] = Some(g);
                grad_refs.insert(g, 1);
            }
            (Some(_), _) => {
                if cast {
                    let c = b.alloc(cat(&[name, " grad (cast back)"]), b.bwd_temp, bytes, None);
                    b.free(g);
                    b.transient(cat(&[name, " grad (accumulate)"]), b.bwd_temp, bytes);
                    b.free(c);
                } else {
                    b.transient(cat(&[name, " grad (accumulate)"]), b.bwd_temp, bytes);
                    b.free(g);
                }
            }
        }
    }
}

/// Drops op `i`'s reference to its output's grad (freed with the last one).
fn release_out_grad(b: &mut B, tz: &Tensors, grad: &mut [Option<BufferId>], grad_refs: &mut HashMap<BufferId, u32>, i: usize) {
    let me = tz.alias[i];
    if let Some(g) = grad[me].take() {
        if me == i {
            let r = grad_refs.entry(g).or_insert(1);
            *r = r.saturating_sub(1);
            if *r == 0 {
                b.free(g);
            }
        } else {
            grad[me] = Some(g);
        }
    }
}

/// Makes the grad of op `i`'s input `j`: a new buffer, the output grad itself through a
/// pass-through add, or a transient when another consumer's backward made it already.
#[allow(clippy::too_many_arguments)]
fn input_grad(b: &mut B, tz: &Tensors, mems: &[OpMem], grad: &mut [Option<BufferId>], grad_refs: &mut HashMap<BufferId, u32>, i: usize, pos: usize, j: usize) {
    let model = b.model;
    let me = tz.alias[i];
    let pass_through = matches!(model.ops[i].kind, fsdp_ir::OpKind::Add);
    let j = tz.alias[j];
    if !tz.differentiable[j] {
        return;
    }
    let shape_n = mems[j].out.map(|o| o.bytes()).unwrap_or(0);
    let same = mems[i].out.map(|o| o.bytes()) == Some(shape_n);
    if crossing_grad(b, mems, grad, i, j) {
        return;
    }
    if let Some(piece) = split_read(&model.ops[i], pos, mems[i].out.map_or(0, |o| o.bytes())) {
        if piece > 0 {
            let g = b.alloc(cat(&[&model.ops[i].name, " grad (split piece)"]), b.bwd_temp, piece, None);
            b.split_pieces[j].push(g);
        }
        return;
    }
    // the op reads a slice (a view) of input j: its grad of the slice's size is made first,
    // then SliceBackward's zeros of j's size with it copied in (added to j's grad when there
    // is one: `old + new`, out of place)
    if let Some(slice) = slice_read(&model.ops[i], pos, mems[i].out.map_or(0, |o| o.bytes())) {
        let gs = b.alloc(cat(&[&model.ops[i].name, " grad (slice)"]), b.bwd_temp, slice, None);
        let full = b.alloc(cat(&[&model.ops[j].name, " grad"]), b.bwd_temp, shape_n, None);
        b.free(gs);
        match grad[j] {
            None => {
                grad[j] = Some(full);
                grad_refs.insert(full, 1);
            }
            Some(_) => {
                b.transient(cat(&[&model.ops[j].name, " grad (accumulate)"]), b.bwd_temp, shape_n);
                b.free(full);
            }
        }
        return;
    }
    match (grad[j], pass_through && same, grad[me]) {
        (None, true, Some(g)) => {
            grad[j] = Some(g);
            *grad_refs.entry(g).or_insert(0) += 1;
        }
        (None, _, _) => {
            let g = b.alloc(cat(&[&model.ops[j].name, " grad"]), b.bwd_temp, shape_n, None);
            grad[j] = Some(g);
            grad_refs.insert(g, 1);
        }
        (Some(g), _, _) => {
            b.transient(cat(&[&model.ops[j].name, " grad (accumulate)"]), b.bwd_temp, shape_n);
            // autograd's sum is a new tensor (`old + new`): FSDPMemTracker labels it by when it
            // was made — which differs from the old one's label only across a unit group's
            // recompute window
            if b.buffers[g.index()].category != b.bwd_temp && grad_refs.get(&g) == Some(&1) {
                grad_refs.remove(&g);
                let n = b.relabel(vec![g], cat(&[&model.ops[j].name, " grad (accumulated)"]), b.bwd_temp, None);
                grad[j] = Some(n);
                grad_refs.insert(n, 1);
            }
        }
    }
}

/// Makes the grad of primary param `k` (owned by `owner`) in the compute dtype `gd`: its own
/// buffer (fsdp2; flat: held apart until the unit's post-backward joins them into its flat
/// grad), or a transient accumulating into the grad an earlier use made (tied weights).
fn param_grad(b: &mut B, gd: DType, k: usize, owner: UnitId) {
    let model = b.model;
    let flat = b.opts.layout == Layout::Flat;
    let p = &model.params[k];
    if !p.requires_grad {
        return;
    }
    let prim = p.name.as_str();
    let bytes = p.numel() * gd.size();
    if flat {
        // FSDP1: the param is a view of the flat param through one `split`; autograd holds
        // each view's grad in the split node's input buffer (a second use's summed into a
        // new tensor) until every view's has come, then joins them (measured:
        // harness/fsdp1_fake.py; post_backward)
        if b.split_of_param[k].is_some() {
            b.transient(cat(&[prim, " grad (accumulate)"]), b.bwd_temp, bytes);
        } else {
            let g = b.alloc(cat(&[prim, " grad"]), b.bwd_temp, bytes, Some(owner));
            b.split_grads[owner.index()].push(g);
            b.split_dtype[owner.index()] = Some(gd);
            b.split_of_param[k] = Some(g);
        }
        return;
    }
    if b.grad_of_param[k].is_some() {
        b.transient(cat(&[prim, " grad (accumulate)"]), b.bwd_temp, bytes);
    } else {
        let g = b.alloc(cat(&[prim, " grad"]), b.bwd_temp, bytes, Some(owner));
        b.grads[owner.index()].push(g);
        b.grad_of_param[k] = Some(g);
    }
}

#[allow(clippy::too_many_arguments)]
fn backward(b: &mut B, cx: &Ctx, mems: &[OpMem], tz: &Tensors, unit_of_op: &[UnitId], region: &[Option<usize>], fs: FwdState, sync: bool) {
    b.phase = Phase::Backward;
    let units = b.units;
    let model = b.model;
    let FwdState { mut saved, mut out_buf } = fs;
    // `loss.backward()` seeds the graph with ones_like(loss), made before the autograd engine
    // starts (so the tracker counts it as activation) and held until the engine returns
    let seed = b.loss.map(|(_, bytes)| b.alloc("loss grad seed (ones_like)".into(), Category::Activation, bytes, None));
    b.grad_made_in.clear();
    let chains = b.chains;
    // grad buffer of each tensor, with the count of tensors sharing it
    let mut grad: Vec<Option<BufferId>> = vec![None; mems.len()];
    let mut grad_refs: HashMap<BufferId, u32> = HashMap::default();
    // remaining backward savers of each tensor
    let mut savers_left: Vec<usize> = tz.saved_by.iter().map(|v| v.len()).collect();
    let mut active: Vec<UnitId> = vec![];
    let mut done_post: HashSet<UnitId> = HashSet::default();
    let mut deferred: Vec<UnitId> = vec![];
    let mut pfo = b.post_forward_order.clone();
    let mut recomputed: HashSet<usize> = HashSet::default();
    // each checkpointed region's first op, and its last op that saves a tensor for backward
    let mut region_start: HashMap<usize, usize> = HashMap::default();
    let mut region_end: HashMap<usize, usize> = HashMap::default();
    let mut last_saver: HashMap<usize, usize> = HashMap::default();
    // selective AC's cached outputs past the early stop: never popped by the recompute, held
    // until the region's backward ends (its first op in forward order)
    let mut unpopped: Vec<bool> = vec![false; mems.len()];
    for (j, r) in region.iter().enumerate() {
        let Some(r) = *r else { continue };
        region_start.entry(r).or_insert(j);
        region_end.insert(r, j);
        let m = &mems[j];
        if !m.saved.is_empty() || m.saves_output || m.saves_inputs.iter().any(|&x| x) {
            last_saver.insert(r, j);
        }
    }
    // First op (in forward order) of each unit's run, and whether its inputs need grad.
    let mut first_op: Vec<Option<usize>> = vec![None; units.len()];
    for (i, &u) in unit_of_op.iter().enumerate() {
        for &c in &chains[u.index()] {
            first_op[c.index()].get_or_insert(i);
        }
    }
    let needs_grad_input = |u: UnitId| -> bool {
        if units[u.index()].is_root() {
            return false;
        }
        let Some(i) = first_op[u.index()] else { return false };
        tz.inputs[i].iter().any(|&(_, j)| tz.differentiable[tz.alias[j]])
    };
    b.entered = vec![false; units.len()];
    let enter = |b: &mut B, u: UnitId, pfo: &mut Vec<UnitId>| {
        b.entered[u.index()] = true;
        b.unshard(u, false);
        b.wait(u);
        // default / explicit backward prefetch
        let idx = pfo.iter().rposition(|&x| x == u);
        if let Some(idx) = idx {
            pfo.remove(idx);
            let (depth, explicit) = match (b.opts.backward_prefetch, units[u.index()].is_root()) {
                (BackwardPrefetch::Implicit | BackwardPrefetch::Pre, _) => (1, false),
                (BackwardPrefetch::Depth(_), true) => (1, false),
                (BackwardPrefetch::Depth(k), false) => (k as usize, true),
                (BackwardPrefetch::None | BackwardPrefetch::Post, _) => (0, false),
            };
            let targets: Vec<UnitId> = pfo[..idx].iter().rev().take(depth).copied().collect();
            let category = if explicit && b.opts.layout == Layout::Fsdp2 { Category::Temp } else { Category::AllGather };
            for t in targets {
                b.unshard_as(t, true, category);
            }
        }
    };
    // a torchtitan-2024 loop computes the loss outside the model: its backward runs before the
    // root's pre-backward hook, which fires at the logits' grad
    let outside_loss = b.opts.train_loop == crate::options::TrainLoop::Torchtitan2024;
    for i in (0..model.ops.len()).rev() {
        let want: &[UnitId] = if outside_loss && matches!(model.ops[i].kind, fsdp_ir::OpKind::CrossEntropy { .. }) { &[] } else { &chains[unit_of_op[i].index()] };
        while let Some(&top) = active.last() {
            if want.contains(&top) {
                break;
            }
            active.pop();
            leave(b, top, needs_grad_input(top), sync, &mut done_post, &mut deferred, &mut pfo);
            after_post_backward(b, mems, &mut grad, &mut grad_refs, top);
        }
        for &u in want {
            if !active.contains(&u) {
                active.push(u);
                enter(b, u, &mut pfo);
            }
        }
        let op = &model.ops[i];
        let m = &mems[i];
        // recompute a checkpointed region when its backward first unpacks what the region
        // saved: at its last op (in forward order) that saves anything. Non-reentrant
        // checkpointing recomputes the region's forward from its start and stops as soon as
        // every saved tensor is back (`early_stop`), so trailing ops that save nothing (the
        // residual add) are neither waited for nor recomputed. Every op of the region is
        // recomputed, whichever unit owns its params.
        if let Some(r) = region[i] {
            if last_saver.get(&r) == Some(&i) && recomputed.insert(r) {
                let start = region_start.get(&r).copied().unwrap_or(i);
                let rpath = model.modules.get(r).map_or("", |m| m.path.as_str());
                // a unit group's members share FSDP2's group forward hooks: the pre-forward runs
                // at the first member recomputed (the last in forward order), the post-forward
                // after the group's first module's recompute; FSDPMemTracker's "in AC" spans both
                let group_of_region = units.iter().find(|u| !u.group.is_empty() && (u.module == rpath || u.group.iter().any(|g| g == rpath)));
                if group_of_region.is_some() {
                    b.bwd_temp = Category::Activation;
                }
                for j in start..=i {
                    let oj = &model.ops[j];
                    let u = unit_of_op[j];
                    // selective AC serves a kept op from its cache: not run, nothing allocated;
                    // and the op whose input-save completes the recompute (early stop packs
                    // inputs before the op runs) does not run either — but a custom autograd
                    // Function (a float8 linear) packs what it saves after its forward: it runs
                    // whole (its casts, its GEMM from the cache) and the stop drops its output
                    let stops_before = j == i && mems[j].saved.is_empty() && !mems[j].saves_output && !b.f8_linear[j];
                    // FSDPMemTracker counts what the recompute makes as activation inside an
                    // FSDP unit's forward, as temp elsewhere (a region op owned by the root or by
                    // a unit around the region)
                    let un = &units[u.index()];
                    // (torchtitan's checkpoint_wrapper: the region's own unit's hooks are outside
                    // it and do not run in the recompute)
                    let own = b.opts.ac_wrapper == crate::options::AcWrapper::Hf;
                    let inside = !un.is_root() && std::iter::once(&un.module).chain(&un.group).any(|umod| (own && umod == rpath) || umod.strip_prefix(rpath).is_some_and(|x| x.starts_with('.')));
                    let category = if inside { Category::Activation } else { Category::Temp };
                    if b.sac[j] || stops_before {
                        b.op(OpKind::Recompute { op: b.op_names[j].clone(), unit: u, cached: true }, Stream::Compute, smallvec![]);
                        // (an output copied from the cached kernel output is made again)
                        if b.sac[j] && !stops_before && mems[j].out_copy && out_buf[j].is_none() {
                            if let Some(o) = mems[j].out {
                                out_buf[j] = Some(b.alloc(cat(&[&oj.name, " ", o.what, " (recomputed)"]), category, o.bytes(), None));
                            }
                        }
                        // a float8 linear's casts run again (they are not GEMMs): only its
                        // `torch.mm` output, and the casts' abs and max, come from SAC's cache
                        if b.sac[j] && !stops_before && !mems[j].fwd_chain.is_empty() {
                            // (with a bias, the cache's buffer is the GEMM's result: the add makes
                            // the output again, and the cached result goes)
                            if let Some(out) = forward_chain(b, j, &oj.name, &mems[j], " (recomputed)", category, ChainRun::Recompute { cached: true }) {
                                out_buf[j] = Some(out);
                            }
                        }
                        // the copies of its inputs it saves are made again (repeat_kv, the
                        // float mask) and saved by the op served from the cache; the inputs
                        // they copy go as below
                        let copies = &mems[j].saved[mems[j].saved.len() - mems[j].input_copies..];
                        for s in copies {
                            let buf = b.alloc(cat(&[&oj.name, " ", s.what, " (recomputed)"]), category, s.bytes(), None);
                            saved[j].push(buf);
                        }
                        if stops_before || mems[j].input_copies == 0 {
                            continue;
                        }
                    } else {
                        // FSDP2's pre-forward hook of a unit inside the region runs in the recompute:
                        // it gathers the unit's params unless its pre-backward (or a prefetch) already
                        // did (a prefetched gather is waited for here); its post-forward does not
                        // reshard in backward
                        b.unshard(u, false);
                        b.wait(u);
                        if inside {
                            b.register_scales(u);
                        }
                        b.op(OpKind::Recompute { op: b.op_names[j].clone(), unit: u, cached: false }, Stream::Compute, smallvec![]);
                        if !mems[j].fwd_chain.is_empty() && out_buf[j].is_none() {
                            out_buf[j] = forward_chain(b, j, &oj.name, &mems[j], " (recomputed)", category, ChainRun::Recompute { cached: false });
                        } else if let Some(o) = mems[j].out {
                            if out_buf[j].is_none() {
                                out_buf[j] = Some(b.alloc(cat(&[&oj.name, " ", o.what, " (recomputed)"]), category, o.bytes(), None));
                            }
                        }
                        let mut v = vec![];
                        for s in &mems[j].saved {
                            v.push(b.alloc(cat(&[&oj.name, " ", s.what, " (recomputed)"]), category, s.bytes(), None));
                        }
                        fwd_scratch(b, &oj.name, &mems[j], " (recomputed)", category);
                        // (first, as in the forward: `first_node_saved` counts from the front; what
                        // the region keeps for it, the mask or position ids, goes after)
                        saved[j].splice(0..0, v);
                    }
                    // Non-reentrant checkpointing keeps only what the recomputed ops save:
                    // drop region-internal inputs whose region consumers have all run and
                    // that none of them saves.
                    for &(_, k) in &tz.inputs[j] {
                        let k = tz.alias[k];
                        if region[k] != Some(r) || k < start {
                            continue;
                        }
                        let done = tz.consumers[k].iter().all(|&c| c <= j || region[c] != Some(r));
                        let kept = mems[k].saves_output
                            || tz.consumers[k].iter().any(|&c| {
                                let pos = tz.inputs[c].iter().find(|&&(_, x)| tz.alias[x] == k).map(|&(p, _)| p);
                                pos.is_some_and(|p| mems[c].saves_inputs.get(p).copied().unwrap_or(false))
                            });
                        if done && !kept {
                            if let Some(buf) = out_buf[k].take() {
                                b.free(buf);
                            }
                        }
                    }
                }
                if group_of_region.is_some_and(|u| u.module == rpath) {
                    b.bwd_temp = Category::Temp;
                }
                let end = region_end.get(&r).copied().unwrap_or(i);
                unpopped[i..=end].copy_from_slice(&b.sac[i..=end]);
                // (a float8 linear's cached GEMM output was popped by its whole recompute)
                unpopped[i] &= !b.f8_linear[i];
                // the early stop unwinds the recomputed forward: what only the ops past it
                // would have used goes with it
                for k in start..=i {
                    let kept = mems[k].saves_output
                        || tz.consumers[k].iter().any(|&c| {
                            let pos = tz.inputs[c].iter().find(|&&(_, x)| tz.alias[x] == k).map(|&(p, _)| p);
                            c <= i && pos.is_some_and(|p| mems[c].saves_inputs.get(p).copied().unwrap_or(false))
                        });
                    if tz.alias[k] == k && region[k] == Some(r) && !kept && !unpopped[k] && tz.consumers[k].iter().any(|&c| c > i && region[c] == Some(r)) {
                        if let Some(buf) = out_buf[k].take() {
                            b.free(buf);
                        }
                    }
                }
                // what SAC kept from inside ops the early-stopped recompute never reached (a
                // float8 cast's abs and max) goes when it stops (FSDP2: the backward of the
                // region's last float8 linear, llama_wide_f8_sac_l1_ws2)
                for k in start..=end {
                    for x in b.sac_kept.remove(&k).into_iter().flatten() {
                        b.free(x);
                    }
                }
            }
        }
        let dep = b.last_ag_op[unit_of_op[i].index()].into_iter().collect();
        b.op(OpKind::Backward { op: b.op_names[i].clone(), unit: unit_of_op[i] }, Stream::Compute, dep);
        join_split(b, tz, mems, &mut grad, &mut grad_refs, i);
        // inputs a composite op's node let go of before its end ([`Step::ReleaseInput`])
        let mut released_early: Vec<usize> = vec![];
        let me = tz.alias[i];
        let has_grad = tz.differentiable[me] || matches!(op.kind, fsdp_ir::OpKind::CrossEntropy { .. });
        if has_grad && m.out.is_some() && m.bwd_chain.is_empty() {
            // backward scratch: alive together; freed before the grads when `bwd_scratch_first`,
            // else one at a time beside them
            let mut scratch = vec![];
            let mut first_node = m.first_node_saved.min(saved[i].len());
            for s in &m.bwd_scratch {
                scratch.push(b.alloc(cat(&[&op.name, " ", s.what]), b.bwd_temp, s.bytes(), None));
                // the first node has run: its saved tensors go
                for x in saved[i].drain(..first_node) {
                    b.free(x);
                }
                first_node = 0;
                if scratch.len() > 1 && !m.bwd_scratch_first {
                    let first = scratch.remove(0);
                    b.free(first);
                }
            }
            if m.bwd_scratch_first {
                for x in scratch.drain(..) {
                    b.free(x);
                }
            }
            // (no scratch: the first node's saved tensors go before the grads)
            for x in saved[i].drain(..first_node) {
                b.free(x);
            }
            // (a linear's node makes its weight's grad, then its input's: measured per op on
            // harness/fsdp2_fake.py, tiny-llama-wide — where the input's grad is added into an
            // earlier one, the weight's grad is beside the sum)
            for &(k, owner) in &b.op_params[i] {
                param_grad(b, cx.cd, k, owner);
            }
            for &(pos, j) in &tz.inputs[i] {
                input_grad(b, tz, mems, &mut grad, &mut grad_refs, i, pos, j);
            }
            for s in scratch {
                b.free(s);
            }
        } else if has_grad && m.out.is_some() {
            // a composite op's nodes, one by one
            let mut made: Vec<Option<BufferId>> = vec![];
            let mut let_go: Vec<usize> = vec![];
            let mut held: Vec<Option<BufferId>> = saved[i].drain(..).map(Some).collect();
            for step in &m.bwd_chain {
                match *step {
                    Step::Make(t) | Step::MakeSaved(t) => made.push(Some(b.alloc(cat(&[&op.name, " ", t.what]), b.bwd_temp, t.bytes(), None))),
                    Step::Drop(k) => {
                        if let Some(x) = made.get_mut(k).and_then(Option::take) {
                            b.free(x);
                        }
                    }
                    Step::Release(k) => {
                        if let Some(x) = held.get_mut(k).and_then(Option::take) {
                            b.free(x);
                        }
                    }
                    Step::ReleaseUnpacked(k) if region[i].is_some() => {
                        if let Some(x) = held.get_mut(k).and_then(Option::take) {
                            b.free(x);
                        }
                    }
                    Step::ReleaseUnpacked(_) => {}
                    Step::DropOutGrad => release_out_grad(b, tz, &mut grad, &mut grad_refs, i),
                    Step::Output => {}
                    Step::ReleaseInput(p) => {
                        for &(pos, j) in &tz.inputs[i] {
                            let j = tz.alias[j];
                            if pos != p || let_go.contains(&j) {
                                continue;
                            }
                            let_go.push(j);
                            if tz.saves[i].contains(&j) {
                                savers_left[j] = savers_left[j].saturating_sub(1);
                                if savers_left[j] == 0 {
                                    if let Some(buf) = out_buf[j].take() {
                                        b.free(buf);
                                    }
                                }
                            } else if region[j].is_some() && region[j] == region[i] && !b.sac[j] && tz.consumers[j].iter().all(|&c| c >= i) {
                                // a recomputed internal this op was the last to hold
                                if let Some(buf) = out_buf[j].take() {
                                    b.free(buf);
                                }
                            }
                        }
                    }
                    Step::InputGrad(p) => {
                        for &(pos, j) in &tz.inputs[i] {
                            if pos == p {
                                input_grad(b, tz, mems, &mut grad, &mut grad_refs, i, pos, j);
                            }
                        }
                    }
                    Step::Deliver(p, k) => {
                        let ready = tz.inputs[i].iter().any(|&(pos, j)| pos == p && has_grad_now(b, &grad, i, tz.alias[j]));
                        if ready {
                            for &(pos, j) in &tz.inputs[i] {
                                if pos == p {
                                    input_grad(b, tz, mems, &mut grad, &mut grad_refs, i, pos, j);
                                }
                            }
                            if let Some(x) = made.get_mut(k).and_then(Option::take) {
                                b.free(x);
                            }
                        }
                    }
                    Step::SumInto(p, x, y, t) => {
                        let delivered = made.get(x).is_some_and(Option::is_none);
                        if !delivered {
                            let sum = b.alloc(cat(&[&op.name, " ", t.what]), b.bwd_temp, t.bytes(), None);
                            if let Some(x) = made.get_mut(x).and_then(Option::take) {
                                b.free(x);
                            }
                            if let Some(y) = made.get_mut(y).and_then(Option::take) {
                                b.free(y);
                            }
                            b.free(sum);
                        }
                        for &(pos, j) in &tz.inputs[i] {
                            if pos == p {
                                input_grad(b, tz, mems, &mut grad, &mut grad_refs, i, pos, j);
                            }
                        }
                        if let Some(y) = made.get_mut(y).and_then(Option::take) {
                            b.free(y);
                        }
                    }
                    Step::ParamGrad(p) => {
                        let Some(prim) = op.params.get(p).map(|n| model.primary_of(n)) else { continue };
                        for &(k, owner) in &b.op_params[i] {
                            if model.params[k].name == prim {
                                param_grad(b, cx.cd, k, owner);
                            }
                        }
                    }
                }
            }
            for x in made.into_iter().flatten() {
                b.free(x);
            }
            saved[i] = held.into_iter().flatten().collect();
            released_early = let_go;
            // a float8 linear's saved weight goes with its node: so does the scale it held
            if let Some(w) = op.params.first().map(|w| model.primary_of(w)) {
                if let Some(x) = b.f8_old.remove(w) {
                    b.free(x);
                }
            }
        }
        // release this op's output grad and saved tensors
        release_out_grad(b, tz, &mut grad, &mut grad_refs, i);
        for s in std::mem::take(&mut saved[i]) {
            b.free(s);
        }
        for &(_, j) in &tz.inputs[i] {
            {
                let j = tz.alias[j];
                if released_early.contains(&j) {
                    continue;
                }
                if tz.saves[i].contains(&j) {
                    savers_left[j] = savers_left[j].saturating_sub(1);
                    if savers_left[j] == 0 {
                        if let Some(buf) = out_buf[j].take() {
                            b.free(buf);
                        }
                    }
                }
                if region[j].is_some() && region[j] == region[i] {
                    // recomputed internals: drop once their consumers' backward ran (but not
                    // selective AC's cache entries before the recompute or never popped by it)
                    let cached = b.sac[j] && (unpopped[j] || region[j].is_some_and(|r| !recomputed.contains(&r)));
                    // (only the consumers that save it hold it: DeepSeek's MoE input goes after
                    // the shared experts' backward, before the routed experts' and the router's)
                    let saves = |c: usize| tz.inputs[c].iter().any(|&(p, x)| tz.alias[x] == j && mems[c].saves_inputs.get(p).copied().unwrap_or(false));
                    let released = || {
                        let any_saver = tz.consumers[j].iter().any(|&c| saves(c));
                        tz.consumers[j].iter().filter(|&&c| !any_saver || saves(c)).all(|&c| c >= i)
                    };
                    if !cached && released() {
                        if let Some(buf) = out_buf[j].take() {
                            b.free(buf);
                        }
                    }
                }
            }
        }
        let saves_me = tz.saves[i].contains(&me);
        if saves_me || (matches!(op.kind, fsdp_ir::OpKind::CrossEntropy { .. }) && tz.alias[i] == i) || (region[i].is_some() && !unpopped[i]) {
            savers_left[me] = savers_left[me].saturating_sub(usize::from(saves_me));
            if savers_left[me] == 0 {
                if let Some(buf) = out_buf[i].take() {
                    b.free(buf);
                }
            }
        }
        // the region's backward is over: its checkpoint frame goes, with the cache entries the
        // recompute never reached
        if let Some(r) = region[i].filter(|r| region_start.get(r) == Some(&i)) {
            for j in i..=region_end.get(&r).copied().unwrap_or(i) {
                // (what SAC kept from inside ops past the early stop: a float8 cast's abs, max)
                for x in b.sac_kept.remove(&j).into_iter().flatten() {
                    b.free(x);
                }
                if std::mem::take(&mut unpopped[j]) {
                    if let Some(buf) = out_buf[j].take() {
                        b.free(buf);
                    }
                    for x in saved[j].drain(..) {
                        b.free(x);
                    }
                }
            }
        }
    }
    while let Some(top) = active.pop() {
        leave(b, top, needs_grad_input(top), sync, &mut done_post, &mut deferred, &mut pfo);
        after_post_backward(b, mems, &mut grad, &mut grad_refs, top);
    }
    // final callback: per FSDP state in module pre-order (root first), its deferred
    // post-backward, then its `finalize_backward` (what it held for the all-reduce goes)
    b.op(OpKind::PhaseEnd, Stream::Compute, smallvec![]);
    let mut is_deferred = vec![false; units.len()];
    for u in &deferred {
        is_deferred[u.index()] = true;
    }
    for u in units.iter().map(|u| u.id) {
        if is_deferred[u.index()] {
            b.post_backward(u, sync);
        }
        if let Some(h) = b.all_reduce_held[u.index()].take() {
            b.free(h);
        }
    }
    // leftovers: grads of tensors nobody consumed, outputs still held
    for g in grad.iter().flatten() {
        if grad_refs.get(g).copied().unwrap_or(0) > 0 && b.buffers[g.index()].free.is_none() {
            grad_refs.insert(*g, 0);
            b.free(*g);
        }
    }
    b.op(OpKind::PhaseEnd, Stream::Compute, smallvec![]);
    for buf in out_buf.into_iter().flatten() {
        if b.buffers[buf.index()].free.is_none() {
            b.free(buf);
        }
    }
    for v in saved {
        for s in v {
            if b.buffers[s.index()].free.is_none() {
                b.free(s);
            }
        }
    }
    if let Some(r) = b.pending_rs.take() {
        b.free(r);
    }
    if let Some(s) = seed {
        b.free(s);
    }
}

fn leave(b: &mut B, u: UnitId, grad_input: bool, sync: bool, done: &mut HashSet<UnitId>, deferred: &mut Vec<UnitId>, _pfo: &mut [UnitId]) {
    if done.contains(&u) {
        return;
    }
    done.insert(u);
    if grad_input {
        b.post_backward(u, sync);
    } else {
        deferred.push(u);
    }
}

#[cfg(test)]
mod tests {
    use super::frame_of;

    /// The module frame that holds a tensor: the child of the common ancestor on the reader's
    /// side (HF Llama's decoder layer calls `self.mlp(x)` with its norm's output).
    #[test]
    fn a_tensor_is_held_by_the_module_it_is_passed_to() {
        let norm = "model.layers.1.post_attention_layernorm";
        assert_eq!(frame_of(norm, "model.layers.1.mlp.gate_proj"), Some("model.layers.1.mlp"));
        assert_eq!(frame_of(norm, "model.layers.1.mlp"), Some("model.layers.1.mlp"));
        // read in the frame it was made in, or by a module called from it
        assert_eq!(frame_of("model.layers.1.mlp.act_fn", "model.layers.1.mlp"), None);
        assert_eq!(frame_of("model.layers.1.mlp", "model.layers.1.mlp.down_proj"), Some("model.layers.1.mlp.down_proj"));
        // a component that only shares a prefix is another module
        assert_eq!(frame_of("model.layers.1", "model.layers.10.mlp"), Some("model.layers.10"));
        // from the root, and into it
        assert_eq!(frame_of("", "lm_head"), Some("lm_head"));
        assert_eq!(frame_of("model.norm", ""), None);
    }
}
