//! Collectives. [`Collective`] is what the executor calls (the NCCL backend and the TCP one
//! between CPU processes implement the same trait); [`CpuGroup`] runs it between rank threads
//! of one process; [`SubGroup`] makes a mesh's shard and replicate groups (and
//! `reshard_after_forward=N`'s post-forward groups where none of their own was made) out of a
//! world group.

pub mod nccl;
pub mod rendezvous;
pub mod selftest;
pub mod tcp;

use crate::error::RtError;
use std::sync::{Arc, Barrier, Mutex};
use tch::Tensor;

/// A collective's result, possibly still in flight on a communication stream (NCCL): the
/// compute stream waits for it only in [`Pending::wait`], where the result is first needed,
/// so the compute issued before that overlaps it — FSDP2's all-gather stream with prefetch.
/// Until then it keeps the collective's input alive, so that its memory is not reused while
/// the collective still reads it.
pub struct Pending {
    out: Option<Tensor>,
    keep: Option<Tensor>,
    done: Option<Arc<crate::cuda::Event>>,
    /// The device whose context `done` belongs to (made current before waiting).
    device: Option<Arc<crate::cuda::Device>>,
    held: bool,
}

impl Pending {
    /// A result that is already there (the CPU collectives).
    pub fn ready(out: Tensor) -> Pending {
        Pending { out: Some(out), keep: None, done: None, device: None, held: false }
    }
    /// `out`, written by work on `device` that `done` marks the end of; `keep` stays alive
    /// until then.
    pub fn in_flight(out: Tensor, keep: Tensor, done: Arc<crate::cuda::Event>, device: Arc<crate::cuda::Device>) -> Pending {
        Pending { out: Some(out), keep: Some(keep), done: Some(done), device: Some(device), held: false }
    }
    /// A result that is there but treated as in flight ([`Pending::is_ready`] is false): the
    /// executor then defers its use as it does for NCCL's, so CPU tests check that ordering
    /// ([`Deferred`]).
    pub fn held(out: Tensor) -> Pending {
        Pending { out: Some(out), keep: None, done: None, device: None, held: true }
    }
    /// Whether the result can be used without waiting (the collective ran synchronously).
    pub fn is_ready(&self) -> bool {
        self.done.is_none() && !self.held
    }
    /// The result, once the compute stream is ordered after the collective.
    pub fn wait(mut self) -> Result<Tensor, RtError> {
        if let Some(ev) = &self.done {
            let bound = self.device.as_ref().map_or(Ok(()), |d| d.bind());
            bound.and_then(|_| crate::cuda::Stream::legacy_default()).and_then(|s| s.wait(ev)).map_err(|e| RtError::Comm(format!("waiting for a collective: {e}")))?;
            // (on an error `done` stays, and dropping waits for the collective on the host)
            self.done = None;
        }
        // the compute stream now runs after the collective: the input's memory may be reused
        self.keep = None;
        self.out.take().ok_or_else(|| RtError::Comm("a collective's result was taken twice".into()))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // dropped unwaited (an error elsewhere): let the collective finish before its buffers go
        if let Some(ev) = self.done.take() {
            if let Some(d) = &self.device {
                let _ = d.bind();
            }
            let _ = ev.synchronize();
        }
    }
}

/// Start and end of a collective on a device stream (NCCL's), as timing events.
pub type DeviceSpan = (Arc<crate::cuda::Event>, Arc<crate::cuda::Event>);

pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Concatenation of every rank's `input` (equal sizes), in rank order.
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError>;
    /// This rank's chunk of the element-wise average of every rank's `input`.
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError>;
    /// Element-wise average of every rank's `input`.
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError>;
    /// [`Collective::all_gather`], waited for when its result is needed ([`Pending::wait`]).
    /// By default it is done at once; NCCL leaves it in flight on its stream.
    fn all_gather_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        Ok(Pending::ready(self.all_gather(input)?))
    }
    /// [`Collective::reduce_scatter_avg`], waited for when its result is needed: NCCL leaves it
    /// in flight on its stream (the input kept alive) while the next unit's backward runs, as
    /// FSDP2's reduce-scatter stream. By default it is done at once.
    fn reduce_scatter_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        Ok(Pending::ready(self.reduce_scatter_avg(input)?))
    }
    /// [`Collective::all_reduce_avg`], waited for when its result is needed (no-shard's
    /// gradient all-reduce, as a reduce-scatter). By default it is done at once.
    fn all_reduce_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        Ok(Pending::ready(self.all_reduce_avg(input)?))
    }
    /// Where the last collective of this group ran on the device (events on its stream,
    /// timing enabled), for measured GPU timelines; `None` where it ran on the host, or when
    /// that span was already reported (each is returned once, never a stale one).
    fn last_span(&self) -> Option<DeviceSpan> {
        None
    }
    /// [`Collective::all_gather`] into `out` (every rank's part written with
    /// `copy(out_part, part)`), for a destination that must keep its storage (FSDP1's flat
    /// parameter). The default goes through a temporary.
    fn all_gather_into(&self, out: &Tensor, input: &Tensor, copy: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), RtError>) -> Result<(), RtError> {
        let all = self.all_gather(input)?;
        copy(out, &all)
    }
    /// [`Collective::all_gather`] where this rank's input is already its row of `out` (1-D:
    /// the ranks' rows of equal length in rank order), as FSDP2's all-gather copies its inputs into
    /// the output's slot: nothing but `out` is allocated. By default through temporaries (the
    /// row copied out, gathered, copied back).
    fn all_gather_in_place(&self, out: &Tensor) -> Result<(), RtError> {
        let row = in_place_rows(out, self.size())?;
        let input = tch::no_grad(|| out.narrow(0, self.rank() as i64 * row, row).copy());
        let all = self.all_gather(&input)?;
        tch::no_grad(|| out.shallow_clone().copy_(&all));
        Ok(())
    }
    /// `f` over the `input`s of the ranks `members` of this group (in that order), every rank
    /// of the group taking part with its own: what a [`SubGroup`] made of this group runs its
    /// collectives with. By default through one all-gather of the whole group (a transient of
    /// every rank's input, which a communicator of the members alone would not make);
    /// [`CpuGroup`] reads the members' inputs in place, `TcpGroup` receives them alone.
    fn with_members(&self, input: &Tensor, members: &[usize], f: &mut dyn FnMut(&[Tensor]) -> Tensor) -> Result<Tensor, RtError> {
        let all = self.all_gather(&input.reshape([1, -1]))?;
        let mine: Vec<Tensor> = members.iter().map(|&m| all.get(m as i64).view(input.size().as_slice())).collect();
        Ok(tch::no_grad(|| f(&mine)))
    }
}

