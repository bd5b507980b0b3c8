//! Pass 6 (optional), reserved memory: replays the plan's allocations through a model of
//! PyTorch's CUDA caching allocator to predict `torch.cuda.max_memory_reserved()` — the
//! tensor peak plus what block rounding, segment sizes, per-stream pools and fragmentation
//! add — and what the process holds beyond it (CUDA context, NCCL buffers), which is what
//! makes a plan that "fits" at 78 GiB fail at 80.
//!
//! The allocator (`c10/cuda/CUDACachingAllocator.cpp`, PyTorch 2.x; constants quoted in
//! `/work/notes/hw-constants.md` §6 and below):
//! - requests round up to 512 B (`kMinBlockSize`); ≤ 1 MiB (`kSmallSize`) is the small pool;
//! - pools are per stream: a block freed on one stream serves only that stream's requests
//!   (FSDP2 allocates all-gather outputs on its all-gather stream, reduce-scatter inputs and
//!   outputs — the sharded grads are views of them — on its reduce-scatter stream);
//! - a request takes the smallest cached free block that holds it (best fit, lowest address
//!   among equals) and splits it if the remainder is ≥ 512 B (small pool, or expandable
//!   segments) or > 1 MiB (large pool); freed blocks merge with free neighbours;
//! - with nothing cached that fits, a new segment: 2 MiB for small requests, 20 MiB for
//!   requests under 10 MiB, else the request rounded up to 2 MiB (`get_allocation_size`);
//! - `expandable_segments:True`: one segment per pool that grows by mapping pages (2 MiB
//!   small, 20 MiB large) at its end, extending a free block at the end; best fit prefers
//!   blocks inside the mapped range;
//! - when a new segment would exceed the device, cached free segments (and an expandable
//!   segment's free tail) are released first, then the request fails (out of memory).
//!
//! The replay runs two steps: the sharded params exist before the first; the optimizer
//! state is created lazily at the first optimizer step (torch.optim's `_init_group`), when
//! the first step's activations lie freed in the cache — which is how real runs fragment.
//! Buffers of per-param tensors (FSDP2's unsharded params, sharded params, optimizer state)
//! are allocated one tensor per param; a relabeled buffer ([`BufferInfo::continues`]) keeps
//! its predecessors' blocks. cuBLAS workspaces come from the same allocator (32 MiB per
//! handle and stream on sm90, 8 MiB + 128 KiB before: `CublasHandlePool.cpp`), one for the
//! forward thread and one for the autograd engine's thread.
//!
//! FSDP1 on a GPU (`--layout flat`) frees each unsharded flat param with `record_stream` on
//! the compute stream (`FlatParamHandle._free_unsharded_flat_param`): the allocator's `free`
//! then only records an event, and the block stays active — neither reusable nor counted
//! out of `active_bytes` — until a later request finds the event passed
//! (`insert_events` / `process_events`). The CPU runs ahead of the GPU in eager mode as far
//! as FSDP1's rate limiter lets it (`limit_all_gathers`, the default): each reshard queues
//! an event, and before each unshard the CPU waits for the oldest queued one once two or
//! more are queued — one per unshard (`_FreeEventQueue.dequeue_if_needed`). The replay keeps
//! that queue: a freed flat param is released when the CPU has waited for its free (the CPU
//! far ahead: the GPU passes a free no sooner than the CPU waits for it). The queue starts
//! empty, and the first step ends with more in it than it started with (the root reshards
//! after backward, and the first unshards do not wait): what stays pending grows over the
//! first step and repeats from the second (Llama-2-7B, 8 GPUs, full AC: two flat params
//! pending at the first step's peak, three at the second's; four queued at the end of
//! each). FSDP2 frees nothing with `record_stream`.
//!
//! Gradient accumulation repeats one micro-batch: from the second on, those before the last
//! allocate and free alike ([`Periods`] checks it on the schedule: each the one before with
//! its own buffers). Where the allocator comes back to a state it was in one to eight
//! micro-batches before — the same segments and blocks, the same blocks held by the buffers
//! that correspond — every later period repeats it, peaks included, so the replay jumps
//! ahead by whole periods to within one period of the last micro-batch (the held blocks
//! passed to the buffers of as many micro-batches later). The starts of micro-batches 2 to
//! 11 are compared. Where only the large pools' part repeats — the small pools' blocks
//! drifting through the cache (a 512-byte activation placed 512 bytes lower at each
//! micro-batch) — the jump replays the skipped micro-batches' small requests alone
//! ([`small_jump`]; the two kinds of pool share nothing but the device's capacity, and the
//! jump is taken only where no segment is made or released), itself jumping once the small
//! pools' state repeats. Exact, not an approximation: a state that does not repeat is
//! replayed in full (`tests/reserved.rs` holds the two equal for 1 to 16 micro-batches). A
//! step of many micro-batches then costs about what the few do that it takes the state to
//! repeat (5 to 11 on the test's cases). A steady plan ([`Plan::steady`]: the plan of more
//! micro-batches is it with its second-to-last repeated) is replayed so as the plan of more
//! ([`needed_within_longer`]): the jump goes to the micro-batch that leaves as many before
//! the last, modulo the period, as the longer plan's jump does.

use crate::hardware::Hardware;
use crate::options::{Device, Layout, Optimizer, Options, Strategy};
use crate::ids::BufferId;
use crate::plan::{BufferInfo, Category, Event, OpKind, Phase, Plan, Stream};
use crate::units::Unit;
use std::collections::BTreeMap;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;
const LARGE_BUFFER: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;
const MIB: u64 = 1 << 20;
/// Steps replayed: the first creates the optimizer state amid the freed activations; the
/// second is the steady state (a third repeats the second's peak: tested).
pub const STEPS: usize = 2;

/// CUDA context of a process with lazy module loading: "around 400MB if CUDA >= 11.7 is used
/// and lazy module loading enabled" (ptrblck, pytorch issue #109888); kernels of cuBLAS,
/// cuDNN and NCCL loaded on first use bring it to ~0.5 GiB (estimate, hw-constants §6.3).
pub const CUDA_CONTEXT_BYTES: u64 = 512 * MIB;
/// NCCL's buffers per communicator: Simple 4 MiB + LL 512 KiB + LL128 4.69 MiB per channel
/// connection (`nccl/src/include/device.h`), ~24 ring channels on 8 NVLink GPUs ≈ 220 MiB
/// (hw-constants §6.4, derived); taken as 256 MiB per communicator.
pub const NCCL_COMM_BYTES: u64 = 256 * MIB;

/// What the allocator model predicts for one rank.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Reserved {
    /// `torch.cuda.max_memory_reserved()`: the most the allocator held in segments.
    pub max_reserved_bytes: u64,
    /// `max_memory_allocated()`-like active bytes: blocks handed out (requests rounded to
    /// 512 B, unsplit remainders included, cuBLAS workspaces included).
    pub max_active_bytes: u64,
    /// cuBLAS workspaces held from the first GEMM on.
    pub workspace_bytes: u64,
    /// CUDA context (outside the allocator).
    pub context_bytes: u64,
    /// NCCL communicator buffers (outside the allocator): one communicator per process group.
    pub nccl_bytes: u64,
    /// What the process holds on the device at its peak: reserved + context + NCCL.
    pub device_bytes: u64,
    /// Whether a request could not be served within the device's memory even after the
    /// cache was released (the run would fail with CUDA out of memory).
    pub out_of_memory: bool,
    /// With `out_of_memory`: what the allocator would have reserved to serve that request,
    /// plus the context and NCCL — a floor of what the run needs (more than the device).
    pub out_of_memory_need_bytes: u64,
    /// Segments (or mapped pages of expandable segments) at the end of the replay.
    pub segments: usize,
}

/// The pool a request is served from: its stream and whether it is small.
type PoolKey = (u8, bool);

/// No block (the end of a segment's list).
const NONE: u32 = u32::MAX;

/// The largest device the free blocks' addresses describe (offsets in 512-byte units, 34 bits:
/// 8 TiB).
const MAX_CAPACITY: u64 = (1 << 34) * MIN_BLOCK - 1;
/// Segments a replay may create (a request past them fails as out of memory; 25 bits of a
/// free block's address).
const MAX_SEGMENTS: usize = 1 << 25;

/// A pool's index among the free set's sixteen: stream 3 bits, small 1.
fn pool_index(pool: PoolKey) -> u8 {
    ((pool.0 & 7) << 1) | u8::from(pool.1)
}

/// A free block's address, the best-fit order among blocks of one size (the caching
/// allocator orders its free blocks by stream, size, address): segment, then offset.
fn address(seg: usize, off: u64) -> u64 {
    ((seg as u64) << 34) | (off / MIN_BLOCK)
}

