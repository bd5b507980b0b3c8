//! Executing into the plan's arena: with `RunConfig::arena`, every step runs with one block of
//! the plan's arena size, and each allocation the plan has (same op, same size) is placed at
//! the plan's offset for it, unless a tensor placed there is still alive. Losses must be
//! bit-identical to the heap run (nothing placed overwrote a live tensor), and most of the
//! step's bytes must land at the plan's offsets (the figure is printed).

use fsdp_planner::{Device, Layout, Options, Policy};
use fsdp_runtime::train::{run_cpu, RunConfig};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn model(name: &str) -> fsdp_ir::Model {
    let cfg = format!("models/{name}.config.json");
    fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(&cfg)).unwrap(), &cfg, name).unwrap()
}

#[test]
fn steps_in_the_plan_arena_train_identically() {
    let base = Options { world_size: 2, batch: 2, seq: 32, policy: Policy::Auto, device: Device::Cpu, ..Options::default() };
    let cases: Vec<(&str, &str, Options)> = vec![
        ("tiny-llama", "ws 2", base.clone()),
        ("tiny-llama", "flat layout", Options { layout: Layout::Flat, ..base.clone() }),
        ("tiny-llama", "checkpointing", Options { checkpoint: vec!["LlamaDecoderLayer".into()], ..base.clone() }),
        ("tiny-gpt2", "dropout 0.1", base.clone()),
        ("tiny-mixtral", "MoE", base.clone()),
    ];
    let mut rows = vec![];
    for (name, what, opts) in cases {
        let m = model(name);
        let plan = fsdp_planner::plan(&m, &opts).unwrap();
        let heap = run_cpu(&plan, &m, &RunConfig::new(3), |_| {}).unwrap();
        let arena = run_cpu(&plan, &m, &RunConfig { arena: true, ..RunConfig::new(3) }, |_| {}).unwrap();
        for (a, b) in heap.iter().zip(&arena) {
            assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "{name} {what}: step {} loss {} in the arena vs {} on the heap", a.step, b.loss, a.loss);
        }
        let st = arena.last().and_then(|r| r.memory.as_ref()).and_then(|m| m.arena).unwrap();
        let frac = st.placed_bytes as f64 / (st.placed_bytes + st.heap_bytes) as f64;
        assert!(frac > 0.4, "{name} {what}: only {:.1}% of the bytes at the plan's offsets", 100.0 * frac);
        rows.push(format!(
            "{name:<13} {what:<14} arena {:>9} B: placed {:>5.1}% of bytes ({} allocations), heap {} B ({} allocations), refused for overlap {}",
            plan.memory.arena_bytes,
            100.0 * frac,
            st.placed,
            st.heap_bytes,
            st.heap,
            st.overlaps
        ));
    }
    println!("{}", rows.join("\n"));
}
