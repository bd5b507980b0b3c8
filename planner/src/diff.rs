//! Side-by-side comparison of two plans: every option that differs (by its flag), units,
//! collectives and bytes, peak memory by category, and — given their predictions — time.

use crate::options::{BackwardPrefetch, Options};
use crate::plan::*;
use crate::print::bytes;
use crate::timeline::{pct, secs, thousands, TimeReport};
use std::fmt::Write;

/// One compared quantity: its name and each plan's value, as printed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub key: String,
    pub a: String,
    pub b: String,
}

impl Row {
    fn new(key: impl Into<String>, a: String, b: String) -> Row {
        Row { key: key.into(), a, b }
    }
    pub fn differs(&self) -> bool {
        self.a != self.b
    }
}

fn comm_bytes(p: &Plan, kind: &str) -> (usize, u64) {
    let v: Vec<&Collective> = p.collectives.iter().filter(|c| c.kind == kind).collect();
    let b = v
        .iter()
        .map(|c| c.numel * fsdp_ir::DType::parse(&c.dtype).map(|d| d.size()).unwrap_or(1))
        .sum();
    (v.len(), b)
}

/// Every planning option by its `plan` flag, with the value as the flag takes it (`-` where
/// the option is left to its default).
pub fn option_values(o: &Options) -> Vec<(&'static str, String)> {
    let opt = |d: Option<fsdp_ir::DType>| d.map_or("-".to_string(), |d| d.torch_name().to_string());
    let b = |x: Option<bool>| x.map_or("-".to_string(), |x| x.to_string());
    vec![
        ("--world-size", o.world_size.to_string()),
        ("--layout", o.layout.name().to_string()),
        ("--strategy", o.strategy.name().to_string()),
        ("--shard-group-size", match o.strategy {
            crate::Strategy::HybridShard { shard_size } => shard_size.to_string(),
            _ => "-".into(),
        }),
        ("--reshard-after-forward", o.reshard_to.map_or_else(|| b(o.reshard_after_forward), |n| n.to_string())),
        ("--root-reshard-after-forward", b(o.root_reshard_after_forward)),
        ("--unit-reshard", if o.unit_reshard.is_empty() && o.unit_reshard_to.is_empty() { "-".into() } else { o.unit_reshard.iter().map(|(u, v)| format!("{u}={v}")).chain(o.unit_reshard_to.iter().map(|(u, n)| format!("{u}={n}"))).collect::<Vec<_>>().join(",") }),
        ("--param-dtype", opt(o.param_dtype)),
        ("--reduce-dtype", opt(o.reduce_dtype)),
        ("--master-dtype", opt(o.master_dtype)),
        ("--forward-prefetch", o.forward_prefetch.to_string()),
        ("--backward-prefetch", match o.backward_prefetch {
            BackwardPrefetch::Implicit => "implicit".into(),
            BackwardPrefetch::None => "none".into(),
            BackwardPrefetch::Pre => "pre".into(),
            BackwardPrefetch::Post => "post".into(),
            BackwardPrefetch::Depth(d) => d.to_string(),
        }),
        ("--grad-accum", o.grad_accum.to_string()),
        ("--grad-sync", o.grad_sync.name().to_string()),
        ("--checkpoint", if o.checkpoint.is_empty() { "-".into() } else { o.checkpoint.join(",") }),
        ("--ac-mode", o.ac_mode.name().to_string()),
        ("--ac-wrapper", o.ac_wrapper.name().to_string()),
        ("--train-loop", o.train_loop.name().to_string()),
        ("--offload", o.offload.name().to_string()),
        ("--optimizer", o.optimizer.name().to_string()),
        ("--batch", o.batch.to_string()),
        ("--seq", o.seq.to_string()),
        ("--attn-implementation", o.attn_implementation.map_or("-".into(), |a| a.name().to_string())),
        ("--device", o.device.name().to_string()),
        ("--expandable-segments", o.expandable_segments.to_string()),
        ("--compile", o.compile.to_string()),
        ("--unit-group", o.unit_group.to_string()),
    ]
}

