//! Safe wrappers over `csrc/shim.cpp`: what the executor needs from libtorch that tch does not
//! expose — a counting CPU allocator ([`MemTracker`]) and the plan arena on top of it
//! ([`Arena`]), FSDP2's in-place storage free/refill of unsharded params, a version-preserving
//! copy, one op's backward from its autograd edge with an upstream gradient ([`backward`]),
//! and transformers' grouped matmul with autograd ([`grouped_mm`]).

use crate::error::RtError;
use std::ffi::{c_char, c_int, c_void, CStr};
use tch::Tensor;

extern "C" {
    fn fsdp_last_error() -> *const c_char;
    fn fsdp_cpu_capability(out: *mut c_char, cap: i64) -> i64;
    fn fsdp_mem_tracker_new() -> i64;
    fn fsdp_mem_tracker_enter(id: i64);
    fn fsdp_mem_tracker_stats(id: i64, cur: *mut i64, peak: *mut i64, reset_peak: c_int);
    fn fsdp_mem_tracker_drop(id: i64);
    fn fsdp_storage_resize(t: *const c_void, nbytes: i64) -> c_int;
    fn fsdp_copy_keep_version(dst: *const c_void, src: *const c_void) -> c_int;
    fn fsdp_edge(t: *const c_void) -> *mut c_void;
    fn fsdp_boundary(t: *const c_void) -> *mut c_void;
    fn fsdp_arena_new(bytes: i64) -> i64;
    fn fsdp_arena_new_cuda(bytes: i64, device: c_int) -> i64;
    fn fsdp_arena_enter(id: i64);
    fn fsdp_arena_leave(id: i64);
    fn fsdp_cuda_arena_selftest() -> c_int;
    fn fsdp_cuda_arena_install() -> c_int;
    fn fsdp_cuda_arena_built() -> c_int;
    fn fsdp_arena_expect(id: i64, offs: *const i64, sizes: *const i64, n: i64);
    fn fsdp_arena_stats(id: i64, out: *mut i64);
    fn fsdp_arena_assign(id: i64, quads: *const i64, n: i64);
    fn fsdp_arena_reset(id: i64);
    fn fsdp_arena_log(id: i64, out: *mut i64, cap: i64) -> i64;
    fn fsdp_arena_free(id: i64) -> c_int;
    fn fsdp_add_scaled_(w: *const c_void, g: *const c_void, alpha: f64) -> c_int;
    fn fsdp_addc_(w: *const c_void, t1: *const c_void, t2: *const c_void, value: f64, div: c_int) -> c_int;
    fn fsdp_cuda_mem(device: c_int, reset_peak: c_int, current: *mut i64, peak: *mut i64) -> c_int;
    fn fsdp_grouped_mm(input: *const c_void, weight: *const c_void, offs: *const c_void) -> *mut c_void;
    fn fsdp_edge_free(e: *mut c_void);
    fn fsdp_edge_same(a: *mut c_void, b: *mut c_void) -> c_int;
    fn fsdp_backward(root: *mut c_void, grad: *mut c_void, inputs: *const *mut c_void, n: i64, seeds: *const *mut c_void, out: *mut *mut c_void) -> c_int;
}

/// The CPU capability libtorch's kernels run at, lowercase (`default`, `avx2`, `avx512`, …;
/// `torch.backends.cpu.get_cpu_capability()`): vectorized kernels of different widths sum in
/// different orders, so results agree bit for bit only within one capability.
pub fn cpu_capability() -> String {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the shim writes at most `buf.len()` bytes, NUL-terminated.
    unsafe { fsdp_cpu_capability(buf.as_mut_ptr(), buf.len() as i64) };
    // SAFETY: NUL-terminated by the shim (buf is zeroed and the shim leaves room for the NUL).
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_lowercase()
}

fn last_error(what: &str) -> RtError {
    // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(fsdp_last_error()) }.to_string_lossy().into_owned();
    RtError::Plan(format!("{what}: {msg}"))
}

fn ptr(t: &Tensor) -> *const c_void {
    t.as_ptr().cast()
}

/// `w += alpha · g` in place, in one kernel (`Tensor::add_` with `alpha`, which tch lacks).
pub fn add_scaled_(w: &Tensor, g: &Tensor, alpha: f64) -> Result<(), RtError> {
    // SAFETY: two live tensors.
    match unsafe { fsdp_add_scaled_(ptr(w), ptr(g), alpha) } {
        0 => Ok(()),
        _ => Err(last_error("add_")),
    }
}

