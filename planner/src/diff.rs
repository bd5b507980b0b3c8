//! Side-by-side comparison of two plans: units, collectives and bytes, peak memory.

use crate::plan::*;
use crate::print::bytes;
use std::fmt::Write;

fn comm_bytes(p: &Plan, kind: &str) -> (usize, u64) {
    let v: Vec<&Collective> = p.collectives.iter().filter(|c| c.kind == kind).collect();
    let b = v
        .iter()
        .map(|c| c.numel * fsdp_ir::DType::parse(&c.dtype).map(|d| d.size()).unwrap_or(1))
        .sum();
    (v.len(), b)
}

pub fn render(a: &Plan, an: &str, b: &Plan, bn: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<28} {:>22} {:>22}", "", an, bn);
    let row = |s: &mut String, k: &str, x: String, y: String| {
        let mark = if x != y { " *" } else { "" };
        let _ = writeln!(s, "{k:<28} {x:>22} {y:>22}{mark}");
    };
    row(&mut s, "policy", a.policy.clone(), b.policy.clone());
    row(&mut s, "layout", format!("{:?}", a.options.layout), format!("{:?}", b.options.layout));
    row(&mut s, "world size", a.options.world_size.to_string(), b.options.world_size.to_string());
    row(&mut s, "units", a.units.len().to_string(), b.units.len().to_string());
    for k in ["all_gather", "reduce_scatter", "all_reduce"] {
        let (ca, ba) = comm_bytes(a, k);
        let (cb, bb) = comm_bytes(b, k);
        row(&mut s, &format!("{k} (count, bytes)"), format!("{ca} · {}", bytes(ba)), format!("{cb} · {}", bytes(bb)));
    }
    row(&mut s, "peak memory", bytes(a.memory.peak_bytes), bytes(b.memory.peak_bytes));
    for c in Category::ALL {
        let x = a.memory.breakdown.get(&c).copied().unwrap_or(0);
        let y = b.memory.breakdown.get(&c).copied().unwrap_or(0);
        if x > 0 || y > 0 {
            row(&mut s, &format!("  {}", c.name()), bytes(x), bytes(y));
        }
    }
    row(&mut s, "peak at", short(&a.memory.peak_at), short(&b.memory.peak_at));
    let ua: Vec<&str> = a.units.iter().map(|u| u.label()).collect();
    let ub: Vec<&str> = b.units.iter().map(|u| u.label()).collect();
    let only_a: Vec<&&str> = ua.iter().filter(|x| !ub.contains(x)).collect();
    let only_b: Vec<&&str> = ub.iter().filter(|x| !ua.contains(x)).collect();
    if !only_a.is_empty() || !only_b.is_empty() {
        let _ = writeln!(s, "\nunits only in {an}: {}", only_a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "));
        let _ = writeln!(s, "units only in {bn}: {}", only_b.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "));
    }
    s
}

fn short(x: &str) -> String {
    if x.len() > 22 {
        format!("…{}", &x[x.len() - 21..])
    } else {
        x.to_string()
    }
}