/// A block of a segment, in its segment's address-ordered list (`prev`, `next`: indices in
/// [`Allocator::blocks`]), as the caching allocator links its blocks.
#[derive(Debug, Clone, Copy)]
struct Block {
    seg: usize,
    off: u64,
    size: u64,
    free: bool,
    /// Its segment's pool ([`pool_index`]).
    pool: u8,
    /// Where it is in its bucket of free blocks, when free ([`FreeSet`]).
    slot: u32,
    prev: u32,
    next: u32,
}

/// A segment: its first and last block. An expandable segment's `mapped` bytes grow in
/// pages; a fixed one is `mapped` bytes from its creation.
#[derive(Clone)]
struct Segment {
    pool: PoolKey,
    first: u32,
    last: u32,
    mapped: u64,
    expandable: bool,
    page: u64,
    /// Given back to the device (`release_cached`): holds nothing.
    released: bool,
}

/// A handed-out block: its index in [`Allocator::blocks`].
type Handle = u32;

#[derive(Clone)]
struct Allocator {
    expandable: bool,
    capacity: u64,
    segments: Vec<Segment>,
    /// Every block, live or merged away (`spare` lists the reusable slots).
    blocks: Vec<Block>,
    spare: Vec<u32>,
    /// Free blocks by pool, size and address: best fit is the first of the request's pool at or
    /// after its size.
    free: FreeSet,
    /// Expandable segment of each pool.
    grow: BTreeMap<PoolKey, usize>,
    reserved: u64,
    active: u64,
    max_reserved: u64,
    max_active: u64,
    oom: bool,
    /// What the allocator would have reserved to serve the first request it could not (the
    /// cache released): more than the device has.
    oom_need: u64,
    /// How many times it released what it had cached ([`Allocator::release_cached`]).
    releases: u64,
}

/// The free blocks: per pool, in buckets by size (four per power of two of the size in
/// 512-byte units, as TLSF allocators bucket theirs) with a bitmap of the non-empty ones;
/// a bucket holds its blocks' best-fit keys — size in 512-byte units above [`address`]
/// (59 bits) — and indices in no order (a block knows its place: [`Block::slot`]). Best fit
/// is the least key at or above the request's in its bucket, else the least of the next
/// non-empty bucket; an insert a push, a removal a swap. (A request finds ~50 free blocks of
/// ~9 sizes in its pool, ~3 in its bucket — up to ~280 blocks — on the README's 8B search;
/// there the buckets took 11.5 G instructions, sorted per-size lists 13.0 G, one unsorted
/// list per pool 15.1 G.)
#[derive(Default, Clone)]
struct FreeSet {
    pools: [FreePool; 16],
}

/// Buckets: sizes of 0–3 units one each, then four per power of two up to 2³⁴ units.
const BUCKETS: usize = 4 + 33 * 4;

#[derive(Default, Clone)]
struct FreePool {
    /// Empty until the pool's first free block.
    buckets: Vec<Vec<(u128, u32)>>,
    /// Bit `b` set: bucket `b` holds a block.
    nonempty: [u64; BUCKETS.div_ceil(64)],
}

/// A free block's best-fit key: by size, then address.
fn fit_key(size: u64, addr: u64) -> u128 {
    (u128::from(size / MIN_BLOCK) << 59) | u128::from(addr)
}

/// The bucket of a size (ordered as the sizes are).
fn bucket(size: u64) -> usize {
    let units = size / MIN_BLOCK;
    if units < 4 {
        return units as usize;
    }
    let log = 63 - units.leading_zeros();
    4 + (log as usize - 2) * 4 + ((units >> (log - 2)) & 3) as usize
}

impl FreePool {
    /// The first non-empty bucket at or after `b`.
    fn next_nonempty(&self, b: usize) -> Option<usize> {
        let mut w = b / 64;
        let mut bits = self.nonempty.get(w)? & (u64::MAX << (b % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.nonempty.get(w)?;
        }
    }
}

impl FreeSet {
    /// Adds `block` of `size` at `addr` ([`address`]): its slot in its bucket.
    #[inline]
    fn insert(&mut self, pool: u8, size: u64, addr: u64, block: u32) -> u32 {
        let key = fit_key(size, addr);
        let p = &mut self.pools[usize::from(pool & 15)];
        if p.buckets.is_empty() {
            p.buckets.resize_with(BUCKETS, Vec::new);
        }
        let b = bucket(size);
        p.nonempty[b / 64] |= 1 << (b % 64);
        let v = &mut p.buckets[b];
        v.push((key, block));
        (v.len() - 1) as u32
    }

    /// Removes the block of `size` at `slot`: the block moved into its slot, if any.
    #[inline]
    fn remove(&mut self, pool: u8, size: u64, slot: u32) -> Option<u32> {
        let p = &mut self.pools[usize::from(pool & 15)];
        let b = bucket(size);
        let v = p.buckets.get_mut(b)?;
        let s = slot as usize;
        if s >= v.len() {
            return None;
        }
        v.swap_remove(s);
        if v.is_empty() {
            p.nonempty[b / 64] &= !(1 << (b % 64));
        }
        v.get(s).map(|&(_, moved)| moved)
    }

