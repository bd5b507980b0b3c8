//! `fsdp-plan sweep`: plans a model over every combination of lists of options (world sizes,
//! policies, micro-batch, sequence length, gradient accumulation, checkpointing, reshard after
//! forward, dtypes): fits?, peak, step time, tokens/s/GPU.

use crate::cli::{options_for, Each, Fixed, HwOpt, Knobs, Precision};
use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use fsdp_planner::timeline::{self, TimeReport};
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
    /// Sequences per micro-batch on each rank, comma-separated: 1,2,4.
    #[arg(long = "batch", value_delimiter = ',', default_value = "1")]
    pub(crate) batches: Vec<u64>,
    /// Tokens per sequence, comma-separated (default: 2048, or the model's learned positions).
    #[arg(long = "seq", value_delimiter = ',')]
    pub(crate) seqs: Vec<u64>,
    /// Gradient accumulation steps, comma-separated.
    #[arg(long = "grad-accum", value_delimiter = ',', default_value = "1")]
    pub(crate) grad_accums: Vec<u32>,
    /// Checkpointing alternatives, comma-separated: `none`, a module class, or classes joined
    /// by `+` (`none,LlamaDecoderLayer`). Default: none.
    #[arg(long = "checkpoint", value_delimiter = ',')]
    pub(crate) checkpoints: Vec<String>,
    /// What checkpointed regions keep, comma-separated: full,selective-op.
    #[arg(long = "ac-mode", value_delimiter = ',', value_parser = ["full", "selective-op"])]
    pub(crate) ac_modes: Vec<String>,
    /// `reshard_after_forward` of the non-root units, comma-separated: true,false (default:
    /// the strategy's).
    #[arg(long = "reshard-after-forward", value_delimiter = ',')]
    pub(crate) reshards: Vec<bool>,
    /// Param dtypes, comma-separated (`none`: no mixed precision).
    #[arg(long = "param-dtype", value_delimiter = ',')]
    pub(crate) param_dtypes: Vec<String>,
    /// Reduce dtypes, comma-separated (`none`: the param dtype).
    #[arg(long = "reduce-dtype", value_delimiter = ',')]
    pub(crate) reduce_dtypes: Vec<String>,
    /// Master (sharded param) dtypes, comma-separated (`none`: the model file's).
    #[arg(long = "master-dtype", value_delimiter = ',')]
    pub(crate) master_dtypes: Vec<String>,
    #[command(flatten)]
    pub(crate) fixed: Fixed,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    /// Memory per GPU a plan must fit in (default: the hardware's), e.g. 80GiB, 80G, 75GB, 8e10.
    #[arg(long)]
    pub(crate) memory_limit: Option<String>,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
}

/// One swept configuration: its world size, policy and per-plan options, and what it gave.
struct Row {
    ws: u64,
    policy: String,
    each: Each,
    seq: u64,
    peak: u64,
    /// What the device needs: reserved + CUDA context + NCCL (the peak on the CPU).
    need: u64,
    /// Offloaded, and the node's host cannot hold its ranks' share.
    host_over: bool,
    reserved: u64,
    t: TimeReport,
}

/// `none` (or nothing) is the option left out; anything else is a value.
fn optional(v: &[String]) -> Vec<Option<String>> {
    if v.is_empty() {
        return vec![None];
    }
    v.iter().map(|x| (x != "none").then(|| x.clone())).collect()
}

fn or_default<T: Clone>(v: &[T], d: T) -> Vec<T> {
    if v.is_empty() {
        vec![d]
    } else {
        v.to_vec()
    }
}

/// Every combination of the list options, in the order the flags list them (the last
/// varies fastest).
fn combinations(a: &SweepArgs) -> Vec<Each> {
    let mut out = vec![Each::default()];
    let mut extend = |f: &dyn Fn(&Each) -> Vec<Each>| out = out.iter().flat_map(f).collect();
    extend(&|e| a.batches.iter().map(|&b| Each { batch: b, ..e.clone() }).collect());
    extend(&|e| or_default(&a.seqs.iter().map(|&s| Some(s)).collect::<Vec<_>>(), None).into_iter().map(|s| Each { seq: s, ..e.clone() }).collect());
    extend(&|e| a.grad_accums.iter().map(|&k| Each { grad_accum: k, ..e.clone() }).collect());
    extend(&|e| {
        optional(&a.checkpoints)
            .into_iter()
            .map(|c| Each { checkpoint: c.map(|c| c.split('+').map(|x| x.trim().to_string()).collect()).unwrap_or_default(), ..e.clone() })
            .collect()
    });
    extend(&|e| or_default(&a.ac_modes, "full".to_string()).into_iter().map(|m| Each { ac_mode: m, ..e.clone() }).collect());
    extend(&|e| or_default(&a.reshards.iter().map(|&r| Some(crate::cli::Raf::Bool(r))).collect::<Vec<_>>(), None).into_iter().map(|r| Each { reshard_after_forward: r, ..e.clone() }).collect());
    extend(&|e| optional(&a.param_dtypes).into_iter().map(|d| Each { precision: Precision { param_dtype: d, ..e.precision.clone() }, ..e.clone() }).collect());
    extend(&|e| optional(&a.reduce_dtypes).into_iter().map(|d| Each { precision: Precision { reduce_dtype: d, ..e.precision.clone() }, ..e.clone() }).collect());
    extend(&|e| optional(&a.master_dtypes).into_iter().map(|d| Each { precision: Precision { master_dtype: d, ..e.precision.clone() }, ..e.clone() }).collect());
    out
}

