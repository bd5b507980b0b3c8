//! `fsdp-plan diff`: two plans side by side — a model under two policies, or two compiled
//! plans.

use crate::cli::{options, HwOpt, PlanOpts};
use crate::io::*;
use anyhow::{bail, Result};
use clap::Args;
use fsdp_planner::timeline;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct DiffArgs {
    /// A model and two --policy values, or two compiled plans.
    pub(crate) files: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) o: PlanOpts,
    /// Policies to compare (with a model): give exactly two.
    #[arg(long = "vs-policy")]
    pub(crate) vs_policy: Vec<String>,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    /// The model of compiled plans, for the time rows (default: models/<model name>.ron).
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
}

pub(crate) fn run(d: DiffArgs) -> Result<()> {
    let hw = load_hardware(&d.hw.hardware)?;
    let (a, an, b, bn, models) = match (d.files.len(), d.vs_policy.len()) {
        (1, 2) => {
            let model = load_model(&d.files[0])?;
            let pa = fsdp_planner::plan(&model, &options(&d.o, &d.vs_policy[0], &model).map_err(user)?).map_err(user)?;
            let pb = fsdp_planner::plan(&model, &options(&d.o, &d.vs_policy[1], &model).map_err(user)?).map_err(user)?;
            (pa, d.vs_policy[0].clone(), pb, d.vs_policy[1].clone(), (model.clone(), model))
        }
        (2, 0) => {
            let (pa, ma) = load_plan_and_model(&d.files[0], d.model.as_deref())?;
            let (pb, mb) = load_plan_and_model(&d.files[1], d.model.as_deref())?;
            (pa, d.files[0].display().to_string(), pb, d.files[1].display().to_string(), (ma, mb))
        }
        _ => bail!(UserError("diff takes MODEL --policy A --policy B, or PLAN1 PLAN2".into())),
    };
    // the time rows go with the table, before the lists of units
    let table = fsdp_planner::diff::render(&a, &an, &b, &bn);
    let (rows, rest) = table.split_at(table.find("\nunits only in").unwrap_or(table.len()));
    let (ma, mb) = models;
    let time = timeline::diff_rows(&timeline::predict(&a, &ma, &hw), &timeline::predict(&b, &mb, &hw));
    out(format_args!("{rows}{time}{rest}"));
    Ok(())
}
