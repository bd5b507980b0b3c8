//! Checkpoints: resuming from `--save` gives bit-identical losses; a run killed after step
//! k loses nothing before its last checkpoint; a checkpoint of another plan or a corrupted
//! file is refused; `consolidate` writes the full HF-named parameters.

use fsdp_planner::{Device, Options};
use fsdp_runtime::train::{run_cpu, RunConfig};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn setup(ws: u64) -> (fsdp_ir::Model, fsdp_planner::Plan) {
    let cfg = "models/tiny-llama.config.json";
    let m = fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(cfg)).unwrap(), cfg, "tiny-llama").unwrap();
    let opts = Options { world_size: ws, batch: 2, seq: 8, device: Device::Cpu, ..Options::default() };
    let plan = fsdp_planner::plan(&m, &opts).unwrap();
    (m, plan)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fsdp-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn losses(plan: &fsdp_planner::Plan, m: &fsdp_ir::Model, cfg: &RunConfig) -> Vec<(usize, f64)> {
    run_cpu(plan, m, cfg, |_| {}).unwrap().into_iter().map(|r| (r.step, r.loss)).collect()
}

#[test]
fn resume_is_bit_identical_and_kill_loses_nothing() {
    let (m, plan) = setup(2);
    let full = losses(&plan, &m, &RunConfig::new(6));
    assert_eq!(full.len(), 6);
    // killed after step 5, checkpoints every 2 steps: the last complete checkpoint is step 4
    let dir = tmp("kill");
    let killed = RunConfig { save: Some(dir.clone()), save_every: 2, stop_after: Some(5), ..RunConfig::new(6) };
    let first = losses(&plan, &m, &killed);
    assert_eq!(first, full[..5].to_vec());
    assert_eq!(std::fs::read_to_string(dir.join("latest")).unwrap().trim(), "step-00000004");
    assert!(!dir.join(".tmp-step-00000005").exists());
    let resumed = losses(&plan, &m, &RunConfig { resume: Some(dir.clone()), ..RunConfig::new(6) });
    assert_eq!(resumed, full[4..].to_vec(), "losses after resume must equal the uninterrupted run bit for bit");

    // consolidate: full HF-named params, loadable as initial weights
    let out = dir.join("model.safetensors");
    let n = fsdp_runtime::checkpoint::consolidate(&fsdp_runtime::checkpoint::latest(&dir).unwrap(), &out).unwrap();
    assert_eq!(n, m.primary_params().count());
    let p = fsdp_runtime::reference::Params::from_safetensors(&m, &out).unwrap();
    assert_eq!(p.tensors.len(), n);
}

#[test]
fn sgd_resume_is_bit_identical() {
    // SGD keeps no optimizer state: the checkpoint holds the shards only
    let cfg = "models/tiny-llama.config.json";
    let m = fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(cfg)).unwrap(), cfg, "tiny-llama").unwrap();
    let opts = Options { world_size: 3, batch: 2, seq: 8, device: Device::Cpu, optimizer: fsdp_planner::Optimizer::Sgd, ..Options::default() };
    let plan = fsdp_planner::plan(&m, &opts).unwrap();
    let run = |c: RunConfig| losses(&plan, &m, &RunConfig { lr: 0.1, ..c });
    let full = run(RunConfig::new(4));
    let dir = tmp("sgd");
    assert_eq!(run(RunConfig { save: Some(dir.clone()), ..RunConfig::new(2) }), full[..2].to_vec());
    assert_eq!(run(RunConfig { resume: Some(dir.clone()), ..RunConfig::new(4) }), full[2..].to_vec());
    assert!(full[3].1 < full[0].1, "SGD at lr 0.1 lowers the loss: {full:?}");
}

#[test]
fn other_plan_and_corruption_are_refused() {
    let (m, plan) = setup(2);
    let dir = tmp("refuse");
    losses(&plan, &m, &RunConfig { save: Some(dir.clone()), ..RunConfig::new(2) });
    // another world size: another plan hash
    let (m4, plan4) = setup(4);
    let e = run_cpu(&plan4, &m4, &RunConfig { resume: Some(dir.clone()), ..RunConfig::new(3) }, |_| {}).unwrap_err().to_string();
    assert!(e.contains("saved for plan"), "{e}");
    // a corrupted shard file
    let st = fsdp_runtime::checkpoint::latest(&dir).unwrap().join("rank-1.safetensors");
    std::fs::write(&st, b"garbage").unwrap();
    let e = run_cpu(&plan, &m, &RunConfig { resume: Some(dir.clone()), ..RunConfig::new(3) }, |_| {}).unwrap_err().to_string();
    assert!(e.contains("rank-1.safetensors") && e.contains("corrupted"), "{e}");
}
