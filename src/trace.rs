//! `fsdp-plan trace` and `plot`: the predicted step as a Chrome/Perfetto trace, and memory
//! over the step as an SVG, of a compiled plan or of a model planned with the options.

use crate::cli::{options, HwOpt, PlanOpts};
use crate::io::*;
use anyhow::Result;
use clap::Args;
use fsdp_planner::hardware::Hardware;
use fsdp_planner::timeline::{self, TimeReport};
use fsdp_planner::Plan;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct ViewArgs {
    /// A compiled plan (`compile -o PLAN.ron`) or a model file (planned with the options).
    pub(crate) input: PathBuf,
    #[command(flatten)]
    pub(crate) o: PlanOpts,
    #[command(flatten)]
    pub(crate) hw: HwOpt,
    /// The model of a compiled plan (default: models/<model name>.ron, checked by hash).
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    #[arg(short, long)]
    pub(crate) output: PathBuf,
}

/// The plan, hardware and predicted time of `trace` / `plot`.
pub(crate) fn view(v: &ViewArgs) -> Result<(Plan, Hardware, TimeReport)> {
    let hw = v.hw.load()?;
    let (plan, model) = if is_plan_file(&v.input) {
        load_plan_and_model(&v.input, v.model.as_deref())?
    } else {
        let model = load_model(&v.input)?;
        let opts = options(&v.o, &v.o.policy, &model).map_err(user)?;
        (fsdp_planner::plan(&model, &opts).map_err(user)?, model)
    };
    crate::io::check_float8(&hw, plan.options.float8.is_some())?;
    let t = timeline::predict(&plan, &model, &hw);
    Ok((plan, hw, t))
}

/// `trace PLAN|MODEL -o trace.json`.
pub(crate) fn trace(v: ViewArgs) -> Result<()> {
    not_an_input(&v.output, &[&v.input])?;
    let (plan, hw, t) = view(&v)?;
    let mem = timeline::memory_timeline(&plan, &t);
    let doc = fsdp_planner::trace::chrome_trace(&plan, &t, &mem);
    write_atomic(&v.output, &serde_json::to_string(&doc)?)?;
    eprintln!(
        "wrote {} ({} ops, predicted step {} on {}; open it in https://ui.perfetto.dev or chrome://tracing)",
        v.output.display(),
        plan.schedule.len(),
        timeline::secs(t.step_time_s),
        hw.name
    );
    Ok(())
}

/// `plot PLAN|MODEL -o memory.svg`.
pub(crate) fn plot(v: ViewArgs) -> Result<()> {
    not_an_input(&v.output, &[&v.input])?;
    let (plan, hw, t) = view(&v)?;
    let mem = timeline::memory_timeline(&plan, &t);
    let svg = fsdp_planner::plot::memory_svg(&plan, &t, &mem, Some((&hw.name, hw.memory_bytes)));
    write_atomic(&v.output, &svg)?;
    eprintln!(
        "wrote {} (peak {} at {}; step {} on {})",
        v.output.display(),
        fsdp_planner::print::bytes(plan.memory.peak_bytes),
        plan.memory.peak_at,
        timeline::secs(t.step_time_s),
        hw.name
    );
    Ok(())
}
