//! torchao float8 training (`--float8`, torchtitan's `[float8]` section): which linears
//! become `Float8Linear`s. The plan's other passes ask this module, so that the rule —
//! `convert_to_float8_training` on every `nn.Linear` but the LM head — lives in one place.

use crate::error::{opt_err, PlanError};
use fsdp_ir::{Model, Op, OpKind};
use std::collections::HashSet;

/// A float8 linear: an `nn.Linear` (not GPT-2's transposed `Conv1D`, not fused experts) that
/// is not the output head (torchtitan's `filter_fqns=["output"]`, HF's `lm_head`).
pub fn is_float8_linear(op: &Op) -> bool {
    matches!(op.kind, OpKind::Linear { transposed: false, .. }) && op.module.rsplit('.').next() != Some("lm_head")
}

/// The primary names of the float8 linears' weights; refuses a weight whose dims
/// `torch._scaled_mm` cannot take (multiples of 16).
pub fn float8_weights(model: &Model) -> Result<HashSet<String>, PlanError> {
    let mut out = HashSet::new();
    for op in model.ops.iter().filter(|o| is_float8_linear(o)) {
        let Some(w) = op.params.first() else { continue };
        let prim = model.primary_of(w);
        if let Some(p) = model.param(prim) {
            if p.shape.iter().any(|d| d % 16 != 0) {
                return Err(opt_err("--float8", format!("`{}` has weight {} of shape {:?}; torch._scaled_mm needs both dims multiples of 16", op.module, p.name, p.shape)));
            }
        }
        out.insert(prim.to_string());
    }
    Ok(out)
}
