//! Verifier run between passes: ownership and layout invariants of the units.

use crate::error::PlanError;
use crate::ids::UnitId;
use crate::options::Layout;
use crate::units::Unit;
use fsdp_ir::Model;
use rustc_hash::FxHashMap as HashMap;

/// Every primary param is owned by exactly one unit; shards × shard-group size = padded
/// size (per unit, and per param for the fsdp2 layout); padding never loses elements.
pub fn verify_units(model: &Model, units: &[Unit], ws: u64, layout: Layout) -> Result<(), PlanError> {
    let mut owner: HashMap<&str, &str> = HashMap::default();
    for u in units {
        for p in &u.params {
            if let Some(o) = owner.insert(&p.name, u.label()) {
                return Err(PlanError::Verify(format!("param {} owned by both {o} and {}", p.name, u.label())));
            }
        }
        let bad = |m: String| Err(PlanError::Verify(format!("{}: {m}", u.label())));
        if u.shard_numel * ws != u.padded_numel || u.padded_numel < u.numel {
            return bad(format!("shard {} × {ws} != padded {} (numel {})", u.shard_numel, u.padded_numel, u.numel));
        }
        if layout == Layout::Fsdp2 {
            let sum: u64 = u.params.iter().map(|p| p.shard_numel).sum();
            if sum != u.shard_numel {
                return bad(format!("param shards add up to {sum}, the unit's shard is {}", u.shard_numel));
            }
            if let Some(p) = u.params.iter().find(|p| p.shard_numel * ws != p.padded_numel || p.padded_numel < p.numel) {
                return bad(format!("param {}: shard {} × {ws} != padded {}", p.name, p.shard_numel, p.padded_numel));
            }
        }
    }
    for p in model.primary_params() {
        if !owner.contains_key(p.name.as_str()) {
            return Err(PlanError::Verify(format!("param {} is owned by no unit", p.name)));
        }
    }
    Ok(())
}

/// The innermost unit covering each op's module (walks up the module path; O(ops · depth)).
pub fn unit_of_ops(model: &Model, units: &[Unit]) -> Vec<UnitId> {
    let by_module: HashMap<&str, UnitId> = units.iter().flat_map(|u| std::iter::once(&u.module).chain(&u.group).map(move |m| (m.as_str(), u.id))).collect();
    model
        .ops
        .iter()
        .map(|o| {
            let mut path = o.module.as_str();
            loop {
                if let Some(&u) = by_module.get(path) {
                    return u;
                }
                match fsdp_ir::parent_path(path) {
                    Some(p) => path = p,
                    None => return UnitId(0),
                }
            }
        })
        .collect()
}