    /// The block of `pool` with the least key at or above `size`'s, but those `skip` refuses.
    fn least(&self, pool: u8, size: u64, skip: impl Fn(u32) -> bool) -> Option<u32> {
        let p = &self.pools[usize::from(pool & 15)];
        let lo = fit_key(size, 0);
        let mut at = bucket(size);
        while let Some(b) = p.next_nonempty(at) {
            let mut best: Option<(u128, u32)> = None;
            for &(k, i) in &p.buckets[b] {
                if k >= lo && best.is_none_or(|(bk, _)| k < bk) && !skip(i) {
                    best = Some((k, i));
                }
            }
            if let Some((_, i)) = best {
                return Some(i);
            }
            at = b + 1;
        }
        None
    }
}

fn round_size(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

impl Allocator {
    fn new(expandable: bool, capacity: u64) -> Self {
        Allocator {
            expandable,
            capacity: capacity.min(MAX_CAPACITY),
            segments: vec![],
            blocks: vec![],
            spare: vec![],
            free: FreeSet::default(),
            grow: BTreeMap::new(),
            reserved: 0,
            active: 0,
            max_reserved: 0,
            max_active: 0,
            oom: false,
            oom_need: 0,
            releases: 0,
        }
    }

    fn should_split(&self, small: bool, remaining: u64) -> bool {
        if small || self.expandable {
            remaining >= MIN_BLOCK
        } else {
            remaining > SMALL_SIZE
        }
    }

    fn block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Appends a block of `size` at `off` to the end of segment `s`.
    fn push_block(&mut self, s: usize, off: u64, size: u64) -> u32 {
        let last = self.segments[s].last;
        let pool = pool_index(self.segments[s].pool);
        let i = self.block(Block { seg: s, off, size, free: false, pool, slot: 0, prev: last, next: NONE });
        match last {
            NONE => self.segments[s].first = i,
            l => self.blocks[l as usize].next = i,
        }
        self.segments[s].last = i;
        i
    }

    /// Takes block `i` out of its segment's list (its bytes belong to a neighbour now, or are
    /// given back).
    fn unlink(&mut self, i: u32) {
        let Block { seg, prev, next, .. } = self.blocks[i as usize];
        match prev {
            NONE => self.segments[seg].first = next,
            p => self.blocks[p as usize].next = next,
        }
        match next {
            NONE => self.segments[seg].last = prev,
            n => self.blocks[n as usize].prev = prev,
        }
        self.spare.push(i);
    }

    /// The free block at the end of an expandable segment's mapped range, if any.
    fn tail(&self, s: usize) -> Option<u32> {
        let seg = self.segments.get(s)?;
        let b = self.blocks.get(seg.last as usize)?;
        (b.free && b.off + b.size == seg.mapped).then_some(seg.last)
    }

    /// Best fit among cached free blocks; an expandable segment's free tail only if no block
    /// inside the mapped range fits (its "expandable size" ranks it last).
    fn find(&self, pool: PoolKey, size: u64) -> Option<u32> {
        let pool = pool_index(pool);
        if !self.expandable {
            return self.free.least(pool, size, |_| false);
        }
        let is_tail = |i: u32| {
            let s = self.blocks[i as usize].seg;
            self.segments[s].expandable && self.tail(s) == Some(i)
        };
        self.free.least(pool, size, is_tail).or_else(|| self.free.least(pool, size, |i| !is_tail(i)))
    }

    #[inline]
    fn take_free(&mut self, i: u32) {
        let b = &self.blocks[i as usize];
        if let Some(moved) = self.free.remove(b.pool, b.size, b.slot) {
            self.blocks[moved as usize].slot = b.slot;
        }
    }

    #[inline]
    fn put_free(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.free = true;
        b.slot = self.free.insert(b.pool, b.size, address(b.seg, b.off), i);
    }

    /// Hands out `size` bytes from the free block `i`.
    fn carve(&mut self, i: u32, size: u64, small: bool) -> (Handle, u64) {
        self.take_free(i);
        let Block { seg, off, size: bsize, next, .. } = self.blocks[i as usize];
        let got = if self.should_split(small, bsize - size) {
            let pool = self.blocks[i as usize].pool;
            let r = self.block(Block { seg, off: off + size, size: bsize - size, free: true, pool, slot: 0, prev: i, next });
            match next {
                NONE => self.segments[seg].last = r,
                n => self.blocks[n as usize].prev = r,
            }
            self.blocks[i as usize].next = r;
            self.put_free(r);
            size
        } else {
            bsize
        };
        let b = &mut self.blocks[i as usize];
        b.size = got;
        b.free = false;
        (i, got)
    }

    fn note_reserved(&mut self, add: u64) {
        self.reserved += add;
        self.max_reserved = self.max_reserved.max(self.reserved);
    }

    /// Releases what is cached and unused: fixed segments that are one free block, and the
    /// free tails of expandable segments (unmapped page by page).
    fn release_cached(&mut self) {
        self.releases += 1;
        for s in 0..self.segments.len() {
            let seg = &self.segments[s];
            if seg.released {
                continue;
            }
            if seg.expandable {
                if let Some(t) = self.tail(s) {
                    let (page, mapped) = (seg.page, seg.mapped);
                    let off = self.blocks[t as usize].off;
                    let keep_to = off.div_ceil(page) * page;
                    if keep_to < mapped {
                        self.take_free(t);
                        if keep_to > off {
                            self.blocks[t as usize].size = keep_to - off;
                            self.put_free(t);
                        } else {
                            self.unlink(t);
                        }
                        self.segments[s].mapped = keep_to;
                        self.reserved -= mapped - keep_to;
                    }
                }
            } else if seg.first != NONE && seg.first == seg.last && self.blocks[seg.first as usize].free {
                let b = seg.first;
                self.take_free(b);
                self.unlink(b);
                self.reserved -= self.segments[s].mapped;
                let seg = &mut self.segments[s];
                seg.mapped = 0;
                seg.released = true;
            }
        }
    }

    /// Whether `h` is a block of a small pool.
    fn is_small(&self, h: Handle) -> bool {
        self.blocks.get(h as usize).is_some_and(|b| self.segments[b.seg].pool.1)
    }

    fn fits(&self, more: u64) -> bool {
        self.reserved + more <= self.capacity
    }

    /// A new fixed segment for `size`, or grows the pool's expandable segment: the free block
    /// that serves the request.
    fn grow(&mut self, pool: PoolKey, size: u64) -> Option<u32> {
        if !self.expandable {
            let seg_size = allocation_size(size);
            if !self.fits(seg_size) {
                self.release_cached();
                if !self.fits(seg_size) {
                    return None;
                }
            }
            let s = self.segments.len();
            if s >= MAX_SEGMENTS {
                return None;
            }
            self.segments.push(Segment { pool, first: NONE, last: NONE, mapped: seg_size, expandable: false, page: seg_size, released: false });
            let b = self.push_block(s, 0, seg_size);
            self.put_free(b);
            self.note_reserved(seg_size);
            return Some(b);
        }
        let page = if pool.1 { SMALL_BUFFER } else { LARGE_BUFFER };
        let s = match self.grow.get(&pool) {
            Some(&s) => s,
            None => {
                let s = self.segments.len();
                self.segments.push(Segment { pool, first: NONE, last: NONE, mapped: 0, expandable: true, page, released: false });
                self.grow.insert(pool, s);
                s
            }
        };
        // the free tail (smaller than the request, or best fit would have taken it) grows
        let need = |a: &Self| {
            let have = a.tail(s).map_or(0, |t| a.blocks[t as usize].size);
            (have, (size - have.min(size)).div_ceil(page) * page)
        };
        let (mut have, mut more) = need(self);
        if !self.fits(more) {
            self.release_cached();
            (have, more) = need(self);
            if !self.fits(more) {
                return None;
            }
        }
        let mapped = self.segments[s].mapped;
        let b = match self.tail(s).filter(|_| have > 0) {
            Some(t) => {
                self.take_free(t);
                self.blocks[t as usize].size = have + more;
                t
            }
            None => self.push_block(s, mapped, more),
        };
        self.segments[s].mapped += more;
        self.note_reserved(more);
        self.put_free(b);
        Some(b)
    }

    fn malloc(&mut self, stream: u8, bytes: u64) -> Option<(Handle, u64)> {
        let size = round_size(bytes);
        let small = size <= SMALL_SIZE;
        let pool = (stream, small);
        let b = match self.find(pool, size) {
            Some(f) => f,
            None => match self.grow(pool, size) {
                Some(f) => f,
                None => {
                    if !self.oom {
                        self.oom_need = self.reserved + allocation_size(size);
                    }
                    self.oom = true;
                    return None;
                }
            },
        };
        let (h, got) = self.carve(b, size, small);
        self.active += got;
        self.max_active = self.max_active.max(self.active);
        Some((h, got))
    }

    fn release(&mut self, h: Handle) {
        let Some(&b) = self.blocks.get(h as usize) else { return };
        if b.free {
            return;
        }
        self.active -= b.size;
        let mut i = h;
        if b.prev != NONE && self.blocks[b.prev as usize].free {
            let p = b.prev;
            self.take_free(p);
            self.blocks[p as usize].size += b.size;
            self.unlink(i);
            i = p;
        }
        let next = self.blocks[i as usize].next;
        if next != NONE && self.blocks[next as usize].free {
            self.take_free(next);
            self.blocks[i as usize].size += self.blocks[next as usize].size;
            self.unlink(next);
        }
        self.put_free(i);
    }
}

fn stream_index(s: Stream) -> u8 {
    match s {
        Stream::Compute => 0,
        Stream::AllGather => 1,
        Stream::ReduceScatter => 2,
        Stream::AllReduce => 3,
    }
}

/// The tensors a buffer stands for: one per param for FSDP2's per-param storages (unsharded
/// params; the setup's sharded params and optimizer state, two states per param for Adam),
/// else one.
fn tensors(opts: &Options, units: &[Unit], buf: &BufferInfo, out: &mut Vec<u64>) {
    out.clear();
    if buf.bytes == 0 {
        return;
    }
    let one = matches!(buf.category, Category::Activation | Category::Temp | Category::Inputs | Category::Buffer | Category::AllGather | Category::ReduceScatter | Category::ShardedGrad);
    if one {
        out.push(buf.bytes);
        return;
    }
    out.extend(tensors_of(opts, units, buf));
}

fn tensors_of(opts: &Options, units: &[Unit], buf: &BufferInfo) -> Vec<u64> {
    if let Some(ps) = crate::buffers::param_storages(opts, units, buf) {
        return ps.into_iter().map(|(_, padded)| padded).collect();
    }
    let per_param = opts.layout == Layout::Fsdp2 && opts.strategy != Strategy::NoShard;
    let copies = match buf.category {
        Category::ShardedParam => 1,
        Category::Optstate if opts.optimizer.keeps_state() => 2,
        _ => return vec![buf.bytes],
    };
    let Some(unit) = buf.unit.and_then(|u| units.get(u.index())) else { return vec![buf.bytes] };
    if !per_param || unit.params.is_empty() || buf.free.is_some() {
        return vec![buf.bytes];
    }
    let ws = opts.shard_size();
    let w: Vec<u64> = unit.params.iter().map(|p| p.local_numel(ws, 0).max(1)).collect();
    let total: u64 = w.iter().sum::<u64>() * copies;
    let mut out = Vec::with_capacity(w.len() * copies as usize);
    let mut given = 0u64;
    for _ in 0..copies {
        for &x in &w {
            let b = (buf.bytes as u128 * x as u128 / total as u128) as u64;
            given += b;
            out.push(b);
        }
    }
    if let Some(last) = out.last_mut() {
        *last += buf.bytes - given;
    }
    out
}

/// cuBLAS workspace per handle and stream: 32 MiB on sm90 (`4096 * 8 * 1024`), else
/// `4096 * 1024 * 2 + 16 * 1024 * 8` (`CublasHandlePool.cpp`).
pub fn cublas_workspace(hw: &Hardware) -> u64 {
    let hopper = hw.gpu.as_ref().is_some_and(|g| g.sms == 132);
    if hopper {
        4096 * 8 * 1024
    } else {
        4096 * 1024 * 2 + 16 * 1024 * 8
    }
}

/// Process groups the plan communicates over, each an NCCL communicator.
fn communicators(opts: &Options) -> u64 {
    match opts.strategy {
        Strategy::HybridShard { .. } if opts.replicate_size() > 1 => 2,
        _ if opts.world_size > 1 => 1,
        _ => 0,
    }
}

/// Replays `plan` through the caching allocator model ([`STEPS`] steps) on `hw`.
pub fn predict(plan: &Plan, hw: &Hardware) -> Reserved {
    predict_steps(plan, hw, STEPS)
}

/// [`predict`] over `steps` training steps.
pub fn predict_steps(plan: &Plan, hw: &Hardware, steps: usize) -> Reserved {
    replay(plan, hw, steps, None).0
}

/// What `plan` needs of the device ([`Reserved::needed_bytes`]), or `None` once the replay
/// finds it over `limit` bytes: it stops as soon as the reserved memory, the CUDA context and
/// NCCL's buffers pass the limit (a search asks whether a configuration fits; past a limit
/// below the device's memory the rest of the replay would only measure by how much not).
pub fn needed_within(plan: &Plan, hw: &Hardware, limit: u64) -> Option<u64> {
    // (on the CPU the tensor peak is the need: no caching allocator)
    if plan.options.device == Device::Cpu {
        return Some(plan.memory.peak_bytes);
    }
    match replay(plan, hw, STEPS, Some(limit)) {
        (_, true) => None,
        (r, false) => Some(r.needed_bytes(plan)),
    }
}

/// The gradient-accumulation micro-batches of a schedule that repeat one another, as the
/// replay may skip them (see the module doc): micro-batch `m` is ops `ops[m]..ops[m + 1]`
/// and allocates buffers `bufs[m]..bufs[m + 1]`; each of micro-batches 3 to k − 2 is the one
/// before with its ops as many later as the one before has, and every buffer of the
/// micro-batches (ids from `bufs[1]` on) `shift` later.
struct Periods {
    ops: Vec<usize>,
    bufs: Vec<usize>,
    shift: usize,
}

/// How many micro-batch starts a step's replay compares (2, 3, …): a state that has not
/// repeated by then is replayed to the end.
const PERIOD_TRIES: usize = 10;
/// The longest period looked for: a micro-batch's start compared with the starts of the
/// micro-batches up to this many before it (Llama-3-8B's first step alternates between two
/// states of its small pool; 3 until 2026-11-27: `tune` over 1,024 × 4096 on 8 GPUs then
/// found some configurations' states repeating only every four to six micro-batches, and
/// planned them in full — 2,879 plans, 22.6 s; 2,813 and 18–19 s now, the same output).
const MAX_PERIOD: usize = 8;

/// [`Periods`] of `plan`, or `None` (fewer than five micro-batches, or ones that do not
/// repeat one another).
fn periods(plan: &Plan, sizes: &[u64], at: &[usize], continued: &[bool], stream_of: &dyn Fn(&BufferInfo) -> u8) -> Option<Periods> {
    let k = plan.options.grad_accum as usize;
    if k < 5 {
        return None;
    }
    let mut ops = vec![usize::MAX; k + 1];
    let mut last = 0u32;
    for (i, op) in plan.schedule.iter().enumerate() {
        let m = op.micro_batch;
        if m < last || m as usize >= k {
            return None;
        }
        last = m;
        if ops[m as usize] == usize::MAX {
            ops[m as usize] = i;
        }
    }
    ops[k] = plan.schedule.len();
    if ops.contains(&usize::MAX) {
        return None;
    }
    // the buffers each micro-batch allocates: ids in order of the micro-batch of their
    // allocation
    let mb_of = |b: &BufferInfo| plan.schedule.get(b.alloc.index()).map(|o| o.micro_batch as usize);
    let mut bufs = vec![usize::MAX; k + 1];
    let mut prev = 0;
    for b in &plan.buffers {
        let m = mb_of(b)?;
        if m < prev {
            return None;
        }
        prev = m;
        if bufs[m] == usize::MAX {
            bufs[m] = b.id.index();
        }
    }
    bufs[k] = plan.buffers.len();
    for m in (0..k).rev() {
        if bufs[m] == usize::MAX {
            bufs[m] = bufs[m + 1];
        }
    }
    let span = ops[2] - ops[1];
    let shift = bufs[2] - bufs[1];
    let first = bufs[1];
    let map = |x: usize| if x >= first { x + shift } else { x };
    for m in 2..k - 1 {
        if ops[m + 1] - ops[m] != span || bufs[m + 1] - bufs[m] != shift {
            return None;
        }
        // micro-batch m − 1's buffers against m's: all that the replay reads of them (of the
        // first middle micro-batch's, live where micro-batch 2 starts, all but what they
        // continue: the first one's buffers, ids before `first`, already allocated then)
        for x in bufs[m - 1]..bufs[m] {
            let (a, b) = (&plan.buffers[x], &plan.buffers[x + shift]);
            let same = sizes[at[x]..at[x + 1]] == sizes[at[x + shift]..at[x + shift + 1]]
                && a.category == b.category
                && a.unit.is_some() == b.unit.is_some()
                && a.free.is_some() == b.free.is_some()
                && continued[x] == continued[x + shift]
                && stream_of(a) == stream_of(b)
                && (m < 3 || a.continues.len() == b.continues.len() && a.continues.iter().zip(&b.continues).all(|(c, d)| map(c.index()) == d.index()));
            if !same {
                return None;
            }
        }
        if m < 3 {
            // (the first middle micro-batch frees what the first one left it, ids before
            // `first`: its events compared from the second on)
            continue;
        }
        for i in 0..span {
            let (a, b) = (&plan.schedule[ops[m - 1] + i], &plan.schedule[ops[m] + i]);
            if a.phase != b.phase || a.stream != b.stream || std::mem::discriminant(&a.kind) != std::mem::discriminant(&b.kind) || a.events.len() != b.events.len() {
                return None;
            }
            let same = a.events.iter().zip(&b.events).all(|(x, y)| match (*x, *y) {
                (Event::Alloc(x), Event::Alloc(y)) | (Event::Free(x), Event::Free(y)) => map(x.index()) == y.index(),
                _ => false,
            });
            if !same {
                return None;
            }
        }
    }
    Some(Periods { ops, bufs, shift })
}

/// What the replay reads of a plan beside its schedule: [`Periods`], each buffer's tensors'
/// sizes (`sizes[at[x]..at[x + 1]]`), whether another buffer continues it, the stream its
/// blocks come from.
struct Replayed<'a> {
    plan: &'a Plan,
    periods: &'a Periods,
    sizes: &'a [u64],
    continued: &'a [bool],
    stream_of: &'a dyn Fn(&BufferInfo) -> u8,
}

/// The blocks the buffers hold in the replay: their tensors' (`held[at[x]..at[x + 1]]`), and
/// those of the buffers they continue (`taken[x]`).
#[derive(Clone, Copy)]
struct Holding<'a> {
    held: &'a [Handle],
    taken: &'a [Vec<Handle>],
    at: &'a [usize],
}

