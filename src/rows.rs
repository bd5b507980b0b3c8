//! `fsdp-plan rows ROWS.json`: plans every published measurement of a rows file
//! (`bench/data/published-rows.json`'s schema: model, GPUs, batch, seq, AC, compile, float8,
//! parallelism, measured tokens/s/GPU and memory) and prints published against predicted,
//! with the error — the time and memory model held against runs it was not fitted to.

use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use fsdp_planner::hardware::Hardware;
use fsdp_ir::DType;
use fsdp_planner::{AcMode, AcWrapper, BackwardPrefetch, Device, Layout, Optimizer, Options, Policy, Strategy, TrainLoop};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(crate) struct RowsArgs {
    /// A rows file (JSON list, the schema of bench/data/published-rows.json).
    pub(crate) rows: PathBuf,
    /// `md`: a Markdown table; `json`: every row with its prediction.
    #[arg(long, default_value = "md", value_parser = ["md", "json"])]
    pub(crate) format: String,
    /// Refit the rows' hardware profile to their measured tokens/s (its compute, memory and
    /// communication rates scaled; see planner/src/refit.rs) and write it here (RON). Every
    /// fitted row must use one profile.
    #[arg(long, value_name = "OUT.ron")]
    pub(crate) fit: Option<PathBuf>,
    /// With --fit: rows (by id, comma-separated) left out of the fit and only predicted.
    #[arg(long, value_delimiter = ',', requires = "fit")]
    pub(crate) holdout: Vec<String>,
    /// With --fit: the rates fitted (the others stay the profile's).
    #[arg(long, value_delimiter = ',', default_value = "compute,memory,comm", value_parser = ["compute", "memory", "comm"], requires = "fit")]
    pub(crate) fit_factors: Vec<String>,
}

/// One row's prediction, or why the planner cannot express it.
struct Outcome {
    id: String,
    split: String,
    what: String,
    measured_tps: f64,
    measured_mem_gib: Option<f64>,
    mem_kind: String,
    result: Result<Predicted, String>,
}

