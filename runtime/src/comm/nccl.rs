//! The GPU collective backend: [`NcclGroup`] implements [`Collective`] over an NCCL
//! communicator made from the rendezvous id (rank 0 calls `ncclGetUniqueId` and the
//! rendezvous sends the 128 bytes to every rank). Collectives run on the group's own stream:
//! it waits (event) for libtorch's compute stream, runs the NCCL call, and the compute stream
//! waits for it, as FSDP2's all-gather / reduce-scatter streams do — at once, or for a
//! collective started with `*_start`, only where its result is first used (an all-gather at
//! its copy-out, a reduce-scatter at the next one or the end of backward), so prefetch and
//! gradient reduction overlap the compute issued meanwhile. Inputs are CUDA tensors
//! on the group's device; averages use NCCL's `ncclAvg`.
//!
//! Without the `cuda` feature the same API exists and returns [`CudaError::NotBuilt`].

use crate::comm::Collective;
use crate::error::RtError;
pub use crate::cuda::CudaError;
use crate::rendezvous::{self, Rendezvous, UniqueId};
use tch::Tensor;

/// Rendezvous for the NCCL backend: rank 0's id is an NCCL unique id.
pub fn rendezvous(cfg: &rendezvous::Config) -> Result<Rendezvous, String> {
    rendezvous::rendezvous(cfg, || unique_id().map_err(|e| e.to_string())).map_err(|e| e.to_string())
}

pub use imp::*;

impl Collective for NcclGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.try_all_gather(input).map_err(|e| RtError::Comm(format!("rank {}: all-gather: {e}", self.rank)))
    }
    fn all_gather_start(&self, input: &Tensor) -> Result<crate::comm::Pending, RtError> {
        self.try_all_gather_start(input).map_err(|e| RtError::Comm(format!("rank {}: all-gather: {e}", self.rank)))
    }
    fn all_gather_in_place(&self, out: &Tensor) -> Result<(), RtError> {
        crate::comm::in_place_rows(out, self.size)?;
        self.try_all_gather_in_place(out).map_err(|e| RtError::Comm(format!("rank {}: all-gather in place: {e}", self.rank)))
    }
    fn last_span(&self) -> Option<crate::comm::DeviceSpan> {
        NcclGroup::last_span(self)
    }
    fn reduce_scatter_start(&self, input: &Tensor) -> Result<crate::comm::Pending, RtError> {
        self.try_reduce_scatter_start(input).map_err(|e| RtError::Comm(format!("rank {}: reduce-scatter: {e}", self.rank)))
    }
    fn all_reduce_start(&self, input: &Tensor) -> Result<crate::comm::Pending, RtError> {
        self.try_all_reduce_start(input).map_err(|e| RtError::Comm(format!("rank {}: all-reduce: {e}", self.rank)))
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.try_reduce_scatter_avg(input).map_err(|e| RtError::Comm(format!("rank {}: reduce-scatter: {e}", self.rank)))
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.try_all_reduce_avg(input).map_err(|e| RtError::Comm(format!("rank {}: all-reduce: {e}", self.rank)))
    }
}

