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

pub fn assign_offsets(ops: &[ScheduleOp], buffers: &mut [BufferInfo]) {
    let mut free = FreeList::default();
    let mut top = 0u64;
    for op in ops {
        for ev in &op.events {
            match *ev {
                Event::Alloc(b) => {
                    let size = buffers[b.index()].bytes;
                    let off = match free.by_size.range((size, 0)..).next().copied() {
                        Some((s, o)) => {
                            free.remove(o);
                            if s > size {
                                free.insert(o + size, s - size);
                            }
                            o
                        }
                        None => {
                            // grow the arena, reusing a free block that ends at the top
                            match free.by_off.iter().next_back().map(|(&o, &s)| (o, s)) {
                                Some((o, s)) if o + s == top => {
                                    free.remove(o);
                                    top = o + size;
                                    o
                                }
                                _ => {
                                    let o = top;
                                    top += size;
                                    o
                                }
                            }
                        }
                    };
                    buffers[b.index()].offset = off;
                }
                Event::Free(b) => {
                    let (mut off, mut size) = (buffers[b.index()].offset, buffers[b.index()].bytes);
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
                    if let Some(ns) = free.remove(off + size) {
                        size += ns;
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
}