/// Whether buffer `x` holds blocks: its tensors' own, or those it continues.
fn holds(held: &[Handle], taken: &[Vec<Handle>], at: &[usize], x: usize) -> bool {
    held[at[x]..at[x + 1]].iter().any(|&h| h != NONE) || !taken[x].is_empty()
}

/// A buffer in [`small_jump`]'s replay: by its distance from the first replayed micro-batch's
/// first buffer, in the frame of the micro-batch replayed (`Err`: a persistent one, by id).
type SmallKey = Result<i64, usize>;
/// The small blocks a buffer holds: by slot (`NONE`: none or a large one), and those it holds
/// for the buffers it continues.
type SmallHeld = (Vec<Handle>, Vec<Handle>);
type SmallLive = rustc_hash::FxHashMap<SmallKey, SmallHeld>;

/// The small pools' state in [`small_jump`]'s replay, `frame` on (its micro-batch's buffers'
/// keys are `frame` more than the first's): the active bytes, the small segments' blocks, and
/// the small blocks each buffer holds (where), by its distance from the frame.
fn small_state(b: &Allocator, live: &SmallLive, frame: i64) -> Vec<u64> {
    let mut v = vec![b.active];
    for (i, s) in b.segments.iter().enumerate().filter(|(_, s)| s.pool.1 && !s.released) {
        v.extend([i as u64, u64::from(s.pool.0), s.mapped]);
        let mut x = s.first;
        while x != NONE {
            let bl = &b.blocks[x as usize];
            v.extend([bl.off, bl.size, u64::from(bl.free)]);
            x = bl.next;
        }
    }
    let place = |h: Handle| if h == NONE { u64::MAX } else { address(b.blocks[h as usize].seg, b.blocks[h as usize].off) };
    let mut keys: Vec<(SmallKey, &SmallHeld)> = live.iter().map(|(k, e)| (k.map(|d| d - frame), e)).collect();
    keys.sort_unstable_by_key(|&(k, _)| k);
    for (k, (hs, ts)) in keys {
        v.extend(match k {
            Ok(d) => [0, d as u64],
            Err(x) => [1, x as u64],
        });
        v.extend(hs.iter().map(|&h| place(h)));
        v.push(ts.len() as u64);
        v.extend(ts.iter().map(|&h| place(h)));
    }
    v
}

