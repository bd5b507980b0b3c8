//! Golden tests: a model file in, the printed plan out. Bless with `UPDATE_EXPECT=1 cargo test`.

use expect_test::{expect_file, ExpectFile};
use fsdp_planner::{AttnImpl, Device, Options};

fn model(name: &str) -> fsdp_ir::Model {
    let path = format!("{}/models/{name}.ron", env!("CARGO_MANIFEST_DIR"));
    fsdp_ir::parse_model(&std::fs::read_to_string(&path).unwrap(), &path).unwrap()
}

fn check(model_name: &str, opts: Options, expect: ExpectFile) {
    let m = model(model_name);
    let plan = fsdp_planner::plan(&m, &opts).unwrap();
    expect.assert_eq(&fsdp_planner::print::render(&plan, false));
}

#[test]
fn tiny_gpt2_fsdp2_schedule() {
    let opts = Options { world_size: 2, batch: 2, seq: 32, device: Device::Cpu, ..Options::default() };
    check("tiny-gpt2", opts, expect_file!["golden/tiny-gpt2-ws2.txt"]);
}

#[test]
fn tiny_llama_flat_backward_post() {
    let opts = Options {
        world_size: 4,
        batch: 1,
        seq: 16,
        layout: fsdp_planner::Layout::Flat,
        backward_prefetch: fsdp_planner::BackwardPrefetch::Post,
        ..Options::default()
    };
    check("tiny-llama", opts, expect_file!["golden/tiny-llama-flat-post-ws4.txt"]);
}

#[test]
fn tiny_llama_mp_checkpoint_grad_accum() {
    let opts = Options {
        world_size: 2,
        batch: 1,
        seq: 16,
        param_dtype: fsdp_ir::DType::parse("bf16"),
        reduce_dtype: fsdp_ir::DType::parse("f32"),
        checkpoint: vec!["LlamaDecoderLayer".into()],
        grad_accum: 2,
        ..Options::default()
    };
    check("tiny-llama", opts, expect_file!["golden/tiny-llama-mp-ac-ga2.txt"]);
}

/// torchtitan's wrapping: the embeddings a unit, the final norm and the head one unit
/// (`model.norm+lm_head`) kept after forward, the root without params (its schedule has no
/// collectives), explicit prefetch through them.
#[test]
fn tiny_llama_torchtitan_wrapping() {
    let opts = Options {
        world_size: 2,
        batch: 1,
        seq: 16,
        device: Device::Cpu,
        policy: fsdp_planner::Policy::Modules(vec!["model.embed_tokens".into(), "model.layers.*".into(), "model.norm+lm_head".into()]),
        unit_reshard: vec![("last".into(), false)],
        forward_prefetch: 1,
        backward_prefetch: fsdp_planner::BackwardPrefetch::Depth(1),
        ..Options::default()
    };
    check("tiny-llama", opts, expect_file!["golden/tiny-llama-torchtitan-wrap-ws2.txt"]);
}

/// Issue 7: what attention saves for backward, eager vs sdpa, for llama-3-8b at S=4096.
#[test]
fn eager_vs_sdpa_activation_llama3_8b_s4096() {
    let m = model("llama-3-8b");
    let mut out = String::new();
    let mut peaks = vec![];
    for attn in [AttnImpl::Sdpa, AttnImpl::Eager] {
        let opts = Options {
            world_size: 8,
            batch: 1,
            seq: 4096,
            param_dtype: fsdp_ir::DType::parse("bf16"),
            reduce_dtype: fsdp_ir::DType::parse("f32"),
            attn_implementation: Some(attn),
            ..Options::default()
        };
        let plan = fsdp_planner::plan(&m, &opts).unwrap();
        let act = plan.memory.breakdown[&fsdp_planner::Category::Activation];
        out += &format!(
            "{:<6} peak {:>14} B  activation at peak {:>14} B  ({})\n",
            attn.name(),
            plan.memory.peak_bytes,
            act,
            fsdp_planner::print::bytes(act)
        );
        out += &fsdp_planner::activation::explain(&m, &opts, "model.layers.0.self_attn.sdpa");
        peaks.push(act);
    }
    out += &format!(
        "eager - sdpa activation at peak: {} B ({})\n",
        peaks[1] as i64 - peaks[0] as i64,
        fsdp_planner::print::bytes(peaks[1].saturating_sub(peaks[0]))
    );
    expect_file!["golden/eager-vs-sdpa-llama-3-8b-s4096.txt"].assert_eq(&out);
}

/// What DeepSeek-V3's latent attention and its router keep for backward at real size, per
/// device and attention implementation (CPU: SDPA's math path, FSDP2-exact in
/// tests/conformance.rs; CUDA: the memory-efficient kernel, from its saved tensors).
#[test]
fn deepseek_v3_latent_attention_saves() {
    let m = model("deepseek-v3");
    let mut out = String::new();
    for (device, attn) in [(Device::Cpu, AttnImpl::Sdpa), (Device::Cpu, AttnImpl::Eager), (Device::Cuda, AttnImpl::Sdpa)] {
        let opts = Options {
            world_size: 256,
            batch: 1,
            seq: 4096,
            param_dtype: fsdp_ir::DType::parse("bf16"),
            reduce_dtype: fsdp_ir::DType::parse("f32"),
            attn_implementation: Some(attn),
            device,
            ..Options::default()
        };
        out += &format!("device {device:?}\n");
        for op in ["model.layers.3.self_attn.sdpa", "model.layers.3.self_attn.rope_q", "model.layers.3.mlp.gate", "model.layers.3.mlp.gate.route"] {
            out += &fsdp_planner::activation::explain(&m, &opts, op);
        }
    }
    expect_file!["golden/deepseek-v3-latent-attention.txt"].assert_eq(&out);
}
