//! Pass 4, buffer assignment: offsets in a per-rank arena by liveness — best fit over a
//! coalescing free list, in allocation order (O(log n) per event). Every storage starts on
//! the device allocator's alignment ([`Device::alignment`]), so a buffer occupies its
//! [`spans`] in the arena, which may exceed the bytes memory counts.

use crate::options::{Device, Layout, Options, Strategy};
use crate::plan::{BufferInfo, Category, Event, ScheduleOp};
use crate::units::Unit;
use std::collections::{BTreeMap, BTreeSet};

/// The storages a buffer of unit params holds one per param (FSDP2's per-param unsharded
/// params: each param its own storage, cut from the all-gather output): `(bytes, padded
/// bytes)` of each, in the unit's param order. `None` for a buffer that is one storage.
pub fn param_storages(opts: &Options, units: &[Unit], buf: &BufferInfo) -> Option<Vec<(u64, u64)>> {
    let per_param = opts.layout == Layout::Fsdp2 && opts.strategy != Strategy::NoShard;
    if !per_param || buf.category != Category::UnshardedParam {
        return None;
    }
    let unit = units.get(buf.unit?.index())?;
    Some(
        unit.params
            .iter()
            .map(|p| {
                let d = opts.gathered_dtype_of(p);
                (p.numel * d.size(), p.padded_numel.max(p.numel) * d.size())
            })
            .collect(),
    )
}

/// `bytes` rounded up to the device's alignment.
pub fn aligned(device: Device, bytes: u64) -> u64 {
    let a = device.alignment();
    bytes.div_ceil(a) * a
}

/// The bytes each buffer occupies in the arena: its bytes rounded up to the device's
/// alignment, or, for a buffer of per-param storages, each param's padded bytes rounded up
/// (so that every param starts aligned). Zero-byte buffers occupy nothing.
pub fn spans(opts: &Options, units: &[Unit], buffers: &[BufferInfo]) -> Vec<u64> {
    let dev = opts.device;
    buffers
        .iter()
        .map(|b| match param_storages(opts, units, b) {
            _ if b.bytes == 0 => 0,
            Some(ps) => ps.iter().map(|&(_, pb)| aligned(dev, pb)).sum::<u64>().max(aligned(dev, b.bytes)),
            None => aligned(dev, b.bytes),
        })
        .collect()
}

/// Free blocks indexed by offset (for coalescing) and by (size, offset) (for best fit).
#[derive(Default)]
struct FreeList {
    by_off: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl FreeList {
    fn insert(&mut self, off: u64, size: u64) {
        self.by_off.insert(off, size);
        self.by_size.insert((size, off));
    }
    fn remove(&mut self, off: u64) -> Option<u64> {
        let size = self.by_off.remove(&off)?;
        self.by_size.remove(&(size, off));
        Some(size)
    }
}

/// The arena offset of every buffer (indexed like `buffers`), each occupying its span
/// (`spans[b]`, see [`spans`]); offsets are multiples of the alignment the spans are rounded to.
pub fn offsets(ops: &[ScheduleOp], spans: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; spans.len()];
    // Invariant: the free list is coalesced and no free block ends at `top`.
    let mut free = FreeList::default();
    let mut top = 0u64;
    for op in ops {
        let mut evs = op.events.iter().peekable();
        while let Some(ev) = evs.next() {
            match *ev {
                Event::Alloc(b) => {
                    let size = spans[b.index()];
                    let best = free.by_size.range((size, 0)..).next().copied();
                    if evs.peek() == Some(&&Event::Free(b)) {
                        // A transient (freed right away): with the invariant, allocating and
                        // freeing it leaves the free list as it was.
                        evs.next();
                        out[b.index()] = best.map_or(top, |(_, o)| o);
                        continue;
                    }
                    let off = match best {
                        Some((s, o)) => {
                            free.remove(o);
                            if s > size {
                                free.insert(o + size, s - size);
                            }
                            o
                        }
                        None => {
                            let o = top;
                            top += size;
                            o
                        }
                    };
                    out[b.index()] = off;
                }
                Event::Free(b) => {
                    let (mut off, mut size) = (out[b.index()], spans[b.index()]);
                    if size == 0 {
                        continue;
                    }
                    if let Some((&po, &ps)) = free.by_off.range(..off).next_back() {
                        if po + ps == off {
                            free.remove(po);
                            off = po;
                            size += ps;
                        }
                    }
                    // nothing is free above the top (the invariant), so only look there below it
                    if off + size != top {
                        if let Some(ns) = free.remove(off + size) {
                            size += ns;
                        }
                    }
                    if off + size == top {
                        top = off;
                    } else {
                        free.insert(off, size);
                    }
                }
            }
        }
    }
    out
}