/// What a jump that replays the small pools leaves ([`small_jump`]): the allocator, and the
/// small blocks held where the jump lands — per buffer, its tensors' (by slot) and those it
/// holds for the buffers it continues.
struct SmallJump {
    alloc: Allocator,
    held: Vec<(usize, Vec<Handle>, Vec<Handle>)>,
    /// The buffers whose small blocks the jump replaced (those it holds come from `held`).
    replaced: Vec<usize>,
}

/// A jump of `j` micro-batches from micro-batch `m` (to the plan's micro-batch `to`) where
/// only the large pools' state repeated ([`state_at`]'s `large_only`): the small pools'
/// requests of the `j` micro-batches replayed, each micro-batch `m`'s with its buffers as
/// many micro-batches on — the small pools' blocks drift through the cache where the large
/// ones repeat (a 512-byte activation of Llama-3-8B placed 512 bytes lower at each
/// micro-batch).
///
/// The pools share nothing but the device's capacity (a request of one pool never takes a
/// block of the other), and this holds only where that is not read: no segment made or cache
/// released in the replayed requests, as none were between the two starts compared (the
/// same reserved bytes and releases). Then the large pools go through the `j` micro-batches
/// as they went through the last period, and the small ones hold as many bytes at each
/// request as there (a small block is its request rounded: what is left of a free block is
/// split off from 512 bytes on, and sizes are multiples of 512; the buffers held where the
/// two compared micro-batches start hold small blocks of the same sizes, [`state_at`]), so
/// the reserved and active peaks are the period's, already counted. `None` where any of it
/// fails. A buffer is keyed by its id in the micro-batches replayed (as if the plan had them
/// all) less micro-batch `m`'s first.
fn small_jump(a: &Allocator, rp: &Replayed, h: Holding, m: usize, to: usize, j: usize) -> Option<SmallJump> {
    let (Replayed { plan, periods: p, sizes, continued, stream_of }, Holding { held, taken, at }) = (rp, h);
    let (first, base, shift) = (p.bufs[1] as i64, p.bufs[m] as i64, p.shift as i64);
    // a buffer by its distance from micro-batch m's first, in the frame of the r-th
    // micro-batch replayed (persistent ones, before micro-batch 1's, by id: `Err`)
    let key = |x: usize, r: usize| if (x as i64) < first { Err(x) } else { Ok(x as i64 - base + r as i64 * shift) };
    // its small blocks: by slot, and those it holds for the buffers it continues
    let load = |x: usize| (held[at[x]..at[x + 1]].iter().map(|&h| if a.is_small(h) { h } else { NONE }).collect::<Vec<_>>(), taken[x].iter().copied().filter(|&h| a.is_small(h)).collect::<Vec<_>>());
    let mut live: SmallLive = Default::default();
    let mut replaced = vec![];
    for x in p.bufs[1]..p.bufs[m] {
        if holds(held, taken, at, x) {
            replaced.push(x);
            let got = load(x);
            if got.0.iter().any(|&h| h != NONE) || !got.1.is_empty() {
                live.insert(key(x, 0), got);
            }
        }
    }
    // what the small pools see of the replayed micro-batch: a buffer's small tensors (by
    // slot) allocated, the blocks of those a buffer continues taken, a buffer freed (one of
    // the micro-batch's own only if it takes part)
    enum Ev {
        Alloc(usize, u8, Vec<(usize, u64)>),
        Take(usize, Vec<usize>),
        Free(usize),
    }
    let own = p.bufs[m]..p.bufs[m + 1];
    let mut part = vec![false; own.len()];
    let mut evs = vec![];
    for op in &plan.schedule[p.ops[m]..p.ops[m + 1]] {
        for e in &op.events {
            match *e {
                Event::Alloc(x) => {
                    let (x, buf) = (x.index(), &plan.buffers[x.index()]);
                    if !buf.continues.is_empty() {
                        evs.push(Ev::Take(x, buf.continues.iter().map(|c| c.index()).collect()));
                    } else {
                        let slots: Vec<(usize, u64)> = sizes[at[x]..at[x + 1]].iter().enumerate().filter(|&(_, &t)| round_size(t) <= SMALL_SIZE).map(|(i, &t)| (i, t)).collect();
                        if slots.is_empty() {
                            continue;
                        }
                        evs.push(Ev::Alloc(x, stream_of(buf), slots));
                    }
                    if own.contains(&x) {
                        part[x - own.start] = true;
                    }
                }
                Event::Free(x) => {
                    let x = x.index();
                    // (a buffer continued into another is freed as that one)
                    let nothing = continued[x] || (own.contains(&x) && !part[x - own.start]);
                    if !nothing {
                        evs.push(Ev::Free(x));
                    }
                }
            }
        }
    }
    // the small blocks buffer `x` holds, as the r-th micro-batch replayed sees it, taken out
    // of it (freed, or passed to the buffer continuing it); a persistent one's read from the
    // replay's blocks the first time, and left empty (none of its blocks held twice)
    let take_out = |live: &mut SmallLive, replaced: &mut Vec<usize>, x: usize, r: usize| -> Vec<Handle> {
        let (hs, ts) = match key(x, r) {
            k @ Ok(_) => live.remove(&k).unwrap_or_default(),
            k @ Err(_) => std::mem::take(live.entry(k).or_insert_with(|| {
                replaced.push(x);
                load(x)
            })),
        };
        hs.into_iter().filter(|&h| h != NONE).chain(ts).collect()
    };
    let mut b = a.clone();
    // (the small pools' states where the last replayed micro-batches ended: where one
    // repeats, the replay jumps ahead by whole periods as [`replay_with`] does)
    let mut seen: Vec<(usize, Vec<u64>)> = vec![];
    let mut r = 0;
    while r < j {
        for e in &evs {
            match *e {
                Ev::Alloc(x, st, ref slots) => {
                    let mut got = (vec![NONE; at[x + 1] - at[x]], vec![]);
                    for &(i, t) in slots {
                        got.0[i] = b.malloc(st, t)?.0;
                    }
                    live.insert(key(x, r), got);
                }
                Ev::Take(x, ref continues) => {
                    let mut got = (vec![NONE; at[x + 1] - at[x]], vec![]);
                    for &c in continues {
                        got.1.extend(take_out(&mut live, &mut replaced, c, r));
                    }
                    if !got.1.is_empty() {
                        live.insert(key(x, r), got);
                    }
                }
                Ev::Free(x) => {
                    for h in take_out(&mut live, &mut replaced, x, r) {
                        b.release(h);
                    }
                }
            }
        }
        r += 1;
        if r < j {
            let now = small_state(&b, &live, r as i64 * shift);
            if let Some(q) = seen.iter().rev().find(|(t, st)| r - t <= MAX_PERIOD && *st == now).map(|(t, _)| r - t) {
                let by = (j - r) / q * q;
                if by > 0 {
                    live = live.into_iter().map(|(k, v)| (k.map(|d| d + (by as i64) * shift), v)).collect();
                    r += by;
                    seen.clear();
                    continue;
                }
            }
            if seen.len() == MAX_PERIOD {
                seen.remove(0);
            }
            seen.push((r, now));
        }
    }
    if b.oom || b.reserved != a.reserved || b.releases != a.releases || b.active != a.active {
        return None;
    }
    (b.max_reserved, b.max_active) = (a.max_reserved, a.max_active);
    // where the jump lands, each buffer as far before micro-batch `to`'s first as it is
    // before the last replayed micro-batch's end
    let mut out = vec![];
    for (k, (hs, ts)) in live {
        if hs.iter().all(|&h| h == NONE) && ts.is_empty() && k.is_ok() {
            continue;
        }
        let x = match k {
            Err(x) => x,
            Ok(d) => {
                let x = p.bufs[to] as i64 + d - j as i64 * shift;
                if x < first || x >= p.bufs[to] as i64 || at[x as usize + 1] - at[x as usize] != hs.len() {
                    return None;
                }
                x as usize
            }
        };
        out.push((x, hs, ts));
    }
    Some(SmallJump { alloc: b, held: out, replaced })
}

