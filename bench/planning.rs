//! Planning speed: llama-3.1-405b at world size 16,384 (target < 50 ms) and a synthetic
//! 10,000-layer model (target < 1 s), release build. Figures go in bench/RESULTS.md.

use criterion::{criterion_group, criterion_main, Criterion};
use fsdp_planner::{Options, Policy};

fn model_405b() -> fsdp_ir::Model {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/llama-3.1-405b.ron")).unwrap();
    fsdp_ir::parse_model(&text, "llama-3.1-405b.ron").unwrap()
}

fn synthetic(layers: u64) -> fsdp_ir::Model {
    let cfg = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "intermediate_size": 688, "num_hidden_layers": {layers}, "num_attention_heads": 4,
            "vocab_size": 1000}}"#
    );
    fsdp_ir::hf::import_hf(&cfg, "synthetic", "synthetic").unwrap()
}

fn bench(c: &mut Criterion) {
    let m = model_405b();
    let opts = Options {
        world_size: 16384,
        batch: 1,
        seq: 8192,
        param_dtype: fsdp_ir::DType::parse("bf16"),
        reduce_dtype: fsdp_ir::DType::parse("f32"),
        ..Options::default()
    };
    c.bench_function("plan llama-3.1-405b ws16384", |b| b.iter_with_large_drop(|| fsdp_planner::plan(&m, &opts).unwrap()));
    let s = synthetic(10_000);
    let opts = Options {
        world_size: 64,
        policy: Policy::Auto,
        seq: 512,
        ..Options::default()
    };
    let mut g = c.benchmark_group("synthetic");
    g.sample_size(10);
    g.bench_function("plan 10000 layers ws64", |b| b.iter_with_large_drop(|| fsdp_planner::plan(&s, &opts).unwrap()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
