//! Pass 4, buffer assignment: offsets in a per-rank arena by liveness — best fit over a
//! coalescing free list, in allocation order (O(log n) per event).

use crate::plan::{BufferInfo, Event, ScheduleOp};
use std::collections::{BTreeMap, BTreeSet};

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

/// The arena offset of every buffer (indexed like `buffers`).
pub fn offsets(ops: &[ScheduleOp], buffers: &[BufferInfo]) -> Vec<u64> {
    let mut out = vec![0u64; buffers.len()];
    // Invariant: the free list is coalesced and no free block ends at `top`.
    let mut free = FreeList::default();
    let mut top = 0u64;
    for op in ops {
        let mut evs = op.events.iter().peekable();
        while let Some(ev) = evs.next() {
            match *ev {
                Event::Alloc(b) => {
                    let size = buffers[b.index()].bytes;
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
                    let (mut off, mut size) = (out[b.index()], buffers[b.index()].bytes);
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
