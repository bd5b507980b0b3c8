//! The sharded executor: runs a compiled plan's schedule on one rank, op by op, in the
//! plan's order — all-gathers into the unit's gathered buffer, copy-out into unsharded
//! params, compute, reshard, reduce-scatter into the local shard, AdamW on the shard.
//!
//! Autograd works as under PyTorch FSDP2: the forward records libtorch's graph (what each
//! op saves is what autograd saves, nothing more); the executor drops each forward value
//! after its last forward use and keeps only the graph's edges. Each backward op runs the
//! engine from its output edge with the gradient that reached it, stopping at its inputs'
//! edges (`torch.autograd.grad(out, inputs, grad)`, [`crate::shim::backward`]), the gradient
//! an input already has from later ops fed in first, so that a value's gradients sum in the
//! order one whole-model backward sums them (to the bit: float8 casts turn an ulp into a
//! float8 step). Unsharded
//! params are leaves whose storage is freed in place at reshard and refilled at the next
//! copy-out (FSDP2's `resize_(0)`), so the weights autograd saved see the re-gathered data.
//! Ops in checkpointed modules run without grad in forward; their `Recompute` ops rebuild the
//! graph from the region's inputs just before the region's backward.
//! Memory is measured by a counting CPU allocator ([`crate::shim::MemTracker`]), or on a GPU
//! by libtorch's CUDA caching allocator's counters. Under `--offload cpu` the sharded state,
//! the reduced gradients and the optimizer live on the host ([`Host`]), measured apart.

pub mod cuda;
pub mod float8;
pub mod ops;
pub mod optim;
pub mod placement;
pub mod reference;
pub mod shim;

use crate::comm::{Collective, Groups};
use crate::error::RtError;
use crate::ops::{forward, OpCx};
use crate::optim::{Optim, State};
use crate::shim::{Edge, MemTracker};
use fsdp_ir::Model;
use fsdp_planner::{Group, Layout, OpKind, Plan};
use std::collections::HashMap;
use tch::{Kind, Tensor};

/// One rank's persistent state: the local shards and their optimizer state.
pub struct Rank {
    /// Per unit: the flat local shard (padded; fsdp2: per-param padded chunks back to back).
    /// On the host (the CPU) under `--offload cpu`, else on `device`.
    pub shards: Vec<Tensor>,
    pub opt: Vec<State>,
    /// Where the step computes (the shards' device unless they are offloaded).
    pub device: tch::Device,
    /// The plan's arena (one block for the whole run) and where a step's allocations go in
    /// it ([`crate::placement::assign`]), made from the first arena step's record and
    /// replayed by the next ones.
    pub arena: Option<(shim::Arena, Option<shim::Assignment>)>,
    /// The last step's global gradient norm (before clipping; over every rank's shards), and
    /// whether its update was skipped for being non-finite.
    pub last_grad_norm: Option<f64>,
    pub skipped: bool,
}

/// The optimizer phase of a step: FSDP2's `clip_grad_norm_` (the global L2 norm of the
/// sharded gradients, computed over the shard group: replicas hold the same shards), then
/// the optimizer on each shard.
#[derive(Debug, Clone, Copy)]
pub struct Update {
    pub opt: Optim,
    /// `max_norm`: gradients scaled by `min(1, max_norm / (norm + 1e-6))`, as torch does.
    pub clip: Option<f64>,
    /// A non-finite gradient norm skips the update (else the step fails with
    /// [`RtError::NonFinite`]).
    pub skip_nonfinite: bool,
}

impl From<Optim> for Update {
    fn from(opt: Optim) -> Update {
        Update { opt, clip: None, skip_nonfinite: false }
    }
}

impl From<&crate::optim::AdamW> for Update {
    fn from(a: &crate::optim::AdamW) -> Update {
        Optim::from(a).into()
    }
}

impl From<crate::optim::AdamW> for Update {
    fn from(a: crate::optim::AdamW) -> Update {
        Optim::from(&a).into()
    }
}

fn err(m: impl Into<String>) -> RtError {
    RtError::Plan(m.into())
}

