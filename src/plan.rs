//! `fsdp-plan plan` (the default command): the schedule, units, communication, predicted peak
//! memory and step time of a model under the options.

use crate::cli::{options, HwOpt, PlanArgs};
use crate::io::*;
use anyhow::Result;
use fsdp_planner::timeline;

pub(crate) fn run(a: PlanArgs, hw: HwOpt) -> Result<()> {
    let model = load_model(&a.model)?;
    let opts = options(&a.o, &a.o.policy).map_err(user)?;
    let plan = fsdp_planner::plan(&model, &opts).map_err(user)?;
    match a.format.as_str() {
        "json" => {
            let hw = load_hardware(&hw.hardware)?;
            let t = timeline::predict(&plan, &model, &hw);
            let mut v = fsdp_planner::print::json(&plan);
            v["time"] = timeline::json(&t);
            println!("{}", serde_json::to_string_pretty(&v)?)
        }
        "ron" => println!("{}", plan_ron(&plan)?),
        _ => {
            let hw = load_hardware(&hw.hardware)?;
            let t = timeline::predict(&plan, &model, &hw);
            print!("{}", fsdp_planner::print::render(&plan, a.full_schedule));
            print!("{}", timeline::render(&t));
        }
    }
    Ok(())
}
