//! The caching-allocator replay on real plans: two steps reach the steady state (a third
//! never raises the reserved peak), reserved ≥ active ≥ the tensor peak.

use fsdp_planner::hardware::Hardware;
use fsdp_planner::reserved::predict_steps;
use fsdp_planner::{AcMode, Options};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn model(name: &str) -> fsdp_ir::Model {
    let p = root().join(format!("models/{name}.ron"));
    fsdp_ir::parse_model(&std::fs::read_to_string(&p).unwrap(), name).unwrap()
}

fn hw(name: &str) -> Hardware {
    ron::from_str(&std::fs::read_to_string(root().join(format!("models/hardware/{name}.ron"))).unwrap()).unwrap()
}

#[test]
fn two_steps_reach_the_steady_state() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    let cases = [
        ("llama-3.1-8b", Options { world_size: 8, batch: 2, seq: 8192, param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, checkpoint: vec!["LlamaDecoderLayer".into()], ac_mode: AcMode::SelectiveOp, unit_reshard: vec![("last".into(), false)], expandable_segments: true, ..Options::default() }),
        ("llama-3.1-8b", Options { world_size: 128, batch: 2, seq: 8192, param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, checkpoint: vec!["model.layers.{0..9}=full".into(), "model.layers.{10..31}=selective-op".into()], ..Options::default() }),
        ("llama-2-7b", Options { world_size: 8, batch: 8, seq: 2048, param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, checkpoint: vec!["LlamaDecoderLayer".into()], layout: fsdp_planner::Layout::Flat, backward_prefetch: fsdp_planner::BackwardPrefetch::Pre, ..Options::default() }),
        ("mixtral-8x7b", Options { world_size: 8, batch: 1, seq: 4096, param_dtype: bf16, reduce_dtype: f32, checkpoint: vec!["MixtralDecoderLayer".into()], ..Options::default() }),
        ("tiny-llama", Options { world_size: 2, batch: 2, seq: 32, ..Options::default() }),
    ];
    let h = hw("h100-sxm");
    for (name, opts) in cases {
        let plan = fsdp_planner::plan(&model(name), &opts).unwrap();
        let two = predict_steps(&plan, &h, 2);
        let three = predict_steps(&plan, &h, 3);
        eprintln!("{name}: peak {} active {} reserved {} (three steps: {})", plan.memory.peak_bytes, two.max_active_bytes, two.max_reserved_bytes, three.max_reserved_bytes);
        assert!(!two.out_of_memory, "{name}");
        assert_eq!(two.max_reserved_bytes, three.max_reserved_bytes, "{name}");
        assert!(two.max_reserved_bytes >= two.max_active_bytes && two.max_active_bytes >= plan.memory.peak_bytes, "{name}");
    }
}