pub(crate) fn sweep(a: &SweepArgs) -> Result<()> {
    crate::allocator::no_huge_pages();
    let model = load_model(&a.model)?;
    let hw = a.hw.load()?;
    let limit = match &a.memory_limit {
        Some(s) => parse_size("--memory-limit", s)?,
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
    let combos = combinations(a);
    let mut rows = vec![];
    for &ws in &a.world_sizes {
        for p in &policies {
            for each in &combos {
                let k = Knobs { fixed: a.fixed.clone(), each: each.clone() };
                let what = |e: PlanError| user(format!("world size {ws}, policy {p}{}: {e}", describe(each)));
                let opts = options_for(&k, ws, p, &model).map_err(what)?;
                let plan = fsdp_planner::plan(&model, &opts).map_err(what)?;
                crate::io::check_float8(&hw, opts.float8.is_some())?;
                let t = timeline::predict(&plan, &model, &hw);
                let r = fsdp_planner::reserved::predict(&plan, &hw);
                let need = r.needed_bytes(&plan);
                // (offloaded: the node's host must hold its ranks' share too)
                let host_over = fsdp_planner::memory::host_need(&plan, &hw).is_some_and(|h| !h.fits());
                rows.push(Row { ws, policy: plan.policy.clone(), each: each.clone(), seq: opts.seq, peak: plan.memory.peak_bytes, need, host_over, reserved: r.max_reserved_bytes, t });
            }
        }
    }
    if a.format == "json" {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "world_size": r.ws,
                    "policy": r.policy,
                    "batch": r.each.batch,
                    "seq": r.seq,
                    "grad_accum": r.each.grad_accum,
                    "checkpoint": r.each.checkpoint,
                    "ac_mode": r.each.ac_mode,
                    "reshard_after_forward": r.each.reshard_after_forward,
                    "param_dtype": r.each.precision.param_dtype,
                    "reduce_dtype": r.each.precision.reduce_dtype,
                    "master_dtype": r.each.precision.master_dtype,
                    "fits": r.need <= limit && !r.host_over,
                    "peak_bytes": r.peak,
                    "max_reserved_bytes": r.reserved,
                    "needed_bytes": r.need,
                    "host_over": r.host_over,
                    "step_time_s": r.t.step_time_s,
                    "exposed_comm_s": r.t.exposed_comm_s,
                    "mfu": r.t.mfu,
                    "tokens_per_s_per_gpu": r.t.tokens_per_s_per_gpu,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "model": model.name,
            "hardware": hw.name,
            "memory_limit_bytes": limit,
            "rows": v,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    outln!("sweep {} on {} · memory limit {}", model.name, hw.name, fsdp_planner::print::bytes(limit));
    // the columns of the options that vary, then the results
    type Col = (&'static str, Box<dyn Fn(&Row) -> String>);
    let mut cols: Vec<Col> = vec![("world size", Box::new(|r: &Row| r.ws.to_string())), ("policy", Box::new(|r: &Row| r.policy.clone()))];
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let varying: Vec<Col> = vec![
        ("batch", Box::new(|r: &Row| r.each.batch.to_string())),
        ("seq", Box::new(|r: &Row| r.seq.to_string())),
        ("grad accum", Box::new(|r: &Row| r.each.grad_accum.to_string())),
        ("checkpoint", Box::new(|r: &Row| if r.each.checkpoint.is_empty() { "none".into() } else { r.each.checkpoint.join("+") })),
        ("ac mode", Box::new(|r: &Row| r.each.ac_mode.clone())),
        ("raf", Box::new(|r: &Row| r.each.reshard_after_forward.map_or("-".into(), |b| b.to_string()))),
        ("param", Box::new(move |r: &Row| opt(&r.each.precision.param_dtype))),
        ("reduce", Box::new(move |r: &Row| opt(&r.each.precision.reduce_dtype))),
        ("master", Box::new(move |r: &Row| opt(&r.each.precision.master_dtype))),
    ];
    for c in varying {
        if rows.iter().any(|r| (c.1)(r) != (c.1)(&rows[0])) {
            cols.push(c);
        }
    }
    cols.push(("fits?", Box::new(move |r: &Row| if r.host_over { "no (host)".into() } else if r.need <= limit { "yes".into() } else { "no".into() })));
    cols.push(("peak", Box::new(|r: &Row| fsdp_planner::print::bytes(r.peak))));
    if rows.iter().any(|r| r.need != r.peak) {
        cols.push(("on device", Box::new(|r: &Row| fsdp_planner::print::bytes(r.need))));
    }
    cols.push(("step time", Box::new(|r: &Row| timeline::secs(r.t.step_time_s))));
    cols.push(("tokens/s/GPU", Box::new(|r: &Row| timeline::thousands(r.t.tokens_per_s_per_gpu))));
    cols.push(("MFU", Box::new(|r: &Row| timeline::pct(r.t.mfu))));
    cols.push(("exposed comm", Box::new(|r: &Row| timeline::secs(r.t.exposed_comm_s))));
    let cells: Vec<Vec<String>> = rows.iter().map(|r| cols.iter().map(|c| (c.1)(r)).collect()).collect();
    let heads: Vec<String> = cols.iter().map(|c| c.0.to_string()).collect();
    outln!("{}", fsdp_planner::print::table(&heads, &cells));
    Ok(())
}

/// ` (batch 2, seq 4096, …)`: the swept options of a combination, for error messages.
fn describe(e: &Each) -> String {
    let mut v = vec![format!("batch {}", e.batch)];
    if let Some(s) = e.seq {
        v.push(format!("seq {s}"));
    }
    if e.grad_accum != 1 {
        v.push(format!("grad accum {}", e.grad_accum));
    }
    if !e.checkpoint.is_empty() {
        v.push(format!("checkpoint {}", e.checkpoint.join("+")));
    }
    format!(" ({})", v.join(", "))
}
