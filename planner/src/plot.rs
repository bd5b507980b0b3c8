//! Memory over one predicted step as a hand-written SVG: stacked areas by FSDPMemTracker
//! category on the predicted clock ([`crate::timeline::memory_timeline`]), the peak marked
//! and labelled, the device's memory as a line when it is in range, the forward / backward /
//! optimizer phases, axes with units and a legend.

use crate::plan::*;
use crate::print::bytes;
use crate::timeline::{coalesce, pct, secs, MemSample, TimeReport};
use std::fmt::Write;

/// Bottom-to-top stacking order: persistent state first, then what comes and goes.
pub const STACK: [Category; 11] = [
    Category::ShardedParam,
    Category::Optstate,
    Category::ShardedGrad,
    Category::Buffer,
    Category::Inputs,
    Category::UnshardedParam,
    Category::AllGather,
    Category::UnshardedGrad,
    Category::ReduceScatter,
    Category::Activation,
    Category::Temp,
];

pub fn color(c: Category) -> &'static str {
    match c {
        Category::ShardedParam => "#2f6ea8",
        Category::UnshardedParam => "#8fbbe3",
        Category::ShardedGrad => "#d9731a",
        Category::UnshardedGrad => "#f5b97a",
        Category::Optstate => "#3d9a4a",
        Category::AllGather => "#8e6bbf",
        Category::ReduceScatter => "#c9b3e6",
        Category::Activation => "#d64541",
        Category::Temp => "#f2a1a8",
        Category::Inputs => "#7f7f7f",
        Category::Buffer => "#b07a4f",
    }
}

/// Escapes text for XML content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 × 10^k) giving about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let k = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    k * p
}

fn fmt_tick(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    format!("{v:.decimals$}")
}