/// The replay's state where micro-batch `m` starts, for comparing with another
/// micro-batch's start: every segment's blocks in address order, the reserved and active
/// bytes, and each buffer allocated before it that holds blocks (by where they are; the
/// micro-batches' own buffers by how far before `m`'s first they are) and the queued FSDP1
/// frees the same way. Segments released (to serve a request near the device's capacity)
/// are left out, and the others numbered in order: nothing reads a segment's index but to
/// order blocks by address, and a released one holds nothing and is never used again — a
/// state that releases and makes a segment per micro-batch repeats (only `MAX_SEGMENTS`
/// counts them, far past what a plan's allocations make).
///
/// `large_only`: the large pools' part (see [`small_jump`]): their segments and blocks, which
/// buffers hold large blocks where, which hold small ones of what size (not where), the
/// reserved and active bytes and how many times the cache was released.
fn state_at(a: &Allocator, h: Holding, in_flight: &std::collections::VecDeque<BufferId>, p: &Periods, m: usize, large_only: bool) -> Vec<u64> {
    let Holding { held, taken, at } = h;
    let kept = |s: &Segment| !(s.released || (large_only && s.pool.1));
    let mut ordinal = vec![u64::MAX; a.segments.len()];
    let mut n = 0;
    for (s, o) in a.segments.iter().zip(&mut ordinal) {
        if kept(s) {
            *o = n;
            n += 1;
        }
    }
    let mut v = vec![a.reserved, a.active, n];
    if large_only {
        v.push(a.releases);
    }
    for s in a.segments.iter().filter(|s| kept(s)) {
        v.extend([u64::from(s.pool.0), u64::from(s.pool.1), s.mapped, u64::from(s.expandable)]);
        let mut i = s.first;
        while i != NONE {
            let b = &a.blocks[i as usize];
            v.extend([b.off, b.size, u64::from(b.free)]);
            i = b.next;
        }
        v.push(u64::MAX);
    }
    let (first, base) = (p.bufs[1], p.bufs[m]);
    let id = |x: usize| if x >= first { (1 << 63) | (base - x) as u64 } else { x as u64 };
    let place = |h: Handle| match a.blocks.get(h as usize) {
        None => u64::MAX,
        // (a small block by its size: where it is, the small pools' replay finds)
        Some(b) if large_only && a.is_small(h) => (1 << 62) | (b.size / MIN_BLOCK),
        Some(b) => address(ordinal.get(b.seg).map_or(b.seg, |&o| o as usize), b.off),
    };
    for x in 0..base {
        if !holds(held, taken, at, x) {
            continue;
        }
        let hs = &held[at[x]..at[x + 1]];
        v.push(id(x));
        v.extend(hs.iter().map(|&h| if h == NONE { u64::MAX } else { place(h) }));
        v.push(taken[x].len() as u64);
        v.extend(taken[x].iter().map(|&h| place(h)));
    }
    v.push(u64::MAX - 1);
    v.extend(in_flight.iter().map(|b| id(b.index())));
    v
}

/// The replay of `steps` steps, stopped (`true`) once the reserved peak with the context and
/// NCCL is over `stop`.
fn replay(plan: &Plan, hw: &Hardware, steps: usize, stop: Option<u64>) -> (Reserved, bool) {
    let (r, stopped, _, _) = replay_with(plan, hw, steps, stop, true, plan.options.grad_accum as usize);
    (r, stopped)
}

/// [`needed_within`] for the same plan with `n` micro-batches accumulated, from this plan of
/// fewer whose builder reached a steady state ([`Plan::steady`]: the plan of `n` is this one
/// with micro-batch `k − 2` repeated): `None` where this plan's replay does not show it.
/// `Some(None)`: over the limit. The replay skips as for `n` (see the module doc): once the
/// allocator's state repeats with a period of `p` micro-batches, it jumps to the micro-batch
/// of this plan that leaves as many before the last, modulo `p`, as the plan of `n` leaves
/// there, its held blocks passed to that micro-batch's buffers — each step must jump (`None`
/// if one does not: the state did not repeat soon enough in this plan's micro-batches).
/// Exact (`planner/tests/accum.rs` holds it to the plan of `n`).
pub fn needed_within_longer(plan: &Plan, hw: &Hardware, limit: u64, n: u32) -> Option<Option<u64>> {
    if !plan.steady || n <= plan.options.grad_accum {
        return None;
    }
    if plan.options.device == Device::Cpu {
        return Some(Some(plan.memory.peak_bytes));
    }
    match replay_with(plan, hw, STEPS, Some(limit), true, n as usize) {
        (_, _, _, false) => None,
        (_, true, _, _) => Some(None),
        (r, false, _, true) => Some(Some(r.needed_bytes(plan))),
    }
}

/// [`predict`] for the same plan with `n` micro-batches (see [`needed_within_longer`]):
/// `None` where this plan's replay does not show it.
#[doc(hidden)]
pub fn predict_longer(plan: &Plan, hw: &Hardware, n: u32) -> Option<Reserved> {
    if !plan.steady || n <= plan.options.grad_accum {
        return None;
    }
    match replay_with(plan, hw, STEPS, None, true, n as usize) {
        (r, _, _, true) => Some(r),
        _ => None,
    }
}

/// The replay of [`STEPS`] steps with every micro-batch replayed, and with those that
/// repeat one another skipped (see the module doc): the two predictions and how many
/// micro-batches the second skipped — what tests hold the skip to.
#[doc(hidden)]
pub fn predict_skipping(plan: &Plan, hw: &Hardware) -> (Reserved, Reserved, usize) {
    let k = plan.options.grad_accum as usize;
    let (full, _, _, _) = replay_with(plan, hw, STEPS, None, false, k);
    let (skipping, _, skipped, _) = replay_with(plan, hw, STEPS, None, true, k);
    (full, skipping, skipped)
}

