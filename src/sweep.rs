//! `fsdp-plan sweep`: plans a model over world sizes and policies (and lists of the other
//! options): fits?, peak, step time, tokens/s/GPU.

use crate::cli::{options_for, HwOpt, Knobs};
use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use fsdp_planner::timeline;
use fsdp_planner::PlanError;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct SweepArgs {
    /// Model file (.ron, or an HF config.json).
    pub(crate) model: PathBuf,
    /// World sizes, comma-separated: 8,64,512.
    #[arg(long = "world-size", value_delimiter = ',', default_value = "8")]
    pub(crate) world_sizes: Vec<u64>,
    /// A wrap policy; repeat the flag or separate policies with `;` (a comma belongs to one
    /// policy: `transformer:A,B` is one policy with two classes). Default: auto.
    #[arg(long = "policy")]
    pub(crate) policies: Vec<String>,
    #[command(flatten)]
    pub(crate) k: Knobs,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    /// Memory per GPU a plan must fit in (default: the hardware's), e.g. 80GiB, 75GB, 8e10.
    #[arg(long)]
    pub(crate) memory_limit: Option<String>,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
}

pub(crate) fn sweep(a: &SweepArgs) -> Result<()> {
    let model = load_model(&a.model)?;
    let hw = load_hardware(&a.hw.hardware)?;
    let limit = match &a.memory_limit {
        Some(s) => parse_size(s)?,
        None => hw.memory_bytes,
    };
    let mut policies: Vec<String> = a.policies.iter().flat_map(|p| p.split(';')).map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if policies.is_empty() {
        policies.push("auto".into());
    }
    for p in &policies {
        // `transformer:A,size:1e8` would be one policy whose second class is `size:1e8`
        if let Some((kind, rest)) = p.split_once(':') {
            if matches!(kind, "transformer" | "modules") && rest.split(',').any(|x| x.contains(':')) {
                bail!(UserError(format!(
                    "--policy `{p}`: a comma separates the classes or modules of one policy; separate policies with `;` or repeat --policy"
                )));
            }
        }
    }
    if a.world_sizes.is_empty() {
        bail!(UserError("--world-size: give at least one world size".into()));
    }
    let mut rows = vec![];
    for &ws in &a.world_sizes {
        for p in &policies {
            let what = |e: PlanError| user(format!("world size {ws}, policy {p}: {e}"));
            let opts = options_for(&a.k, ws, p).map_err(what)?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(what)?;
            let t = timeline::predict(&plan, &model, &hw);
            rows.push((ws, plan.policy.clone(), plan.memory.peak_bytes, t));
        }
    }
    if a.format == "json" {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(ws, policy, peak, t)| {
                serde_json::json!({
                    "world_size": ws,
                    "policy": policy,
                    "fits": *peak <= limit,
                    "peak_bytes": peak,
                    "step_time_s": t.step_time_s,
                    "exposed_comm_s": t.exposed_comm_s,
                    "mfu": t.mfu,
                    "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "model": model.name,
            "hardware": hw.name,
            "memory_limit_bytes": limit,
            "batch": a.k.batch,
            "seq": a.k.seq,
            "rows": v,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "sweep {} on {} · memory limit {} · batch {} × seq {} · param dtype {} · reduce dtype {}",
        model.name,
        hw.name,
        fsdp_planner::print::bytes(limit),
        a.k.batch,
        a.k.seq,
        a.k.param_dtype.as_deref().unwrap_or("(param's)"),
        a.k.reduce_dtype.as_deref().unwrap_or("(param dtype)")
    );
    let pw = rows.iter().map(|r| r.1.len()).max().unwrap_or(6).max(6);
    println!(
        "{:>10}  {:<pw$}  {:<5} {:>12} {:>11} {:>13} {:>6} {:>13}",
        "world size", "policy", "fits?", "peak", "step time", "tokens/s/GPU", "MFU", "exposed comm"
    );
    for (ws, policy, peak, t) in &rows {
        println!(
            "{:>10}  {:<pw$}  {:<5} {:>12} {:>11} {:>13} {:>6} {:>13}",
            ws,
            policy,
            if *peak <= limit { "yes" } else { "no" },
            fsdp_planner::print::bytes(*peak),
            timeline::secs(t.step_time_s),
            timeline::thousands(t.tokens_per_s_per_gpu),
            timeline::pct(t.mfu),
            timeline::secs(t.exposed_comm_s)
        );
    }
    Ok(())
}
