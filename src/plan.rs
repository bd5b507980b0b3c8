//! `fsdp-plan plan` (the default command): the schedule, units, communication, predicted peak
//! memory (and whether it fits) and step time of a model under the options.

use crate::cli::{options, HwOpt, PlanArgs};
use crate::io::*;
use anyhow::Result;
use fsdp_planner::print;
use fsdp_planner::timeline;

pub(crate) fn run(a: PlanArgs, hw: HwOpt) -> Result<()> {
    let model = load_model(&a.model)?;
    let opts = options(&a.o, &a.o.policy, &model).map_err(user)?;
    let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
    if opts.float8.is_some() {
        let kept = fsdp_planner::float8::left_in_high_precision(&model);
        if !kept.is_empty() {
            let shown: Vec<&str> = kept.iter().take(4).map(String::as_str).collect();
            eprintln!(
                "note: --float8: {} linear(s) left in high precision, their dims not multiples of 16 (torchtitan's filter): {}{}",
                kept.len(),
                shown.join(", "),
                if kept.len() > shown.len() { ", …" } else { "" }
            );
        }
    }
    short_dim0_note(&plan);
    if a.format == "ron" {
        outln!("{}", plan_ron(&plan)?);
        return Ok(());
    }
    // (whose host memory the verdict names)
    let host_of = hw.host_memory.as_ref().map(|_| "--host-memory".to_string());
    let hw = hw.load()?;
    crate::io::check_float8(&hw, opts.float8.is_some())?;
    let (limit, of) = match &a.memory_limit {
        Some(s) => (parse_size("--memory-limit", s)?, "--memory-limit".to_string()),
        None => (hw.memory_bytes, hw.name.clone()),
    };
    let reserve = a.reserve.as_deref().map(|s| crate::io::parse_size_or_zero("--reserve", s)).transpose()?;
    let t = timeline::predict(&plan, &model, &hw);
    let reserved = fsdp_planner::reserved::predict(&plan, &hw);
    // (with --reserve, as tune judges it: the tensor peak plus the reserve)
    let (need, of) = match reserve {
        Some(r) => (plan.memory.peak_bytes.saturating_add(r), format!("{of}, the tensor peak + {} reserve", fsdp_planner::print::bytes(r))),
        None => (reserved.needed_bytes(&plan), of),
    };
    // --offload cpu: every rank of the node keeps its state on the node's host (checked where
    // the node's host memory is known)
    let host = fsdp_planner::memory::host_need(&plan, &hw).filter(|h| h.has.is_some());
    if a.format == "json" {
        let mut v = print::json(&plan);
        v["time"] = timeline::json(&t);
        v["reserved"] = reserved.json();
        v["fits"] = serde_json::json!({
            "memory_limit_bytes": limit,
            "limit_of": of,
            "needed_bytes": need,
            "fits": need <= limit && host.is_none_or(|h| h.fits()),
            "headroom_bytes": limit as i128 - need as i128,
            "host_needed_bytes": host.map(|h| h.bytes()),
            "host_memory_bytes": host.and_then(|h| h.has),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut body = if a.summary { print::summary(&plan) } else { print::render(&plan, a.full_schedule) };
    if a.peak_buffers {
        body += &format!("\nbuffers live at the peak ({}):\n", plan.memory.peak_at);
        for b in fsdp_planner::memory::live_at_peak(&plan) {
            body += &format!("  {:>12}  {:<16} {}\n", print::bytes(b.bytes), b.category.name(), b.name);
        }
    }
    let res = reserved.render(&plan);
    let res = if res.is_empty() { res } else { format!("  {res}\n") };
    let host = match host {
        Some(h @ fsdp_planner::memory::HostNeed { has: Some(has), .. }) => format!("  host: {} per rank × {} ranks: {}\n", print::bytes(h.per_rank), h.ranks, print::verdict(h.bytes(), has, &format!("the node's host memory, {}", host_of.as_deref().unwrap_or(&hw.name)))),
        _ => String::new(),
    };
    out(format_args!("{body}{res}  {}\n{host}{}", print::verdict(need, limit, &of), timeline::render(&t)));
    Ok(())
}

/// A note on stderr where FSDP2's dim-0 sharding leaves every rank holding whole rows of
/// parameters shorter than the shard group (MoE experts stacked over more ranks than
/// experts) and that costs a rank more than 1% of its sharded params: memory the plan counts
/// and a user may not expect.
fn short_dim0_note(plan: &fsdp_planner::Plan) {
    // (measured in fake mode, Mixtral-8x7B at 64 ranks, its experts on dim 1, batch 1 × 256:
    // FSDP2's step peaks in the optimizer at 23.0 GB where the plan says 21.9 — AdamW's
    // for-loop `addcdiv_` on the [8, 28672, 4096] DTensors allocates three buffers of 1.8-1.9
    // GB; with CUDA's foreach AdamW the plan was within 2 KiB)
    let multi = plan.units.iter().flat_map(|u| &u.params).find(|p| p.shard_dim > 0 && p.shape.len() >= 3);
    if let (Some(p), fsdp_planner::options::Device::Cpu) = (multi, plan.options.device) {
        eprintln!("note: `{}` ({:?}) is sharded on dim {} on a CPU device: FSDP2 there runs the optimizer's for-loop kernels, whose in-place updates of DTensors of 3 or more dims sharded on a dim past 0 allocate full-size buffers the plan does not count", p.name, p.shape, p.shard_dim);
    }
    let groups = fsdp_planner::units::short_dim0(&plan.units, &plan.options);
    let extra: u64 = groups.iter().map(|g| g.extra_bytes).sum();
    let sharded: u64 = plan.units.iter().flat_map(|u| &u.params).map(|p| p.shard_numel * p.dtype.size()).sum();
    if extra == 0 || extra * 100 < sharded {
        return;
    }
    let n = plan.options.shard_size();
    let shown: Vec<String> = groups.iter().take(3).map(|g| format!("{} × {} {:?}", g.count, g.pattern, g.shape)).collect();
    eprintln!(
        "note: FSDP2 shards parameters on dim 0 (Shard(0)): {} parameter(s) have dim 0 below the shard group of {n} ranks, so every rank holds whole rows of them ({} more per rank than an even 1/{n}): {}{} — `--shard-dim {}=1` shards them on dim 1 (FSDP2's shard_placement_fn, torchtitan's choice for experts) where the group divides it",
        groups.iter().map(|g| g.count).sum::<usize>(),
        print::bytes(extra),
        shown.join(", "),
        if groups.len() > shown.len() { ", …" } else { "" },
        groups.first().map_or("PATTERN", |g| g.pattern.as_str())
    );
}
