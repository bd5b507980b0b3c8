//! What the tune benches share: the models and the H100 profile from the repository, and the
//! options of their scenarios (bf16 params, f32 reduce and masters, AdamW: the README's).

use fsdp_planner::Options;

pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

pub fn h100() -> fsdp_planner::hardware::Hardware {
    ron::from_str(&std::fs::read_to_string(format!("{ROOT}/models/hardware/h100-sxm.ron")).unwrap()).unwrap()
}

pub fn model(name: &str) -> fsdp_ir::Model {
    fsdp_ir::parse_model(&std::fs::read_to_string(format!("{ROOT}/models/{name}.ron")).unwrap(), name).unwrap()
}

pub fn options(world_size: u64, seq: u64) -> Options {
    Options {
        world_size,
        seq,
        param_dtype: fsdp_ir::DType::parse("bf16"),
        reduce_dtype: fsdp_ir::DType::parse("f32"),
        master_dtype: fsdp_ir::DType::parse("f32"),
        optimizer: fsdp_planner::Optimizer::AdamW,
        ..Options::default()
    }
}