struct Shared {
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

/// One rank's handle on a group of threads.
pub struct CpuGroup {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

impl CpuGroup {
    /// Handles for `size` ranks (give one to each thread).
    pub fn new(size: usize) -> Vec<CpuGroup> {
        let shared = Arc::new(Shared {
            slots: Mutex::new((0..size).map(|_| None).collect()),
            barrier: Barrier::new(size),
        });
        (0..size)
            .map(|rank| CpuGroup {
                rank,
                size,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Publish `t`, wait for all, run `f` over every rank's tensor, wait again.
    fn exchange<R>(&self, t: &Tensor, f: impl FnOnce(&[Tensor]) -> R) -> R {
        {
            let mut s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            s[self.rank] = Some(t.shallow_clone());
        }
        self.shared.barrier.wait();
        let out = {
            let s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            let all: Vec<Tensor> = s.iter().map(|x| x.as_ref().map(|t| t.shallow_clone()).unwrap_or_else(|| Tensor::zeros([0], tch::kind::FLOAT_CPU))).collect();
            f(&all)
        };
        self.shared.barrier.wait();
        // every rank has read every slot: let go of this rank's input (a collective must not
        // keep its input alive, e.g. the cast copy of a mixed-precision shard)
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = None;
        out
    }
}

/// The row length of an in-place all-gather's output over `size` ranks ([`Collective::
/// all_gather_in_place`]): a 1-D tensor whose length is a multiple of `size` (checked before
/// any rank enters the collective, so that all fail alike).
pub(crate) fn in_place_rows(out: &Tensor, size: usize) -> Result<i64, RtError> {
    let (n, s) = (out.numel() as i64, size.max(1) as i64);
    if out.dim() != 1 || n % s != 0 {
        return Err(RtError::Comm(format!("all-gather in place: a 1-D output whose length is a multiple of the group's {size} ranks expected, got shape {:?}", out.size())));
    }
    Ok(n / s)
}

/// Every row of `out` (`row` elements each) but `own`'s from `rows` (one tensor per row).
fn copy_rows(out: &Tensor, row: i64, rows: &[Tensor], own: usize) {
    for (i, t) in rows.iter().enumerate().filter(|(i, _)| *i != own) {
        out.narrow(0, i as i64 * row, row).copy_(t);
    }
}

fn sum_in_rank_order(all: &[Tensor]) -> Tensor {
    let mut acc = all[0].copy();
    for t in &all[1..] {
        acc += t;
    }
    acc
}

impl Collective for CpuGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError> {
        Ok(tch::no_grad(|| self.exchange(input, |all| Tensor::cat(all, 0))))
    }
    fn all_gather_into(&self, out: &Tensor, input: &Tensor, copy: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), RtError>) -> Result<(), RtError> {
        // straight from every rank's input into its part of `out`: no temporary
        tch::no_grad(|| {
            self.exchange(input, |all| {
                let mut at = 0;
                for t in all {
                    let n = t.numel() as i64;
                    copy(&out.narrow(0, at, n), t)?;
                    at += n;
                }
                Ok(())
            })
        })
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        let n = self.size as i64;
        let r = self.rank as i64;
        Ok(tch::no_grad(|| {
            self.exchange(input, |all| {
                let chunk = input.size()[0] / n;
                let parts: Vec<Tensor> = all.iter().map(|t| t.narrow(0, r * chunk, chunk)).collect();
                sum_in_rank_order(&parts) / (n as f64)
            })
        }))
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        let n = self.size as f64;
        Ok(tch::no_grad(|| self.exchange(input, |all| sum_in_rank_order(all) / n)))
    }
    fn all_gather_in_place(&self, out: &Tensor) -> Result<(), RtError> {
        let row = in_place_rows(out, self.size)?;
        tch::no_grad(|| self.exchange(&out.narrow(0, self.rank as i64 * row, row), |all| copy_rows(out, row, all, self.rank)));
        Ok(())
    }
    fn with_members(&self, input: &Tensor, members: &[usize], f: &mut dyn FnMut(&[Tensor]) -> Tensor) -> Result<Tensor, RtError> {
        // (the members' slots as they are: no copy of the others')
        Ok(tch::no_grad(|| {
            self.exchange(input, |all| {
                let mine: Vec<Tensor> = members.iter().filter_map(|&m| all.get(m).map(|t| t.shallow_clone())).collect();
                f(&mine)
            })
        }))
    }
}

/// A group of one rank (no-shard's shard group, full sharding's replicate group): every
/// collective returns its input.
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError> {
        Ok(tch::no_grad(|| input.copy()))
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        Ok(tch::no_grad(|| input.copy()))
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        Ok(tch::no_grad(|| input.copy()))
    }
}

/// The process groups of one rank's step, as FSDP2's 2-D (replicate, shard) device mesh:
/// world rank `w` is shard index `w % shard_size` of replica `w / shard_size`. Params are
/// gathered and gradients reduce-scattered over `shard`; hybrid sharding then all-reduces the
/// sharded gradients over `replicate`; no-shard all-reduces whole gradients over `world`.
pub struct Groups<'a> {
    pub world: &'a dyn Collective,
    pub shard: &'a dyn Collective,
    pub replicate: &'a dyn Collective,
    /// `reshard_after_forward=N`'s post-forward groups (N consecutive ranks), by N: the
    /// backward's all-gather of the post-forward slices runs over this rank's (where a size is
    /// missing, over a [`SubGroup`] of the world).
    pub post: &'a [(usize, &'a dyn Collective)],
}

static SOLO: Solo = Solo;

impl<'a> Groups<'a> {
    /// Full sharding (shard = world) or no-shard (shard = this rank alone): one group is
    /// all they need. Hybrid sharding needs [`cpu_mesh`] (or the NCCL equivalent).
    pub fn flat(world: &'a dyn Collective, no_shard: bool) -> Groups<'a> {
        if no_shard {
            Groups { world, shard: &SOLO, replicate: world, post: &[] }
        } else {
            Groups { world, shard: world, replicate: &SOLO, post: &[] }
        }
    }
    /// This rank's post-forward group of `n` ranks, if one was made.
    pub fn post_forward(&self, n: usize) -> Option<&'a dyn Collective> {
        self.post.iter().find(|(k, _)| *k == n).map(|(_, g)| *g)
    }
}