/// [`replay`], skipping the micro-batches that repeat one another where `skip` (see the
/// module doc), as the plan's replay with `accum` micro-batches where that is more than the
/// plan's ([`needed_within_longer`]): also whether it is shown (every step jumped).
fn replay_with(plan: &Plan, hw: &Hardware, steps: usize, stop: Option<u64>, skip: bool, accum: usize) -> (Reserved, bool, usize, bool) {
    let opts = &plan.options;
    let comms = communicators(opts);
    let (context, nccl) = match opts.device {
        Device::Cuda => (CUDA_CONTEXT_BYTES, comms * NCCL_COMM_BYTES),
        Device::Cpu => (0, 0),
    };
    let capacity = hw.memory_bytes.saturating_sub(context + nccl);
    let mut a = Allocator::new(opts.expandable_segments, capacity);
    let workspace = if opts.device == Device::Cuda { cublas_workspace(hw) } else { 0 };
    let n = plan.buffers.len();
    // each buffer's tensors once (every step allocates them again): `sizes[at[i]..at[i + 1]]`,
    // and the blocks they hold in the same places of `held` (NONE: none)
    let mut sizes: Vec<u64> = Vec::with_capacity(2 * n);
    let mut at: Vec<usize> = Vec::with_capacity(n + 1);
    let mut one = vec![];
    for b in &plan.buffers {
        at.push(sizes.len());
        tensors(opts, &plan.units, b, &mut one);
        sizes.extend_from_slice(&one);
    }
    at.push(sizes.len());
    let mut held: Vec<Handle> = vec![NONE; sizes.len()];
    // a buffer that continues others holds their blocks from its allocation on
    let mut taken: Vec<Vec<Handle>> = vec![vec![]; n];
    let mut continued = vec![false; n];
    for b in &plan.buffers {
        for c in &b.continues {
            continued[c.index()] = true;
        }
    }
    let stream_of = |b: &BufferInfo| stream_index(plan.schedule.get(b.alloc.index()).map_or(Stream::Compute, |o| o.stream));
    let alloc = |a: &mut Allocator, held: &mut [Handle], taken: &mut [Vec<Handle>], b: &BufferInfo| {
        let i = b.id.index();
        if !b.continues.is_empty() {
            let mut hs = vec![];
            for c in &b.continues {
                let c = c.index();
                hs.extend(held[at[c]..at[c + 1]].iter().copied().filter(|&h| h != NONE));
                held[at[c]..at[c + 1]].fill(NONE);
                hs.append(&mut taken[c]);
            }
            taken[i] = hs;
            return;
        }
        let st = stream_of(b);
        for (slot, &t) in held[at[i]..at[i + 1]].iter_mut().zip(&sizes[at[i]..at[i + 1]]) {
            if let Some((h, _)) = a.malloc(st, t) {
                *slot = h;
            }
        }
    };
    let free = |a: &mut Allocator, held: &mut [Handle], taken: &mut [Vec<Handle>], b: &BufferInfo| {
        let i = b.id.index();
        for slot in &mut held[at[i]..at[i + 1]] {
            if *slot != NONE {
                a.release(*slot);
                *slot = NONE;
            }
        }
        for h in std::mem::take(&mut taken[i]) {
            a.release(h);
        }
    };
    let lazy_state = |b: &BufferInfo| b.category == Category::Optstate && b.free.is_none();
    // FSDP1's unsharded flat params (see the module doc): freed when the rate limiter has
    // waited for their free
    let fsdp1_gpu = opts.layout == Layout::Flat && opts.device == Device::Cuda;
    let deferred = |b: &BufferInfo| fsdp1_gpu && b.category == Category::UnshardedParam && b.unit.is_some();
    let mut in_flight: std::collections::VecDeque<BufferId> = Default::default();
    let mut workspaces_made = false;
    let mut stopped = false;
    let mut skipped = 0;
    let periods = if skip { periods(plan, &sizes, &at, &continued, &stream_of) } else { None };
    let longer = accum > plan.options.grad_accum as usize;
    if longer && periods.is_none() {
        return (Reserved::default(), false, 0, false);
    }
    let mut jumps = 0;
    let k_plan = plan.options.grad_accum as usize;
    // (the replay stopped over the limit or out of memory where the plan of `accum` does)
    let mut valid_end = false;
    'steps: for step in 0..steps {
        let mut state_made = step > 0;
        // (replayed as more micro-batches: this step's jump; what happens before it, in the
        // micro-batches before the last, happens in the plan of `accum` too)
        let mut jumped = false;
        // (the states where the last micro-batches started, while looking for a period)
        let mut recent: Vec<(usize, Vec<u64>, Option<Vec<u64>>)> = vec![];
        let mut i = 0;
        while let Some(op) = plan.schedule.get(i) {
            i += 1;
            if let Some(p) = &periods {
                let k = p.ops.len() - 1;
                // where micro-batch m (2 ≤ m ≤ k − 2, the first PERIOD_TRIES of them) starts
                let m = op.micro_batch as usize;
                // (and FSDP1's queued frees all of buffers made before m: one still queued from
                // the step before, ids past m's, is not named relative to m)
                if i - 1 == p.ops[m] && !(longer && jumped) && (2..=(k - 2).min(1 + PERIOD_TRIES)).contains(&m) && !a.oom && in_flight.iter().all(|b| b.index() < p.bufs[m]) {
                    let hold = Holding { held: &held, taken: &taken, at: &at };
                    let now = state_at(&a, hold, &in_flight, p, m, false);
                    // (FSDP1's queued frees are not replayed by `small_jump`)
                    let large = (!fsdp1_gpu).then(|| state_at(&a, hold, &in_flight, p, m, true));
                    // micro-batches m − n, …, m − 1 left the state as they found it: so do the
                    // next n, and the next; on from the last start of such a period before
                    // the last micro-batch, each held block passed to the buffer of as many
                    // micro-batches later
                    let period = recent.iter().rev().find(|(r, st, _)| m - r <= MAX_PERIOD && *st == now).map(|(r, _, _)| m - r);
                    // (else where the large pools' state repeats, the small ones replayed)
                    let large_period = match (period, &large) {
                        (None, Some(l)) => recent.iter().rev().find(|(r, _, st)| m - r <= MAX_PERIOD && st.as_ref() == Some(l)).map(|(r, _, _)| m - r),
                        _ => None,
                    };
                    let split = large_period.is_some();
                    let period = period.or(large_period);
                    // (replayed as `accum` micro-batches: to the one that leaves as many middle
                    // ones before the last, modulo the period, as the plan of `accum` does at
                    // its jump — the state names no micro-batch, only its phase in the period)
                    // (`None`: no jump — as more micro-batches, where the micro-batches left
                    // after `m` are fewer than the longer plan leaves after its jump)
                    // (as more micro-batches, a period found at the micro-batch to go to
                    // jumps there too: nothing to pass on)
                    let target = match period {
                        Some(n) if longer => (k - 1).checked_sub((accum - 1 - m) % n).filter(|&to| to >= m),
                        Some(n) => Some(m + (k - 1 - m) / n * n).filter(|&to| to > m),
                        None => None,
                    };
                    let to = target.unwrap_or(m);
                    let by = (to - m) * p.shift;
                    // (a buffer and the one it passes its blocks to have as many tensors: the
                    // live ones are of micro-batches 2 on, whose buffers `periods` compared)
                    let live: Vec<usize> = if to > m { (p.bufs[1]..p.bufs[m]).filter(|&x| holds(&held, &taken, &at, x)).collect() } else { vec![] };
                    let same = live.iter().all(|&x| at[x + 1] - at[x] == at[x + by + 1] - at[x + by]);
                    let j = if longer { accum - 1 - (k - 1 - to) - m } else { to - m };
                    let small = if split && target.is_some() && same {
                        let r = Replayed { plan, periods: p, sizes: &sizes, continued: &continued, stream_of: &stream_of };
                        small_jump(&a, &r, Holding { held: &held, taken: &taken, at: &at }, m, to, j)
                    } else {
                        None
                    };
                    if target.is_some() && same && (!split || small.is_some()) {
                        // (the small blocks from the replay of the small pools, the large ones
                        // passed on as below)
                        let small_held = small.map(|sj| {
                            for &x in &sj.replaced {
                                for h in &mut held[at[x]..at[x + 1]] {
                                    if a.is_small(*h) {
                                        *h = NONE;
                                    }
                                }
                                taken[x].retain(|&h| !a.is_small(h));
                            }
                            a = sj.alloc;
                            sj.held
                        });
                        for &x in live.iter().rev() {
                            let (src, dst) = (at[x]..at[x + 1], at[x + by]..at[x + by + 1]);
                            let hs: Vec<Handle> = held[src.clone()].to_vec();
                            held[src].fill(NONE);
                            held[dst].copy_from_slice(&hs);
                            taken[x + by] = std::mem::take(&mut taken[x]);
                        }
                        for b in in_flight.iter_mut() {
                            if b.index() >= p.bufs[1] {
                                *b = BufferId::new(b.index() + by);
                            }
                        }
                        for (x, hs, ts) in small_held.into_iter().flatten() {
                            for (h, &s) in held[at[x]..at[x + 1]].iter_mut().zip(&hs) {
                                if s != NONE {
                                    *h = s;
                                }
                            }
                            taken[x].extend(ts);
                        }
                        recent.clear();
                        skipped += j;
                        jumps += 1;
                        jumped = true;
                        i = p.ops[to];
                        continue;
                    }
                    recent.push((m, now, large));
                }
            }
            // a request the device could not serve: the run fails there (what it would have
            // reserved is kept); the rest of the replay measures nothing
            // (every step before this one jumped: this one started as in the plan of `accum`)
            let shared = jumps - usize::from(jumped) == step && (jumped || (op.micro_batch as usize) < k_plan - 1);
            if a.oom {
                valid_end = shared;
                break 'steps;
            }
            if stop.is_some_and(|s| a.max_reserved + context + nccl > s) {
                stopped = true;
                valid_end = shared;
                break 'steps;
            }
            if matches!(op.kind, OpKind::Setup) && step > 0 {
                // persistent state lives on; the per-step setup buffers (the previous step's
                // loss) come again
                for e in &op.events {
                    if let Event::Alloc(b) = *e {
                        let buf = &plan.buffers[b.index()];
                        if buf.free.is_some() {
                            alloc(&mut a, &mut held, &mut taken, buf);
                        }
                    }
                }
                continue;
            }
            if !workspaces_made && op.phase == Phase::Forward && matches!(op.kind, OpKind::Forward { .. }) && workspace > 0 {
                workspaces_made = true;
                for _ in 0..2 {
                    a.malloc(0, workspace);
                }
            }
            if !state_made && matches!(op.kind, OpKind::OptimizerStep { .. }) && opts.optimizer != Optimizer::None {
                state_made = true;
                for b in plan.buffers.iter().filter(|b| lazy_state(b)) {
                    alloc(&mut a, &mut held, &mut taken, b);
                }
            }
            for e in &op.events {
                match *e {
                    Event::Alloc(b) => {
                        let buf = &plan.buffers[b.index()];
                        if step == 0 && lazy_state(buf) {
                            continue;
                        }
                        // (the rate limiter waits for the oldest queued free, two or more queued)
                        if deferred(buf) && in_flight.len() >= 2 {
                            if let Some(x) = in_flight.pop_front() {
                                free(&mut a, &mut held, &mut taken, &plan.buffers[x.index()]);
                            }
                        }
                        alloc(&mut a, &mut held, &mut taken, buf);
                    }
                    Event::Free(b) => {
                        if deferred(&plan.buffers[b.index()]) {
                            in_flight.push_back(b);
                        } else if !continued[b.index()] {
                            free(&mut a, &mut held, &mut taken, &plan.buffers[b.index()]);
                        }
                    }
                }
            }
        }
    }
    let segments = a.segments.iter().filter(|s| !s.released).map(|s| if s.expandable { (s.mapped / s.page) as usize } else { 1 }).sum();
    let r = Reserved {
        max_reserved_bytes: a.max_reserved,
        max_active_bytes: a.max_active,
        workspace_bytes: 2 * workspace,
        context_bytes: context,
        nccl_bytes: nccl,
        device_bytes: a.max_reserved + context + nccl,
        out_of_memory: a.oom,
        out_of_memory_need_bytes: if a.oom { a.oom_need + context + nccl } else { 0 },
        segments,
    };
    // (replayed as more micro-batches: each step jumped, or stopped over the limit first)
    let shown = !longer || jumps == steps || valid_end;
    (r, stopped, skipped, shown)
}

impl Reserved {
    /// What the plan needs of the device: on a GPU the allocator's reserved peak plus the
    /// CUDA context and NCCL's buffers — where the replay ran out of the device's memory, at
    /// least what the failed request would have reserved, and the tensor peak with the context
    /// and NCCL (the replay stops at the device's size: its reserved peak is no measure then);
    /// on the CPU (no caching allocator) the tensor peak.
    pub fn needed_bytes(&self, plan: &Plan) -> u64 {
        match plan.options.device {
            Device::Cuda if self.out_of_memory => self.device_bytes.max(self.out_of_memory_need_bytes).max(plan.memory.peak_bytes + self.context_bytes + self.nccl_bytes),
            Device::Cuda => self.device_bytes,
            Device::Cpu => plan.memory.peak_bytes,
        }
    }

