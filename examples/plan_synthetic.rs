//! Plans a synthetic N-layer Llama-style model five times and prints each time (profiling aid for the
//! 10,000-layer planning benchmark): `cargo run --release --example plan_synthetic -- 10000`.

use std::time::Instant;

fn main() {
    let layers: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let cfg = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "intermediate_size": 688, "num_hidden_layers": {layers}, "num_attention_heads": 4,
            "vocab_size": 1000}}"#
    );
    let model = fsdp_ir::hf::import_hf(&cfg, "synthetic", "synthetic").expect("import");
    let opts = fsdp_planner::Options {
        world_size: 64,
        policy: fsdp_planner::Policy::Auto,
        seq: 512,
        ..fsdp_planner::Options::default()
    };
    for _ in 0..5 {
        let t = Instant::now();
        let plan = fsdp_planner::plan(&model, &opts).expect("plan");
        let dt = t.elapsed();
        println!("{} ops, {} buffers: {:.3} s", plan.schedule.len(), plan.buffers.len(), dt.as_secs_f64());
        let t = Instant::now();
        drop(plan);
        println!("  drop {:.3} s", t.elapsed().as_secs_f64());
    }
}