/// `w += value · t1 · t2` in place (`Tensor::addcmul_` with `value`, which tch lacks).
pub fn addcmul_(w: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<(), RtError> {
    // SAFETY: three live tensors.
    match unsafe { fsdp_addc_(ptr(w), ptr(t1), ptr(t2), value, 0) } {
        0 => Ok(()),
        _ => Err(last_error("addcmul_")),
    }
}

/// `w += value · t1 / t2` in place (`Tensor::addcdiv_` with `value`, which tch lacks).
pub fn addcdiv_(w: &Tensor, t1: &Tensor, t2: &Tensor, value: f64) -> Result<(), RtError> {
    // SAFETY: three live tensors.
    match unsafe { fsdp_addc_(ptr(w), ptr(t1), ptr(t2), value, 1) } {
        0 => Ok(()),
        _ => Err(last_error("addcdiv_")),
    }
}

/// libtorch's CUDA caching allocator on device `ordinal`: (bytes allocated now, the most
/// allocated since the last reset), as `torch.cuda.memory_allocated` /
/// `max_memory_allocated`; `reset_peak` then starts a new peak (`reset_peak_memory_stats`).
/// An error where libtorch has no CUDA allocator (a CPU-only build or machine).
pub fn cuda_allocator_bytes(ordinal: usize, reset_peak: bool) -> Result<(u64, u64), RtError> {
    let (mut cur, mut peak) = (0i64, 0i64);
    // SAFETY: writes two i64s through valid pointers.
    match unsafe { fsdp_cuda_mem(ordinal as c_int, c_int::from(reset_peak), &mut cur, &mut peak) } {
        0 => Ok((cur.max(0) as u64, peak.max(0) as u64)),
        _ => Err(last_error("CUDA allocator stats")),
    }
}

/// Counts the CPU bytes libtorch allocates on the threads that [`MemTracker::enter`]ed it,
/// until they are freed (by any thread): current and peak.
pub struct MemTracker(i64);

impl MemTracker {
    #[allow(clippy::new_without_default)]
    pub fn new() -> MemTracker {
        // SAFETY: installs the allocator once, then only touches the shim's own table.
        MemTracker(unsafe { fsdp_mem_tracker_new() })
    }
    /// Charges this thread's next allocations to the tracker.
    pub fn enter(&self) {
        // SAFETY: sets a thread-local id.
        unsafe { fsdp_mem_tracker_enter(self.0) }
    }
    /// Stops charging this thread's allocations to any tracker.
    pub fn leave() {
        // SAFETY: sets a thread-local id.
        unsafe { fsdp_mem_tracker_enter(0) }
    }
    /// (current, peak) bytes; `reset_peak` makes the peak the current value afterwards.
    pub fn stats(&self, reset_peak: bool) -> (u64, u64) {
        let (mut cur, mut peak) = (0i64, 0i64);
        // SAFETY: writes two i64s through valid pointers.
        unsafe { fsdp_mem_tracker_stats(self.0, &mut cur, &mut peak, c_int::from(reset_peak)) };
        (cur.max(0) as u64, peak.max(0) as u64)
    }
}

impl Drop for MemTracker {
    fn drop(&mut self) {
        // SAFETY: removes the id from the shim's table; later frees of its memory are ignored.
        unsafe { fsdp_mem_tracker_drop(self.0) }
    }
}

/// A plan's arena: one block of the plan's arena size. While a thread that
/// [`MemTracker::enter`]ed a tracker has also [`Arena::enter`]ed it, every allocation is
/// recorded ([`Arena::log`]: schedule op, ordinal in the op, size, when freed) and placed:
/// with an assignment ([`Arena::assign`], made by [`crate::placement`] from an earlier step's
/// record) at the offset assigned to its (op, ordinal) when its size is the recorded one;
/// without one, at the offset of a buffer of its size that the plan allocates in the current
/// schedule op ([`Arena::expect`]). Never where a placed tensor is still alive: then, and for
/// what has no place, the heap serves it. So the plan's offsets are used where the run
/// allocates what the plan says, and checked (a live tensor is never overwritten) always.
pub struct Arena {
    id: i64,
    /// What the block adds to the CUDA caching allocator's allocated bytes (0 on the CPU).
    device_bytes: u64,
}

/// Where a step's allocations go: `(epoch, ordinal, offset or None for the heap, bytes)`.
pub type Assignment = Vec<(u32, u32, Option<u64>, u64)>;

/// One allocation an arena saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocRec {
    /// The schedule op it happened in (`index + 1`; 0 before the first op).
    pub epoch: u32,
    /// Its place among the op's allocations.
    pub ordinal: u32,
    pub bytes: u64,
    /// Order of the arena's allocations and frees.
    pub alloc_seq: u64,
    /// When it was freed (sequence number and schedule op), if it was.
    pub free: Option<(u64, u32)>,
}

