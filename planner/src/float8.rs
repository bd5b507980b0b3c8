//! torchao float8 training (`--float8`, torchtitan's `[float8]` section): which linears
//! become `Float8Linear`s. The plan's other passes ask this module, so that the rule lives in
//! one place: torchtitan's `module_filter_fn` — every `nn.Linear` whose in and out features
//! are multiples of 16 (float8 tensor cores need it) and that is not the output head.

use fsdp_ir::{Model, Op, OpKind};
use std::collections::HashSet;

/// An `nn.Linear` (not GPT-2's transposed `Conv1D`, not fused experts) that is not the output
/// head (torchtitan's `filter_fqns=["output"]`, HF's `lm_head`).
fn convertible(op: &Op) -> bool {
    matches!(op.kind, OpKind::Linear { transposed: false, .. }) && op.module.rsplit('.').next() != Some("lm_head")
}

fn dims_ok(model: &Model, op: &Op) -> bool {
    let w = op.params.first().and_then(|p| model.param(model.primary_of(p)));
    w.is_some_and(|w| shape_ok(&w.shape))
}

fn shape_ok(w: &[u64]) -> bool {
    w.len() == 2 && w.iter().all(|d| d % 16 == 0)
}

/// [`is_float8_linear`] for a caller that holds the weight's shape, not the model (the
/// runtime's kernels).
pub fn converts(op: &Op, weight_shape: &[u64]) -> bool {
    convertible(op) && shape_ok(weight_shape)
}

/// Whether `op` runs as a float8 linear under `--float8`.
pub fn is_float8_linear(model: &Model, op: &Op) -> bool {
    convertible(op) && dims_ok(model, op)
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
    model.ops.iter().filter(|o| convertible(o) && !dims_ok(model, o)).map(|o| o.module.clone()).collect()
}
