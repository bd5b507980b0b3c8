//! Where one tune candidate's time goes (plan, timeline, allocator replay) on Llama-3-8B:
//! a profiling aid for `tune`'s speed (`cargo run --release --example tune_cost`).

use std::time::Instant;

fn main() {
    let root = env!("CARGO_MANIFEST_DIR");
    let hw: fsdp_planner::hardware::Hardware = ron::from_str(&std::fs::read_to_string(format!("{root}/models/hardware/h100-sxm.ron")).expect("profile")).expect("profile parses");
    let m = fsdp_ir::parse_model(&std::fs::read_to_string(format!("{root}/models/llama-3-8b.ron")).expect("model"), "llama-3-8b").expect("model parses");
    for (batch, ckpt) in [(1u64, false), (4, true)] {
        let opts = fsdp_planner::Options {
            world_size: 8,
            batch,
            seq: 8192,
            param_dtype: fsdp_ir::DType::parse("bf16"),
            reduce_dtype: fsdp_ir::DType::parse("f32"),
            master_dtype: fsdp_ir::DType::parse("f32"),
            checkpoint: if ckpt { vec!["model.layers.{0..15}=full".into(), "model.layers.{16..31}=selective-op".into()] } else { vec![] },
            ..Default::default()
        };
        let n = 20;
        let t0 = Instant::now();
        let mut plan = None;
        for _ in 0..n {
            plan = Some(fsdp_planner::plan_unchecked(&m, &opts).expect("plans"));
        }
        let tp = t0.elapsed().as_secs_f64() / n as f64;
        let plan = plan.expect("planned");
        let t1 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(fsdp_planner::timeline::predict(&plan, &m, &hw));
        }
        let tt = t1.elapsed().as_secs_f64() / n as f64;
        let t2 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(fsdp_planner::reserved::predict(&plan, &hw));
        }
        let tr = t2.elapsed().as_secs_f64() / n as f64;
        println!("batch {batch} checkpointed {ckpt}: plan {:.2} ms, timeline {:.2} ms, allocator replay {:.2} ms ({} schedule ops)", tp * 1e3, tt * 1e3, tr * 1e3, plan.schedule.len());
    }
}