    /// One line: the reserved peak and what the device holds beyond it.
    pub fn render(&self, plan: &Plan) -> String {
        use crate::print::bytes;
        if plan.options.device == Device::Cpu {
            return String::new();
        }
        format!(
            "max reserved {} (caching allocator{}{}) + CUDA context {} + NCCL {} = {} on the device",
            bytes(self.max_reserved_bytes),
            if plan.options.expandable_segments { ", expandable segments" } else { "" },
            if self.out_of_memory { "; a request fails: CUDA out of memory" } else { "" },
            bytes(self.context_bytes),
            bytes(self.nccl_bytes),
            bytes(self.device_bytes)
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment of the naive allocator: pool, mapped bytes, page, blocks in address order
    /// (size, free).
    type NaiveSeg = (PoolKey, u64, u64, Vec<(u64, bool)>);

    /// The allocator's rules written the slow way (every block of every segment scanned per
    /// request) — the oracle the indexed allocator must agree with on random traces.
    struct Naive {
        expandable: bool,
        segs: Vec<NaiveSeg>,
        reserved: u64,
        max_reserved: u64,
    }

    impl Naive {
        fn malloc(&mut self, stream: u8, bytes: u64) -> (usize, usize) {
            let size = round_size(bytes);
            let small = size <= SMALL_SIZE;
            let pool = (stream, small);
            // best fit: (size, segment, offset) smallest; an expandable tail only as a last resort
            let mut best: Option<(bool, u64, usize, u64, usize)> = None;
            for (s, (p, mapped, _, blocks)) in self.segs.iter().enumerate() {
                if *p != pool {
                    continue;
                }
                let mut off = 0;
                for (i, &(bs, free)) in blocks.iter().enumerate() {
                    if free && bs >= size {
                        let tail = self.expandable && off + bs == *mapped && i + 1 == blocks.len();
                        let key = (tail, bs, s, off, i);
                        if best.is_none_or(|b| key < b) {
                            best = Some(key);
                        }
                    }
                    off += bs;
                }
            }
            let (s, i) = match best {
                Some((_, _, s, _, i)) => (s, i),
                None if !self.expandable => {
                    let seg = allocation_size(size);
                    self.segs.push((pool, seg, seg, vec![(seg, true)]));
                    self.reserved += seg;
                    (self.segs.len() - 1, 0)
                }
                None => {
                    let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
                    let s = match self.segs.iter().position(|x| x.0 == pool) {
                        Some(s) => s,
                        None => {
                            self.segs.push((pool, 0, page, vec![]));
                            self.segs.len() - 1
                        }
                    };
                    let seg = &mut self.segs[s];
                    let have = match seg.3.last() {
                        Some(&(bs, true)) => {
                            seg.3.pop();
                            bs
                        }
                        _ => 0,
                    };
                    let more = (size - have).div_ceil(page) * page;
                    seg.1 += more;
                    seg.3.push((have + more, true));
                    self.reserved += more;
                    (s, seg.3.len() - 1)
                }
            };
            self.max_reserved = self.max_reserved.max(self.reserved);
            let expandable = self.expandable;
            let blocks = &mut self.segs[s].3;
            let bs = blocks[i].0;
            let split = if small || expandable { bs - size >= MIN_BLOCK } else { bs - size > SMALL_SIZE };
            if split {
                blocks[i] = (size, false);
                blocks.insert(i + 1, (bs - size, true));
            } else {
                blocks[i].1 = false;
            }
            (s, i)
        }

        /// Frees the `k`-th allocated block of segment `s`.
        fn free(&mut self, s: usize, off: u64) {
            let blocks = &mut self.segs[s].3;
            let mut o = 0;
            let Some(i) = blocks.iter().position(|&(bs, _)| {
                let hit = o == off;
                o += bs;
                hit
            }) else {
                return;
            };
            blocks[i].1 = true;
            if i + 1 < blocks.len() && blocks[i + 1].1 {
                blocks[i].0 += blocks.remove(i + 1).0;
            }
            if i > 0 && blocks[i - 1].1 {
                let b = blocks.remove(i);
                blocks[i - 1].0 += b.0;
            }
        }
    }

    fn offset_of(n: &Naive, s: usize, i: usize) -> u64 {
        n.segs[s].3[..i].iter().map(|b| b.0).sum()
    }

    /// A deterministic pseudo-random trace of allocations and frees on two streams, sizes
    /// from 100 B to 60 MiB.
    fn trace(seed: u64, n: usize) -> Vec<(bool, u8, u64, usize)> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|_| {
                let r = next();
                let size = match r % 4 {
                    0 => 100 + next() % 4096,
                    1 => 1 + next() % (2 * MIB),
                    2 => next() % (12 * MIB),
                    _ => next() % (60 * MIB),
                };
                (r % 3 != 0, (next() % 2) as u8, size.max(1), (next() % 64) as usize)
            })
            .collect()
    }

    #[test]
    fn indexed_allocator_agrees_with_the_naive_one() {
        for expandable in [false, true] {
            for seed in 0..20 {
                let mut a = Allocator::new(expandable, u64::MAX);
                let mut n = Naive { expandable, segs: vec![], reserved: 0, max_reserved: 0 };
                let mut live: Vec<(Handle, (usize, u64))> = vec![];
                for (alloc, stream, size, pick) in trace(seed, 400) {
                    if alloc || live.is_empty() {
                        let (h, _) = a.malloc(stream, size).expect("no capacity limit");
                        let (s, i) = n.malloc(stream, size);
                        let no = (s, offset_of(&n, s, i));
                        let b = a.blocks[h as usize];
                        assert_eq!((b.seg, b.off), no, "seed {seed} expandable {expandable}: placement");
                        live.push((h, no));
                    } else {
                        let (h, (s, off)) = live.swap_remove(pick % live.len());
                        a.release(h);
                        n.free(s, off);
                    }
                    assert_eq!(a.reserved, n.reserved, "seed {seed} expandable {expandable}: reserved");
                }
                assert_eq!(a.max_reserved, n.max_reserved);
            }
        }
    }

    #[test]
    fn segment_sizes_and_splits_follow_the_caching_allocator() {
        let mut a = Allocator::new(false, u64::MAX);
        // small requests share a 2 MiB segment
        a.malloc(0, 1000);
        a.malloc(0, 4000);
        assert_eq!(a.reserved, 2 * MIB);
        // 1-10 MiB requests come from 20 MiB segments, split while > 1 MiB remains
        let (h5, got) = a.malloc(0, 5 * MIB).unwrap();
        assert_eq!((got, a.reserved), (5 * MIB, 22 * MIB));
        a.malloc(0, 5 * MIB);
        assert_eq!(a.reserved, 22 * MIB);
        // a remainder of <= 1 MiB is not split off: the block is handed out whole
        let (_, got) = a.malloc(0, 9 * MIB + 512 * 1024).unwrap();
        assert_eq!((got, a.reserved), (10 * MIB, 22 * MIB));
        // >= 10 MiB: its own segment, rounded to 2 MiB
        a.malloc(0, 11 * MIB);
        assert_eq!(a.reserved, 34 * MIB);
        // a freed block serves its own stream only
        a.release(h5);
        a.malloc(1, 5 * MIB);
        assert_eq!(a.reserved, 54 * MIB);
        a.malloc(0, 5 * MIB);
        assert_eq!(a.reserved, 54 * MIB);
        assert_eq!(a.max_reserved, 54 * MIB);
    }

    #[test]
    fn expandable_segments_grow_in_pages_and_release_under_pressure() {
        let mut a = Allocator::new(true, 400 * MIB);
        let (x, _) = a.malloc(0, 100 * MIB).unwrap();
        a.malloc(0, 100 * MIB);
        assert_eq!(a.reserved, 200 * MIB);
        a.release(x);
        // 150 MiB fits nowhere inside: the segment grows by 8 pages of 20 MiB
        a.malloc(0, 150 * MIB);
        assert_eq!(a.reserved, 360 * MIB);
        // fixed segments: the same trace reserves a segment per large request
        let mut b = Allocator::new(false, 300 * MIB);
        let (x, _) = b.malloc(0, 100 * MIB).unwrap();
        b.malloc(0, 100 * MIB);
        b.release(x);
        // 150 MiB does not fit in 300 MiB next to 200 cached: the free 100 MiB segment is
        // released first
        b.malloc(0, 150 * MIB);
        assert_eq!(b.reserved, 250 * MIB);
        assert!(!b.oom);
        assert!(b.malloc(0, 200 * MIB).is_none());
        assert!(b.oom);
    }
}