fn cat_index(c: Category) -> usize {
    Category::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

/// The SVG document. `limit`: the device's memory (label, bytes), drawn when within twice
/// the peak.
pub fn memory_svg(plan: &Plan, report: &TimeReport, mem: &[MemSample], limit: Option<(&str, u64)>) -> String {
    const W: f64 = 1100.0;
    const H: f64 = 600.0;
    let (x0, x1, y0, y1) = (90.0, 820.0, 92.0, 520.0);
    let samples = coalesce(mem);
    let t_end = report.step_time_s.max(samples.last().map(|m| m.t).unwrap_or(0.0));
    let t_end = if t_end > 0.0 { t_end } else { 1.0 };
    // peak sample (first of the largest)
    let (pi, peak) = samples.iter().enumerate().fold((0, 0u64), |acc, (i, m)| if m.total() > acc.1 { (i, m.total()) } else { acc });
    // units
    let (yu, yname) = if peak >= 1 << 30 {
        (1073741824.0, "GiB")
    } else if peak >= 1 << 20 {
        (1048576.0, "MiB")
    } else {
        (1024.0, "KiB")
    };
    let (tu, tname) = if t_end >= 2.0 {
        (1.0, "s")
    } else if t_end >= 2e-3 {
        (1e-3, "ms")
    } else {
        (1e-6, "µs")
    };
    let limit = limit.filter(|l| l.1 > 0 && (l.1 as f64) <= 2.0 * peak.max(1) as f64);
    let ymax_b = (peak.max(limit.map(|l| l.1).unwrap_or(0)) as f64 * 1.1).max(1.0);
    let ymax = ymax_b / yu;
    let ystep = nice_step(ymax, 6.0);
    let ymax = (ymax / ystep).ceil() * ystep;
    let xmax = t_end / tu;
    let xstep = nice_step(xmax, 8.0);
    let sx = |t: f64| x0 + (t / tu) / xmax * (x1 - x0);
    let sy = |b: f64| y1 - (b / yu) / ymax * (y1 - y0);

    // one column per pixel: the sample with the most memory among those alive in it
    let cols = (x1 - x0).round() as usize;
    let mut col: Vec<Option<usize>> = vec![None; cols];
    for (i, m) in samples.iter().enumerate() {
        let a = m.t;
        let b = samples.get(i + 1).map(|n| n.t).unwrap_or(t_end).max(a);
        let ca = (((sx(a) - x0).floor()) as isize).clamp(0, cols as isize - 1) as usize;
        let cb = (((sx(b) - x0).ceil() as isize) - 1).clamp(ca as isize, cols as isize - 1) as usize;
        for c in col.iter_mut().take(cb + 1).skip(ca) {
            match c {
                Some(j) if samples[*j].total() >= m.total() => {}
                _ => *c = Some(i),
            }
        }
    }
    // fill gaps (columns no sample reaches) with the previous column's
    for c in 1..cols {
        if col[c].is_none() {
            col[c] = col[c - 1];
        }
    }
    // runs of equal columns
    let mut runs: Vec<(f64, f64, usize)> = vec![];
    for (c, s) in col.iter().enumerate() {
        let Some(s) = *s else { continue };
        let (a, b) = (x0 + c as f64, x0 + c as f64 + 1.0);
        match runs.last_mut() {
            Some(r) if samples[r.2].bytes == samples[s].bytes && (r.1 - a).abs() < 1e-9 => r.1 = b,
            _ => runs.push((a, b, s)),
        }
    }
    let used: Vec<Category> = STACK.iter().copied().filter(|&c| samples.iter().any(|m| m.bytes[cat_index(c)] > 0)).collect();

    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Arial, Helvetica, sans-serif">"##
    );
    let o = &plan.options;
    let title = format!("Memory over one training step: {} · world size {} · rank {}", plan.model_name, o.world_size, plan.memory.rank);
    let _ = writeln!(s, r##"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"##);
    let _ = writeln!(s, r##"<text x="{x0}" y="28" font-size="18" font-weight="bold" fill="#222">{}</text>"##, esc(&title));
    let sub = format!(
        "{} · batch {} × seq {} · predicted on {}: step {} · MFU {} · peak {}",
        plan.policy,
        o.batch,
        o.seq,
        report.hardware,
        secs(report.step_time_s),
        pct(report.mfu),
        bytes(plan.memory.peak_bytes)
    );
    let _ = writeln!(s, r##"<text x="{x0}" y="50" font-size="13" fill="#444">{}</text>"##, esc(&sub));

    // phase strip above the plot
    let mut phases: Vec<(Phase, f64, f64)> = vec![];
    for (op, sp) in plan.schedule.iter().zip(&report.ops) {
        if op.stream != Stream::Compute || op.phase == Phase::Setup {
            continue;
        }
        match phases.last_mut() {
            Some(p) if p.0 == op.phase => p.2 = p.2.max(sp.end),
            _ => phases.push((op.phase, sp.start, sp.end)),
        }
    }
    for (ph, a, b) in &phases {
        let (name, fill) = match ph {
            Phase::Forward => ("forward", "#e8f0f8"),
            Phase::Backward => ("backward", "#f8ece4"),
            Phase::Optimizer => ("optimizer", "#e8f4e8"),
            Phase::Setup => ("setup", "#eeeeee"),
        };
        let (xa, xb) = (sx(*a), sx(*b).max(sx(*a) + 1.0));
        let _ = writeln!(s, r##"<rect x="{xa:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}"/>"##, y0, xb - xa, y1 - y0);
        let _ = writeln!(s, r##"<rect x="{xa:.1}" y="62" width="{:.1}" height="18" fill="{fill}" stroke="#bbb" stroke-width="0.5"/>"##, xb - xa);
        if xb - xa > 8.0 * name.len() as f64 {
            let _ = writeln!(s, r##"<text x="{:.1}" y="75" font-size="12" text-anchor="middle" fill="#444">{name}</text>"##, (xa + xb) / 2.0);
        }
    }

    // grid and y axis
    let mut v = 0.0;
    while v <= ymax + 1e-9 {
        let y = y1 - v / ymax * (y1 - y0);
        let _ = writeln!(s, r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#ddd" stroke-width="1"/>"##);
        let _ = writeln!(s, r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end" fill="#333">{}</text>"##, x0 - 8.0, y + 4.0, fmt_tick(v, ystep));
        v += ystep;
    }
    // x axis ticks
    let mut v = 0.0;
    while v <= xmax + 1e-9 {
        let x = x0 + v / xmax * (x1 - x0);
        let _ = writeln!(s, r##"<line x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{:.1}" stroke="#333" stroke-width="1"/>"##, y1 + 5.0);
        let _ = writeln!(s, r##"<text x="{x:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="#333">{}</text>"##, y1 + 20.0, fmt_tick(v, xstep));
        v += xstep;
    }

    // stacked areas
    let mut below = vec![0u64; runs.len()];
    for &c in &used {
        let ci = cat_index(c);
        let top: Vec<u64> = runs.iter().zip(&below).map(|(r, b)| b + samples[r.2].bytes[ci]).collect();
        let mut d = String::new();
        for (k, r) in runs.iter().enumerate() {
            let y = sy(top[k] as f64);
            let _ = write!(d, "{}{:.1},{:.2} L{:.1},{:.2} ", if k == 0 { "M" } else { "L" }, r.0, y, r.1, y);
        }
        for (k, r) in runs.iter().enumerate().rev() {
            let y = sy(below[k] as f64);
            let _ = write!(d, "L{:.1},{:.2} L{:.1},{:.2} ", r.1, y, r.0, y);
        }
        d.push('Z');
        let _ = writeln!(s, r##"<path d="{d}" fill="{}" stroke="none"><title>{}</title></path>"##, color(c), c.name());
        below = top;
    }
    // outline of the total
    let mut d = String::new();
    for (k, r) in runs.iter().enumerate() {
        let y = sy(below[k] as f64);
        let _ = write!(d, "{}{:.1},{:.2} L{:.1},{:.2} ", if k == 0 { "M" } else { "L" }, r.0, y, r.1, y);
    }
    let _ = writeln!(s, r##"<path d="{}" fill="none" stroke="#333" stroke-width="0.8"/>"##, d.trim_end());

    // axes
    let _ = writeln!(s, r##"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333" stroke-width="1.2"/>"##);
    let _ = writeln!(s, r##"<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="#333" stroke-width="1.2"/>"##);
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle" fill="#222">time since the start of the step ({tname})</text>"##,
        (x0 + x1) / 2.0,
        y1 + 44.0
    );
    let _ = writeln!(
        s,
        r##"<text transform="translate(24,{:.1}) rotate(-90)" font-size="13" text-anchor="middle" fill="#222">memory in use, rank {} ({yname})</text>"##,
        (y0 + y1) / 2.0,
        plan.memory.rank
    );

    // device memory line
    if let Some((name, b)) = limit {
        let y = sy(b as f64);
        let _ = writeln!(s, r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#b00020" stroke-width="1.5" stroke-dasharray="8,4"/>"##);
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end" fill="#b00020">{} memory {}</text>"##,
            x1 - 4.0,
            y - 5.0,
            esc(name),
            bytes(b)
        );
    }

    // peak marker and label
    if let Some(pm) = samples.get(pi) {
        let a = pm.t;
        let b = samples.get(pi + 1).map(|n| n.t).unwrap_or(t_end);
        let x = sx((a + b) / 2.0);
        let y = sy(peak as f64);
        let _ = writeln!(s, r##"<line x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{y:.1}" stroke="#111" stroke-width="1.2" stroke-dasharray="4,3"/>"##);
        let _ = writeln!(s, r##"<circle cx="{x:.1}" cy="{y:.1}" r="4.5" fill="#111"/>"##);
        let label = format!("peak {} at {}", bytes(plan.memory.peak_bytes), plan.memory.peak_at);
        let label = if label.chars().count() > 70 { format!("{}…", label.chars().take(69).collect::<String>()) } else { label };
        let w = 6.6 * label.chars().count() as f64 + 12.0;
        let lx = (x - w / 2.0).clamp(x0 + 2.0, x1 - w - 2.0);
        let ly = (y - 30.0).max(y0 + 2.0);
        let _ = writeln!(s, r##"<rect x="{lx:.1}" y="{ly:.1}" width="{w:.1}" height="20" rx="3" fill="white" fill-opacity="0.92" stroke="#111" stroke-width="0.8"/>"##);
        let _ = writeln!(s, r##"<text x="{:.1}" y="{:.1}" font-size="12" fill="#111">{}</text>"##, lx + 6.0, ly + 14.0, esc(&label));
    }

    // legend: top of the stack first, with the value at the peak
    let lx = x1 + 24.0;
    let _ = writeln!(s, r##"<text x="{lx}" y="{}" font-size="13" font-weight="bold" fill="#222">category (at peak)</text>"##, y0 + 4.0);
    let peak_bytes = samples.get(pi).map(|m| m.bytes).unwrap_or([0; 11]);
    for (k, &c) in used.iter().rev().enumerate() {
        let y = y0 + 22.0 + 22.0 * k as f64;
        let _ = writeln!(s, r##"<rect x="{lx}" y="{:.1}" width="14" height="14" fill="{}" stroke="#555" stroke-width="0.5"/>"##, y - 11.0, color(c));
        let _ = writeln!(s, r##"<text x="{}" y="{y:.1}" font-size="12" fill="#222">{}</text>"##, lx + 20.0, c.name());
        let _ = writeln!(s, r##"<text x="{}" y="{y:.1}" font-size="12" text-anchor="end" fill="#444">{}</text>"##, W - 14.0, bytes(peak_bytes[cat_index(c)]));
    }
    s.push_str("</svg>\n");
    s
}