struct Predicted {
    tps: f64,
    peak_gib: f64,
    reserved_gib: f64,
    active_gib: f64,
    hardware: String,
    /// The predicted step: its time, the compute stream's busy time, communication the
    /// compute stream waits on.
    step_s: f64,
    compute_s: f64,
    exposed_comm_s: f64,
    /// The compute stream's busy time by kind of work: GEMMs (linears, MoE experts),
    /// attention, the optimizer step, everything else (element-wise, norms, the loss, FSDP's
    /// copies).
    by_kind: [(&'static str, f64); 4],
}

/// The compute stream's busy seconds by kind of work (see [`Predicted::by_kind`]).
fn compute_by_kind(plan: &fsdp_planner::Plan, model: &fsdp_ir::Model, t: &fsdp_planner::timeline::TimeReport) -> [(&'static str, f64); 4] {
    use fsdp_planner::plan::OpKind as S;
    let kinds: std::collections::HashMap<&str, &fsdp_ir::OpKind> = model.ops.iter().map(|o| (o.name.as_str(), &o.kind)).collect();
    let mut out = [("gemm", 0.0), ("attention", 0.0), ("optimizer", 0.0), ("other", 0.0)];
    for span in t.ops.iter().filter(|s| s.stream == fsdp_planner::plan::Stream::Compute) {
        let Some(op) = plan.schedule.get(span.op.index()) else { continue };
        let slot = match &op.kind {
            S::Forward { op, .. } | S::Recompute { op, .. } | S::Backward { op, .. } => match kinds.get(&**op) {
                Some(fsdp_ir::OpKind::Linear { .. } | fsdp_ir::OpKind::Experts { .. }) => 0,
                Some(fsdp_ir::OpKind::Attention { .. }) => 1,
                _ => 3,
            },
            S::OptimizerStep { .. } => 2,
            _ => 3,
        };
        out[slot].1 += span.end - span.start;
    }
    out
}

/// The hardware profile of a row: torchtitan's Grand Teton H100s (96 GB HBM2e, 500 W) are
/// `h100-96gb-500w`, else the row's `planner_profile`; a network the source states per node
/// (`network_gbps_per_node`) sets the NIC rate (at NDR's 46 of 50 GB/s achievable, NVIDIA).
fn hardware_of(row: &Value) -> Result<Hardware> {
    let h = &row["hardware"];
    let grand_teton = h["memory_gb"].as_f64() == Some(96.0) && h["planner_profile"].as_str().is_some_and(|p| p.starts_with("h100"));
    let name = if grand_teton { "h100-96gb-500w" } else { h["planner_profile"].as_str().unwrap_or("h100-sxm") };
    let mut hw = load_hardware(name)?;
    if let (Some(gbps), Some(g)) = (h["network_gbps_per_node"].as_f64(), hw.gpu.as_mut()) {
        let nics = g.nccl.nics_per_node.max(1) as f64;
        g.nccl.nic_bandwidth = gbps / 8.0 * 1e9 * (46.0 / 50.0) / nics;
    }
    Ok(hw)
}

/// The plan options of a row, or why it is beyond the planner.
fn options_of(row: &Value, model: &fsdp_ir::Model) -> std::result::Result<Options, String> {
    let p = &row["parallelism"];
    for k in ["tp", "pp", "cp"] {
        if p[k].as_u64().unwrap_or(1) > 1 {
            return Err(format!("{k} {} (beyond FSDP)", p[k]));
        }
    }
    let kind = p["kind"].as_str().unwrap_or("FSDP2");
    let ws = row["hardware"]["world_size"].as_u64().ok_or("no world size")?;
    let (shard, repl) = (p["dp_shard"].as_u64().unwrap_or(ws), p["dp_replicate"].as_u64().unwrap_or(1));
    let fsdp1 = kind.starts_with("FSDP1");
    let strategy = if repl > 1 { Strategy::HybridShard { shard_size: shard } } else { Strategy::FullShard };
    let layer = model.modules.iter().find(|m| m.class.ends_with("DecoderLayer") || m.class == "GPT2Block").map(|m| m.class.clone()).ok_or("no decoder layer")?;
    let layers: Vec<String> = model.modules.iter().filter(|m| m.class == layer).map(|m| m.path.clone()).collect();
    let (checkpoint, ac_mode) = match row["activation_checkpointing"].as_str().unwrap_or("none") {
        "none" => (vec![], AcMode::Full),
        "full" => (vec![layer.clone()], AcMode::Full),
        "selective-op" => (vec![layer.clone()], AcMode::SelectiveOp),
        // torchtitan's selective_ac_option 2 (and IBM's every-other-block): the odd blocks
        "selective-layer" => (layers.iter().skip(1).step_by(2).cloned().collect(), AcMode::Full),
        other => return Err(format!("activation checkpointing `{other}`")),
    };
    let mp = &row["mixed_precision"];
    let dt = |k: &str| mp[k].as_str().and_then(DType::parse);
    Ok(Options {
        world_size: ws,
        policy: Policy::Auto,
        layout: if fsdp1 { Layout::Flat } else { Layout::Fsdp2 },
        strategy,
        reshard_after_forward: None,
        root_reshard_after_forward: None,
        // torchtitan's FSDP2 keeps its last block unsharded after forward
        unit_reshard: if fsdp1 { vec![] } else { vec![("last".into(), false)] },
        unit_reshard_to: vec![],
        shard_dims: vec![],
        param_dtype: dt("param"),
        reduce_dtype: dt("reduce"),
        master_dtype: dt("master"),
        forward_prefetch: 0,
        backward_prefetch: if fsdp1 { BackwardPrefetch::Pre } else { BackwardPrefetch::Implicit },
        grad_accum: row["grad_accum"].as_u64().unwrap_or(1) as u32,
        // (every row is of one micro-batch per step)
        grad_sync: fsdp_planner::GradSync::Last,
        checkpoint,
        ac_mode,
        // torchtitan wraps each block with checkpoint_wrapper before sharding it (for rows
        // without float8 all-gather under SAC the wrapper moves only a tracker category, which
        // no row compares)
        ac_wrapper: AcWrapper::Torchtitan,
        // (the loop of the row's run, where its source says: torchtitan-2024 kept the logits)
        train_loop: match row["train_loop"].as_str() {
            None => TrainLoop::Hf,
            Some(l) => TrainLoop::parse(l).ok_or_else(|| format!("train_loop `{l}`"))?,
        },
        offload: fsdp_planner::Offload::None,
        optimizer: match row["optimizer"].as_str() {
            Some("adam") => Optimizer::Adam,
            Some("sgd") => Optimizer::Sgd,
            _ => Optimizer::AdamW,
        },
        batch: row["local_batch"].as_u64().ok_or("no local batch")?,
        seq: row["seq_len"].as_u64().ok_or("no seq len")?,
        attn_implementation: None,
        device: Device::Cuda,
        expandable_segments: row["allocator"]["expandable_segments"].as_bool().unwrap_or(false),
        compile: row["compile"].as_bool() == Some(true),
        unit_group: 1,
        reshard_to: None,
        // torchtitan's float8 recipe (docs/float8.md): tensorwise, weights all-gathered in
        // float8 unless the row says otherwise
        float8: (row["float8"].as_bool() == Some(true)).then(|| fsdp_planner::options::Float8 { recipe: fsdp_planner::options::Float8Recipe::Tensorwise, all_gather: row["float8_all_gather"].as_bool().unwrap_or(true) }),
    })
}

fn describe(row: &Value) -> String {
    let h = &row["hardware"];
    format!(
        "{} · {} × {} · {} × {} · AC {}{}{}",
        row["model"]["planner_config"].as_str().map(|p| p.trim_start_matches("models/").trim_end_matches(".config.json")).unwrap_or("?"),
        h["world_size"],
        h["gpu"].as_str().unwrap_or("?").split(['(', ';']).next().unwrap_or("").trim().trim_start_matches("NVIDIA "),
        row["local_batch"],
        row["seq_len"],
        row["activation_checkpointing"].as_str().unwrap_or("?"),
        if row["compile"].as_bool() == Some(true) { " · compile" } else { "" },
        row["parallelism"]["kind"].as_str().map(|k| format!(" · {k}")).unwrap_or_default(),
    )
}

fn evaluate(row: &Value, root: &Path) -> Outcome {
    let m = &row["measured"];
    let mut out = Outcome {
        id: row["id"].as_str().unwrap_or("?").to_string(),
        split: row["split"].as_str().unwrap_or("").to_string(),
        what: describe(row),
        measured_tps: m["tokens_per_s_per_gpu"].as_f64().unwrap_or(0.0),
        measured_mem_gib: m["memory_gib"].as_f64(),
        mem_kind: m["memory_kind"].as_str().unwrap_or("").to_string(),
        result: Err(String::new()),
    };
    out.result = (|| -> std::result::Result<Predicted, String> {
        let cfg = row["model"]["planner_config"].as_str().ok_or("no planner config")?;
        let model = load_model(&root.join(cfg)).map_err(|e| e.to_string())?;
        let opts = options_of(row, &model)?;
        let hw = hardware_of(row).map_err(|e| e.to_string())?;
        let plan = fsdp_planner::plan(&model, &opts).map_err(|e| e.to_string())?;
        let t = fsdp_planner::timeline::predict(&plan, &model, &hw);
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let reserved = fsdp_planner::reserved::predict(&plan, &hw);
        Ok(Predicted { tps: t.tokens_per_s_per_gpu, peak_gib: gib(plan.memory.peak_bytes), reserved_gib: gib(reserved.max_reserved_bytes), active_gib: gib(reserved.max_active_bytes), hardware: hw.name.clone(), step_s: t.step_time_s, compute_s: t.compute_s, exposed_comm_s: t.exposed_comm_s, by_kind: compute_by_kind(&plan, &model, &t) })
    })();
    out
}

/// The predicted memory of the kind the row measured (`max_reserved`, `max_active`).
fn mem_of(o: &Outcome, p: &Predicted) -> Option<f64> {
    match o.mem_kind.as_str() {
        "max_reserved" => Some(p.reserved_gib),
        "max_active" => Some(p.active_gib),
        _ => None,
    }
}

fn pct(pred: f64, meas: f64) -> f64 {
    100.0 * (pred / meas - 1.0)
}

pub(crate) fn run(a: RowsArgs) -> Result<()> {
    let text = read(&a.rows)?;
    let rows: Vec<Value> = serde_json::from_str(&text).map_err(|e| json_error(&a.rows, &text, "not a rows file: ", e))?;
    if rows.is_empty() {
        bail!(UserError(format!("{}: no rows", a.rows.display())));
    }
    // model paths in a rows file are relative to the repository (as bench/data's are)
    let root = search_dirs("models").into_iter().filter_map(|d| d.parent().map(Path::to_path_buf)).find(|r| r.join("models").is_dir()).unwrap_or_else(|| PathBuf::from("."));
    if let Some(out) = &a.fit {
        not_an_input(out, &[&a.rows])?;
        return fit(&a, &rows, &root, out);
    }
    let outcomes: Vec<Outcome> = rows.iter().map(|r| evaluate(r, &root)).collect();
    if a.format == "json" {
        let v: Vec<Value> = outcomes
            .iter()
            .map(|o| {
                let mut j = serde_json::json!({"id": o.id, "split": o.split, "config": o.what, "measured_tokens_per_s_per_gpu": o.measured_tps, "measured_memory_gib": o.measured_mem_gib, "memory_kind": o.mem_kind});
                match &o.result {
                    Ok(p) => {
                        j["predicted_tokens_per_s_per_gpu"] = p.tps.into();
                        j["tokens_error_pct"] = pct(p.tps, o.measured_tps).into();
                        j["predicted_peak_gib"] = p.peak_gib.into();
                        j["predicted_reserved_gib"] = p.reserved_gib.into();
                        j["predicted_active_gib"] = p.active_gib.into();
                        j["hardware"] = p.hardware.clone().into();
                        j["predicted_step_s"] = p.step_s.into();
                        j["predicted_compute_s"] = p.compute_s.into();
                        j["predicted_exposed_comm_s"] = p.exposed_comm_s.into();
                        j["predicted_compute_by_kind_s"] = p.by_kind.iter().map(|&(k, v)| (k.to_string(), Value::from(v))).collect::<serde_json::Map<_, _>>().into();
                    }
                    Err(e) => j["not_expressible"] = e.clone().into(),
                }
                j
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut cells = vec![];
    for o in &outcomes {
        let (tps, err, mem, merr, hw) = match &o.result {
            Ok(p) => {
                let pm = mem_of(o, p).unwrap_or(p.peak_gib);
                let merr = o.measured_mem_gib.map_or("".into(), |m| format!("{:+.1}%", pct(pm, m)));
                (format!("{:.0}", p.tps), format!("{:+.1}%", pct(p.tps, o.measured_tps)), format!("{pm:.1}"), merr, p.hardware.clone())
            }
            Err(e) => (format!("— {e}"), String::new(), String::new(), String::new(), String::new()),
        };
        let mm = o.measured_mem_gib.map_or("".into(), |m| format!("{m:.1} ({})", o.mem_kind.trim_start_matches("max_")));
        cells.push(vec![o.id.clone(), o.what.clone(), hw, format!("{:.0}", o.measured_tps), tps, err, mm, mem, merr]);
    }
    let heads: Vec<String> = ["id", "configuration", "profile", "tok/s/GPU", "predicted", "error", "memory GiB", "predicted", "error"].iter().map(|s| s.to_string()).collect();
    outln!("{}", markdown(&heads, &cells));
    // summary per split
    for split in ["shared", "extra"] {
        let of: Vec<(&Outcome, &Predicted)> = outcomes.iter().filter(|o| o.split == split).filter_map(|o| o.result.as_ref().ok().map(|p| (o, p))).collect();
        if of.is_empty() {
            continue;
        }
        let errs: Vec<f64> = of.iter().map(|(o, p)| pct(p.tps, o.measured_tps)).collect();
        let within = errs.iter().filter(|e| e.abs() <= 10.0).count();
        let mean = errs.iter().sum::<f64>() / errs.len() as f64;
        let rms = (errs.iter().map(|e| e * e).sum::<f64>() / errs.len() as f64).sqrt();
        let mem: Vec<f64> = of.iter().filter_map(|(o, p)| Some(pct(mem_of(o, p)?, o.measured_mem_gib?))).collect();
        let mem_within = mem.iter().filter(|e| e.abs() <= 5.0).count();
        outln!(
            "\n{split}: {} of {} rows expressible · tokens/s/GPU: {within} within 10%, mean error {mean:+.1}%, RMS {rms:.1}% · memory: {mem_within} of {} within 5%",
            of.len(),
            outcomes.iter().filter(|o| o.split == split).count(),
            mem.len()
        );
    }
    Ok(())
}

/// `rows FILE --fit OUT.ron`: the expressible rows planned once, the profile refitted to
/// their measured tokens/s (held-out rows only predicted), the fitted profile written.
fn fit(a: &RowsArgs, rows: &[Value], root: &Path, out: &Path) -> Result<()> {
    let file = a.rows.display();
    for h in &a.holdout {
        if !rows.iter().any(|r| r["id"].as_str() == Some(h.as_str())) {
            bail!(UserError(format!("--holdout: {file} has no row `{h}`")));
        }
    }
    // (id, model, plan, measured, profile name)
    let mut planned = vec![];
    let mut skipped = vec![];
    for row in rows {
        let id = row["id"].as_str().unwrap_or("?").to_string();
        let measured = row["measured"]["tokens_per_s_per_gpu"].as_f64().filter(|t| *t > 0.0);
        let r = (|| -> std::result::Result<_, String> {
            let measured = measured.ok_or("no measured tokens_per_s_per_gpu")?;
            let cfg = row["model"]["planner_config"].as_str().ok_or("no planner config")?;
            let model = load_model(&root.join(cfg)).map_err(|e| e.to_string())?;
            let opts = options_of(row, &model)?;
            let hw = hardware_of(row).map_err(|e| e.to_string())?;
            let plan = fsdp_planner::plan(&model, &opts).map_err(|e| e.to_string())?;
            Ok((model, plan, measured, hw))
        })();
        match r {
            Ok((model, plan, measured, hw)) => planned.push((id, model, plan, measured, hw)),
            Err(e) => skipped.push(format!("{id}: {e}")),
        }
    }
    let fitted = |id: &str| !a.holdout.iter().any(|h| h == id);
    let mut names: Vec<&str> = planned.iter().filter(|p| fitted(&p.0)).map(|p| p.4.name.as_str()).collect();
    names.sort();
    names.dedup();
    let hw = match names.as_slice() {
        [] => bail!(UserError(format!("{file}: no row to fit (none expressible, or all held out)"))),
        [_] => planned.iter().find(|p| fitted(&p.0)).map(|p| p.4.clone()).ok_or_else(|| user("no row"))?,
        many => bail!(UserError(format!("{file}: the fitted rows use several profiles ({}): fit one profile at a time (split the file or --holdout the others)", many.join(", ")))),
    };
    let cases: Vec<fsdp_planner::refit::Case> = planned.iter().map(|p| fsdp_planner::refit::Case { plan: &p.2, model: &p.1, measured_tokens_per_s: p.3 }).collect();
    let mask: Vec<bool> = planned.iter().map(|p| fitted(&p.0)).collect();
    let free = ["compute", "memory", "comm"].map(|f| a.fit_factors.iter().any(|x| x == f));
    let r = fsdp_planner::refit::refit(&cases, &mask, free, &hw);
    let mut fitted_hw = r.hardware.clone();
    fitted_hw.name = format!("{}-fit", hw.name);
    let header = format!(
        "// {} refitted to {} by `fsdp-plan rows --fit`: compute ×{:.4}, memory ×{:.4}, communication ×{:.4}\n",
        hw.name, file, r.factors[0], r.factors[1], r.factors[2]
    );
    let cfg = ron::ser::PrettyConfig::new().struct_names(false);
    write_atomic(out, &(header + &ron::ser::to_string_pretty(&fitted_hw, cfg)?))?;
    let mut cells = vec![];
    for (i, p) in planned.iter().enumerate() {
        let pct = |x: f64| format!("{:+.1}%", 100.0 * (x / p.3 - 1.0));
        cells.push(vec![p.0.clone(), if mask[i] { "fitted".into() } else { "held out".into() }, p.4.name.clone(), format!("{:.0}", p.3), format!("{:.0}", r.before[i]), pct(r.before[i]), format!("{:.0}", r.after[i]), pct(r.after[i])]);
    }
    let heads: Vec<String> = ["id", "", "profile", "tok/s/GPU", "before", "error", "after", "error"].iter().map(|s| s.to_string()).collect();
    outln!("{}", markdown(&heads, &cells));
    outln!(
        "\n{}: compute ×{:.4}, memory ×{:.4}, communication ×{:.4} · RMS log error of the fitted rows {:.1}% → {:.1}% · written to {}",
        hw.name,
        r.factors[0],
        r.factors[1],
        r.factors[2],
        r.rms_before,
        r.rms_after,
        out.display()
    );
    if !skipped.is_empty() {
        outln!("not planned: {}", skipped.join("; "));
    }
    Ok(())
}

/// A Markdown table.
fn markdown(heads: &[String], rows: &[Vec<String>]) -> String {
    let line = |c: &[String]| format!("| {} |", c.iter().map(|x| x.replace('|', "/")).collect::<Vec<_>>().join(" | "));
    let mut s = line(heads);
    s.push('\n');
    s.push_str(&format!("|{}|", heads.iter().enumerate().map(|(i, _)| if i >= 3 { "---:" } else { "---" }).collect::<Vec<_>>().join("|")));
    for r in rows {
        s.push('\n');
        s.push_str(&line(r));
    }
    s
}
