//! The checker rejects broken plans: each case takes a plan the planner emitted (which
//! passes), breaks one rule the checker promises to enforce, and expects that rule's message.

use fsdp_planner::{checker, Category, Event, OpKind, Options, Plan};

fn planned(name: &str, opts: Options) -> (fsdp_ir::Model, Plan) {
    let text = std::fs::read_to_string(format!("{}/../models/{name}.ron", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let m = fsdp_ir::parse_model(&text, name).unwrap();
    let p = fsdp_planner::plan(&m, &opts).unwrap();
    (m, p)
}

fn tiny() -> (fsdp_ir::Model, Plan) {
    planned("tiny-llama", Options { world_size: 2, ..Options::default() })
}

/// Applies `mutate` to a fresh plan and returns the checker's message.
fn broken(mutate: impl FnOnce(&mut Plan)) -> String {
    let (m, mut p) = tiny();
    checker::check(&m, &p).expect("the planner's own plan passes");
    mutate(&mut p);
    match checker::check(&m, &p) {
        Ok(()) => panic!("the checker accepted a broken plan"),
        Err(e) => e.to_string(),
    }
}

/// The op index of the first event allocating or freeing `b`.
fn event_op(p: &Plan, ev: Event) -> usize {
    p.schedule.iter().position(|o| o.events.contains(&ev)).unwrap()
}

#[test]
fn accepts_what_the_planner_emits() {
    for layout in [fsdp_planner::Layout::Fsdp2, fsdp_planner::Layout::Flat] {
        for name in ["tiny-llama", "tiny-gpt2", "tiny-mixtral", "tiny-llama-tied"] {
            let (m, p) = planned(name, Options { world_size: 3, layout, grad_accum: 2, seq: 64, ..Options::default() });
            checker::check(&m, &p).unwrap();
        }
    }
}

#[test]
fn overlapping_live_buffers() {
    let msg = broken(|p| {
        // two activations alive at the same time, put at the same offset
        let acts: Vec<usize> = p
            .buffers
            .iter()
            .filter(|b| b.category == Category::Activation && b.bytes > 0 && b.free.is_some())
            .map(|b| b.id.index())
            .collect();
        let (a, b) = acts
            .iter()
            .flat_map(|&a| acts.iter().map(move |&b| (a, b)))
            .find(|&(a, b)| {
                let (x, y) = (&p.buffers[a], &p.buffers[b]);
                a != b && x.alloc < y.alloc && y.alloc < x.free.unwrap() && y.offset != x.offset
            })
            .unwrap();
        p.buffers[b].offset = p.buffers[a].offset;
    });
    assert!(msg.contains("overlaps live"), "{msg}");
}

#[test]
fn a_buffer_off_the_allocator_alignment() {
    // libtorch's vectorized CPU kernels may round differently on a buffer that does not start
    // where c10's allocator would start it (64 bytes; CUDA's caching allocator: 512): every
    // arena offset is aligned
    let msg = broken(|p| {
        let b = p.buffers.iter().position(|b| b.bytes > 0 && b.free.is_some()).unwrap();
        p.buffers[b].offset += 8;
    });
    assert!(msg.contains("off the device's 512-byte alignment"), "{msg}");
    for (device, align) in [(fsdp_planner::Device::Cpu, 64), (fsdp_planner::Device::Cuda, 512)] {
        let (m, mut p) = planned("tiny-llama", Options { world_size: 2, device, ..Options::default() });
        assert!(p.buffers.iter().all(|b| b.offset % align == 0));
        let b = p.buffers.iter().position(|b| b.bytes > 0 && b.free.is_some()).unwrap();
        p.buffers[b].offset += align / 2;
        let msg = checker::check(&m, &p).unwrap_err().to_string();
        assert!(msg.contains(&format!("off the device's {align}-byte alignment")), "{msg}");
    }
}

#[test]
fn params_used_before_the_gather() {
    let msg = broken(|p| {
        // drop the copy-out's unsharded params of the first unit with params: the forward ops
        // of that unit now read sharded params
        let b = p
            .buffers
            .iter()
            .find(|b| b.category == Category::UnshardedParam && b.unit.is_some())
            .map(|b| b.id)
            .unwrap();
        let (a, f) = (event_op(p, Event::Alloc(b)), event_op(p, Event::Free(b)));
        p.schedule[a].events.retain(|e| *e != Event::Alloc(b));
        p.schedule[f].events.retain(|e| *e != Event::Free(b));
    });
    assert!(msg.contains("while it is sharded"), "{msg}");
}

#[test]
fn reduce_scatter_before_the_last_gradient_write() {
    let msg = broken(|p| {
        // move a unit's reduce-scatter kind onto the first backward op of the step
        let rs = p.schedule.iter().position(|o| matches!(o.kind, OpKind::ReduceScatter { .. })).unwrap();
        let first_bwd = p.schedule.iter().position(|o| matches!(o.kind, OpKind::Backward { .. })).unwrap();
        let kind = p.schedule[rs].kind.clone();
        p.schedule[first_bwd].kind = kind;
    });
    assert!(msg.contains("before its last gradient write"), "{msg}");
}

#[test]
fn double_free_and_leak() {
    let msg = broken(|p| {
        let b = p.buffers.iter().find(|b| b.category == Category::Activation && b.free.is_some()).unwrap().id;
        let f = event_op(p, Event::Free(b));
        p.schedule[f].events.push(Event::Free(b));
    });
    assert!(msg.contains("which is not live"), "{msg}");
    let msg = broken(|p| {
        let b = p.buffers.iter().find(|b| b.category == Category::Activation && b.free.is_some()).unwrap().id;
        let f = event_op(p, Event::Free(b));
        p.schedule[f].events.retain(|e| *e != Event::Free(b));
        p.memory.peak_bytes = u64::MAX; // keep the leak from being hidden by the peak check
    });
    assert!(msg.contains("still live at the end of the step") || msg.contains("simulated peak"), "{msg}");
}

#[test]
fn forward_dependency_and_wrong_peak() {
    let msg = broken(|p| {
        let n = p.schedule.len();
        p.schedule[1].deps.push(fsdp_planner::ids::OpId::new(n - 1));
    });
    assert!(msg.contains("depends on later"), "{msg}");
    let msg = broken(|p| p.memory.peak_bytes += 1);
    assert!(msg.contains("simulated peak"), "{msg}");
    let msg = broken(|p| {
        *p.memory.breakdown.get_mut(&Category::Activation).unwrap() += 512;
    });
    assert!(msg.contains("activation: simulated"), "{msg}");
}