impl Rank {
    /// Cuts this rank's shards out of full (HF-named, primary) weights.
    /// `rank` is the world rank; its shards are those of its index in its shard group.
    pub fn from_full(plan: &Plan, full: &HashMap<String, Tensor>, rank: usize) -> Result<Rank, RtError> {
        let ws = plan.options.shard_size() as i64;
        let r = rank as i64 % ws.max(1);
        let mut shards = vec![];
        // `--master-dtype`: the shards (and so their grads and optimizer state) in it
        let master = plan.options.master_dtype.map(kind_of);
        for u in plan.units.iter() {
            let get = |n: &str| full.get(n).map(|w| match master {
                Some(k) if w.is_floating_point() && w.kind() != k => w.to_kind(k),
                _ => w.shallow_clone(),
            }).ok_or_else(|| err(format!("weights lack `{n}`")));
            let shard = tch::no_grad(|| -> Result<Tensor, RtError> {
                Ok(match plan.options.layout {
                    Layout::Fsdp2 => {
                        let mut parts = vec![];
                        for p in &u.params {
                            // FSDP2's Shard(d): rank r's slices of dim d (dim 0 unless
                            // `--shard-dim`), padded to ceil(len / ws) of them, contiguous
                            let (d, mut pad_shape, len, c) = chunk_of(p, ws);
                            let shape: Vec<i64> = p.shape.iter().map(|&x| x as i64).collect();
                            let w = get(&p.name)?.detach().reshape(shape.as_slice());
                            let rows = (len - r * c).clamp(0, c);
                            let mine = if rows > 0 { w.narrow(d, r * c, rows) } else { w.narrow(d, 0, 0) };
                            pad_shape[d as usize] = c - rows;
                            let pad = Tensor::zeros(pad_shape.as_slice(), (w.kind(), w.device()));
                            parts.push(Tensor::cat(&[mine, pad], d).contiguous().reshape([-1]));
                        }
                        if parts.is_empty() {
                            Tensor::zeros([0], tch::kind::FLOAT_CPU) // a unit without params
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
        // the state of the optimizer the plan names (none for SGD: the plan has none)
        let opt = shards.iter().map(|s| State::for_optim(plan.options.optimizer, s)).collect();
        let device = shards.first().map_or(tch::Device::Cpu, |s| s.device());
        Ok(Rank { shards, opt, device, arena: None, last_grad_norm: None, skipped: false })
    }

    /// The same state on `device` (shards, optimizer state), for a rank that runs on a GPU;
    /// `offloaded` (FSDP2's CPUOffloadPolicy) leaves the state on the host; the steps compute
    /// on `device` all the same.
    pub fn to_device(self, device: tch::Device, offloaded: bool) -> Rank {
        if offloaded && device.is_cuda() {
            // (pinned, as CPUOffloadPolicy's `pin_memory=True` keeps them: the copies to the
            // device before each all-gather are DMA, as the plan's PCIe time assumes)
            // (where pinning fails the shards stay pageable: slower copies, the same values)
            let pin = |t: &Tensor| match t.f_is_pinned(device) {
                Ok(false) => t.f_pin_memory(device).unwrap_or_else(|_| t.shallow_clone()),
                _ => t.shallow_clone(),
            };
            return Rank { shards: self.shards.iter().map(pin).collect(), device, ..self };
        }
        if offloaded || self.shards.iter().all(|s| s.device() == device) {
            return Rank { device, ..self };
        }
        let mv = |t: &Tensor| tch::no_grad(|| t.to_device(device));
        Rank {
            shards: self.shards.iter().map(mv).collect(),
            opt: self.opt.iter().map(|o| State { m: mv(&o.m), v: mv(&o.v), step: o.step }).collect(),
            device,
            last_grad_norm: self.last_grad_norm,
            skipped: self.skipped,
            arena: None,
        }
    }
}

/// The dtype a unit's grads are reduced (and, unsynced under mixed precision, accumulated)
/// in: `reduce_dtype`, else the param dtype (FSDP2's rule), else the shard's own.
fn reduce_kind_of(reduce: Option<Kind>, param: Option<Kind>, shard: &Tensor) -> Kind {
    reduce.or(param).unwrap_or(shard.kind())
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
        fsdp_ir::DType::Float8E4m3fn => Kind::Float8e4m3fn,
    }
}

/// Views of a unit's unsharded params in its all-gather output (every rank's shard,
/// concatenated in rank order), in unit order.
pub fn unsharded_views(plan: &Plan, u: usize, gathered: &Tensor) -> Vec<(String, Tensor)> {
    let unit = &plan.units[u];
    let ws = plan.options.shard_size() as i64;
    let mut out = vec![];
    match plan.options.layout {
        Layout::Fsdp2 => {
            let rows = gathered.reshape([ws, unit.shard_numel as i64]);
            for p in &unit.params {
                if p.shard_dim != 0 {
                    // Shard(d): each rank's chunk viewed in its shape, cut to its real slices
                    // and put side by side along d (one rank: a view)
                    let (d, cs, len, c) = chunk_of(p, ws);
                    let pieces: Vec<Tensor> = (0..ws)
                        .filter_map(|r| {
                            let n = (len - r * c).clamp(0, c);
                            (n > 0).then(|| rows.get(r).narrow(0, p.offset as i64, p.shard_numel as i64).view(cs.as_slice()).narrow(d, 0, n))
                        })
                        .collect();
                    let full = if pieces.len() == 1 { pieces[0].shallow_clone() } else { Tensor::cat(&pieces, d) };
                    out.push((p.name.clone(), full));
                    continue;
                }
                let d0 = p.shape[0] as i64;
                let rest = (p.numel / p.shape[0]) as i64;
                let s = p.shard_numel as i64;
                let full = rows.narrow(1, p.offset as i64, s).reshape([-1, rest]).narrow(0, 0, d0);
                let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                out.push((p.name.clone(), full.reshape(shape.as_slice())));
            }
        }
        Layout::Flat => {
            for p in &unit.params {
                let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                out.push((p.name.clone(), gathered.narrow(0, p.offset as i64, p.numel as i64).reshape(shape.as_slice())));
            }
        }
    }
    out
}

/// Copies param `p` of unit `u` from the unit's all-gather output into `dst` (its unsharded
/// tensor, contiguous) with `copy(dst_piece, src_piece)`: one piece per rank for the FSDP2
/// layout (rank r's slices of the param's shard dim), one for the flat layout.
fn copy_param_into(
    plan: &Plan,
    u: usize,
    p: &fsdp_planner::units::UnitParam,
    gathered: &Tensor,
    dst: &Tensor,
    copy: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), RtError>,
) -> Result<(), RtError> {
    let unit = &plan.units[u];
    match plan.options.layout {
        Layout::Fsdp2 => {
            let ws = plan.options.shard_size() as i64;
            copy_chunks(p, ws, &gathered.view([ws, unit.shard_numel as i64]), p.offset as i64, dst, copy)?;
        }
        Layout::Flat => copy(&dst.view([-1]), &gathered.narrow(0, p.offset as i64, p.numel as i64))?,
    }
    Ok(())
}

/// Copies param `p` into `dst` from `rows` (one row per rank, `p`'s padded chunk at column
/// `offset` of each): rank r's real slices of the param's shard dim (FSDP2's Shard(d), dim 0
/// unless `--shard-dim`), its padded chunk viewed in its shape.
fn copy_chunks(p: &fsdp_planner::units::UnitParam, ws: i64, rows: &Tensor, offset: i64, dst: &Tensor, copy: &mut dyn FnMut(&Tensor, &Tensor) -> Result<(), RtError>) -> Result<(), RtError> {
    let (d, cs, len, c) = chunk_of(p, ws);
    for r in 0..ws {
        let start = r * c;
        if start >= len {
            break;
        }
        let n = c.min(len - start);
        copy(&dst.narrow(d, start, n), &rows.get(r).narrow(0, offset, p.shard_numel as i64).view(cs.as_slice()).narrow(d, 0, n))?;
    }
    Ok(())
}

/// The copy-out of unit `u`'s params from its all-gather output into their unsharded tensors
/// (`dst(param)`), as FSDP2's `foreach_all_gather_copy_out` does: dim-0 params straight from
/// the output (`split_with_sizes_copy`: no temporaries); Shard(dim > 0) params (`--shard-dim`)
/// first copied, every rank's rows, into a temporary of the param's padded size, then
/// chunk-cat from it along their dim — the temporaries held until every param is done.
fn copy_out_into(plan: &Plan, u: usize, gathered: &Tensor, dst: &mut dyn FnMut(&fsdp_planner::units::UnitParam) -> Result<Tensor, RtError>) -> Result<(), RtError> {
    let ws = plan.options.shard_size() as i64;
    let copy = &mut |d: &Tensor, s: &Tensor| shim::copy_keep_version(d, s);
    if plan.options.layout == Layout::Flat {
        for p in &plan.units[u].params {
            copy_param_into(plan, u, p, gathered, &dst(p)?, copy)?;
        }
        return Ok(());
    }
    let rows = gathered.view([ws, plan.units[u].shard_numel as i64]);
    let mut temporaries = vec![];
    for p in &plan.units[u].params {
        let t = dst(p)?;
        if p.shard_dim > 0 {
            let tmp = Tensor::empty([ws, p.shard_numel as i64], (gathered.kind(), gathered.device()));
            shim::copy_keep_version(&tmp, &rows.narrow(1, p.offset as i64, p.shard_numel as i64))?;
            copy_chunks(p, ws, &tmp, 0, &t, copy)?;
            temporaries.push(tmp);
        } else {
            copy_chunks(p, ws, &rows, p.offset as i64, &t, copy)?;
        }
    }
    drop(temporaries);
    Ok(())
}

/// [`copy_out_into`] for a unit gathered as bytes (`--float8-all-gather`: float8 weights beside
/// params in the param dtype): each param's bytes of every rank's row into its tensor's bytes
/// (FSDP2 copies out of a uint8 all-gather so). Params sharded on dim 0 only.
fn copy_out_bytes(plan: &Plan, u: usize, gathered: &Tensor, dst: &mut dyn FnMut(&fsdp_planner::units::UnitParam) -> Result<Tensor, RtError>) -> Result<(), RtError> {
    let ws = plan.options.shard_size() as i64;
    let size = |p: &fsdp_planner::units::UnitParam| plan.options.gathered_dtype_of(p).size() as i64;
    let row: i64 = plan.units[u].params.iter().map(|p| p.shard_numel as i64 * size(p)).sum();
    let rows = gathered.view([ws, row]);
    let mut at = 0i64;
    for p in &plan.units[u].params {
        let t = dst(p)?;
        let (d, _, len, c) = chunk_of(p, ws);
        if d != 0 {
            return Err(err(format!("`{}`: float8 all-gather of a param sharded on dim {d}", p.name)));
        }
        let sz = size(p);
        let per_row = if len == 0 { 0 } else { p.numel as i64 / len * sz };
        let bytes = tch::no_grad(|| t.view([-1]).view_dtype(Kind::Uint8));
        for r in 0..ws {
            let start = r * c;
            if start >= len {
                break;
            }
            let n = c.min(len - start) * per_row;
            shim::copy_keep_version(&bytes.narrow(0, start * per_row, n), &rows.get(r).narrow(0, at, n))?;
        }
        at += p.shard_numel as i64 * sz;
    }
    Ok(())
}

/// A param's shard dim `d` (FSDP2's `Shard(d)`: 0, or what `--shard-dim` says), the shape of
/// one rank's padded chunk (dim `d` cut to `c` = ceil(len / ws) slices), `len` and `c`.
fn chunk_of(p: &fsdp_planner::units::UnitParam, ws: i64) -> (i64, Vec<i64>, i64, i64) {
    let d = p.shard_dim as usize;
    let len = p.shape[d] as i64;
    let c = (len + ws - 1) / ws;
    let cs = p.shape.iter().enumerate().map(|(i, &x)| if i == d { c } else { x as i64 }).collect();
    (d as i64, cs, len, c)
}

/// Unsharded params of a unit from its all-gather output (the copy-out), as new tensors.
pub fn copy_out(plan: &Plan, u: usize, gathered: &Tensor) -> HashMap<String, Tensor> {
    unsharded_views(plan, u, gathered).into_iter().map(|(n, v)| (n, v.copy())).collect()
}

/// The reduce-scatter input of a unit: its grads laid out like the all-gather output.
fn rs_input(plan: &Plan, u: usize, grads: &HashMap<String, Tensor>, kind: Kind) -> Result<Tensor, RtError> {
    let unit = &plan.units[u];
    let ws = plan.options.shard_size() as i64;
    let numel = match plan.options.layout {
        Layout::Fsdp2 => ws * unit.shard_numel as i64,
        Layout::Flat => unit.padded_numel as i64,
    };
    let device = grads.values().next().map(|t| t.device()).unwrap_or(tch::Device::Cpu);
    // one buffer in the reduce dtype, each grad cast straight into its place (padding and
    // params without a grad stay zero), as FSDP2's foreach copy into the reduce-scatter input
    let buf = Tensor::zeros([numel], (kind, device));
    for p in &unit.params {
        if let Some(g) = grads.get(&p.name) {
            let g = g.contiguous();
            copy_param_into(plan, u, p, &buf, &g, &mut |grad_piece, buf_piece| {
                let mut b = buf_piece.shallow_clone();
                b.f_copy_(grad_piece).map_err(|e| err(format!("reduce-scatter input of `{}`: {e}", p.name)))
            })?;
        }
    }
    Ok(buf)
}

/// Runs one training step of `plan` on this rank. `batches[k]` holds micro-batch k's model
/// inputs (`input_ids`, `labels`). Returns the mean loss of this rank's micro-batches.
/// `comm` is the world group: fine for full sharding and no-shard; hybrid sharding needs
/// [`step_timed`] with its shard and replicate groups.
pub fn step(plan: &Plan, model: &Model, comm: &dyn Collective, rank: &mut Rank, batches: &[HashMap<String, Tensor>], cx: &OpCx, opt: impl Into<Update>) -> Result<f64, RtError> {
    let groups = Groups::flat(comm, plan.options.strategy == fsdp_planner::Strategy::NoShard);
    step_timed(plan, model, &groups, rank, batches, cx, opt, None, None)
}

/// Measured memory of one step on this rank: bytes of the persistent state it starts with
/// (shards, optimizer state, the batch; offloaded, the batch alone) plus the peak of what
/// libtorch allocated on this rank's thread during the step (gathered buffers, unsharded
/// params, activations and all autograd saves, gradients, collective buffers, temporaries),
/// from the counting allocator.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    pub peak_bytes: u64,
    /// The persistent part of `peak_bytes`.
    pub persistent_bytes: u64,
    /// Per schedule op: (bytes live after it, peak bytes while it ran), persistent state
    /// included, the same quantities as the plan's [`fsdp_planner::memory::per_op`]; for
    /// finding the op where a run departs from its plan.
    pub per_op: Vec<(u64, u64)>,
    /// Set to `Some` before the step to run it in the plan's arena ([`shim::Arena`]): the
    /// step's allocations are placed at the plan's offsets where they match a planned
    /// buffer; afterwards, what was placed.
    pub arena: Option<shim::ArenaStats>,
    /// Under `--offload cpu` on the CPU runtime: the host's peak, measured apart from the
    /// device's (the shards and optimizer state the step starts with + the peak of what the
    /// step allocated on the host: gradients, the optimizer's temporaries), the quantity of
    /// the plan's [`fsdp_planner::memory::HostMemory`].
    pub host_peak_bytes: Option<u64>,
}

/// Where FSDP2's CPUOffloadPolicy keeps the sharded state: the host. On a GPU host tensors
/// are the CPU's, which the CUDA allocator's counters leave out; on the CPU runtime they are
/// the same memory as the "device"'s, charged to a tracker of their own while the step's is
/// left (and made outside the plan's arena), so that the step counts the device's bytes.
struct Host<'a> {
    offload: bool,
    /// (the step's tracker, re-entered after a host section; the host's)
    trackers: Option<(&'a MemTracker, &'a MemTracker)>,
    arena: Option<&'a shim::Arena>,
}

impl Host<'_> {
    /// Runs `f` with its allocations on the host (as is, without offload).
    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        if !self.offload {
            return f();
        }
        if let Some(a) = self.arena {
            a.leave();
        }
        if let Some((_, h)) = self.trackers {
            h.enter();
        }
        // (the step's tracker and arena back however `f` ends)
        let _back = Back(self);
        f()
    }
}

/// Re-enters the step's tracker and arena when a [`Host::run`] section ends.
struct Back<'a, 'b>(&'a Host<'b>);

impl Drop for Back<'_, '_> {
    fn drop(&mut self) {
        if let Some((d, _)) = self.0.trackers {
            d.enter();
        }
        if let Some(a) = self.0.arena {
            a.enter();
        }
    }
}

/// `t` copied to `device`: a new tensor even where it is there already (the CPU runtime's
/// host and device are one memory, counted apart).
fn copy_to(t: &Tensor, device: tch::Device) -> Tensor {
    tch::no_grad(|| if t.device() == device { t.copy() } else { t.to_device(device) })
}

/// Counts the bytes a step allocates: libtorch's CPU allocations on this thread (the shim's
/// counting allocator, [`MemTracker`]), or on a GPU the CUDA caching allocator of the rank's
/// device (`torch.cuda.memory_allocated` / `max_memory_allocated`, less what was allocated
/// when the step began).
enum Probe {
    Cpu(MemTracker),
    Cuda { ordinal: usize, base: u64 },
}

impl Probe {
    fn start(device: tch::Device) -> Result<Probe, RtError> {
        match device {
            tch::Device::Cuda(i) => {
                let (cur, _) = shim::cuda_allocator_bytes(i, true)?;
                Ok(Probe::Cuda { ordinal: i, base: cur })
            }
            _ => {
                let t = MemTracker::new();
                t.enter();
                Ok(Probe::Cpu(t))
            }
        }
    }
    /// (bytes allocated now, the most allocated since the last call), both counted from the
    /// start of the step.
    fn stats(&self) -> (u64, u64) {
        match self {
            Probe::Cpu(t) => t.stats(true),
            Probe::Cuda { ordinal, base } => {
                let (c, p) = shim::cuda_allocator_bytes(*ordinal, true).unwrap_or((*base, *base));
                (c.saturating_sub(*base), p.saturating_sub(*base))
            }
        }
    }
    fn leave() {
        MemTracker::leave();
    }
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

/// The checkpointed module (a module of a class or path in `options.checkpoint`; `checkpointed` holds
/// their paths) an op runs in: the outermost one on its module path.
fn region_of<'a>(checkpointed: &std::collections::HashSet<&str>, op: &'a fsdp_ir::Op) -> Option<&'a str> {
    let mut path = op.module.as_str();
    let mut found = None;
    loop {
        if checkpointed.contains(path) {
            found = Some(path);
        }
        match fsdp_ir::parent_path(path) {
            Some(p) => path = p,
            None => return found,
        }
    }
}

