use std::time::Instant;
fn main() {
    let text = std::fs::read_to_string("models/llama-3.1-8b.ron").unwrap();
    let m = fsdp_ir::parse_model(&text, "x").unwrap();
    let hw: fsdp_planner::hardware::Hardware = ron::from_str(&std::fs::read_to_string("models/hardware/h100-sxm.ron").unwrap()).unwrap();
    let opts = fsdp_planner::Options { world_size: 8, batch: 2, seq: 8192, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), checkpoint: vec!["LlamaDecoderLayer".into()], ..Default::default() };
    for _ in 0..3 {
        let t0 = Instant::now();
        let p = fsdp_planner::plan(&m, &opts).unwrap();
        let t1 = Instant::now();
        let t = fsdp_planner::timeline::predict(&p, &m, &hw);
        let t2 = Instant::now();
        let r = fsdp_planner::reserved::predict(&p, &hw);
        let t3 = Instant::now();
        println!("plan {:?} predict {:?} reserved {:?} ({} ops, {} bufs) {} {}", t1 - t0, t2 - t1, t3 - t2, p.schedule.len(), p.buffers.len(), t.step_time_s, r.max_reserved_bytes);
    }
}