/// The post-forward group sizes of `plan` (`reshard_after_forward=N` of its units, N between
/// one rank and the world): the groups a job makes beside its mesh.
pub fn post_forward_sizes(plan: &fsdp_planner::Plan) -> Vec<usize> {
    let ws = plan.options.world_size as usize;
    let mut v: Vec<usize> = plan.units.iter().filter_map(|u| u.reshard_to).map(|n| n as usize).filter(|&n| n > 1 && n < ws).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// CPU thread groups of `n` consecutive ranks out of `ws` (the post-forward groups of
/// `reshard_after_forward=n`), one handle per world rank, in world order; `n` must divide
/// `ws` (as the plan's options check).
pub fn cpu_runs(ws: usize, n: usize) -> Result<Vec<CpuGroup>, RtError> {
    if n == 0 || !ws.is_multiple_of(n) {
        return Err(RtError::Plan(format!("post-forward groups of {n} ranks do not divide the world's {ws}")));
    }
    Ok((0..ws / n).flat_map(|_| CpuGroup::new(n)).collect())
}

/// A subgroup of a world group, made of world collectives: every rank of the world takes part
/// in each one (every rank runs the same schedule, so all reach the same collective together)
/// and keeps its members' parts, with [`CpuGroup`]'s arithmetic (so results are bit-identical
/// to it). What a job of processes uses for hybrid sharding's shard and replicate groups and
/// for post-forward groups (over TCP: each through a world all-gather, a transient no group
/// of its own makes); a group of the whole world is the world itself, a group of one needs no
/// collective.
pub struct SubGroup<'a> {
    world: &'a dyn Collective,
    /// World ranks, in group order.
    members: Vec<usize>,
    /// This rank's place in `members`.
    index: usize,
}

impl<'a> SubGroup<'a> {
    /// This rank's (shard, replicate) groups of the mesh [`cpu_mesh`] makes: world rank `w` is
    /// shard index `w % shard_size` of replica `w / shard_size`.
    pub fn mesh(world: &'a dyn Collective, shard_size: usize) -> (SubGroup<'a>, SubGroup<'a>) {
        let ws = world.size();
        let (rep, idx, s) = mesh_position(world.rank(), ws, shard_size);
        let shard = SubGroup { world, members: (rep * s..rep * s + s).collect(), index: idx };
        let replicate = SubGroup { world, members: (idx..ws).step_by(s).collect(), index: rep };
        (shard, replicate)
    }
    fn whole(&self) -> bool {
        self.members.len() == self.world.size()
    }
    /// The group is the whole world of several ranks: its collectives are the world's own
    /// (and may stay in flight, with the world's device timing).
    fn delegates(&self) -> bool {
        self.whole() && self.members.len() > 1
    }
    /// `f` over every member's tensor, in group order (one world collective:
    /// [`Collective::with_members`]).
    fn members_inputs(&self, input: &Tensor, f: &mut dyn FnMut(&[Tensor]) -> Tensor) -> Result<Tensor, RtError> {
        self.world.with_members(input, &self.members, f)
    }
}