/// A tensor by the name of the value or param it is the gradient of.
type Named = (String, Tensor);

/// What a float8 linear's backward reads ([`float8::backward`]): the forward's high-precision
/// input and the weight (high precision, or the bits gathered in float8; aliases: an unsharded
/// weight freed at reshard is re-gathered into the same storage before the backward), and
/// which of input, weight and bias want a gradient.
struct F8Saved {
    x: Tensor,
    x_grad: bool,
    w: Tensor,
    /// The weight's scale when it was gathered in float8 (`w` its e4m3 bits, else the weight in
    /// high precision).
    w_scale: Option<Tensor>,
    w_grad: bool,
    b_grad: bool,
}

fn add_grad(map: &mut HashMap<String, Tensor>, name: &str, g: Tensor) {
    match map.get_mut(name) {
        Some(acc) => *acc += g,
        None => {
            map.insert(name.to_string(), g);
        }
    }
}

/// [`step`], recording each schedule op's wall-clock (start, end) in seconds from the start
/// of the step into `spans` (one entry per schedule op, in schedule order).
#[allow(clippy::too_many_arguments)]
pub fn step_timed(
    plan: &Plan,
    model: &Model,
    comm: &Groups,
    rank: &mut Rank,
    batches: &[HashMap<String, Tensor>],
    cx: &OpCx,
    opt: impl Into<Update>,
    mut spans: Option<&mut Vec<(f64, f64)>>,
    stats: Option<&mut StepStats>,
) -> Result<f64, RtError> {
    let device = rank.device;
    let offload = plan.options.offload == fsdp_planner::Offload::Cpu;
    // the arena lives with the rank (one block for the run); taken out for the step
    let mut arena = match (stats.as_ref().and_then(|s| s.arena), rank.arena.take()) {
        (Some(_), Some(a)) => Some(a),
        (Some(_), None) => Some((
            match device {
                tch::Device::Cuda(i) => shim::Arena::new_cuda(plan.memory.arena_bytes, i)?,
                _ => shim::Arena::new(plan.memory.arena_bytes)?,
            },
            None,
        )),
        (None, _) => None,
    };
    if let Some((a, _)) = &arena {
        a.reset();
    }
    let mut tracker = match stats.is_some() {
        true => Some(Probe::start(device)?),
        false => None,
    };
    // a GPU arena's block is one allocation of the caching allocator, made before the step:
    // counted with the step's memory, not as held before it (the whole block at every op: the
    // per-op figures are the device's footprint, where the CPU arena counts live placed bytes)
    if let (Some(Probe::Cuda { base, .. }), Some((a, _))) = (tracker.as_mut(), &arena) {
        *base = base.saturating_sub(a.device_bytes());
    }
    if let Some((a, _)) = &arena {
        a.enter();
    }
    let state = || rank.shards.iter().chain(rank.opt.iter().flat_map(|o| [&o.m, &o.v]));
    let inputs = || batches.iter().flat_map(|b| b.values());
    // (offloaded, the state is the host's)
    let persistent = if offload { held_bytes(inputs()) } else { held_bytes(state().chain(inputs())) };
    let host_persistent = held_bytes(state());
    let host_tracker = (offload && matches!(tracker, Some(Probe::Cpu(_)))).then(MemTracker::new);
    let host = Host {
        offload,
        trackers: match (&tracker, &host_tracker) {
            (Some(Probe::Cpu(d)), Some(h)) => Some((d, h)),
            _ => None,
        },
        arena: arena.as_ref().map(|a| &a.0),
    };
    let mut per_op = vec![];
    let mut probe = tracker.as_ref().map(|t| (t, &mut per_op));
    let opt: Update = opt.into();
    let r = run_step(plan, model, comm, rank, batches, cx, &opt, &mut spans, &mut probe, arena.as_ref().map(|a| &a.0), &host);
    let arena_stats = arena.as_ref().map(|a| a.0.stats());
    if let Some((a, map)) = &mut arena {
        a.leave();
        // the first arena step (or one that allocated otherwise) is recorded for the next
        if map.is_none() || arena_stats.is_some_and(|s| s.mismatched > 0) {
            let m = crate::placement::assign(plan, &a.log());
            a.assign(&m);
            *map = Some(m);
        }
    }
    rank.arena = arena;
    if tracker.is_some() {
        Probe::leave();
        if let Some(st) = stats {
            st.arena = arena_stats;
            st.persistent_bytes = persistent;
            st.host_peak_bytes = host_tracker.as_ref().map(|h| host_persistent + h.stats(false).1);
            // per_op covers the whole step (its last entry closes the last op)
            st.peak_bytes = persistent + per_op.iter().map(|x| x.1).max().unwrap_or(0);
            st.per_op = per_op.into_iter().map(|(c, p)| (c + persistent, p + persistent)).collect();
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn run_step(
    plan: &Plan,
    model: &Model,
    comm: &Groups,
    rank: &mut Rank,
    batches: &[HashMap<String, Tensor>],
    cx: &OpCx,
    update: &Update,
    spans: &mut Option<&mut Vec<(f64, f64)>>,
    probe: &mut Option<(&Probe, &mut Vec<(u64, u64)>)>,
    arena: Option<&shim::Arena>,
    host: &Host,
) -> Result<f64, RtError> {
    let t0 = std::time::Instant::now();
    let nu = plan.units.len();
    let param_kind = plan.options.param_dtype.map(kind_of);
    let reduce_kind = plan.options.reduce_dtype.map(kind_of);
    let owner = plan.param_owners();
    // each parameter's place in `model.parameters()`'s order (clip_grad_norm_'s)
    let param_order: HashMap<&str, usize> = model.params.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect();
    let ops: HashMap<&str, &fsdp_ir::Op> = model.ops.iter().map(|o| (o.name.as_str(), o)).collect();
    let loss_op = model.ops.last().map(|o| o.name.as_str()).unwrap_or("");
    // Ops the plan recomputes (they run without grad in forward), and their regions.
    let recomputed: std::collections::HashSet<&str> = plan
        .schedule
        .iter()
        .filter_map(|s| match &s.kind {
            OpKind::Recompute { op, .. } => Some(&**op),
            _ => None,
        })
        .collect();
    // selective AC's kept outputs: held from the forward until the recompute runs the op again
    let sac_attn = fsdp_planner::AttnImpl::parse(&plan.attn_implementation).unwrap_or(fsdp_planner::AttnImpl::Sdpa);
    let sac: std::collections::HashSet<&str> = model
        .ops
        .iter()
        .zip(fsdp_planner::schedule::sac_saved_ops(model, &plan.options, sac_attn))
        .filter(|x| x.1)
        .map(|x| x.0.name.as_str())
        .collect();
    let checkpointed: std::collections::HashSet<&str> = model
        .modules
        .iter()
        .filter(|m| plan.options.checkpoints().iter().any(|(c, _)| *c == m.class || *c == m.path))
        .map(|m| m.path.as_str())
        .collect();
    let region: HashMap<&str, &str> = model
        .ops
        .iter()
        .filter(|o| recomputed.contains(o.name.as_str()))
        .filter_map(|o| region_of(&checkpointed, o).map(|r| (o.name.as_str(), r)))
        .collect();
    // Forward consumers of each value; recompute consumers inside / outside its region.
    let producer_region = |n: &str| region.get(n).copied();
    let mut fwd_uses: HashMap<&str, usize> = HashMap::new();
    let mut rec_inputs: HashMap<&str, usize> = HashMap::new();
    let mut rec_internal: HashMap<&str, usize> = HashMap::new();
    for o in &model.ops {
        for n in &o.inputs {
            *fwd_uses.entry(n.as_str()).or_default() += 1;
            if let Some(r) = region.get(o.name.as_str()) {
                if producer_region(n) == Some(r) {
                    *rec_internal.entry(n.as_str()).or_default() += 1;
                } else {
                    *rec_inputs.entry(n.as_str()).or_default() += 1;
                }
            }
        }
    }
    let model_inputs: std::collections::HashSet<&str> = model.inputs.iter().map(|i| i.name.as_str()).collect();
    let mut gathered: Vec<Option<crate::comm::Pending>> = (0..nu).map(|_| None).collect();
    // flat layout: each unit's padded flat parameter (the all-gather output, kept)
    let mut flat_full: Vec<Option<Tensor>> = (0..nu).map(|_| None).collect();
    let mut flat_grad: Vec<Option<Tensor>> = (0..nu).map(|_| None).collect();
    let flat_layout = plan.options.layout == Layout::Flat && plan.options.strategy != fsdp_planner::Strategy::NoShard;
    let unit_param: HashMap<&str, &fsdp_planner::units::UnitParam> = plan.units.iter().flat_map(|u| u.params.iter().map(|p| (p.name.as_str(), p))).collect();
    // buffers FSDP2 holds past their use (see where they are set)
    let mut last_fwd_ag: Option<Tensor> = None;
    let mut last_rs_input: Option<Tensor> = None;
    // Unsharded params per unit (leaves; storage freed at reshard, refilled at copy-out).
    let mut params: Vec<HashMap<String, Tensor>> = (0..nu).map(|_| HashMap::new()).collect();
    let mut resident = vec![false; nu];
    // reshard_after_forward=int: each unit's post-forward slices (per param, this rank's 1/N
    // of its padded unsharded tensor), and whether the unit's pending all-gather is of them
    let mut post_fwd: Vec<Vec<Tensor>> = (0..nu).map(|_| vec![]).collect();
    let mut gathered_post = vec![false; nu];
    if plan.options.strategy == fsdp_planner::Strategy::NoShard {
        // no-shard: the local "shard" is the whole unit and the params are views of it (a
        // cast copy under mixed precision), as FSDP's NO_SHARD flat parameter; the optimizer
        // updates them in place
        for u in 0..nu {
            let src = match param_kind {
                Some(k) if k != rank.shards[u].kind() => rank.shards[u].to_kind(k),
                _ => rank.shards[u].shallow_clone(),
            };
            for (n, v) in tch::no_grad(|| unsharded_views(plan, u, &src)) {
                let t = v.detach();
                let t = if t.is_floating_point() { t.set_requires_grad(true) } else { t };
                params[u].insert(n, t);
            }
            resident[u] = true;
        }
    }
    let mut pgrads: Vec<HashMap<String, Tensor>> = (0..nu).map(|_| HashMap::new()).collect();
    // FSDP2 under mixed precision without gradient sync: a unit's grads kept upcast to the
    // reduce dtype across micro-batches (`unsharded_accumulated_grad`), each later backward's
    // added at its post-backward
    let mut accumulated: Vec<HashMap<String, Tensor>> = (0..nu).map(|_| HashMap::new()).collect();
    // the order each unit's param grads were made in (the plan's, for the arena)
    let mut pgrad_order: Vec<Vec<String>> = vec![vec![]; nu];
    let mut sgrads: Vec<Option<Tensor>> = (0..nu).map(|_| None).collect();
    let mut normed = false;
    // hybrid sharding: reduce-scattered grads waiting for their all-reduce across replicas
    let hybrid = matches!(plan.options.strategy, fsdp_planner::Strategy::HybridShard { .. }) && plan.options.replicate_size() > 1;
    let mut pending: Vec<Option<Tensor>> = (0..nu).map(|_| None).collect();
    // the gradient reduction in flight (unit, result), FSDP2's reduce_scatter_state
    let mut rs_flight: Option<(usize, crate::comm::Pending)> = None;
    // a GPU step's timeline is read from the device (see DeviceClock)
    let mut clock = match (spans.is_some(), rank.device) {
        (true, tch::Device::Cuda(i)) => Some(DeviceClock::new(i)?),
        _ => None,
    };
    let mut env: HashMap<String, Tensor> = HashMap::new();
    let mut grads: HashMap<String, Tensor> = HashMap::new();
    let mut out_edge: HashMap<String, Edge> = HashMap::new();
    let mut in_edges: HashMap<String, Vec<(String, Edge)>> = HashMap::new();
    let mut param_edges: HashMap<String, Vec<(String, Edge)>> = HashMap::new();
    // values a checkpointed forward computed without grad that would have required grad
    let mut would_grad: std::collections::HashSet<String> = std::collections::HashSet::new();
    // float8 linears' forwards run without autograd: what their backward reads, by op
    let mut f8_saved: HashMap<String, F8Saved> = HashMap::new();
    // --float8-all-gather: units whose float8 weights are gathered in float8 (as bytes, beside
    // the rest in the param dtype); the scales of a gather in flight, and of the float8
    // weights resident, by primary name
    let f8_gather: Vec<bool> = plan.units.iter().map(|un| plan.options.float8.is_some_and(|f| f.all_gather) && un.params.iter().any(|p| p.float8)).collect();
    let mut f8_pending: Vec<HashMap<String, (Tensor, bool)>> = (0..nu).map(|_| HashMap::new()).collect();
    let mut f8_scale: HashMap<String, (Tensor, bool)> = HashMap::new();
    // torchao's float8 linears (`--float8`), decided by the plan: tensorwise only (libtorch's
    // CPU `_scaled_mm` has no per-row scales)
    if let Some(f) = plan.options.float8 {
        if f.recipe != fsdp_planner::Float8Recipe::Tensorwise {
            return Err(RtError::Plan(format!("--float8 {}: the runtime runs torchao's tensorwise recipe only", f.recipe.name())));
        }
    }
    let f8_ops: std::collections::HashSet<&str> = match plan.options.float8 {
        Some(_) => model.ops.iter().filter(|o| fsdp_planner::float8::is_float8_linear(model, o)).map(|o| o.name.as_str()).collect(),
        None => Default::default(),
    };
    // under op-level SAC, the abs and amax of each float8 linear's forward casts, kept by op
    // from the forward of its region until its recompute ([`float8::Sac`]), which takes every
    // one (a float8 linear saves its input: never past the recompute's early stop); each op's
    // region
    let op_region: HashMap<&str, usize> = match plan.options.float8 {
        Some(_) => model.ops.iter().zip(fsdp_planner::schedule::checkpoint_regions(model, &plan.options)).filter_map(|(o, r)| r.map(|r| (o.name.as_str(), r))).collect(),
        None => Default::default(),
    };
    let region_mode = fsdp_planner::schedule::region_modes(model, &plan.options);
    let f8_sac = |op: &str| f8_ops.contains(op) && op_region.get(op).is_some_and(|r| region_mode.get(r) == Some(&fsdp_planner::AcMode::SelectiveOp));
    let mut f8_kept: HashMap<String, std::collections::VecDeque<Tensor>> = HashMap::new();
    // the GEMM results (before the bias) SAC's cache keeps of float8 linears with a bias
    let mut f8_gemm: HashMap<String, Tensor> = HashMap::new();
    let (mut fwd_left, mut rec_in_left, mut rec_int_left) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut losses = vec![];
    let mut mb = u32::MAX;
    // this micro-batch's kernel context (its dropout noise key)
    let mut cxm = *cx;
    let param = |params: &[HashMap<String, Tensor>], resident: &[bool], name: &str| -> Result<Tensor, RtError> {
        let prim = model.primary_of(name);
        let u = *owner.get(prim).ok_or_else(|| err(format!("param `{prim}` has no unit")))?;
        match params[u].get(prim) {
            Some(t) if resident[u] => Ok(t.shallow_clone()),
            _ => Err(err(format!("param `{prim}` used while {} is sharded", plan.units[u].label()))),
        }
    };
    for sop in &plan.schedule {
        if let Some(a) = arena {
            let slots: Vec<(u64, u64)> = sop
                .events
                .iter()
                .filter_map(|e| match e {
                    fsdp_planner::Event::Alloc(b) => plan.buffers.get(b.index()).map(|x| (x.offset, x.bytes)),
                    _ => None,
                })
                .collect();
            a.expect(&slots);
        }
        if let Some((t, v)) = probe.as_mut() {
            if !v.is_empty() || sop.id.index() > 0 {
                // closes the previous op
                v.push(t.stats());
            }
        }
        if let Some(c) = clock.as_mut() {
            c.mark()?;
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
            cxm.train = cx.train.map(|n| crate::ops::Noise { micro: mb as u64, ..n });
            env.clear();
            grads.clear();
            out_edge.clear();
            in_edges.clear();
            param_edges.clear();
            would_grad.clear();
            f8_saved.clear();
            f8_kept.clear();
            f8_gemm.clear();
            fwd_left = fwd_uses.clone();
            rec_in_left = rec_inputs.clone();
            rec_int_left = rec_internal.clone();
            let b = batches.get(mb as usize).ok_or_else(|| err(format!("no data for micro-batch {mb}")))?;
            for (k, v) in b {
                env.insert(k.clone(), v.shallow_clone());
            }
        }
        if !matches!(sop.kind, OpKind::Backward { .. } | OpKind::Recompute { .. } | OpKind::AllGather { .. } | OpKind::CopyOut { .. } | OpKind::Reshard { .. } | OpKind::KeepGrads { .. } | OpKind::AccumulateGrads { .. }) {
            // the next reduction (FSDP2's post-backward: the compute stream waits for the
            // previous one before the next is issued, one in flight at a time), or anything
            // that may need the reduced gradient (the replicas' all-reduce, the optimizer) or
            // ends the backward: the reduction in flight is finished first
            if let Some((v, p)) = rs_flight.take() {
                finish_reduction(v, p.wait()?, hybrid, &mut pending, &mut sgrads, &rank.shards, host)?;
            }
        }
        match &sop.kind {
            OpKind::PhaseEnd => {
                last_rs_input = None;
            }
            OpKind::Setup => {}
            OpKind::KeepGrads { unit } | OpKind::AccumulateGrads { unit } => {
                let u = unit.index();
                let rk = reduce_kind_of(reduce_kind, param_kind, &rank.shards[u]);
                let grad_kind = param_kind.unwrap_or(rank.shards[u].kind());
                if plan.options.layout == Layout::Fsdp2 && rk != grad_kind {
                    tch::no_grad(|| {
                        for n in std::mem::take(&mut pgrad_order[u]) {
                            let Some(g) = pgrads[u].remove(&n) else { continue };
                            match accumulated[u].get_mut(&n) {
                                Some(a) => *a += g,
                                None => {
                                    accumulated[u].insert(n, g.to_kind(rk));
                                }
                            }
                        }
                    });
                }
            }
            OpKind::AllGather { unit, group: Group::PostForward, .. } => {
                // the post-forward slices (already in the param dtype), one after the other,
                // gathered over the N consecutive ranks of this rank's post-forward group
                let u = unit.index();
                let n = plan.units[u].reshard_to.ok_or_else(|| err(format!("{}: a post-forward all-gather of a unit without reshard_to", sop.id)))? as usize;
                // (copied into this rank's row of the output, as FSDP2's all-gather copy-in:
                // over a group of its own — rank threads, an NCCL communicator — the output is
                // all it allocates; over a SubGroup of a world of processes the world's
                // all-gather adds its transient)
                let sub;
                let post: &dyn Collective = match comm.post_forward(n) {
                    Some(g) => g,
                    None => {
                        sub = crate::comm::SubGroup::mesh(comm.world, n).0;
                        &sub
                    }
                };
                let numel: i64 = post_fwd[u].iter().map(|t| t.numel() as i64).sum();
                let first = post_fwd[u].first().ok_or_else(|| err(format!("{}: a post-forward all-gather without post-forward slices", sop.id)))?;
                let out = Tensor::empty([numel * n as i64], (first.kind(), first.device()));
                tch::no_grad(|| {
                    let mut at = post.rank() as i64 * numel;
                    for t in &post_fwd[u] {
                        out.narrow(0, at, t.numel() as i64).copy_(&t.reshape([-1]));
                        at += t.numel() as i64;
                    }
                });
                post.all_gather_in_place(&out)?;
                gathered[u] = Some(crate::comm::Pending::ready(out));
                gathered_post[u] = true;
            }
            OpKind::AllGather { unit, .. } if f8_gather[unit.index()] => {
                // torchao's float8 all-gather: each float8 weight's shard cast with the whole
                // weight's scale (amax all-reduced over the shard group), the rest cast to the
                // param dtype, all gathered as one uint8 buffer of their bytes (FSDP2 gathers a
                // unit of mixed dtypes so)
                let u = unit.index();
                if host.offload || plan.options.layout != Layout::Fsdp2 {
                    return Err(err(format!("{}: float8 all-gather runs with FSDP2's layout on the device only", sop.id)));
                }
                let shard = &rank.shards[u];
                let mut pieces = Vec::with_capacity(plan.units[u].params.len());
                for p in &plan.units[u].params {
                    let piece = shard.narrow(0, p.offset as i64, p.shard_numel as i64);
                    let bytes = if p.float8 {
                        let local = tch::no_grad(|| float8::local_amax(&piece));
                        let amax = tch::no_grad(|| comm.shard.all_gather(&local).map(|a| a.max()))?;
                        let (bits, scale) = tch::no_grad(|| float8::weight_shard(&piece, &amax));
                        f8_pending[u].insert(p.name.clone(), (scale, p.requires_grad));
                        bits.view_dtype(Kind::Uint8)
                    } else {
                        let c = match param_kind {
                            Some(k) if k != piece.kind() => tch::no_grad(|| piece.to_kind(k)),
                            _ => piece,
                        };
                        c.view_dtype(Kind::Uint8)
                    };
                    pieces.push(bytes);
                }
                let s = tch::no_grad(|| Tensor::cat(&pieces, 0));
                drop(pieces);
                gathered[u] = Some(comm.shard.all_gather_start(&s)?);
            }
            OpKind::AllGather { unit, .. } => {
                // mixed precision: the shard is cast to param_dtype, then gathered
                let u = unit.index();
                let s = if host.offload {
                    // CPUOffloadPolicy: each param's padded host shard copied to the device in
                    // its own dtype, then cast to the param dtype (the copy dropped at once),
                    // then put together as the all-gather's input (FSDP2 copies them into the
                    // output's slot: these go once it is made)
                    let shard = &rank.shards[u];
                    let pieces: Vec<Tensor> = plan.units[u]
                        .params
                        .iter()
                        .map(|p| {
                            let d = copy_to(&shard.narrow(0, p.offset as i64, p.shard_numel as i64), rank.device);
                            match param_kind {
                                Some(k) if k != d.kind() => tch::no_grad(|| d.to_kind(k)),
                                _ => d,
                            }
                        })
                        .collect();
                    match pieces.is_empty() {
                        true => copy_to(shard, rank.device),
                        false => tch::no_grad(|| Tensor::cat(&pieces, 0)),
                    }
                } else {
                    match param_kind {
                        Some(k) => rank.shards[u].to_kind(k),
                        None => rank.shards[u].shallow_clone(),
                    }
                };
                if plan.options.layout == Layout::Flat {
                    // FSDP1: gathered straight into the unit's padded flat parameter, whose
                    // storage persists (freed at reshard, refilled here)
                    match &flat_full[u] {
                        Some(f) => {
                            shim::realloc_storage(f)?;
                            comm.shard.all_gather_into(f, &s, &mut |d, x| shim::copy_keep_version(d, x))?;
                        }
                        None => flat_full[u] = Some(comm.shard.all_gather(&s)?),
                    }
                } else {
                    // in flight until the copy-out needs it (prefetch overlaps compute on GPUs)
                    gathered[u] = Some(comm.shard.all_gather_start(&s)?);
                }
            }
            OpKind::CopyOut { unit } if plan.options.layout == Layout::Flat => {
                // FSDP1: the params are views into the flat parameter (made once per step)
                let u = unit.index();
                let f = flat_full[u].as_ref().ok_or_else(|| err(format!("{}: copy-out without all-gather", sop.id)))?;
                if params[u].is_empty() {
                    for p in &plan.units[u].params {
                        let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                        let v = f.narrow(0, p.offset as i64, p.numel as i64).view(shape.as_slice()).detach();
                        let v = if v.is_floating_point() { v.set_requires_grad(true) } else { v };
                        params[u].insert(p.name.clone(), v);
                    }
                }
                resident[u] = true;
            }
            OpKind::CopyOut { unit } if gathered_post[unit.index()] => {
                // rows of the post-forward group, each the concatenated slices of one rank:
                // a param is its slice from every row, in row order, then unpadded
                let u = unit.index();
                let g = gathered[u].take().ok_or_else(|| err(format!("{}: copy-out without all-gather", sop.id)))?.wait()?;
                let n = plan.units[u].reshard_to.unwrap_or(1) as i64;
                let rows = g.view([n, -1]);
                let mut off = 0i64;
                for p in &plan.units[u].params {
                    let len = p.padded_numel as i64 / n;
                    let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                    let full = tch::no_grad(|| Tensor::cat(&(0..n).map(|r| rows.get(r).narrow(0, off, len)).collect::<Vec<_>>(), 0).narrow(0, 0, p.numel as i64).view(shape.as_slice()));
                    off += len;
                    match params[u].get(&p.name) {
                        Some(t) => {
                            shim::realloc_storage(t)?;
                            shim::copy_keep_version(t, &full)?;
                        }
                        None => {
                            let t = full.detach().copy();
                            let t = if t.is_floating_point() { t.set_requires_grad(true) } else { t };
                            params[u].insert(p.name.clone(), t);
                        }
                    }
                }
                // FSDPParam.to_unsharded: the slices go once copied out
                post_fwd[u].clear();
                gathered_post[u] = false;
                resident[u] = true;
            }
            OpKind::CopyOut { unit } if f8_gather[unit.index()] => {
                // the bytes of each param from every rank's row into its unsharded tensor:
                // float8 weights as e4m3 bits (no grad of their own: the linear's backward
                // makes the weight's), the rest in the param dtype
                let u = unit.index();
                let g = gathered[u].take().ok_or_else(|| err(format!("{}: copy-out without all-gather", sop.id)))?.wait()?;
                for (name, scale) in f8_pending[u].drain() {
                    f8_scale.insert(name, scale);
                }
                let fresh = params[u].is_empty();
                let id = sop.id;
                copy_out_bytes(plan, u, &g, &mut |p| {
                    if fresh {
                        let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                        let kind = if p.float8 { Kind::Float8e4m3fn } else { param_kind.unwrap_or(kind_of(p.dtype)) };
                        let t = Tensor::empty(shape.as_slice(), (kind, g.device()));
                        let t = if p.float8 || !p.requires_grad { t } else { t.set_requires_grad(true) };
                        params[u].insert(p.name.clone(), t.shallow_clone());
                        Ok(t)
                    } else {
                        let t = params[u].get(&p.name).ok_or_else(|| err(format!("{id}: unsharded param `{}` missing", p.name)))?;
                        shim::realloc_storage(t)?;
                        Ok(t.shallow_clone())
                    }
                })?;
                if sop.phase == fsdp_planner::Phase::Forward {
                    last_fwd_ag = Some(g);
                } else {
                    drop(g);
                }
                resident[u] = true;
            }
            OpKind::CopyOut { unit } => {
                let u = unit.index();
                let g = gathered[u].take().ok_or_else(|| err(format!("{}: copy-out without all-gather", sop.id)))?.wait()?;
                // from the all-gather output into each param's storage, rank piece by rank
                // piece (FSDP2's split_with_sizes_copy; Shard(dim > 0) params through
                // temporaries, as FSDP2's copy-out: `copy_out_into`)
                if params[u].is_empty() {
                    let mut made = vec![];
                    copy_out_into(plan, u, &g, &mut |p| {
                        let shape: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
                        let t = Tensor::empty(shape.as_slice(), (g.kind(), g.device()));
                        made.push((p.name.clone(), t.shallow_clone()));
                        Ok(t)
                    })?;
                    for (name, t) in made {
                        let t = if t.is_floating_point() { t.set_requires_grad(true) } else { t };
                        params[u].insert(name, t);
                    }
                } else {
                    let id = sop.id;
                    let have = &params[u];
                    copy_out_into(plan, u, &g, &mut |p| {
                        let t = have.get(&p.name).ok_or_else(|| err(format!("{id}: unsharded param `{}` missing", p.name)))?;
                        shim::realloc_storage(t)?;
                        Ok(t.shallow_clone())
                    })?;
                }
                if plan.options.layout == Layout::Fsdp2 && sop.phase == fsdp_planner::Phase::Forward {
                    // FSDP2 keeps a forward all-gather's output until the next forward
                    // all-gather is waited on (the last until the root's post-forward), as
                    // the plan's buffers say
                    last_fwd_ag = Some(g);
                } else {
                    drop(g);
                }
                resident[u] = true;
            }
            OpKind::Reshard { unit } => {
                let u = unit.index();
                // reshard_after_forward=int, after forward: this rank's 1/N of each param's
                // padded unsharded tensor is kept (FSDPParam.to_sharded_post_forward)
                if let (Some(n), fsdp_planner::Phase::Forward) = (plan.units[u].reshard_to, sop.phase) {
                    let r = (comm.world.rank() as u64 % n) as i64;
                    post_fwd[u] = plan.units[u]
                        .params
                        .iter()
                        .map(|p| {
                            let t = params[u].get(&p.name).ok_or_else(|| err(format!("{}: unsharded param `{}` missing", sop.id, p.name)))?;
                            let len = (p.padded_numel / n) as i64;
                            Ok(tch::no_grad(|| {
                                let flat = t.detach().reshape([-1]);
                                let pad = p.padded_numel as i64 - p.numel as i64;
                                let flat = if pad > 0 { Tensor::cat(&[flat.shallow_clone(), flat.new_zeros([pad], (flat.kind(), flat.device()))], 0) } else { flat };
                                flat.narrow(0, r * len, len).copy()
                            }))
                        })
                        .collect::<Result<_, RtError>>()?;
                }
                match &flat_full[u] {
                    // the params are views of it: one storage
                    Some(f) => shim::free_storage(f)?,
                    None => {
                        for t in params[u].values() {
                            shim::free_storage(t)?;
                        }
                    }
                }
                resident[u] = false;
            }
            OpKind::Forward { op, .. } | OpKind::Recompute { op, .. } => {
                let Some(o) = ops.get(&**op) else {
                    if &**op == "post-forward" {
                        last_fwd_ag = None;
                    }
                    continue;
                };
                let is_recompute = matches!(sop.kind, OpKind::Recompute { .. });
                let grad_on = is_recompute || !recomputed.contains(&**op);
                let f8 = f8_ops.contains(o.name.as_str());
                // inputs and params enter through boundaries, so this op's backward can run
                // on its own piece of the graph (and a value a checkpointed forward computed
                // without grad still collects the gradient for its producer's backward)
                let mut ins = Vec::with_capacity(o.inputs.len());
                for n in &o.inputs {
                    let t = env.get(n).ok_or_else(|| err(format!("{op}: input `{n}` missing")))?;
                    let wants = t.is_floating_point() && (t.requires_grad() || would_grad.contains(n));
                    ins.push(if grad_on && wants { shim::boundary(t)? } else { t.shallow_clone() });
                }
                let mut ps: Vec<Tensor> = Vec::with_capacity(o.params.len());
                for pn in &o.params {
                    let p = param(&params, &resident, pn)?;
                    ps.push(if grad_on && p.requires_grad() { shim::boundary(&p)? } else { p });
                }
                let out = {
                    let ir: Vec<&Tensor> = ins.iter().collect();
                    let pr: Vec<&Tensor> = ps.iter().collect();
                    if f8 {
                        // op-level SAC: the forward keeps its casts' abs and amax, the recompute
                        // takes them, and the GEMM output SAC kept
                        let sac8 = f8_sac(o.name.as_str());
                        let mut kept = match (sac8, is_recompute) {
                            (true, false) => Some(std::collections::VecDeque::new()),
                            // (what the forward kept is there: a recompute without it would make
                            // the same numbers and hide the loss)
                            (true, true) => Some(f8_kept.remove(&o.name).ok_or_else(|| err(format!("{op}: the recompute finds no abs and amax kept by selective AC")))?),
                            (false, _) => None,
                        };
                        // (SAC keeps a GEMM's output: a linear's own without a bias, else its
                        // result before the bias, apart)
                        let cache_gemm = sac8 && sac.contains(o.name.as_str());
                        let biased = pr.len() > 1;
                        let cached = match (cache_gemm && is_recompute, biased) {
                            (true, true) => Some(f8_gemm.remove(&o.name).ok_or_else(|| err(format!("{op}: the recompute finds no GEMM result kept by selective AC")))?),
                            (true, false) => Some(env.get(&o.name).ok_or_else(|| err(format!("{op}: the recompute finds no GEMM output kept by selective AC")))?.shallow_clone()),
                            (false, _) => None,
                        };
                        let keep_gemm = cache_gemm && biased && !is_recompute;
                        let mode = match (&mut kept, is_recompute) {
                            (Some(k), false) => float8::Sac::Keep(k),
                            (Some(k), true) => float8::Sac::Take(k),
                            (None, _) => float8::Sac::Off,
                        };
                        let w = if pr[0].kind() == Kind::Float8e4m3fn {
                            // the weight gathered in float8: its bits and scale as they are
                            let (scale, _) = f8_scale.get(model.primary_of(&o.params[0])).ok_or_else(|| err(format!("{op}: no scale for the float8 weight `{}`", o.params[0])))?;
                            float8::Weight::Float8 { bits: pr[0], scale }
                        } else {
                            float8::Weight::High(pr[0])
                        };
                        let (y, gemm) = tch::no_grad(|| float8::forward(ir[0], w, pr.get(1).copied(), mode, cached, keep_gemm))?;
                        if let Some(g) = gemm {
                            f8_gemm.insert(o.name.clone(), g);
                        }
                        if let (Some(k), false) = (kept, is_recompute) {
                            f8_kept.insert(o.name.clone(), k);
                        }
                        y
                    } else if grad_on {
                        forward(&cxm, o, &ir, &pr)?
                    } else {
                        tch::no_grad(|| forward(&cxm, o, &ir, &pr))?
                    }
                };
                if o.name == loss_op {
                    losses.push(out.double_value(&[]));
                }
                if grad_on && f8 {
                    // torchao's float8 linear keeps its high-precision input and weight for
                    // its own backward ([`float8::backward`]), as autograd would keep them
                    let (x, w) = (&ins[0], &ps[0]);
                    // (a weight gathered in float8 is bits without a grad of their own: the
                    // linear's backward makes the weight's, if it is trained)
                    let gathered8 = f8_scale.get(model.primary_of(&o.params[0])).filter(|_| w.kind() == Kind::Float8e4m3fn);
                    let sv = F8Saved {
                        x: x.detach(),
                        x_grad: x.requires_grad(),
                        w: w.detach(),
                        w_scale: gathered8.map(|(t, _)| t.shallow_clone()),
                        w_grad: w.requires_grad() || gathered8.is_some_and(|(_, trained)| *trained),
                        b_grad: ps.get(1).is_some_and(|b| b.requires_grad()),
                    };
                    if sv.x_grad || sv.w_grad || sv.b_grad {
                        would_grad.insert(o.name.clone());
                    }
                    f8_saved.insert(o.name.clone(), sv);
                } else if grad_on {
                    let es: Vec<(String, Edge)> = o.inputs.iter().zip(&ins).filter_map(|(n, t)| Edge::of(t).map(|e| (n.clone(), e))).collect();
                    in_edges.insert(o.name.clone(), es);
                    let pe: Vec<(String, Edge)> = o.params.iter().zip(&ps).filter_map(|(n, t)| Edge::of(t).map(|e| (model.primary_of(n).to_string(), e))).collect();
                    param_edges.insert(o.name.clone(), pe);
                    if let Some(e) = Edge::of(&out) {
                        out_edge.insert(o.name.clone(), e);
                    }
                } else if out.is_floating_point()
                    && (ps.iter().any(|p| p.requires_grad() || (f8 && p.kind() == Kind::Float8e4m3fn)) || o.inputs.iter().zip(&ins).any(|(n, t)| t.requires_grad() || would_grad.contains(n)))
                {
                    would_grad.insert(o.name.clone());
                }
                drop(ins);
                // drop what no later op of this phase reads (autograd keeps what it saved)
                let keep_out = if is_recompute {
                    rec_int_left.get(o.name.as_str()).copied().unwrap_or(0) > 0
                } else {
                    // (a float8 linear with a bias: SAC keeps its GEMM's result, not the output)
                    (sac.contains(o.name.as_str()) && !f8_gemm.contains_key(&o.name)) || fwd_left.get(o.name.as_str()).copied().unwrap_or(0) > 0 || rec_in_left.get(o.name.as_str()).copied().unwrap_or(0) > 0
                };
                if keep_out || o.name == loss_op {
                    env.insert(o.name.clone(), out);
                } else {
                    env.remove(&o.name);
                }
                for n in &o.inputs {
                    if model_inputs.contains(n.as_str()) {
                        continue;
                    }
                    let (a, b) = if is_recompute {
                        let in_region = producer_region(n) == region.get(o.name.as_str()).copied();
                        let c = if in_region { &mut rec_int_left } else { &mut rec_in_left };
                        if let Some(x) = c.get_mut(n.as_str()) {
                            *x = x.saturating_sub(1);
                        }
                        (rec_int_left.get(n.as_str()).copied().unwrap_or(0), rec_in_left.get(n.as_str()).copied().unwrap_or(0))
                    } else {
                        if let Some(x) = fwd_left.get_mut(n.as_str()) {
                            *x = x.saturating_sub(1);
                        }
                        (fwd_left.get(n.as_str()).copied().unwrap_or(0), rec_in_left.get(n.as_str()).copied().unwrap_or(0))
                    };
                    let later_fwd = if is_recompute { 0 } else { a };
                    let later_rec = if is_recompute { a + b } else { b };
                    if later_fwd == 0 && later_rec == 0 && (is_recompute || !sac.contains(n.as_str()) || f8_gemm.contains_key(n)) {
                        env.remove(n);
                    }
                }
            }
            OpKind::Backward { op, .. } => {
                let Some(o) = ops.get(&**op) else { continue };
                // (input, gradient) and (primary param, gradient)
                let (in_grads, p_grads): (Vec<Named>, Vec<Named>) = if let Some(sv) = f8_saved.remove(&o.name) {
                    let Some(gout) = grads.remove(&o.name) else { continue };
                    let w = match &sv.w_scale {
                        Some(scale) => float8::Weight::Float8 { bits: &sv.w, scale },
                        None => float8::Weight::High(&sv.w),
                    };
                    let g = tch::no_grad(|| float8::backward(&sv.x, w, o.params.len() > 1, &gout))?;
                    let ins = if sv.x_grad { vec![(o.inputs[0].clone(), g.input)] } else { vec![] };
                    // (the bias's first, as autograd makes them)
                    let mut pg = vec![];
                    if let (true, Some(b)) = (sv.b_grad, g.bias) {
                        pg.push((model.primary_of(&o.params[1]).to_string(), b));
                    }
                    if sv.w_grad {
                        pg.push((model.primary_of(&o.params[0]).to_string(), g.weight));
                    }
                    (ins, pg)
                } else {
                    let ins = in_edges.remove(&o.name).unwrap_or_default();
                    let pes = param_edges.remove(&o.name).unwrap_or_default();
                    let Some(root) = out_edge.remove(&o.name) else { continue };
                    let gout = if o.name == loss_op {
                        let l = env.remove(&o.name).ok_or_else(|| err(format!("{op}: loss missing")))?;
                        l.ones_like()
                    } else {
                        match grads.remove(&o.name) {
                            Some(g) => g,
                            None => continue, // no gradient reaches this op
                        }
                    };
                    // identity ops (dropout at p = 0) pass the gradient through
                    if let Some((n, _)) = ins.iter().find(|(_, e)| e.same(&root)) {
                        add_grad(&mut grads, n, gout);
                        continue;
                    }
                    let targets: Vec<&Edge> = ins.iter().chain(pes.iter()).map(|(_, e)| e).collect();
                    // the gradient an input already has (from ops later in the forward) enters
                    // the op's backward first, as autograd sums a value's grads: a norm's input,
                    // read twice inside it, gets `(later + a) + b` (its result replaces it)
                    let mut seen: std::collections::HashSet<&str> = Default::default();
                    let seeds: Vec<Option<Tensor>> = ins.iter().map(|(n, _)| if seen.insert(n.as_str()) { grads.remove(n) } else { None }).collect();
                    let mut gi = shim::backward(&root, gout, &targets, seeds)?.into_iter();
                    let in_grads = ins.into_iter().filter_map(|(n, _)| gi.next().filter(|g| g.defined()).map(|g| (n, g))).collect();
                    (in_grads, pes.into_iter().filter_map(|(p, _)| gi.next().filter(|g| g.defined()).map(|g| (p, g))).collect())
                };
                for (n, g) in in_grads {
                    add_grad(&mut grads, &n, g);
                }
                for (prim, g) in p_grads {
                    let prim = &prim;
                    {
                        let u = *owner.get(prim.as_str()).ok_or_else(|| err(format!("param `{prim}` has no unit")))?;
                        match (flat_layout, unit_param.get(prim.as_str())) {
                            // FSDP1: grads accumulate into the unit's padded flat gradient
                            (true, Some(p)) => tch::no_grad(|| {
                                let fg = flat_grad[u].get_or_insert_with(|| Tensor::zeros([plan.units[u].padded_numel as i64], (g.kind(), g.device())));
                                let mut v = fg.narrow(0, p.offset as i64, p.numel as i64).view_as(&g);
                                v += g;
                            }),
                            _ => {
                                if !pgrads[u].contains_key(prim.as_str()) {
                                    pgrad_order[u].push(prim.clone());
                                }
                                add_grad(&mut pgrads[u], prim, g)
                            }
                        }
                    }
                }
            }
            OpKind::ReduceScatter { unit, .. } | OpKind::AllReduce { unit, group: Group::World, .. } => {
                let u = unit.index();
                // grads are reduced in reduce_dtype (else their own dtype), then kept in the
                // shard's (master) dtype
                let gk = reduce_kind_of(reduce_kind, param_kind, &rank.shards[u]);
                let input = match flat_grad[u].take() {
                    // FSDP1 reduce-scatters the flat gradient itself (cast when reduce_dtype
                    // differs)
                    Some(fg) if fg.kind() == gk => fg,
                    Some(fg) => tch::no_grad(|| fg.to_kind(gk)),
                    None if accumulated[u].is_empty() => tch::no_grad(|| rs_input(plan, u, &pgrads[u], gk))?,
                    None => tch::no_grad(|| rs_input(plan, u, &accumulated[u], gk))?,
                };
                pgrads[u].clear();
                pgrad_order[u].clear();
                accumulated[u].clear();
                let started = match &sop.kind {
                    // no-shard: the whole gradient, averaged over the world
                    OpKind::AllReduce { .. } => comm.world.all_reduce_start(&input)?,
                    _ => comm.shard.reduce_scatter_start(&input)?,
                };
                if plan.options.layout == Layout::Fsdp2 && matches!(sop.kind, OpKind::ReduceScatter { .. }) {
                    // FSDP2 keeps a reduce-scatter's input until the next reduce-scatter (the
                    // last until the end of backward), as the plan's buffers say
                    last_rs_input = Some(input);
                } else {
                    drop(input);
                }
                if started.is_ready() {
                    finish_reduction(u, started.wait()?, hybrid, &mut pending, &mut sgrads, &rank.shards, host)?;
                } else {
                    // in flight (NCCL) while the next unit's backward runs; finished at the
                    // next reduction or where its result is needed
                    rs_flight = Some((u, started));
                }
            }
            OpKind::AllReduce { unit, .. } => {
                // hybrid sharding: this rank's reduce-scattered shard, averaged across replicas
                let u = unit.index();
                let part = pending[u].take().ok_or_else(|| err(format!("{}: all-reduce without a reduce-scatter", sop.id)))?;
                finish_reduction(u, comm.replicate.all_reduce_avg(&part)?, false, &mut pending, &mut sgrads, &rank.shards, host)?;
                drop(part);
            }
            OpKind::OptimizerStep { unit } => {
                let u = unit.index();
                // a unit's parameters in its shard (and gradient): FSDP2's optimizer steps one
                // sharded param at a time; FSDP1's flat parameter is one tensor
                // (each piece with its parameter's place in the model's order, which clipping
                // stacks the norms in; a flat parameter's, its unit's)
                let keyed_pieces = |v: usize| -> Vec<(usize, i64, i64)> {
                    match plan.options.layout {
                        Layout::Fsdp2 => plan.units[v].params.iter().filter(|p| p.shard_numel > 0).map(|p| (param_order.get(p.name.as_str()).copied().unwrap_or(usize::MAX), p.offset as i64, p.shard_numel as i64)).collect(),
                        Layout::Flat => vec![(v, 0, rank.shards[v].numel() as i64)],
                    }
                };
                let pieces = |v: usize| -> Vec<(i64, i64)> { keyed_pieces(v).into_iter().map(|(_, o, l)| (o, l)).collect() };
                // (offloaded: on the host, as torch.optim steps FSDP2's CPU shards)
                host.run(|| -> Result<(), RtError> {
                    if !normed {
                        // before the first unit's step: the norm of all of them (clip_grad_norm_)
                        normed = true;
                        rank.skipped = false;
                        // torch's clip_grad_norm_ to the bit: each parameter's 2-norm (float32
                        // and float64 ones a reduction that copies nothing; reduced-precision
                        // ones a float32 copy of one parameter at a time, no more than the
                        // optimizer's own temporaries, the norm rounded to their dtype as
                        // `vector_norm` returns it), the norm of their stack in their dtype,
                        // then `max_norm / (total + 1e-6)` as Python's `__rtruediv__` computes
                        // it (`reciprocal() * max_norm`, in that dtype), clamped to 1 and
                        // multiplied into each grad. Summed in double or divided in double
                        // instead, the coefficient was an ulp off torch's on most clipped steps
                        // (float32's rounding of a double): Adam all but cancels a scale, but
                        // at ATEN_CPU_CAPABILITY=default it moved a value across a float8
                        // rounding boundary by step 3 (tiny-qwen2-wide under torchao).
                        // (stacked in the model's parameter order, `model.parameters()`'s, as
                        // torch stacks grads of one dtype: a float32 sum of squares is not
                        // associative. Not to the bit — approximations: grads of mixed dtypes,
                        // which torch groups by dtype first; a parameter torch leaves without
                        // a grad — an expert no token reached — whose zeros are stacked here;
                        // CUDA, whose `_foreach_norm` kernel reduces in its own order; FSDP1's
                        // flat parameters, one norm each where FSDP1 squares, all-reduces and
                        // roots even on one rank.)
                        let local = tch::no_grad(|| -> Result<Option<Tensor>, RtError> {
                            let mut norms: Vec<(usize, Tensor)> = vec![];
                            for (v, g) in sgrads.iter().enumerate() {
                                let Some(g) = g else { continue };
                                let g = g.f_reshape([-1])?;
                                for (key, o, len) in keyed_pieces(v) {
                                    let p = g.f_narrow(0, o, len)?;
                                    norms.push((key, match p.kind() {
                                        Kind::Float | Kind::Double => p.f_norm()?,
                                        k => p.f_norm_scalaropt_dtype(2, Kind::Float)?.f_to_kind(k)?,
                                    }));
                                }
                            }
                            if norms.is_empty() {
                                return Ok(None);
                            }
                            norms.sort_by_key(|x| x.0);
                            let norms: Vec<Tensor> = norms.into_iter().map(|x| x.1).collect();
                            Ok(Some(Tensor::f_stack(&norms, 0)?.f_norm()?))
                        })?;
                        let n = comm.shard.size();
                        // (over several shards: each rank's norm squared, their sum — in
                        // double here, where FSDP2's DTensor sums float32 squares — and its
                        // root, in the local norm's dtype)
                        let total = match local {
                            Some(t) if n == 1 => t,
                            local => {
                                let kind = local.as_ref().map_or(Kind::Float, Tensor::kind);
                                let l = local.map_or(0.0, |t| t.double_value(&[]));
                                let sum = comm.shard.all_reduce_avg(&Tensor::from(l * l).to_device(rank.device))?.double_value(&[]) * n as f64;
                                Tensor::from(sum.sqrt()).f_to_kind(kind)?
                            }
                        };
                        let norm = total.double_value(&[]);
                        rank.last_grad_norm = Some(norm);
                        if !norm.is_finite() {
                            if !update.skip_nonfinite {
                                return Err(RtError::NonFinite(format!("the gradient norm is {norm}")));
                            }
                            rank.skipped = true;
                        } else if let Some(max) = update.clip {
                            let coef = tch::no_grad(|| -> Result<Tensor, RtError> { Ok(total.f_add_scalar(1e-6)?.f_reciprocal()?.f_mul_scalar(max)?.f_clamp_max(1.0)?) })?;
                            for g in sgrads.iter_mut().flatten() {
                                let c = coef.f_to_device(g.device())?;
                                let _ = tch::no_grad(|| g.f_mul_(&c))?;
                            }
                        }
                    }
                    if rank.skipped {
                        return Ok(());
                    }
                    let opt = &update.opt;
                    if let Some(g) = &sgrads[u] {
                        opt.step_pieces(&rank.shards[u], g, &mut rank.opt[u], &pieces(u))?;
                    }
                    Ok(())
                })?;
            }
            OpKind::ZeroGrad => {
                for g in sgrads.iter_mut() {
                    *g = None;
                }
            }
        }
        if let Some(c) = clock.as_mut() {
            // a collective's span is where it ran on its own stream (the arms above that
            // `continue` are compute ops, whose span stays the compute stream's)
            let group = match &sop.kind {
                OpKind::AllGather { .. } | OpKind::ReduceScatter { .. } => Some(comm.shard),
                OpKind::AllReduce { group: Group::World, .. } => Some(comm.world),
                OpKind::AllReduce { .. } => Some(comm.replicate),
                _ => None,
            };
            if let Some(slot) = c.comm.last_mut() {
                *slot = group.and_then(|g| g.last_span());
            }
        }
    }
    if let Some((v, p)) = rs_flight.take() {
        // (a schedule that ends with its last reduction)
        finish_reduction(v, p.wait()?, hybrid, &mut pending, &mut sgrads, &rank.shards, host)?;
    }
    if let Some(sp) = spans.as_deref_mut() {
        if let Some(last) = sp.last_mut() {
            last.1 = t0.elapsed().as_secs_f64();
        }
        if let Some(mut c) = clock.take() {
            c.mark()?;
            *sp = c.spans()?;
        }
    }
    // (normally already released by the plan's post-forward and end of backward)
    drop((last_fwd_ag, last_rs_input));
    if let Some((t, v)) = probe.as_mut() {
        v.push(t.stats());
    }
    Ok(losses.iter().sum::<f64>() / losses.len().max(1) as f64)
}

/// Device timestamps of a step on a GPU, for its measured timeline: a timing event on the
/// compute stream where each schedule op starts (and one where the step ends), and for a
/// collective the events around it on NCCL's stream ([`Collective::last_span`]). Kernels run
/// after the host launches them, so host clocks would time launches, not work.
struct DeviceClock {
    stream: crate::cuda::Stream,
    marks: Vec<crate::cuda::Event>,
    comm: Vec<Option<crate::comm::DeviceSpan>>,
    // last: the events above go before the context is released
    device: crate::cuda::Device,
}

impl DeviceClock {
    fn new(ordinal: usize) -> Result<DeviceClock, RtError> {
        let c = |e: crate::cuda::CudaError| err(format!("timing the step on cuda:{ordinal}: {e}"));
        let device = crate::cuda::Device::new(ordinal).map_err(c)?;
        let stream = crate::cuda::Stream::legacy_default().map_err(c)?;
        Ok(DeviceClock { stream, marks: vec![], comm: vec![], device })
    }
    /// Marks where the next op (or the end of the step) starts on the compute stream.
    fn mark(&mut self) -> Result<(), RtError> {
        let e = crate::cuda::Event::new(&self.device, true).map_err(|e| err(e.to_string()))?;
        e.record(&self.stream).map_err(|e| err(e.to_string()))?;
        self.marks.push(e);
        // the op's collective span, if it turns out to be one (set after it ran)
        self.comm.push(None);
        Ok(())
    }
    /// (start, end) of each op in seconds from the step's first mark, once the device is done.
    fn spans(self) -> Result<Vec<(f64, f64)>, RtError> {
        let e = |e: crate::cuda::CudaError| err(format!("reading the step's device timestamps: {e}"));
        let (Some(t0), Some(last)) = (self.marks.first(), self.marks.last()) else { return Ok(vec![]) };
        last.synchronize().map_err(e)?;
        let at = |ev: &crate::cuda::Event| -> Result<f64, RtError> {
            ev.synchronize().map_err(e)?;
            Ok(t0.elapsed_ms(ev).map_err(e)? as f64 * 1e-3)
        };
        (0..self.marks.len() - 1)
            .map(|i| match self.comm.get(i).and_then(|c| c.as_ref()) {
                Some((s, t)) => Ok((at(s)?, at(t)?)),
                None => Ok((at(&self.marks[i])?, at(&self.marks[i + 1])?)),
            })
            .collect()
    }
}

/// A unit's reduced gradient, once its reduction is done: hybrid sharding's waits for the
/// all-reduce across replicas that follows; otherwise it is cast to the shard's (master)
/// dtype and accumulated into the unit's sharded gradient.
fn finish_reduction(u: usize, out: Tensor, hybrid: bool, pending: &mut [Option<Tensor>], sgrads: &mut [Option<Tensor>], shards: &[Tensor], host: &Host) -> Result<(), RtError> {
    if hybrid {
        pending[u] = Some(out);
        return Ok(());
    }
    let out = tch::no_grad(|| out.to_kind(shards[u].kind()));
    if host.offload {
        // CPUOffloadPolicy: the reduced shard goes to the host and accumulates there; the
        // device's copy is dropped
        return host.run(|| {
            let h = copy_to(&out, tch::Device::Cpu);
            match &mut sgrads[u] {
                Some(acc) => tch::no_grad(|| acc.f_add_(&h)).map(|_| ()).map_err(|e| err(format!("accumulating unit {u}'s host gradient: {e}"))),
                None => {
                    sgrads[u] = Some(h);
                    Ok(())
                }
            }
        });
    }
    // (a later micro-batch's under --grad-sync each: added in place, as FSDP2's
    // `grad._local_tensor += new_sharded_grad`)
    match &mut sgrads[u] {
        Some(acc) => tch::no_grad(|| acc.f_add_(&out)).map(|_| ()).map_err(|e| err(format!("accumulating unit {u}'s gradient: {e}"))),
        None => {
            sgrads[u] = Some(out);
            Ok(())
        }
    }
}

/// Where a measured step departs from its plan: the `n` schedule ops with the highest
/// measured in-op peak, one line each (op, planned and measured peak, the difference, and
/// how the bytes live after the op compare).
pub fn memory_report(plan: &Plan, stats: &StepStats, n: usize) -> String {
    let planned = fsdp_planner::memory::per_op(&plan.schedule, &plan.buffers);
    let mut rows: Vec<(u64, String)> = plan
        .schedule
        .iter()
        .zip(planned.iter().zip(&stats.per_op))
        .map(|(op, (&(pl, pp), &(ml, mp)))| {
            let d = mp as i64 - pp as i64;
            let line = format!(
                "{:<48} peak planned {pp:>9} measured {mp:>9} ({d:+}), after: {:+}",
                fsdp_planner::memory::describe(op, Some(&plan.units)),
                ml as i64 - pl as i64
            );
            (mp, line)
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    rows.into_iter().take(n).map(|r| r.1 + "\n").collect()
}
