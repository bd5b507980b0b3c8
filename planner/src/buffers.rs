//! Pass 4, buffer assignment: offsets in a per-rank arena by liveness (first fit over a
//! coalescing free list, in allocation order).

use crate::plan::{BufferInfo, Event, ScheduleOp};
use std::collections::BTreeMap;

pub fn assign_offsets(ops: &[ScheduleOp], buffers: &mut [BufferInfo]) {
    // free blocks: offset -> size; `top` is the end of the used arena
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    let mut top = 0u64;
    for op in ops {
        for ev in &op.events {
            match *ev {
                Event::Alloc(b) => {
                    let size = buffers[b.index()].bytes;
                    let hit = free.iter().find(|(_, &s)| s >= size).map(|(&o, &s)| (o, s));
                    let off = match hit {
                        Some((o, s)) => {
                            free.remove(&o);
                            if s > size {
                                free.insert(o + size, s - size);
                            }
                            o
                        }
                        None => {
                            // extend the last free block if it touches the top
                            match free.iter().next_back().map(|(&o, &s)| (o, s)) {
                                Some((o, s)) if o + s == top => {
                                    free.remove(&o);
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
                    if let Some((&po, &ps)) = free.range(..off).next_back() {
                        if po + ps == off {
                            free.remove(&po);
                            off = po;
                            size += ps;
                        }
                    }
                    if let Some(&ns) = free.get(&(off + size)) {
                        free.remove(&(off + size));
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