impl Collective for SubGroup<'_> {
    fn rank(&self) -> usize {
        self.index
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn all_gather_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        match self.delegates() {
            true => self.world.all_gather_start(input),
            false => Ok(Pending::ready(self.all_gather(input)?)),
        }
    }
    fn last_span(&self) -> Option<DeviceSpan> {
        match self.delegates() {
            true => self.world.last_span(),
            false => None,
        }
    }
    fn reduce_scatter_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        match self.delegates() {
            true => self.world.reduce_scatter_start(input),
            false => Ok(Pending::ready(self.reduce_scatter_avg(input)?)),
        }
    }
    fn all_reduce_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        match self.delegates() {
            true => self.world.all_reduce_start(input),
            false => Ok(Pending::ready(self.all_reduce_avg(input)?)),
        }
    }
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError> {
        match self.members.len() {
            1 => Ok(tch::no_grad(|| input.copy())),
            _ if self.whole() => self.world.all_gather(input),
            _ => self.members_inputs(input, &mut |m| Tensor::cat(m, 0)),
        }
    }
    fn all_gather_in_place(&self, out: &Tensor) -> Result<(), RtError> {
        match self.members.len() {
            1 => Ok(()),
            _ if self.whole() => self.world.all_gather_in_place(out),
            n => {
                let row = in_place_rows(out, n)?;
                let own = self.index;
                let mine = out.narrow(0, own as i64 * row, row);
                self.members_inputs(&mine, &mut |m| {
                    copy_rows(out, row, m, own);
                    Tensor::zeros([0], (out.kind(), out.device()))
                })
                .map(drop)
            }
        }
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        let n = self.members.len() as i64;
        match n {
            1 => Ok(tch::no_grad(|| input.copy())),
            _ if self.whole() => self.world.reduce_scatter_avg(input),
            _ => {
                let chunk = input.size()[0] / n;
                let r = self.index as i64;
                self.members_inputs(input, &mut |m| {
                    let parts: Vec<Tensor> = m.iter().map(|t| t.narrow(0, r * chunk, chunk)).collect();
                    sum_in_rank_order(&parts) / (n as f64)
                })
            }
        }
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        let n = self.members.len();
        match n {
            1 => Ok(tch::no_grad(|| input.copy())),
            _ if self.whole() => self.world.all_reduce_avg(input),
            _ => self.members_inputs(input, &mut |m| sum_in_rank_order(m) / (n as f64)),
        }
    }
}

/// A collective whose `*_start` results are [`Pending::held`]: the executor treats them as in
/// flight (a reduce-scatter finished at the next reduction or where its result is needed),
/// exactly as with NCCL, while the arithmetic stays the wrapped group's. For testing that
/// ordering on the CPU.
pub struct Deferred<'a>(pub &'a dyn Collective);

impl Collective for Deferred<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.0.all_gather(input)
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.0.reduce_scatter_avg(input)
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.0.all_reduce_avg(input)
    }
    fn all_gather_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        Ok(Pending::held(self.0.all_gather(input)?))
    }
    fn reduce_scatter_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        Ok(Pending::held(self.0.reduce_scatter_avg(input)?))
    }
    fn all_reduce_start(&self, input: &Tensor) -> Result<Pending, RtError> {
        Ok(Pending::held(self.0.all_reduce_avg(input)?))
    }
    fn last_span(&self) -> Option<DeviceSpan> {
        self.0.last_span()
    }
    fn all_gather_into(&self, out: &Tensor, input: &Tensor, copy: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), RtError>) -> Result<(), RtError> {
        self.0.all_gather_into(out, input, copy)
    }
    fn with_members(&self, input: &Tensor, members: &[usize], f: &mut dyn FnMut(&[Tensor]) -> Tensor) -> Result<Tensor, RtError> {
        self.0.with_members(input, members, f)
    }
    fn all_gather_in_place(&self, out: &Tensor) -> Result<(), RtError> {
        self.0.all_gather_in_place(out)
    }
}

/// Where world rank `w` of `ws` sits in FSDP2's 2-D (replicate × shard) device mesh whose
/// shard groups have `shard_size` ranks: (replica, index in its shard group, the shard size
/// clamped to 1..=ws). Shard groups are runs of consecutive ranks; a replicate group takes
/// one rank of each.
pub fn mesh_position(w: usize, ws: usize, shard_size: usize) -> (usize, usize, usize) {
    let s = shard_size.clamp(1, ws.max(1));
    (w / s, w % s, s)
}

/// CPU thread groups for `ws` ranks sharded in groups of `shard_size`: per world rank, its
/// (world, shard, replicate) handles.
pub fn cpu_mesh(ws: usize, shard_size: usize) -> Vec<(CpuGroup, CpuGroup, CpuGroup)> {
    let s = mesh_position(0, ws, shard_size).2;
    let r = ws / s;
    let mut world: Vec<Option<CpuGroup>> = CpuGroup::new(ws).into_iter().map(Some).collect();
    let mut shard: Vec<Vec<Option<CpuGroup>>> = (0..r).map(|_| CpuGroup::new(s).into_iter().map(Some).collect()).collect();
    let mut repl: Vec<Vec<Option<CpuGroup>>> = (0..s).map(|_| CpuGroup::new(r).into_iter().map(Some).collect()).collect();
    (0..ws)
        .filter_map(|w| {
            let (rep, idx, _) = mesh_position(w, ws, s);
            Some((world[w].take()?, shard[rep][idx].take()?, repl[idx][rep].take()?))
        })
        .collect()
}