/// What an arena placed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ArenaStats {
    /// Bytes and allocations placed at the plan's offsets.
    pub placed_bytes: u64,
    pub placed: u64,
    /// Bytes and allocations the heap served (no planned buffer of that size in the op).
    pub heap_bytes: u64,
    pub heap: u64,
    /// Allocations refused a planned offset because a placed tensor there was still alive.
    pub overlaps: u64,
    /// Replayed allocations that were not the ones the assignment was made for.
    pub mismatched: u64,
}

impl Arena {
    pub fn new(bytes: u64) -> Result<Arena, RtError> {
        // SAFETY: allocates a block owned by the shim.
        match unsafe { fsdp_arena_new(bytes as i64) } {
            0 => Err(RtError::Plan(format!("cannot allocate a {bytes}-byte arena"))),
            id => Ok(Arena { id, device_bytes: 0 }),
        }
    }
    /// A GPU arena on CUDA device `ordinal`: its block is one allocation of libtorch's CUDA
    /// caching allocator, and an allocator put in front of that one (once per process; it
    /// passes everything through outside an arena step) places the step's CUDA allocations
    /// in it. One GPU per process: allocations on another device are never placed. An error
    /// in a build without the `cuda` feature, or when libtorch_cuda is not loaded.
    pub fn new_cuda(bytes: u64, ordinal: usize) -> Result<Arena, RtError> {
        let what = || format!("cannot make a {bytes}-byte arena on cuda:{ordinal}");
        let allocated = || cuda_allocator_bytes(ordinal, false).map(|x| x.0).map_err(|e| RtError::Plan(format!("{}: {e}", what())));
        // SAFETY: swaps libtorch's CUDA allocator for a wrapper that passes everything through.
        if unsafe { fsdp_cuda_arena_install() } != 0 {
            return Err(last_error(&what()));
        }
        let before = allocated()?;
        // SAFETY: allocates a block through libtorch's CUDA allocator, owned by the shim.
        let id = match unsafe { fsdp_arena_new_cuda(bytes as i64, ordinal as c_int) } {
            0 => return Err(last_error(&what())),
            id => id,
        };
        let mut a = Arena { id, device_bytes: 0 }; // dropped (freed) if the count fails
        a.device_bytes = allocated()?.saturating_sub(before);
        Ok(a)
    }
    /// What the block adds to the CUDA caching allocator's allocated bytes
    /// (`torch.cuda.memory_allocated`): its size rounded as that allocator rounds; 0 for a
    /// CPU arena.
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes
    }
    /// Places allocations in this arena: for a CPU arena, this thread's tracked ones (the
    /// thread must have [`MemTracker::enter`]ed a tracker); for a GPU arena, every CUDA
    /// allocation of the process on its device (the autograd engine runs a CUDA backward on
    /// a thread of its own).
    pub fn enter(&self) {
        // SAFETY: sets a thread-local or process-wide id.
        unsafe { fsdp_arena_enter(self.id) }
    }
    /// Stops placing allocations in this arena.
    pub fn leave(&self) {
        // SAFETY: clears the ids that name this arena.
        unsafe { fsdp_arena_leave(self.id) }
    }
    /// The (offset, bytes) of the buffers the plan allocates in the op about to run.
    pub fn expect(&self, slots: &[(u64, u64)]) {
        let offs: Vec<i64> = slots.iter().map(|s| s.0 as i64).collect();
        let sizes: Vec<i64> = slots.iter().map(|s| s.1 as i64).collect();
        // SAFETY: two arrays of `len` i64s.
        unsafe { fsdp_arena_expect(self.id, offs.as_ptr(), sizes.as_ptr(), offs.len() as i64) }
    }
    /// From now on places the allocation `(epoch, ordinal)` at `offset` (`None`: the heap)
    /// when it has `bytes`; another size, or an allocation not listed, counts as
    /// [`ArenaStats::mismatched`] (replaces the per-op matching of [`Arena::expect`]).
    pub fn assign(&self, quads: &[(u32, u32, Option<u64>, u64)]) {
        let flat: Vec<i64> = quads.iter().flat_map(|q| [q.0 as i64, q.1 as i64, q.2.map_or(-1, |o| o as i64), q.3 as i64]).collect();
        // SAFETY: 4·len i64s.
        unsafe { fsdp_arena_assign(self.id, flat.as_ptr(), quads.len() as i64) }
    }
    /// Starts a new step: clears the record and the statistics (the block and the assignment
    /// stay, so each step reuses the memory the previous one touched).
    pub fn reset(&self) {
        // SAFETY: only touches the shim's own table.
        unsafe { fsdp_arena_reset(self.id) }
    }
    /// Every allocation since the last reset, in order.
    pub fn log(&self) -> Vec<AllocRec> {
        // SAFETY: cap 0 writes nothing; then a buffer of 6·n i64s.
        let n = unsafe { fsdp_arena_log(self.id, std::ptr::null_mut(), 0) }.max(0) as usize;
        let mut v = vec![0i64; 6 * n];
        let m = unsafe { fsdp_arena_log(self.id, v.as_mut_ptr(), n as i64) }.max(0) as usize;
        v.chunks_exact(6)
            .take(m.min(n))
            .map(|r| AllocRec { epoch: r[0] as u32, ordinal: r[1] as u32, bytes: r[2] as u64, alloc_seq: r[3] as u64, free: (r[4] >= 0).then_some((r[4] as u64, r[5] as u32)) })
            .collect()
    }
    pub fn stats(&self) -> ArenaStats {
        let mut o = [0i64; 6];
        // SAFETY: writes six i64s.
        unsafe { fsdp_arena_stats(self.id, o.as_mut_ptr()) };
        ArenaStats {
            placed_bytes: o[0] as u64,
            placed: o[1] as u64,
            heap_bytes: o[2] as u64,
            heap: o[3] as u64,
            overlaps: o[4] as u64,
            mismatched: o[5] as u64,
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: frees the block unless placed tensors are alive (then it stays allocated).
        unsafe { fsdp_arena_free(self.id) };
    }
}

