//! `fsdp-plan diff`: two plans side by side — a model under two policies, or two compiled
//! plans — every option that differs, units, collectives, memory and predicted time.

use crate::cli::{options_for, HwOpt, Knobs};
use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use fsdp_planner::timeline;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct DiffArgs {
    /// A model (with two --policy values), or two compiled plans.
    pub(crate) files: Vec<PathBuf>,
    #[arg(long, default_value_t = 8)]
    pub(crate) world_size: u64,
    /// The two policies to compare, with a model: `--policy A --policy B`.
    #[arg(long = "policy")]
    pub(crate) policies: Vec<String>,
    #[command(flatten)]
    pub(crate) k: Knobs,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    /// The model of compiled plans, for the time rows (default: models/<model name>.ron).
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub(crate) format: String,
}

pub(crate) fn run(d: DiffArgs) -> Result<()> {
    let hw = d.hw.load()?;
    let (a, an, b, bn, ma, mb) = match (d.files.as_slice(), d.policies.as_slice()) {
        ([model], [pa, pb]) => {
            let model = load_model(model)?;
            let plan = |p: &str| -> Result<fsdp_planner::Plan> { fsdp_planner::plan(&model, &options_for(&d.k, d.world_size, p, &model).map_err(user)?).map_err(user) };
            (plan(pa)?, pa.clone(), plan(pb)?, pb.clone(), model.clone(), model)
        }
        ([_], ps) => bail!(UserError(format!("diff MODEL compares two policies: give --policy twice (got {}{})", ps.len(), if ps.is_empty() { String::new() } else { format!(": {}", ps.join(", ")) }))),
        ([fa, fb], []) => {
            let (pa, ma) = load_plan_and_model(fa, d.model.as_deref())?;
            let (pb, mb) = load_plan_and_model(fb, d.model.as_deref())?;
            (pa, fa.display().to_string(), pb, fb.display().to_string(), ma, mb)
        }
        _ => bail!(UserError("diff takes MODEL --policy A --policy B, or PLAN1 PLAN2".into())),
    };
    crate::io::check_float8(&hw, a.options.float8.is_some() || b.options.float8.is_some())?;
    let mut rows = fsdp_planner::diff::rows(&a, &b);
    rows.extend(fsdp_planner::diff::time_rows(&timeline::predict(&a, &ma, &hw), &timeline::predict(&b, &mb, &hw)));
    if d.format == "json" {
        outln!("{}", serde_json::to_string_pretty(&fsdp_planner::diff::json(&a, &an, &b, &bn, &rows))?);
    } else {
        out(format_args!("{}", fsdp_planner::diff::render(&a, &an, &b, &bn, &rows)));
    }
    Ok(())
}
