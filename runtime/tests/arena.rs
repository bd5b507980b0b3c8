//! Executing into the plan's arena (`RunConfig::arena`, the default): every step runs in one
//! block of the plan's arena size; the first step records what each schedule op allocates,
//! and from the second on each allocation that is one of the plan's buffers goes to that
//! buffer's offset, the kernel temporaries into space the plan leaves free at their op
//! (`fsdp_runtime::placement`). Losses must be bit-identical to the heap run (nothing placed
//! overwrote a live tensor), the replayed steps must allocate exactly what was recorded and
//! never find a region in use, and at least 90% of a step's bytes must be in the arena (the
//! figures are printed).

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
        ("tiny-llama", "grad accum 2", Options { grad_accum: 2, ..base.clone() }),
        ("tiny-llama", "HSDP 2 x 2", Options { world_size: 4, strategy: fsdp_planner::Strategy::HybridShard { shard_size: 2 }, ..base.clone() }),
        ("tiny-llama", "bf16 / f32", Options { param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..base.clone() }),
        ("tiny-gpt2", "dropout 0.1", base.clone()),
        ("tiny-mixtral", "MoE", base.clone()),
    ];
    let mut rows = vec![];
    for (name, what, opts) in cases {
        let m = model(name);
        let plan = fsdp_planner::plan(&m, &opts).unwrap();
        let heap = run_cpu(&plan, &m, &RunConfig { arena: false, ..RunConfig::new(3) }, |_| {}).unwrap();
        let arena = run_cpu(&plan, &m, &RunConfig { arena: true, ..RunConfig::new(3) }, |_| {}).unwrap();
        for (a, b) in heap.iter().zip(&arena) {
            assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "{name} {what}: step {} loss {} in the arena vs {} on the heap", a.step, b.loss, a.loss);
        }
        let st = arena.last().and_then(|r| r.memory.as_ref()).and_then(|m| m.arena).unwrap();
        let frac = st.placed_bytes as f64 / (st.placed_bytes + st.heap_bytes) as f64;
        assert!(frac > 0.9, "{name} {what}: only {:.1}% of the bytes in the arena", 100.0 * frac);
        assert_eq!((st.overlaps, st.mismatched), (0, 0), "{name} {what}: the replayed step departed from the recorded one");
        rows.push(format!(
            "{name:<13} {what:<14} arena {:>9} B: placed {:>5.1}% of bytes ({} allocations), heap {} B ({} allocations), refused for overlap {}, not as recorded {}",
            plan.memory.arena_bytes,
            100.0 * frac,
            st.placed,
            st.heap_bytes,
            st.heap,
            st.overlaps,
            st.mismatched
        ));
    }
    println!("{}", rows.join("\n"));
}