/// Frees `t`'s storage in place (every tensor and saved variable sharing it sees size 0), as
/// FSDP2's reshard does with `untyped_storage().resize_(0)`.
pub fn free_storage(t: &Tensor) -> Result<(), RtError> {
    // SAFETY: `t` is a live tensor handle.
    match unsafe { fsdp_storage_resize(ptr(t), 0) } {
        0 => Ok(()),
        _ => Err(last_error("freeing storage")),
    }
}

/// Re-allocates `t`'s storage (freed by [`free_storage`]), contents undefined until written
/// with [`copy_keep_version`].
pub fn realloc_storage(t: &Tensor) -> Result<(), RtError> {
    let nbytes = (t.numel() * t.kind().elt_size_in_bytes()) as i64;
    // SAFETY: `t` is a live tensor handle.
    match unsafe { fsdp_storage_resize(ptr(t), nbytes) } {
        0 => Ok(()),
        _ => Err(last_error("re-allocating storage")),
    }
}

/// `dst.copy_(src)` without autograd and without bumping the version counter `dst` shares
/// with its base, so what autograd saved of an unsharded param stays valid after a refill.
pub fn copy_keep_version(dst: &Tensor, src: &Tensor) -> Result<(), RtError> {
    // SAFETY: both are live tensor handles with allocated storage.
    match unsafe { fsdp_copy_keep_version(ptr(dst), ptr(src)) } {
        0 => Ok(()),
        _ => Err(last_error("copying into unsharded param")),
    }
}

/// The autograd edge a tensor's gradient flows into (its grad_fn and output number, or a
/// leaf's grad accumulator). Holding it keeps the graph behind it, not the tensor.
pub struct Edge(*mut c_void);

impl Edge {
    /// `None` when `t` does not require grad.
    pub fn of(t: &Tensor) -> Option<Edge> {
        // SAFETY: `t` is a live tensor handle; null means no edge.
        let e = unsafe { fsdp_edge(ptr(t)) };
        (!e.is_null()).then_some(Edge(e))
    }
    pub fn same(&self, other: &Edge) -> bool {
        // SAFETY: both boxes are live.
        unsafe { fsdp_edge_same(self.0, other.0) != 0 }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        // SAFETY: the box was created by `fsdp_edge` and is freed once.
        unsafe { fsdp_edge_free(self.0) }
    }
}

/// A tensor sharing `t`'s storage whose gradient stops at a node of its own (leading on to
/// `t`'s producer, if `t` requires grad): an op computed from boundaries is a piece of the
/// graph whose backward can run alone, from its output edge to its boundaries' edges.
pub fn boundary(t: &Tensor) -> Result<Tensor, RtError> {
    // SAFETY: `t` is a live handle; the shim returns a new heap tensor we own, or null.
    let p = unsafe { fsdp_boundary(ptr(t)) };
    if p.is_null() {
        return Err(last_error("op boundary"));
    }
    // SAFETY: `p` is a heap at::Tensor created for us.
    Ok(unsafe { Tensor::from_ptr(p.cast()) })
}

