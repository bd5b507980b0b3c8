//! Text rendering of a plan: units, schedule (compute runs folded per unit), collectives,
//! memory peak and breakdown.

use crate::memory::describe;
use crate::plan::*;
use std::collections::BTreeMap;
use std::fmt::Write;

/// `1.50 GiB`, `12.0 KiB`, `512 B`.
pub fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// `7.24M`, `1.20B`.
pub fn count(n: u64) -> String {
    let v = n as f64;
    if n >= 1_000_000_000 {
        format!("{:.2}B", v / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.2}M", v / 1e6)
    } else if n >= 1_000 {
        format!("{:.1}K", v / 1e3)
    } else {
        n.to_string()
    }
}

pub fn render(plan: &Plan, full_schedule: bool) -> String {
    let mut s = String::new();
    let o = &plan.options;
    let _ = writeln!(
        s,
        "plan for {} · world size {} · layout {:?} · strategy {:?} · policy {} · attn {}",
        plan.model_name, o.world_size, o.layout, o.strategy, plan.policy, plan.attn_implementation
    );
    let _ = writeln!(
        s,
        "batch {} × seq {} · param dtype {} · reduce dtype {} · optimizer {:?} · grad accum {} · device {:?}",
        o.batch,
        o.seq,
        o.param_dtype.map(|d| d.torch_name()).unwrap_or("(param's)"),
        o.reduce_dtype.map(|d| d.torch_name()).unwrap_or("(param dtype)"),
        o.optimizer,
        o.grad_accum,
        o.device
    );
    let _ = writeln!(s, "\nunits ({}):", plan.units.len());
    let _ = writeln!(s, "  {:<5} {:<32} {:>7} {:>12} {:>12} {:>12}  raf", "id", "module", "params", "numel", "padded", "shard");
    for u in &plan.units {
        let _ = writeln!(
            s,
            "  {:<5} {:<32} {:>7} {:>12} {:>12} {:>12}  {}",
            u.id.to_string(),
            format!("{} ({})", u.label(), u.class),
            u.params.len(),
            u.numel,
            u.padded_numel,
            u.shard_numel,
            u.reshard_after_forward
        );
    }
    for sh in &plan.shared {
        let _ = writeln!(s, "  tied: {} = {} (owned by {}; modules {})", sh.param, sh.aliases.join(", "), sh.unit, sh.modules.join(", "));
    }
    let _ = writeln!(s, "\nschedule ({} ops):", plan.schedule.len());
    let mut i = 0;
    let ops = &plan.schedule;
    while i < ops.len() {
        let op = &ops[i];
        let fold_unit = match &op.kind {
            OpKind::Forward { unit, .. } | OpKind::Backward { unit, .. } | OpKind::Recompute { unit, .. } if !full_schedule => Some((std::mem::discriminant(&op.kind), *unit)),
            _ => None,
        };
        if let Some((d, u)) = fold_unit {
            let mut j = i;
            while j + 1 < ops.len() {
                let n = &ops[j + 1];
                let same = match &n.kind {
                    OpKind::Forward { unit, .. } | OpKind::Backward { unit, .. } | OpKind::Recompute { unit, .. } => std::mem::discriminant(&n.kind) == d && *unit == u,
                    _ => false,
                };
                if !same {
                    break;
                }
                j += 1;
            }
            let what = match &op.kind {
                OpKind::Forward { .. } => "forward",
                OpKind::Backward { .. } => "backward",
                _ => "recompute",
            };
            let range = if j > i { format!("{}..{}", op.id, ops[j].id) } else { op.id.to_string() };
            let mark = if (i..=j).contains(&plan.memory.peak_op.index()) { "  <- peak" } else { "" };
            let _ = writeln!(s, "  {:<14} {:<14} {} {} ({} ops){mark}", range, "compute", what, plan.units[u.index()].label(), j - i + 1);
            i = j + 1;
            continue;
        }
        let stream = match op.stream {
            Stream::Compute => "compute",
            Stream::AllGather => "all-gather",
            Stream::ReduceScatter => "reduce-scatter",
            Stream::AllReduce => "all-reduce",
        };
        let extra = match &op.kind {
            OpKind::AllGather { numel, dtype, .. } | OpKind::ReduceScatter { numel, dtype, .. } | OpKind::AllReduce { numel, dtype, .. } => {
                format!("  {} × {} = {}", numel, dtype, bytes(numel * dtype.size()))
            }
            _ => String::new(),
        };
        let deps = if op.deps.is_empty() {
            String::new()
        } else {
            format!("  after {}", op.deps.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","))
        };
        let desc = describe(op, Some(&plan.units));
        let desc = desc.split_once(' ').map(|x| x.1).unwrap_or(&desc).to_string();
        let mark = if i == plan.memory.peak_op.index() { "  <- peak" } else { "" };
        let _ = writeln!(s, "  {:<14} {:<14} {desc}{extra}{deps}{mark}", op.id.to_string(), stream);
        i += 1;
    }
    let mut per_kind: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for c in &plan.collectives {
        let size = fsdp_ir::DType::parse(&c.dtype).map(|d| d.size()).unwrap_or(1);
        let e = per_kind.entry((c.kind.as_str(), c.dtype.as_str())).or_default();
        e.0 += 1;
        e.1 += c.numel * size;
    }
    let _ = writeln!(s, "\ncommunication per step (per rank, unsharded buffer sizes):");
    for ((k, d), (n, b)) in &per_kind {
        let _ = writeln!(s, "  {k:<15} {d:<9} {n:>5} × · total {}", bytes(*b));
    }
    let m = &plan.memory;
    let _ = writeln!(s, "\npredicted peak memory (rank {}): {} ({} B) at {}", m.rank, bytes(m.peak_bytes), m.peak_bytes, m.peak_at);
    for (c, b) in &m.breakdown {
        if *b > 0 {
            let _ = writeln!(s, "  {:<16} {:>12}  {:>5.1}%", c.name(), bytes(*b), 100.0 * *b as f64 / m.peak_bytes.max(1) as f64);
        }
    }
    let _ = writeln!(s, "  arena size {}", bytes(m.arena_bytes));
    s
}