/// Checks shared by both builds: a contiguous tensor whose dim 0 splits evenly.
fn check_split(input: &Tensor, size: usize, what: &str) -> Result<(), CudaError> {
    let d0 = input.size().first().copied().unwrap_or(0);
    if input.dim() == 0 || d0 % size as i64 != 0 {
        return Err(CudaError::Tensor(format!("{what}: dim 0 ({d0}) of shape {:?} is not a multiple of the world size {size}", input.size())));
    }
    Ok(())
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{check_split, CudaError, UniqueId};
    use crate::cuda::{Device, Event, Stream};
    use crate::rendezvous::Rendezvous;
    use crate::watchdog::{Ledger, Watchdog};
    use cudarc::nccl::{result, sys};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use tch::{Kind, Tensor};

    fn nccl_err(what: &str) -> impl FnOnce(result::NcclError) -> CudaError + '_ {
        move |e| {
            let msg = unsafe {
                let p = sys::ncclGetErrorString(e.0);
                if p.is_null() {
                    format!("{:?}", e.0)
                } else {
                    format!("{:?}: {}", e.0, std::ffi::CStr::from_ptr(p).to_string_lossy())
                }
            };
            CudaError::Nccl { what: what.to_string(), error: msg }
        }
    }

    fn load() -> Result<(), CudaError> {
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoNccl("libnccl.so not loadable".into()));
        }
        Ok(())
    }

    /// NCCL's version as (major, minor, patch).
    pub fn version() -> Result<(u32, u32, u32), CudaError> {
        load()?;
        let v = result::get_nccl_version().map_err(nccl_err("ncclGetVersion"))? as u32;
        Ok((v / 10000, (v / 100) % 100, v % 100))
    }

    /// A fresh NCCL unique id (rank 0 only).
    pub fn unique_id() -> Result<UniqueId, CudaError> {
        load()?;
        let id = result::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// What the watchdog sees of a group: its communicator, the collectives in flight on its
    /// stream, and whether it was aborted (then no call may use it again).
    struct Watched {
        comm: sys::ncclComm_t,
        aborted: AtomicBool,
        ledger: Ledger<Arc<Event>>,
        label: String,
    }

    // The watchdog only reads the handle and calls ncclCommGetAsyncError / ncclCommAbort,
    // which NCCL allows from another thread.
    unsafe impl Send for Watched {}
    unsafe impl Sync for Watched {}

    /// The group's stream and what orders it with libtorch's (the communicator is
    /// [`Watched::comm`]); used under the group's mutex, one collective at a time.
    struct Inner {
        stream: Stream,
        ready: Event,
        compute: Stream,
    }

    /// One rank's NCCL communicator, its stream and the events that order it with libtorch's.
    pub struct NcclGroup {
        pub(super) rank: usize,
        pub(super) size: usize,
        inner: Mutex<Inner>,
        watched: Arc<Watched>,
        /// The last collective's start and end on the group's stream.
        last: Mutex<Option<crate::comm::DeviceSpan>>,
        /// (last: the streams and events above go before the context is released)
        device: Arc<Device>,
    }

    // The communicator is used under the mutex, from one thread at a time.
    unsafe impl Send for NcclGroup {}
    unsafe impl Sync for NcclGroup {}

    fn dtype(k: Kind) -> Result<sys::ncclDataType_t, CudaError> {
        use sys::ncclDataType_t::*;
        Ok(match k {
            Kind::Float => ncclFloat32,
            Kind::Double => ncclFloat64,
            Kind::Half => ncclFloat16,
            Kind::BFloat16 => ncclBfloat16,
            Kind::Int => ncclInt32,
            Kind::Int64 => ncclInt64,
            Kind::Int8 => ncclInt8,
            Kind::Uint8 => ncclUint8,
            k => return Err(CudaError::Tensor(format!("NCCL has no type for {k:?}"))),
        })
    }

    impl NcclGroup {
        /// Joins the communicator `id` as `rank` of `size` on CUDA device `ordinal`
        /// (collective: every rank must call it).
        pub fn new(rank: usize, size: usize, id: &UniqueId, ordinal: usize) -> Result<NcclGroup, CudaError> {
            load()?;
            // tch's CUDA tensors need libtorch_cuda in the process
            crate::cuda::load_torch_cuda()?;
            let device = Device::new(ordinal)?;
            let nid = sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
            let mut comm: sys::ncclComm_t = std::ptr::null_mut();
            unsafe { result::comm_init_rank(&mut comm, size as i32, nid, rank as i32) }.map_err(nccl_err("ncclCommInitRank"))?;
            NcclGroup::assemble(rank, size, device, comm)
        }

        /// This rank's communicator among the ranks that pass the same `color`, ordered by
        /// `key` (`ncclCommSplit`, the new communicator inherits this one's config): hybrid
        /// sharding's shard and replicate groups, as FSDP2's 2-D device mesh makes them, and
        /// `reshard_after_forward=N`'s post-forward groups.
        /// Collective over this group: every rank calls it, with splits in the same order.
        /// The new group has its own stream.
        pub fn split(&self, color: usize, key: usize) -> Result<NcclGroup, CudaError> {
            let _g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            self.usable("ncclCommSplit")?;
            let device = Device::new(self.device.ordinal)?;
            let mut comm: sys::ncclComm_t = std::ptr::null_mut();
            unsafe { sys::ncclCommSplit(self.watched.comm, color as i32, key as i32, &mut comm, std::ptr::null_mut()) }.result().map_err(nccl_err("ncclCommSplit"))?;
            let (rank, size) = unsafe { (result::comm_user_rank(comm), result::comm_count(comm)) };
            let (rank, size) = (rank.map_err(nccl_err("ncclCommUserRank"))? as usize, size.map_err(nccl_err("ncclCommCount"))? as usize);
            NcclGroup::assemble(rank, size, device, comm)
        }

        /// A group around communicator `comm` on `device`: its own stream and the events that
        /// order it with libtorch's compute stream.
        fn assemble(rank: usize, size: usize, device: Device, comm: sys::ncclComm_t) -> Result<NcclGroup, CudaError> {
            let stream = Stream::new(&device)?;
            let ready = Event::new(&device, false)?;
            let compute = Stream::legacy_default()?;
            let watched = Arc::new(Watched { comm, aborted: AtomicBool::new(false), ledger: Ledger::default(), label: format!("NCCL group of {size} (here rank {rank}) on cuda:{}", device.ordinal) });
            Ok(NcclGroup { rank, size, inner: Mutex::new(Inner { stream, ready, compute }), watched, last: Mutex::new(None), device: Arc::new(device) })
        }

        /// Refuses a communicator the watchdog aborted.
        fn usable(&self, what: &str) -> Result<(), CudaError> {
            match self.watched.aborted.load(Ordering::Acquire) {
                true => Err(CudaError::Nccl { what: what.to_string(), error: "the communicator was aborted by the watchdog".into() }),
                false => Ok(()),
            }
        }

        /// A timing event where the next collective starts on the group's stream.
        fn starting(&self, g: &Inner) -> Result<Arc<Event>, CudaError> {
            let start = Arc::new(Event::new(&self.device, true)?);
            start.record(&g.stream)?;
            Ok(start)
        }

        /// Records the end of a collective just issued on the group's stream (after
        /// `start`): for the watchdog, as the span of a measured timeline, and returned for
        /// whatever waits for the collective.
        fn issued(&self, g: &Inner, start: Arc<Event>, what: &str, numel: i64) -> Result<Arc<Event>, CudaError> {
            let end = Arc::new(Event::new(&self.device, true)?);
            end.record(&g.stream)?;
            self.watched.ledger.push(format!("{what} of {numel} elements"), start.clone(), end.clone());
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((start, end.clone()));
            Ok(end)
        }

        /// See [`crate::comm::Collective::last_span`] (taken: a span is reported once).
        pub fn last_span(&self) -> Option<crate::comm::DeviceSpan> {
            self.last.lock().unwrap_or_else(|e| e.into_inner()).take()
        }

        /// [`NcclGroup::new`] with a rendezvous' rank, size and id.
        pub fn from_rendezvous(rz: &Rendezvous, ordinal: usize) -> Result<NcclGroup, CudaError> {
            NcclGroup::new(rz.rank, rz.world_size, &rz.id, ordinal)
        }

        pub fn device(&self) -> tch::Device {
            tch::Device::Cuda(self.device.ordinal)
        }

        fn input(&self, t: &Tensor) -> Result<Tensor, CudaError> {
            if t.device() != self.device() {
                return Err(CudaError::Tensor(format!("rank {}: tensor on {:?}, the NCCL group is on {:?}", self.rank, t.device(), self.device())));
            }
            Ok(t.detach().contiguous())
        }

        /// Enqueues `op(send, recv, comm, stream)` on the group's stream after the compute
        /// stream's work so far, between timing events, then `after` with the end event. Should anything fail
        /// once NCCL may have the buffers, the group's stream is synchronized before the
        /// error returns, so that no buffer is freed (and reused) under NCCL.
        fn enqueue<T>(&self, g: &Inner, send: &Tensor, recv: &Tensor, what: &str, op: impl FnOnce(*const std::ffi::c_void, *mut std::ffi::c_void, sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>, after: impl FnOnce(&Inner, &Arc<Event>) -> Result<T, CudaError>) -> Result<T, CudaError> {
            self.usable(what)?;
            self.device.bind()?;
            g.ready.record(&g.compute)?;
            g.stream.wait(&g.ready)?;
            let start = self.starting(g)?;
            let r = op(send.data_ptr() as *const _, recv.data_ptr(), self.watched.comm, g.stream.raw() as sys::cudaStream_t)
                .map_err(nccl_err(what))
                .and_then(|_| self.issued(g, start, what, send.numel().max(recv.numel()) as i64))
                .and_then(|end| after(g, &end));
            if r.is_err() {
                let _ = g.stream.synchronize();
            }
            r
        }

        /// Runs `op` on the group's stream, ordered after and before the compute stream's work.
        fn run(&self, send: &Tensor, recv: &Tensor, what: &str, op: impl FnOnce(*const std::ffi::c_void, *mut std::ffi::c_void, sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>) -> Result<(), CudaError> {
            let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            self.enqueue(&g, send, recv, what, op, |g, end| g.compute.wait(end))
        }

        /// `op` left in flight on the group's stream: it starts after the compute stream's
        /// work so far, and the compute stream waits for it only in
        /// [`crate::comm::Pending::wait`]; `send` is kept alive until then (the caching
        /// allocator would otherwise hand its memory to a compute kernel while NCCL still
        /// reads it). `recv` was allocated on the compute stream before the launch, so no
        /// compute kernel still uses its memory when NCCL writes it.
        fn run_in_flight(&self, send: Tensor, recv: Tensor, what: &str, op: impl FnOnce(*const std::ffi::c_void, *mut std::ffi::c_void, sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>) -> Result<crate::comm::Pending, CudaError> {
            let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let end = self.enqueue(&g, &send, &recv, what, op, |_, end| Ok(end.clone()))?;
            Ok(crate::comm::Pending::in_flight(recv, send, end, self.device.clone()))
        }

        /// An all-gather left in flight until the copy-out that needs it.
        pub fn try_all_gather_start(&self, input: &Tensor) -> Result<crate::comm::Pending, CudaError> {
            let (x, out, ty) = self.gather_buffers(input)?;
            let n = x.numel();
            self.run_in_flight(x, out, "ncclAllGather", |s, r, c, st| unsafe { result::all_gather(s, r, n, ty, c, st) })
        }

        /// A reduce-scatter left in flight while the next unit's backward runs.
        pub fn try_reduce_scatter_start(&self, input: &Tensor) -> Result<crate::comm::Pending, CudaError> {
            let (x, out, ty) = self.scatter_buffers(input)?;
            let n = out.numel();
            self.run_in_flight(x, out, "ncclReduceScatter", |s, r, c, st| unsafe { result::reduce_scatter(s, r, n, ty, sys::ncclRedOp_t::ncclAvg, c, st) })
        }

        /// An all-reduce left in flight (no-shard's gradients).
        pub fn try_all_reduce_start(&self, input: &Tensor) -> Result<crate::comm::Pending, CudaError> {
            let x = self.input(input)?;
            let ty = dtype(x.kind())?;
            let out = Tensor::empty(x.size().as_slice(), (x.kind(), self.device()));
            let n = x.numel();
            self.run_in_flight(x, out, "ncclAllReduce", |s, r, c, st| unsafe { result::all_reduce(s, r, n, ty, sys::ncclRedOp_t::ncclAvg, c, st) })
        }

        /// A reduce-scatter's contiguous input, its output (the input's dim 0 ÷ the group
        /// size) and NCCL's type.
        fn scatter_buffers(&self, input: &Tensor) -> Result<(Tensor, Tensor, sys::ncclDataType_t), CudaError> {
            check_split(input, self.size, "reduce-scatter")?;
            let x = self.input(input)?;
            let ty = dtype(x.kind())?;
            let mut shape = x.size();
            shape[0] /= self.size as i64;
            let out = Tensor::empty(shape.as_slice(), (x.kind(), self.device()));
            Ok((x, out, ty))
        }

        /// An all-gather's contiguous input, its output (world size × the input along dim 0)
        /// and NCCL's type.
        fn gather_buffers(&self, input: &Tensor) -> Result<(Tensor, Tensor, sys::ncclDataType_t), CudaError> {
            let x = self.input(input)?;
            let ty = dtype(x.kind())?;
            let mut shape = x.size();
            if shape.is_empty() {
                shape.push(1);
            }
            shape[0] *= self.size as i64;
            let out = Tensor::empty(shape.as_slice(), (x.kind(), self.device()));
            Ok((x, out, ty))
        }

        pub fn try_all_gather(&self, input: &Tensor) -> Result<Tensor, CudaError> {
            let (x, out, ty) = self.gather_buffers(input)?;
            let n = x.numel();
            self.run(&x, &out, "ncclAllGather", |s, r, c, st| unsafe { result::all_gather(s, r, n, ty, c, st) })?;
            Ok(out)
        }

        /// An all-gather whose input is this rank's row of `out` (1-D, on the device): NCCL's
        /// in-place form (`sendbuff = recvbuff + rank · count`), nothing allocated.
        pub fn try_all_gather_in_place(&self, out: &Tensor) -> Result<(), CudaError> {
            if out.device() != self.device() || !out.is_contiguous() {
                return Err(CudaError::Tensor(format!("rank {}: an in-place all-gather's output must be contiguous on {:?} (it is on {:?})", self.rank, self.device(), out.device())));
            }
            let ty = dtype(out.kind())?;
            let row = out.numel() / self.size.max(1);
            let mine = out.narrow(0, (self.rank * row) as i64, row as i64);
            self.run(&mine, out, "ncclAllGather", |s, r, c, st| unsafe { result::all_gather(s, r, row, ty, c, st) })
        }

        pub fn try_reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, CudaError> {
            let (x, out, ty) = self.scatter_buffers(input)?;
            let n = out.numel();
            self.run(&x, &out, "ncclReduceScatter", |s, r, c, st| unsafe { result::reduce_scatter(s, r, n, ty, sys::ncclRedOp_t::ncclAvg, c, st) })?;
            Ok(out)
        }

        pub fn try_all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, CudaError> {
            let x = self.input(input)?;
            let ty = dtype(x.kind())?;
            let out = Tensor::empty(x.size().as_slice(), (x.kind(), self.device()));
            let n = x.numel();
            self.run(&x, &out, "ncclAllReduce", |s, r, c, st| unsafe { result::all_reduce(s, r, n, ty, sys::ncclRedOp_t::ncclAvg, c, st) })?;
            Ok(out)
        }
    }

    /// How long dropping a group waits for its collectives in flight before aborting it.
    const DRAIN: Duration = Duration::from_secs(30);

    /// Watches `groups` (all on one device) every half second: a collective that has not
    /// completed within `timeout`, or an asynchronous NCCL error, aborts every one of them
    /// (`ncclCommAbort`, which also ends the kernels that wait for a dead peer) and hands the
    /// message to `on_fail`, which is expected to end the process. Stops when dropped.
    pub fn watchdog(groups: &[&NcclGroup], timeout: Duration, on_fail: impl FnOnce(String) + Send + 'static) -> Result<Watchdog, CudaError> {
        let watched: Vec<Arc<Watched>> = groups.iter().map(|g| g.watched.clone()).collect();
        let Some(first) = groups.first() else {
            return Ok(Watchdog::start(Duration::from_secs(3600), || Ok(()), |_| {}));
        };
        let device = Device::new(first.device.ordinal)?;
        let seen = watched.clone();
        let check = move || -> Result<(), String> {
            device.bind().map_err(|e| e.to_string())?;
            for w in seen.iter().filter(|w| !w.aborted.load(Ordering::Acquire)) {
                let mut r = sys::ncclResult_t::ncclSuccess;
                unsafe { sys::ncclCommGetAsyncError(w.comm, &mut r) }.result().map_err(|e| format!("{}: ncclCommGetAsyncError: {:?}", w.label, e.0))?;
                if !matches!(r, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) {
                    let why = nccl_err("asynchronous error")(result::NcclError(r));
                    return Err(format!("{}: {why}", w.label));
                }
                w.ledger.check(Instant::now(), timeout).map_err(|e| format!("{}: {e}", w.label))?;
            }
            Ok(())
        };
        let fail = move |msg: String| {
            for w in &watched {
                if !w.aborted.swap(true, Ordering::AcqRel) {
                    unsafe {
                        let _ = sys::ncclCommAbort(w.comm);
                    }
                }
            }
            on_fail(msg)
        };
        Ok(Watchdog::start(Duration::from_millis(500), check, fail))
    }

    impl Drop for NcclGroup {
        fn drop(&mut self) {
            if self.watched.aborted.swap(true, Ordering::AcqRel) {
                // aborted by the watchdog: the communicator is gone
                return;
            }
            let _ = self.device.bind();
            // ncclCommDestroy waits for the communicator's pending work: when that does not
            // finish (an error path with a peer gone), abort instead of hanging
            unsafe {
                if self.watched.ledger.drain(DRAIN) {
                    let _ = result::comm_destroy(self.watched.comm);
                } else {
                    let _ = sys::ncclCommAbort(self.watched.comm);
                }
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{check_split, CudaError, UniqueId};
    use crate::rendezvous::Rendezvous;
    use std::convert::Infallible;
    use tch::Tensor;

    pub fn version() -> Result<(u32, u32, u32), CudaError> {
        Err(CudaError::NotBuilt)
    }
    pub fn unique_id() -> Result<UniqueId, CudaError> {
        Err(CudaError::NotBuilt)
    }
    pub fn watchdog(_groups: &[&NcclGroup], _timeout: std::time::Duration, _on_fail: impl FnOnce(String) + Send + 'static) -> Result<crate::watchdog::Watchdog, CudaError> {
        Err(CudaError::NotBuilt)
    }

    pub struct NcclGroup {
        pub(super) rank: usize,
        pub(super) size: usize,
        never: Infallible,
    }

    impl NcclGroup {
        pub fn new(_rank: usize, _size: usize, _id: &UniqueId, _ordinal: usize) -> Result<NcclGroup, CudaError> {
            Err(CudaError::NotBuilt)
        }
        pub fn from_rendezvous(_rz: &Rendezvous, _ordinal: usize) -> Result<NcclGroup, CudaError> {
            Err(CudaError::NotBuilt)
        }
        pub fn split(&self, _color: usize, _key: usize) -> Result<NcclGroup, CudaError> {
            match self.never {}
        }
        pub fn last_span(&self) -> Option<crate::comm::DeviceSpan> {
            match self.never {}
        }
        pub fn device(&self) -> tch::Device {
            match self.never {}
        }
        pub fn try_all_gather_start(&self, _input: &Tensor) -> Result<crate::comm::Pending, CudaError> {
            match self.never {}
        }
        pub fn try_all_gather(&self, _input: &Tensor) -> Result<Tensor, CudaError> {
            match self.never {}
        }
        pub fn try_all_gather_in_place(&self, _out: &Tensor) -> Result<(), CudaError> {
            match self.never {}
        }
        pub fn try_reduce_scatter_start(&self, _input: &Tensor) -> Result<crate::comm::Pending, CudaError> {
            match self.never {}
        }
        pub fn try_all_reduce_start(&self, _input: &Tensor) -> Result<crate::comm::Pending, CudaError> {
            match self.never {}
        }
        pub fn try_reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, CudaError> {
            check_split(input, self.size, "reduce-scatter")?;
            match self.never {}
        }
        pub fn try_all_reduce_avg(&self, _input: &Tensor) -> Result<Tensor, CudaError> {
            match self.never {}
        }
    }
}
