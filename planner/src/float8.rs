//! torchao float8 training (`--float8`, torchtitan's `[float8]` section): which linears
//! become `Float8Linear`s. The plan's other passes ask this module, so that the rule lives in
//! one place: torchtitan's `module_filter_fn` — every `nn.Linear` whose in and out features
//! are multiples of 16 (float8 tensor cores need it) and that is not the output head.

use crate::error::PlanError;
use crate::options::Options;
use fsdp_ir::{Model, Op, OpKind};
use std::collections::HashSet;

/// An `nn.Linear` (not GPT-2's transposed `Conv1D`, not fused experts, not an MoE router —
/// transformers' `*TopKRouter` modules hold a weight but are no `nn.Linear`, and DeepSeek's
/// computes in float32 —) that is not the output head (torchtitan's `filter_fqns=["output"]`,
/// HF's `lm_head`). A model file without the op's module class: by the op alone.
fn convertible(model: &Model, op: &Op) -> bool {
    matches!(op.kind, OpKind::Linear { transposed: false, float32: false, .. })
        && op.module.rsplit('.').next() != Some("lm_head")
        && model.module_class(&op.module).is_none_or(|c| c == "Linear")
}

fn dims_ok(model: &Model, op: &Op) -> bool {
    let w = op.params.first().and_then(|p| model.param(model.primary_of(p)));
    w.is_some_and(|w| shape_ok(&w.shape))
}

fn shape_ok(w: &[u64]) -> bool {
    w.len() == 2 && w.iter().all(|d| d % 16 == 0)
}

/// Whether `op` runs as a float8 linear under `--float8`.
pub fn is_float8_linear(model: &Model, op: &Op) -> bool {
    convertible(model, op) && dims_ok(model, op)
}

/// The primary names of the float8 linears' weights.
pub fn float8_weights(model: &Model) -> HashSet<String> {
    model
        .ops
        .iter()
        .filter(|o| is_float8_linear(model, o))
        .filter_map(|o| o.params.first().map(|w| model.primary_of(w).to_string()))
        .collect()
}

/// The linears torchtitan's filter leaves in high precision for their dims (not multiples of
/// 16): module paths.
pub fn left_in_high_precision(model: &Model) -> Vec<String> {
    model.ops.iter().filter(|o| convertible(model, o) && !dims_ok(model, o)).map(|o| o.module.clone()).collect()
}

/// `--float8-all-gather` needs every float8 weight's dim 0 to split evenly over the shard
/// group: torchao 0.18's `fsdp_pre_all_gather(mesh)` casts the unpadded local shard, so the
/// ranks of an uneven split hand FSDP2's all-gather inputs of unequal sizes, which it cannot
/// gather (torch 2.11 `_fsdp_param.py` checks the padded size only for the five-argument
/// extension). Refused, naming the first such weight.
pub fn check_even_gather(model: &Model, opts: &Options) -> Result<(), PlanError> {
    let n = opts.shard_size();
    if !opts.float8.is_some_and(|f| f.all_gather) || n <= 1 {
        return Ok(());
    }
    for op in model.ops.iter().filter(|o| is_float8_linear(model, o)) {
        let Some(w) = op.params.first().and_then(|p| model.param(model.primary_of(p))) else { continue };
        if let Some(&d0) = w.shape.first().filter(|&&d| d % n != 0) {
            return Err(crate::error::opt_err(
                "--float8-all-gather",
                format!(
                    "`{}`'s dim 0 ({d0}) does not split evenly over the shard group's {n} ranks: torchao 0.18 casts each rank's unpadded shard before FSDP2's all-gather, which cannot gather shards of unequal sizes; use a shard group size dividing it, or weights gathered as they are",
                    w.name
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> Model {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../models/{name}.ron"));
        fsdp_ir::parse_model(&std::fs::read_to_string(&p).unwrap(), name).unwrap()
    }

    /// MoE routers hold a weight whose dims may be multiples of 16 (Qwen3-235B's 4096 × 128,
    /// DeepSeek-V3's 7168 × 256, float32) but are transformers' `*TopKRouter` modules, no
    /// `nn.Linear`: torchao never converts them. The blocks' projections it does.
    #[test]
    fn routers_stay_in_high_precision() {
        for (name, router, linear) in [("qwen3-235b-a22b", "model.layers.0.mlp.gate", "model.layers.0.self_attn.q_proj"), ("deepseek-v3", "model.layers.3.mlp.gate", "model.layers.3.self_attn.o_proj")] {
            let m = model(name);
            let find = |module: &str| m.ops.iter().find(|o| o.module == module && matches!(o.kind, OpKind::Linear { .. })).unwrap_or_else(|| panic!("{name}: no linear in {module}"));
            let (r, l) = (find(router), find(linear));
            let w = m.param(m.primary_of(&r.params[0])).unwrap();
            assert!(w.shape.iter().all(|d| d % 16 == 0), "{name}: {:?}", w.shape);
            assert!(!is_float8_linear(&m, r) && is_float8_linear(&m, l), "{name}");
            assert!(!float8_weights(&m).contains(m.primary_of(&r.params[0])));
            assert!(!left_in_high_precision(&m).iter().any(|p| p == router));
        }
    }
}
