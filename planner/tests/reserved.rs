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

/// A profile by name; `NAME+K` with K MiB more device memory (a case that would otherwise
/// run out of it by a few MiB).
fn hw(name: &str) -> Hardware {
    let (name, more) = name.split_once('+').map_or((name, 0), |(n, k)| (n, k.parse::<u64>().unwrap()));
    let mut h: Hardware = ron::from_str(&std::fs::read_to_string(root().join(format!("models/hardware/{name}.ron"))).unwrap()).unwrap();
    h.memory_bytes += more << 20;
    h
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

/// FSDP1 on a GPU frees each unsharded flat param with `record_stream`: the caching allocator
/// keeps its block active until the CPU has waited for that free in FSDP1's rate limiter
/// (`_FreeEventQueue`: before an unshard, one wait for the oldest queued free once two or
/// more are queued). Llama-2-7B's peak (PR #165's rows: the loss's backward, the forward just
/// done) comes with the last blocks' flat params still queued: three (blocks 29 to 31) once
/// the first step has left four queued (its first two unshards and the backward's first
/// prefetch find fewer than two queued, and the root reshards after backward, unmatched) —
/// worked out by hand from FSDP1's queue. FSDP2 frees nothing with `record_stream`.
#[test]
fn fsdp1_flat_params_stay_active_until_the_rate_limiter_waits_for_their_free() {
    // a decoder block's flat param in bf16: 4·4096² + 3·4096·11008 + 2·4096 params (a
    // multiple of the 8 ranks: no padding)
    let flat = (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) * 2u64;
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    // (PR #165's rows: torchtitan's loop of March 2024, whose f32 logits put the peak at the
    // loss's backward, the forward just done)
    let loop_2024 = fsdp_planner::TrainLoop::parse("torchtitan-2024").unwrap();
    let base = Options { world_size: 8, batch: 8, seq: 2048, param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, checkpoint: vec!["LlamaDecoderLayer".into()], train_loop: loop_2024, ..Options::default() };
    let h = hw("h100-96gb-500w");
    let m = model("llama-2-7b");
    let fsdp1 = fsdp_planner::plan(&m, &Options { layout: fsdp_planner::Layout::Flat, backward_prefetch: fsdp_planner::BackwardPrefetch::Pre, ..base.clone() }).unwrap();
    let fsdp2 = fsdp_planner::plan(&m, &base).unwrap();
    let over = |plan: &fsdp_planner::Plan, steps| predict_steps(plan, &h, steps).max_active_bytes - plan.memory.peak_bytes;
    // (what else the active peak holds beyond the tensor peak — two cuBLAS workspaces of 32
    // MiB, blocks rounded to 512 B, remainders under 1 MiB left unsplit — stays well below a
    // flat param; the plan's tensor peak is the steady state's, the optimizer state there:
    // from the second step on)
    let rounding = 64 * 1024 * 1024 + flat / 4;
    assert!(over(&fsdp2, 2) < rounding, "FSDP2: {} over the tensor peak", over(&fsdp2, 2));
    for (steps, queued) in [(2, 3), (3, 3)] {
        let o = over(&fsdp1, steps);
        assert!(o >= queued * flat && o < queued * flat + rounding, "{steps} steps: {o} over the tensor peak, {queued} flat params of {flat} B queued");
    }
}

/// Gradient accumulation: the replay skips the micro-batches that repeat one another once the
/// allocator comes back to the state a micro-batch found (`reserved.rs`'s module doc). Held
/// against the replay of every micro-batch, field for field, for 1 to 16 micro-batches on
/// FSDP2 (mixed precision: the accumulated grads upcast), FSDP1's queued frees, expandable
/// segments, op-level SAC, HSDP, CPU offload and units kept after forward — the 8B case's
/// reserved peak is not monotone in the micro-batches (5 reserves 2 MiB more than 4 and 6),
/// which a skip guessing from the count rather than the state would miss (its first step
/// alternates between two states: a period of two micro-batches), and the last case's
/// second step repeats only every five. The skip must happen too: from 12 micro-batches on,
/// at least all but seven (and the five-micro-batch period's, exactly). And a search's
/// replay, stopped once over its limit, stops where the full replay's need is passed.
#[test]
fn skipping_repeated_micro_batches_replays_every_one_exactly() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    let mp = Options { param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, ..Options::default() };
    let cases = [
        ("llama-3-8b", "h100-sxm", Options { world_size: 8, batch: 1, seq: 4096, ..mp.clone() }),
        ("llama-2-7b", "h100-96gb-500w", Options { world_size: 8, batch: 2, seq: 2048, checkpoint: vec!["LlamaDecoderLayer".into()], layout: fsdp_planner::Layout::Flat, backward_prefetch: fsdp_planner::BackwardPrefetch::Pre, ..mp.clone() }),
        ("llama-3.1-8b", "h100-sxm", Options { world_size: 16, batch: 1, seq: 8192, checkpoint: vec!["model.layers.{0..15}=full".into(), "model.layers.{16..31}=selective-op".into()], unit_reshard: vec![("last".into(), false)], expandable_segments: true, ..mp.clone() }),
        ("llama-3-8b", "h100-sxm", Options { world_size: 16, batch: 2, seq: 4096, checkpoint: vec!["LlamaDecoderLayer".into()], strategy: fsdp_planner::Strategy::HybridShard { shard_size: 8 }, ..mp.clone() }),
        ("llama-3-8b", "h100-sxm", Options { world_size: 8, batch: 1, seq: 2048, device: fsdp_planner::Device::Cuda, offload: fsdp_planner::Offload::Cpu, checkpoint: vec!["LlamaDecoderLayer".into()], ..mp.clone() }),
        ("tiny-llama", "h100-sxm", Options { world_size: 2, batch: 2, seq: 32, ..Options::default() }),
        // (its second step's state repeats every five micro-batches, from the eighth)
        // (64 MiB over an H100's 80 GB: at two micro-batches it needs 33 MiB more than that
        // since a linear's weight grad is made before its input's; its long period comes of
        // the allocator's releases near the device's capacity)
        ("llama-3-8b", "h100-sxm+64", Options { world_size: 8, batch: 2, seq: 4096, checkpoint: vec!["model.layers.{0..11}=full".into(), "model.layers.{12..31}=selective-op".into()], reshard_after_forward: Some(false), policy: fsdp_planner::Policy::parse("modules:model.embed_tokens,model.layers.*,lm_head").unwrap(), forward_prefetch: 1, backward_prefetch: fsdp_planner::BackwardPrefetch::Depth(2), ..mp.clone() }),
    ];
    // (the last case's second step repeats every five micro-batches from the eighth: of 16,
    // it skips 15 in all, 10 with periods of up to three looked for; its large pools repeat
    // sooner, the small ones replayed (`small_jump`): 17)
    let long_period = cases[cases.len() - 1].clone();
    let mut checked = 0;
    for (name, hw_name, opts) in cases {
        let (m, h) = (model(name), hw(hw_name));
        for k in 1..=16u32 {
            let o = Options { grad_accum: k, ..opts.clone() };
            let plan = fsdp_planner::plan(&m, &o).unwrap_or_else(|e| panic!("{name}: {e}"));
            let (full, skipping, skipped) = fsdp_planner::reserved::predict_skipping(&plan, &h);
            assert!(!full.out_of_memory, "{name}, {k} micro-batches: out of memory");
            assert_eq!(full, skipping, "{name}, {k} micro-batches ({skipped} skipped)");
            // a search's replay, which stops once over its limit (and skips too): over the
            // full replay's need by a byte it stops, at it it does not
            let need = full.needed_bytes(&plan);
            assert_eq!(fsdp_planner::reserved::needed_within(&plan, &h, full.device_bytes - 1), None, "{name}, {k} micro-batches");
            assert_eq!(fsdp_planner::reserved::needed_within(&plan, &h, full.device_bytes), Some(need), "{name}, {k} micro-batches");
            if k >= 12 {
                // (of the 2 × (k − 4) that two steps could skip at most, from the start of
                // the third micro-batch on; the fewest here: 6 of 18 at 13, the expandable
                // segments' case, whose period is two micro-batches)
                assert!(skipped >= k as usize - 7, "{name}, {k} micro-batches: {skipped} skipped");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 112);
    let (name, hw_name, opts) = long_period;
    let plan = fsdp_planner::plan(&model(name), &Options { grad_accum: 16, ..opts }).unwrap();
    assert_eq!(fsdp_planner::reserved::predict_skipping(&plan, &hw(hw_name)).2, 17);
}
