//! `rows --fit`'s refit recovers a profile's rates: "measured" throughputs made by a profile
//! whose compute, memory and communication are scaled by known factors are fitted from the
//! unscaled profile; the fit must find the compute factor, predict every fitted case, and
//! predict a case it did not see (held out).

use fsdp_planner::hardware::Hardware;
use fsdp_planner::refit::{refit, scale, Case};
use fsdp_planner::{AcMode, Options};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn refit_recovers_scaled_rates_and_predicts_a_held_out_case() {
    let m = fsdp_ir::parse_model(&std::fs::read_to_string(root().join("models/llama-1b.ron")).unwrap(), "llama-1b").unwrap();
    let hw: Hardware = ron::from_str(&std::fs::read_to_string(root().join("models/hardware/h100-sxm.ron")).unwrap()).unwrap();
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    let base = Options { param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, seq: 4096, ..Options::default() };
    let configs = [
        Options { world_size: 8, batch: 1, ..base.clone() },
        Options { world_size: 8, batch: 2, checkpoint: vec!["LlamaDecoderLayer".into()], ..base.clone() },
        Options { world_size: 64, batch: 1, checkpoint: vec!["LlamaDecoderLayer".into()], ac_mode: AcMode::SelectiveOp, ..base.clone() },
        Options { world_size: 256, batch: 1, seq: 1024, ..base.clone() },
        // held out
        Options { world_size: 32, batch: 2, seq: 2048, checkpoint: vec!["LlamaDecoderLayer".into()], ..base.clone() },
    ];
    let plans: Vec<_> = configs.iter().map(|o| fsdp_planner::plan_unchecked(&m, o).unwrap()).collect();
    let truth = [0.85, 0.7, 0.6];
    let scaled = scale(&hw, truth);
    let cases: Vec<Case> = plans.iter().map(|p| Case { plan: p, model: &m, measured_tokens_per_s: fsdp_planner::timeline::predict(p, &m, &scaled).tokens_per_s_per_gpu }).collect();
    let fit = [true, true, true, true, false];
    let r = refit(&cases, &fit, [true; 3], &hw);
    assert!(r.rms_before > 5.0, "the scaled profile should be far off first: {}", r.rms_before);
    for k in 0..3 {
        assert!((r.factors[k] / truth[k] - 1.0).abs() < 0.01, "factors {:?} vs {truth:?}", r.factors);
    }
    for (i, c) in cases.iter().enumerate() {
        let err = r.after[i] / c.measured_tokens_per_s - 1.0;
        let bar = if fit[i] { 0.01 } else { 0.03 };
        assert!(err.abs() < bar, "case {i} ({}): {:+.2}% after the refit (factors {:?})", if fit[i] { "fitted" } else { "held out" }, 100.0 * err, r.factors);
    }
    assert!(r.rms_after < 1.0, "rms after {}", r.rms_after);
    // a factor held fixed stays 1; the others absorb what they can
    let fixed = refit(&cases, &fit, [true, true, false], &hw);
    assert_eq!(fixed.factors[2], 1.0);
    assert!(fixed.rms_after < r.rms_before);
    eprintln!("factors {:?} (truth {truth:?}), rms {:.2}% -> {:.4}%", r.factors, r.rms_before, r.rms_after);
}
