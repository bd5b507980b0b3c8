//! `fsdp-plan compile`: writes the plan (RON, or JSON with `--format json`) with its format
//! version and model/options hashes, for `trace`, `plot`, `diff` and `run` to read back.

use crate::cli::PlanArgs;
use crate::io::*;
use anyhow::{Context, Result};
use std::path::PathBuf;

pub(crate) fn run(p: PlanArgs, output: PathBuf) -> Result<()> {
    not_an_input(&output, &[&p.model])?;
    let model = load_model(&p.model)?;
    let opts = crate::cli::options(&p.o, &p.o.policy, &model).map_err(user)?;
    let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
    let text = match p.format.as_str() {
        "json" => serde_json::to_string_pretty(&plan).context("serializing the plan")?,
        _ => plan_ron(&plan)?,
    };
    write_atomic(&output, &text)?;
    eprintln!(
        "wrote {} ({} ops, {} buffers, predicted peak {})",
        output.display(),
        plan.schedule.len(),
        plan.buffers.len(),
        fsdp_planner::print::bytes(plan.memory.peak_bytes)
    );
    Ok(())
}