/// Grouped matmul with autograd: rows `[offs[i-1], offs[i])` of `input` [S, k] times
/// `weight[i]` [k, n] → [S, n] (`offs`: cumulative rows per group, int32/int64). It saves
/// input, weight and offsets for backward, like transformers' grouped-mm fallback.
pub fn grouped_mm(input: &Tensor, weight: &Tensor, offs: &Tensor) -> Result<Tensor, RtError> {
    // SAFETY: live handles; the shim returns a new heap tensor we own, or null.
    let p = unsafe { fsdp_grouped_mm(ptr(input), ptr(weight), ptr(offs)) };
    if p.is_null() {
        return Err(last_error("grouped mm"));
    }
    // SAFETY: `p` is a heap at::Tensor created for us.
    Ok(unsafe { Tensor::from_ptr(p.cast()) })
}

/// Backward of the graph behind `root` with upstream gradient `grad` (freeing what it runs
/// through, as `retain_graph=False`): the gradient reaching each of `inputs` (undefined
/// tensors where none reaches), like `torch.autograd.grad(out, inputs, grad)`. `grad` is
/// taken, so that (when nothing else holds it) it is freed once the first node has used it,
/// as inside one whole-model backward. `seeds[i]`: the gradient `inputs[i]` already has from
/// later consumers, taken and summed into its result first, in the order one whole-model
/// backward sums them (see `fsdp_backward` in csrc/shim.cpp).
pub fn backward(root: &Edge, grad: Tensor, inputs: &[&Edge], seeds: Vec<Option<Tensor>>) -> Result<Vec<Tensor>, RtError> {
    let mut grad = grad;
    let ins: Vec<*mut c_void> = inputs.iter().map(|e| e.0).collect();
    let mut out: Vec<*mut c_void> = vec![std::ptr::null_mut(); ins.len()];
    let mut seeds: Vec<Option<Tensor>> = seeds;
    seeds.resize_with(ins.len(), || None);
    let seed_ptrs: Vec<*mut c_void> = seeds.iter_mut().map(|s| s.as_mut().map_or(std::ptr::null_mut(), |t| t.as_mut_ptr().cast())).collect();
    // SAFETY: all boxes, the grad and the seeds are live; the shim fills `out` with new tensor
    // handles and leaves the grad and the seeds it takes undefined.
    let rc = unsafe { fsdp_backward(root.0, grad.as_mut_ptr().cast(), ins.as_ptr(), ins.len() as i64, seed_ptrs.as_ptr(), out.as_mut_ptr()) };
    if rc != 0 {
        return Err(last_error("backward"));
    }
    // SAFETY: each pointer is a heap at::Tensor the shim created for us to own.
    Ok(out.into_iter().map(|p| unsafe { Tensor::from_ptr(p.cast()) }).collect())
}

/// Whether this build has the GPU arena ([`Arena::new_cuda`]): a `cuda` build that found the
/// CUDA runtime headers (`scripts/setup-venv.sh` installs them); without it a GPU run
/// allocates from libtorch's caching allocator.
pub fn cuda_arena_built() -> bool {
    // SAFETY: returns a constant.
    unsafe { fsdp_cuda_arena_built() != 0 }
}

/// Runs the GPU arena's allocator (the one put in front of libtorch's CUDA caching allocator)
/// over a fake caching allocator in host memory: placement, recorded heap allocations and
/// frees, the device check, the deleters. `Ok(false)` in a build without it (no `cuda`
/// feature, or no CUDA headers at build time).
pub fn cuda_arena_selftest() -> Result<bool, RtError> {
    // SAFETY: works on the shim's own tables and host memory only.
    match unsafe { fsdp_cuda_arena_selftest() } {
        0 => Ok(true),
        2 => Ok(false),
        _ => Err(last_error("GPU arena")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_arena_allocator_places_records_and_frees() {
        match cuda_arena_selftest() {
            Ok(true) => {}
            Ok(false) => {
                if cfg!(feature = "cuda") {
                    panic!("a cuda build must compile the GPU arena (CUDA headers from scripts/setup-venv.sh)");
                }
                eprintln!("SKIPPED: built without the `cuda` feature");
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn cuda_allocator_stats_report_why_without_a_gpu() {
        match cuda_allocator_bytes(0, false) {
            // a GPU machine: the counters of device 0
            Ok((cur, peak)) => assert!(peak >= cur, "{cur} {peak}"),
            Err(e) => {
                let m = e.to_string();
                assert!(m.starts_with("CUDA allocator stats: "), "{m}");
                eprintln!("SKIPPED on this machine (no CUDA device): {m}");
            }
        }
    }
}
