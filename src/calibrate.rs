//! `fsdp-plan calibrate`: fits a hardware profile to a measured timeline of the same plan.

use crate::cli::{options, PlanArgs};
use crate::io::*;
use anyhow::{bail, Context, Result};
use fsdp_planner::{Device, Plan};
use std::path::{Path, PathBuf};

/// A measured Chrome trace (`run --trace`) and the device it was measured on (its
/// `otherData.device`; traces written before that field were all of the CPU runtime).
pub(crate) fn read_trace(path: &Path) -> Result<(serde_json::Value, Device)> {
    let text = read(path)?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| json_error(path, &text, "", e))?;
    let device = match doc["otherData"]["device"].as_str() {
        None => Device::Cpu,
        Some(d) => Device::parse(d).ok_or_else(|| user(format!("{}: otherData.device: unknown device `{d}` (cpu or cuda)", path.display())))?,
    };
    Ok((doc, device))
}

/// (start, end) in seconds per schedule op of `plan`, from a trace [`read_trace`] read: a
/// measured one (`run --trace`, not `trace`'s prediction) of this very plan.
pub(crate) fn read_measured(path: &Path, doc: &serde_json::Value, plan: &Plan) -> Result<Vec<(f64, f64)>> {
    let file = path.display();
    let hw = doc["otherData"]["hardware"].as_str().unwrap_or("");
    if !hw.starts_with("measured") {
        bail!(UserError(format!("{file}: a predicted trace (hardware `{hw}`), not a measured one: calibrate from `run --trace`")));
    }
    match doc["otherData"]["plan_hash"].as_str() {
        Some(h) if h == plan.plan_hash => {}
        h => bail!(UserError(format!(
            "{file}: measured for plan {}, but the model and options given plan {}: give the options of the run that wrote it",
            h.unwrap_or("(none)"),
            plan.plan_hash
        ))),
    }
    fsdp_planner::trace::spans_from_trace(doc, plan).map_err(|e| user(format!("{file}: {e}")))
}

/// `calibrate MODEL [plan options] --trace measured.json --hardware H -o fitted.ron`.
pub(crate) fn run(p: PlanArgs, trace: PathBuf, hardware: String, output: PathBuf) -> Result<()> {
    let model = load_model(&p.model)?;
    let mut opts = options(&p.o, &p.o.policy, &model).map_err(user)?;
    // the plan the run executed: on the device the trace was measured on
    not_an_input(&output, &[&p.model, &trace])?;
    let (doc, device) = read_trace(&trace)?;
    opts.device = device;
    let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
    let hw = load_hardware(&hardware)?;
    let measured = read_measured(&trace, &doc, &plan)?;
    let c = fsdp_planner::calibrate::calibrate(&plan, &model, &hw, &measured);
    let cfg = ron::ser::PrettyConfig::new().struct_names(false);
    let text = ron::ser::to_string_pretty(&c.hardware, cfg).context("serializing the profile")?;
    write_atomic(&output, &text)?;
    outln!(
        "measured step {:.3} ms · predicted with {} {:.3} ms ({:+.1}%) · calibrated {:.3} ms ({:+.1}%) → {}",
        c.measured_step_s * 1e3,
        hw.name,
        c.predicted_before_s * 1e3,
        100.0 * c.error_before(),
        c.predicted_after_s * 1e3,
        100.0 * c.error_after(),
        output.display()
    );
    Ok(())
}
