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

/// An aligned text table: a header row, then one row per entry; a column whose cells are all
/// numbers (they start with a digit, a sign or a dot) is right-aligned, the others left.
pub fn table(heads: &[String], rows: &[Vec<String>]) -> String {
    let n = heads.len();
    let width = |c: usize| rows.iter().map(|r| r.get(c).map_or(0, |x| x.chars().count())).chain([heads[c].chars().count()]).max().unwrap_or(0);
    let numeric = |c: usize| !rows.is_empty() && rows.iter().all(|r| r.get(c).and_then(|x| x.chars().next()).is_some_and(|ch| ch.is_ascii_digit() || "+-.".contains(ch)));
    let cols: Vec<(usize, bool)> = (0..n).map(|c| (width(c), numeric(c))).collect();
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (c, &(w, right)) in cols.iter().enumerate() {
            let x = cells.get(c).map_or("", |x| x.as_str());
            let pad = " ".repeat(w.saturating_sub(x.chars().count()));
            if c > 0 {
                l.push_str("  ");
            }
            if right {
                l.push_str(&pad);
                l.push_str(x);
            } else {
                l.push_str(x);
                l.push_str(&pad);
            }
        }
        l.trim_end().to_string()
    };
    let mut out = line(heads);
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out
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

/// The dtype of the sharded (master) parameters: `--master-dtype`, else the model file's.
pub fn master_dtype(plan: &Plan) -> String {
    match plan.options.master_dtype {
        Some(d) => d.torch_name().to_string(),
        None => {
            let d = plan.units.iter().flat_map(|u| &u.params).map(|p| p.dtype).find(|d| d.is_float());
            format!("{} (the model's)", d.map_or("float32", |d| d.torch_name()))
        }
    }
}

/// The plan's first two lines: the model and every option, by the values the flags take.
pub fn header(plan: &Plan) -> String {
    let o = &plan.options;
    let strategy = match o.strategy {
        crate::Strategy::HybridShard { shard_size } => format!("hybrid-shard (shard {shard_size} × replicate {})", o.world_size / shard_size.max(1)),
        s => s.name().to_string(),
    };
    format!(
        "plan for {} · world size {} · layout {} · strategy {strategy} · policy {} · attn {}\n\
         batch {} × seq {} per rank · param dtype {} · reduce dtype {} · master dtype {} · optimizer {} · grad accum {} · device {}{}\n",
        plan.model_name,
        o.world_size,
        o.layout.name(),
        plan.policy,
        plan.attn_implementation,
        o.batch,
        o.seq,
        o.param_dtype.map(|d| d.torch_name()).unwrap_or("(the master's)"),
        o.reduce_dtype.map(|d| d.torch_name()).unwrap_or("(the param dtype)"),
        master_dtype(plan),
        o.optimizer.name(),
        o.grad_accum,
        o.device.name(),
        if o.compile { " · torch.compile" } else { "" }
    ) + &match o.float8 {
        Some(f) => format!("float8 linears ({}{})\n", f.recipe.name(), if f.all_gather { ", weights all-gathered in float8" } else { "" }),
        None => String::new(),
    } + match (o.ac_wrapper, o.checkpoint.is_empty()) {
        (crate::options::AcWrapper::Torchtitan, false) => "checkpoints: torchtitan's checkpoint_wrapper (the blocks' FSDP hooks outside them)\n",
        _ => "",
    } + match o.train_loop {
        crate::options::TrainLoop::Torchtitan2024 => "training loop: torchtitan-2024 (float32 logits out of the model, kept from one step's forward to the next)\n",
        crate::options::TrainLoop::Hf => "",
    } + match o.offload {
        crate::options::Offload::Cpu => "offload: CPUOffloadPolicy (sharded params, grads and the optimizer on the host; H2D copies before each all-gather, D2H after each reduce-scatter)\n",
        crate::options::Offload::None => "",
    }
}