/// The JSON document of `plan --format json`.
pub fn json(plan: &Plan) -> serde_json::Value {
    let units: Vec<serde_json::Value> = plan
        .units
        .iter()
        .map(|u| {
            serde_json::json!({
                "id": u.id.to_string(),
                "name": u.module,
                "class": u.class,
                "modules": modules_of(plan, u),
                "params": u.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
                "numel": u.numel,
                "padded_numel": u.padded_numel,
                "shard_numel": u.shard_numel,
                "reshard_after_forward": u.reshard_after_forward,
            })
        })
        .collect();
    let colls: Vec<serde_json::Value> = plan
        .collectives
        .iter()
        .map(|c| serde_json::json!({"kind": c.kind, "unit": c.unit, "numel": c.numel, "dtype": c.dtype, "op": c.op.to_string()}))
        .collect();
    let breakdown: serde_json::Map<String, serde_json::Value> = plan
        .memory
        .breakdown
        .iter()
        .map(|(c, b)| (c.name().to_string(), serde_json::json!(b)))
        .collect();
    serde_json::json!({
        "model": plan.model_name,
        "plan_hash": plan.plan_hash,
        "options": plan.options,
        "policy": plan.policy,
        "attn_implementation": plan.attn_implementation,
        "units": units,
        "shared": plan.shared,
        "collectives": colls,
        "memory": {
            "rank": plan.memory.rank,
            "peak_bytes": plan.memory.peak_bytes,
            "peak_at": plan.memory.peak_at,
            "breakdown": breakdown,
            "arena_bytes": plan.memory.arena_bytes,
        },
    })
}

fn modules_of(plan: &Plan, u: &crate::units::Unit) -> Vec<String> {
    let mut v: Vec<String> = u
        .params
        .iter()
        .flat_map(|p| std::iter::once(&p.name).chain(&p.aliases))
        .map(|n| n.rsplit_once('.').map(|x| x.0).unwrap_or("").to_string())
        .collect();
    v.sort();
    v.dedup();
    let _ = plan;
    v
}
