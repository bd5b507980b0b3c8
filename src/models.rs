//! `fsdp-plan models`: the shipped models (models/*.ron) with their architecture, parameter
//! count and the per-GPU peak of one standard configuration (fp32 masters, bf16 params, f32
//! reduce, AdamW, every block checkpointed, one sequence per GPU) — where to start; and
//! `fsdp-plan models MODEL [--ops]`: one model's IR laid out (what `import hf` made of a
//! config: modules, parameters, tied weights, forward ops).

use crate::io::*;
use anyhow::Result;
use clap::Args;
use fsdp_planner::print::{bytes, table};
use fsdp_ir::DType;
use fsdp_planner::Options;

#[derive(Args)]
pub(crate) struct ModelsArgs {
    /// One model (a .ron, a shipped model's name or an HF config.json): its module tree with
    /// parameters, like blocks folded.
    pub(crate) model: Option<std::path::PathBuf>,
    /// With MODEL: also the forward ops, in order.
    #[arg(long, requires = "model")]
    pub(crate) ops: bool,
    #[arg(long, default_value_t = 8)]
    pub(crate) world_size: u64,
    #[arg(long, default_value_t = 4096)]
    pub(crate) seq: u64,
    /// Also the tiny test models.
    #[arg(long)]
    pub(crate) all: bool,
}

pub(crate) fn run(a: ModelsArgs) -> Result<()> {
    if let Some(m) = &a.model {
        // a shipped model by its name (`llama-3.1-8b`) when no such file is here
        let shipped = search_dirs("models").into_iter().map(|d| d.join(m).with_extension("ron")).find(|p| p.is_file());
        let path = if m.exists() { m.clone() } else { shipped.unwrap_or_else(|| m.clone()) };
        let model = load_model(&path)?;
        crate::io::out(format_args!("{}", fsdp_planner::layout::model_tree(&model, a.ops)));
        return Ok(());
    }
    let dir = search_dirs("models").into_iter().find(|d| d.is_dir()).ok_or_else(|| user("no models/ directory here"))?;
    let mut files: Vec<_> = std::fs::read_dir(&dir)?.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "ron")).collect();
    files.sort();
    let mut rows = vec![];
    for f in files {
        let name = stem(&f);
        if !a.all && name.starts_with("tiny-") {
            continue;
        }
        let model = load_model(&f)?;
        let class = model.modules.first().map(|m| m.class.clone()).unwrap_or_default();
        let params: u64 = model.params.iter().filter(|p| p.tied_to.is_none()).map(|p| p.numel()).sum();
        let layer = model.modules.iter().find(|m| m.class.ends_with("DecoderLayer") || m.class == "GPT2Block").map(|m| m.class.clone());
        // (learned positions bound the sequence: GPT-2's 1024)
        let seq = if model.ops.iter().any(|o| matches!(o.kind, fsdp_ir::OpKind::PositionEmbedding)) { a.seq.min(crate::cli::default_seq(&model)) } else { a.seq };
        let opts = Options {
            world_size: a.world_size,
            seq,
            batch: 1,
            master_dtype: DType::parse("f32"),
            param_dtype: DType::parse("bf16"),
            reduce_dtype: DType::parse("f32"),
            optimizer: fsdp_planner::Optimizer::AdamW,
            checkpoint: layer.into_iter().collect(),
            ..Options::default()
        };
        let peak = match fsdp_planner::plan_unchecked(&model, &opts) {
            Ok(p) => bytes(p.memory.peak_bytes),
            Err(e) => format!("({e})"),
        };
        rows.push(vec![name, class, format!("{:.2}B", params as f64 / 1e9), seq.to_string(), peak]);
    }
    let heads: Vec<String> = ["model", "architecture", "parameters", "seq", &format!("peak per GPU on {}", a.world_size)].iter().map(|s| s.to_string()).collect();
    outln!("{}", table(&heads, &rows));
    outln!("(fp32 masters, bf16 params, f32 reduce, AdamW, every decoder block checkpointed, batch 1: `fsdp-plan plan MODEL --summary …` for any other)");
    Ok(())
}