/// The rows of two plans: the policy and every option that differs, then what they give.
pub fn rows(a: &Plan, b: &Plan) -> Vec<Row> {
    let mut v = vec![Row::new("policy", a.policy.clone(), b.policy.clone())];
    for ((k, x), (_, y)) in option_values(&a.options).into_iter().zip(option_values(&b.options)) {
        if x != y || k == "--world-size" {
            v.push(Row::new(k.trim_start_matches('-').replace('-', " "), x, y));
        }
    }
    if a.attn_implementation != b.attn_implementation {
        v.push(Row::new("attention", a.attn_implementation.clone(), b.attn_implementation.clone()));
    }
    v.push(Row::new("units", a.units.len().to_string(), b.units.len().to_string()));
    for k in ["all_gather", "reduce_scatter", "all_reduce"] {
        let (ca, ba) = comm_bytes(a, k);
        let (cb, bb) = comm_bytes(b, k);
        if ca + cb > 0 {
            v.push(Row::new(format!("{k} (count, bytes)"), format!("{ca} · {}", bytes(ba)), format!("{cb} · {}", bytes(bb))));
        }
    }
    v.push(Row::new("peak memory", bytes(a.memory.peak_bytes), bytes(b.memory.peak_bytes)));
    for c in Category::ALL {
        let x = a.memory.breakdown.get(&c).copied().unwrap_or(0);
        let y = b.memory.breakdown.get(&c).copied().unwrap_or(0);
        if x > 0 || y > 0 {
            v.push(Row::new(format!("  {}", c.name()), bytes(x), bytes(y)));
        }
    }
    v.push(Row::new("peak at", a.memory.peak_at.clone(), b.memory.peak_at.clone()));
    v
}

/// The time rows of two predictions.
pub fn time_rows(a: &TimeReport, b: &TimeReport) -> Vec<Row> {
    let hw = if a.hardware == b.hardware { format!("step time ({})", a.hardware) } else { "step time".to_string() };
    vec![
        Row::new(hw, secs(a.step_time_s), secs(b.step_time_s)),
        Row::new("  compute", secs(a.compute_s), secs(b.compute_s)),
        Row::new("  exposed comm", secs(a.exposed_comm_s), secs(b.exposed_comm_s)),
        Row::new("MFU", pct(a.mfu), pct(b.mfu)),
        Row::new("tokens/s/GPU", thousands(a.tokens_per_s_per_gpu), thousands(b.tokens_per_s_per_gpu)),
    ]
}

/// The units each plan has and the other lacks.
fn only(a: &Plan, b: &Plan) -> (Vec<String>, Vec<String>) {
    // (a unit of several modules by all of them, as the policy names it: `model.norm+lm_head`,
    // `model.layers.0+model.layers.1`)
    let ua: Vec<String> = a.units.iter().map(|u| u.name()).collect();
    let ub: Vec<String> = b.units.iter().map(|u| u.name()).collect();
    (
        ua.iter().filter(|x| !ub.contains(x)).map(|x| x.to_string()).collect(),
        ub.iter().filter(|x| !ua.contains(x)).map(|x| x.to_string()).collect(),
    )
}

/// The text table: rows that differ are marked `*`; then the units only one plan has.
pub fn render(a: &Plan, an: &str, b: &Plan, bn: &str, rows: &[Row]) -> String {
    let w = |f: fn(&Row) -> usize, h: usize| rows.iter().map(f).max().unwrap_or(0).max(h);
    let (wk, wa, wb) = (w(|r| r.key.chars().count(), 0), w(|r| r.a.chars().count(), an.chars().count()), w(|r| r.b.chars().count(), bn.chars().count()));
    let mut s = String::new();
    let _ = writeln!(s, "{:<wk$}  {:>wa$}  {:>wb$}", "", an, bn);
    for r in rows {
        let mark = if r.differs() { " *" } else { "" };
        let _ = writeln!(s, "{:<wk$}  {:>wa$}  {:>wb$}{mark}", r.key, r.a, r.b);
    }
    let (only_a, only_b) = only(a, b);
    if !only_a.is_empty() || !only_b.is_empty() {
        let _ = writeln!(s, "\nunits only in {an}: {}", only_a.join(", "));
        let _ = writeln!(s, "units only in {bn}: {}", only_b.join(", "));
    }
    s
}

/// `diff --format json`: the two names, every row (with whether it differs) and the units
/// only one plan has.
pub fn json(a: &Plan, an: &str, b: &Plan, bn: &str, rows: &[Row]) -> serde_json::Value {
    let (only_a, only_b) = only(a, b);
    serde_json::json!({
        "a": an,
        "b": bn,
        "rows": rows.iter().map(|r| serde_json::json!({"key": r.key.trim(), "a": r.a, "b": r.b, "differs": r.differs()})).collect::<Vec<_>>(),
        "units_only_in_a": only_a,
        "units_only_in_b": only_b,
    })
}