pub fn render(plan: &Plan, full_schedule: bool) -> String {
    let mut s = String::new();
    s += &header(plan);
    let _ = writeln!(s, "\nunits ({}):", plan.units.len());
    let heads: Vec<String> = ["id", "module", "params", "numel", "padded", "shard", "raf"].iter().map(|h| h.to_string()).collect();
    let rows: Vec<Vec<String>> = plan
        .units
        .iter()
        .map(|u| {
            let module = match u.group.last() {
                Some(_) if u.class.contains('+') => format!("{} ({})", u.name(), u.class),
                Some(last) => format!("{} … {last} ({} × {})", u.label(), 1 + u.group.len(), u.class),
                None => format!("{} ({})", u.label(), u.class),
            };
            let raf = u.reshard_to.map_or(u.reshard_after_forward.to_string(), |n| n.to_string());
            vec![u.id.to_string(), module, u.params.len().to_string(), u.numel.to_string(), u.padded_numel.to_string(), u.shard_numel.to_string(), raf]
        })
        .collect();
    for l in table(&heads, &rows).lines() {
        let _ = writeln!(s, "  {l}");
    }
    for sh in &plan.shared {
        let _ = writeln!(s, "  tied: {} = {} (owned by {}; modules {})", sh.param, sh.aliases.join(", "), sh.unit, sh.modules.join(", "));
    }
    let _ = writeln!(s, "\nunit tree:");
    for l in crate::layout::unit_tree(plan).lines() {
        let _ = writeln!(s, "  {l}");
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
        let deps: Vec<String> = op.deps.iter().map(|d| d.to_string()).collect();
        let desc = describe(op, Some(&plan.units));
        let desc = desc.split_once(' ').map(|x| x.1).unwrap_or(&desc).to_string();
        let mark = if i == plan.memory.peak_op.index() { "  <- peak" } else { "" };
        s += &crate::layout::op_line(&op.id.to_string(), stream, &format!("{desc}{extra}"), &deps, mark);
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
    if let Some(h) = &m.host {
        let _ = writeln!(s, "{}", host_line(h));
    }
    s
}

/// `--offload cpu`: what the host holds (rank 0), at its peak (the optimizer step).
pub fn host_line(h: &crate::plan::HostMemory) -> String {
    format!(
        "host memory (CPU offload, rank 0): {} at the optimizer step — sharded params {}, sharded grads {}, optimizer state {}, its step's temporaries {}",
        bytes(h.peak_bytes),
        bytes(h.sharded_param),
        bytes(h.sharded_grad),
        bytes(h.optstate),
        bytes(h.optimizer_temp)
    )
}

/// One screen: the header, the units by class, the communication per step and the peak with
/// its largest categories (`plan --summary`).
pub fn summary(plan: &Plan) -> String {
    let mut s = header(plan);
    // units: the root, then each class with its count and the size of one
    let mut classes: Vec<(String, usize, u64, bool)> = vec![];
    for u in plan.units.iter().filter(|u| !u.is_root()) {
        match classes.iter_mut().find(|c| c.0 == u.class) {
            Some(c) => c.1 += 1,
            None => classes.push((u.class.clone(), 1, u.numel, u.reshard_after_forward)),
        }
    }
    let root = plan.units.iter().find(|u| u.is_root());
    let mut parts: Vec<String> = root.map(|r| format!("root ({} params)", count(r.numel))).into_iter().collect();
    parts.extend(classes.iter().map(|(c, n, numel, _)| format!("{n} × {c} ({} params each)", count(*numel))));
    let _ = writeln!(s, "\n{} units: {}", plan.units.len(), parts.join(", "));
    let total: u64 = plan.collectives.iter().map(|c| c.numel * fsdp_ir::DType::parse(&c.dtype).map_or(1, |d| d.size())).sum();
    let mut kinds: BTreeMap<&str, u32> = BTreeMap::new();
    for c in &plan.collectives {
        *kinds.entry(c.kind.as_str()).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let _ = writeln!(s, "communication per step: {} ({})", kinds.join(", "), bytes(total));
    let m = &plan.memory;
    let mut cats: Vec<(&Category, &u64)> = m.breakdown.iter().filter(|x| *x.1 > 0).collect();
    cats.sort_by_key(|x| std::cmp::Reverse(*x.1));
    let top: Vec<String> = cats.iter().take(4).map(|(c, b)| format!("{} {}", c.name(), bytes(**b))).collect();
    let _ = writeln!(s, "predicted peak memory (rank {}): {} at {} — {}", m.rank, bytes(m.peak_bytes), m.peak_at, top.join(", "));
    if let Some(h) = &m.host {
        let _ = writeln!(s, "  {}", host_line(h));
    }
    s
}

/// Whether a peak fits a per-GPU memory limit, and by how much: `fits in 80.00 GiB (h100-sxm)
/// with 11.00 GiB to spare` / `does not fit in …: 50.03 GiB over`.
pub fn verdict(peak: u64, limit: u64, of: &str) -> String {
    if peak <= limit {
        format!("fits in {} ({of}) with {} to spare", bytes(limit), bytes(limit - peak))
    } else {
        format!("does not fit in {} ({of}): {} over", bytes(limit), bytes(peak - limit))
    }
}

/// The JSON document of `plan --format json`.
pub fn json(plan: &Plan) -> serde_json::Value {
    let units: Vec<serde_json::Value> = plan
        .units
        .iter()
        .map(|u| {
            let mut v = serde_json::json!({
                "id": u.id.to_string(),
                "name": u.module,
                "class": u.class,
                "modules": modules_of(plan, u),
                "params": u.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
                "numel": u.numel,
                "padded_numel": u.padded_numel,
                "shard_numel": u.shard_numel,
                "reshard_after_forward": u.reshard_after_forward,
            });
            // (`reshard_after_forward=N`: the unit's own post-forward group)
            if let Some(n) = u.reshard_to {
                v["reshard_to"] = n.into();
            }
            v
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
            "host": plan.memory.host,
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
