//! `fsdp-plan import hf CONFIG.json -o MODEL.ron`.

use crate::io::*;
use anyhow::Result;
use clap::Subcommand;
use fsdp_planner::parse_dtype;
use std::path::PathBuf;

#[derive(Subcommand)]
pub(crate) enum ImportCmd {
    /// `import hf CONFIG.json -o MODEL.ron`
    Hf {
        config: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Model name (default: the file stem).
        #[arg(long)]
        name: Option<String>,
        /// Parameter dtype (default: the config's torch_dtype, as HF's from_config).
        #[arg(long)]
        dtype: Option<String>,
    },
}

pub(crate) fn run(from: ImportCmd) -> Result<()> {
    let ImportCmd::Hf { config, output, name, dtype } = from;
    not_an_input(&output, &[&config])?;
    let text = read(&config)?;
    let name = name.unwrap_or_else(|| stem(&config));
    let dtype = dtype.as_deref().map(|d| parse_dtype("--dtype", d)).transpose().map_err(user)?;
    let file = config.display().to_string();
    let (model, notes) = fsdp_ir::hf::import_hf_report(&text, &file, &name, dtype).map_err(user)?;
    for n in &notes {
        let kind = if n.starts_with("unknown key") { "warning" } else { "note" };
        eprintln!("{kind}: {file}: {n}");
    }
    write_atomic(&output, &fsdp_ir::to_ron(&model))?;
    eprintln!(
        "wrote {} ({}, {} params, {} ops, {} parameters in total)",
        output.display(),
        model.architecture,
        model.params.len(),
        model.ops.len(),
        model.total_numel()
    );
    Ok(())
}
