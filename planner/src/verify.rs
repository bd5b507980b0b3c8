//! Verifier run between passes: ownership and layout invariants of the units.

use crate::error::PlanError;
use crate::ids::UnitId;
use crate::units::Unit;
use fsdp_ir::{is_within, Model};
use std::collections::HashMap;

/// Every primary param is owned by exactly one unit; shard sizes add up.
pub fn verify_units(model: &Model, units: &[Unit]) -> Result<(), PlanError> {
    let mut owner: HashMap<&str, &str> = HashMap::new();
    for u in units {
        for p in &u.params {
            if let Some(o) = owner.insert(&p.name, u.label()) {
                return Err(PlanError::Verify(format!("param {} owned by both {o} and {}", p.name, u.label())));
            }
        }
        let sum: u64 = u.params.iter().map(|p| p.shard_numel).sum();
        if u.padded_numel != u.shard_numel * (u.padded_numel / u.shard_numel.max(1)) || (sum != u.shard_numel && sum != 0) {
            return Err(PlanError::Verify(format!("{}: shard sizes do not add up", u.label())));
        }
    }
    for p in model.primary_params() {
        if !owner.contains_key(p.name.as_str()) {
            return Err(PlanError::Verify(format!("param {} is owned by no unit", p.name)));
        }
    }
    Ok(())
}

/// The innermost unit covering each op's module.
pub fn unit_of_ops(model: &Model, units: &[Unit]) -> Vec<UnitId> {
    model
        .ops
        .iter()
        .map(|o| {
            units
                .iter()
                .filter(|u| is_within(&o.module, &u.module))
                .max_by_key(|u| u.module.len())
                .map(|u| u.id)
                .unwrap_or(UnitId(0))
        })
        .collect()
}
