//! Checkpoints: resuming from `--save` gives bit-identical losses; a run killed after step
//! k loses nothing before its last checkpoint; a checkpoint saved at another world size is
//! resharded on load (the run continues as if uninterrupted, within rounding); one of another
//! model or a corrupted file is refused; `consolidate` writes the full HF-named parameters. Weights files of
//! another model, another dtype, or cut short are refused naming the tensor.

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

/// A scratch directory, removed when the guard drops (a failing test's too).
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fsdp-ckpt-{name}-")).tempdir().unwrap()
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
    let tmp = tmp("kill");
    let dir = tmp.path();
    let killed = RunConfig { save: Some(dir.to_path_buf()), save_every: 2, stop_after: Some(5), ..RunConfig::new(6) };
    let first = losses(&plan, &m, &killed);
    assert_eq!(first, full[..5].to_vec());
    assert_eq!(std::fs::read_to_string(dir.join("latest")).unwrap().trim(), "step-00000004");
    assert!(!dir.join(".tmp-step-00000005").exists());
    let resumed = losses(&plan, &m, &RunConfig { resume: Some(dir.to_path_buf()), ..RunConfig::new(6) });
    assert_eq!(resumed, full[4..].to_vec(), "losses after resume must equal the uninterrupted run bit for bit");

    // consolidate: full HF-named params, loadable as initial weights
    let out = dir.join("model.safetensors");
    let n = fsdp_runtime::checkpoint::consolidate(&fsdp_runtime::checkpoint::latest(dir).unwrap(), &out).unwrap();
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
    // the same batch every step (one window, four times): SGD must lower its loss
    let tmp = tmp("sgd");
    let dir = tmp.path();
    let window: Vec<u32> = (0..48u32).map(|i| (i * 37 + 11) % 256).collect();
    let data = dir.join("same.u32");
    std::fs::write(&data, window.iter().cycle().take(4 * 48).flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let run = |c: RunConfig| losses(&plan, &m, &RunConfig { lr: 0.1, data: Some(data.clone()), ..c });
    let full = run(RunConfig::new(4));
    let ck = dir.join("ck");
    assert_eq!(run(RunConfig { save: Some(ck.clone()), ..RunConfig::new(2) }), full[..2].to_vec());
    assert_eq!(run(RunConfig { resume: Some(ck.clone()), ..RunConfig::new(4) }), full[2..].to_vec());
    assert!(full.windows(2).all(|w| w[1].1 < w[0].1), "SGD at lr 0.1 lowers the loss of one batch: {full:?}");
}

#[test]
fn other_plan_and_corruption_are_refused() {
    let (m, plan) = setup(2);
    let tmp = tmp("refuse");
    let dir = tmp.path();
    losses(&plan, &m, &RunConfig { save: Some(dir.to_path_buf()), ..RunConfig::new(2) });
    // another model: nothing to reshard from
    let cfg = "models/tiny-llama-gqa.config.json";
    let mg = fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(cfg)).unwrap(), cfg, "tiny-llama-gqa").unwrap();
    let pg = fsdp_planner::plan(&mg, &Options { world_size: 2, batch: 2, seq: 8, device: Device::Cpu, ..Options::default() }).unwrap();
    let e = run_cpu(&pg, &mg, &RunConfig { resume: Some(dir.to_path_buf()), ..RunConfig::new(3) }, |_| {}).unwrap_err().to_string();
    assert!(e.contains("saved for another model"), "{e}");
    // a corrupted shard file
    let st = fsdp_runtime::checkpoint::latest(dir).unwrap().join("rank-1.safetensors");
    std::fs::write(&st, b"garbage").unwrap();
    let e = run_cpu(&plan, &m, &RunConfig { resume: Some(dir.to_path_buf()), ..RunConfig::new(3) }, |_| {}).unwrap_err().to_string();
    assert!(e.contains("rank-1.safetensors: not a safetensors file: 7 bytes, shorter than the 8-byte header length"), "{e}");
}

/// Saved by 2 ranks (batch 2 each), resumed by 4 (batch 1 each, the same global batch and
/// so the same data windows): every parameter and AdamW state reassembled and resharded; the
/// run continues as the uninterrupted one (within the rounding of averaging over 4 ranks
/// instead of 2), and says that it resharded.
#[test]
fn resume_at_another_world_size_reshards() {
    let (m, plan2) = setup(2);
    let opts4 = Options { world_size: 4, batch: 1, seq: 8, device: Device::Cpu, ..Options::default() };
    let plan4 = fsdp_planner::plan(&m, &opts4).unwrap();
    let full = losses(&plan2, &m, &RunConfig::new(5));
    let tmp = tmp("reshard");
    let dir = tmp.path();
    losses(&plan2, &m, &RunConfig { save: Some(dir.to_path_buf()), ..RunConfig::new(3) });
    let reps = run_cpu(&plan4, &m, &RunConfig { resume: Some(dir.to_path_buf()), ..RunConfig::new(5) }, |_| {}).unwrap();
    assert!(reps[0].notes.iter().any(|n| n.contains("saved by world size 2") && n.contains("resharded on load")), "{:?}", reps[0].notes);
    for (r, (step, want)) in reps.iter().zip(&full[3..]) {
        assert_eq!(r.step, *step);
        assert!((r.loss - want).abs() / want < 1e-5, "step {step}: {} vs {want} uninterrupted", r.loss);
    }
}

/// A rank's files copied in from another step (the directory of step 2 holding rank 1's
/// files of step 1) would resume or consolidate two points of training mixed: refused.
#[test]
fn a_rank_of_another_step_is_refused() {
    let (m, plan) = setup(2);
    let tmp = tmp("mixed");
    let dir = tmp.path();
    losses(&plan, &m, &RunConfig { save: Some(dir.to_path_buf()), save_every: 1, ..RunConfig::new(2) });
    let (s1, s2) = (dir.join("step-00000001"), dir.join("step-00000002"));
    assert!(fsdp_runtime::checkpoint::consolidate(&s2, &dir.join("ok.safetensors")).is_ok());
    for f in ["rank-1.json", "rank-1.safetensors"] {
        std::fs::copy(s1.join(f), s2.join(f)).unwrap();
    }
    let e = run_cpu(&plan, &m, &RunConfig { resume: Some(dir.to_path_buf()), ..RunConfig::new(3) }, |_| {}).unwrap_err().to_string();
    assert!(e.contains("rank-1.json: saved after step 1, but it is in the directory of step 2"), "{e}");
    let out = dir.join("model.safetensors");
    let e = fsdp_runtime::checkpoint::consolidate(&s2, &out).unwrap_err().to_string();
    assert!(e.contains("saved after step 1, but it is in the directory of step 2"), "{e}");
    assert!(!out.exists());
    // outside a step directory (renamed): rank 0's step decides
    let moved = dir.join("moved");
    std::fs::rename(&s2, &moved).unwrap();
    let e = fsdp_runtime::checkpoint::consolidate(&moved, &out).unwrap_err().to_string();
    assert!(e.contains("rank-1.json: saved after step 1, rank 0's after step 2"), "{e}");
}

/// `--weights`: every parameter present, floating point, with its shape; a tied alias may be
/// present with its primary's shape, HF's old non-parameter buffers are skipped; a tensor the
/// model has no parameter for, or a file cut short, is refused naming it.
#[test]
fn weights_files_are_checked_by_name() {
    use fsdp_runtime::reference::Params;
    use tch::{Kind, Tensor};
    let tmp = tmp("weights");
    let d = tmp.path();
    let tied = fsdp_ir::parse_model(&std::fs::read_to_string(root().join("models/tiny-llama-tied.ron")).unwrap(), "tied").unwrap();
    let src = root().join("tests/fixtures/runtime/tiny-llama-tied/weights.safetensors");
    let base: Vec<(String, Tensor)> = Tensor::read_safetensors(&src).unwrap();
    assert!(Params::from_safetensors(&tied, &src).is_ok());
    let emb = |named: &[(String, Tensor)]| named.iter().find(|(n, _)| n == "model.embed_tokens.weight").unwrap().1.shallow_clone();
    type Edit<'a> = &'a dyn Fn(&mut Vec<(String, Tensor)>);
    let write = |name: &str, f: Edit| {
        let mut v: Vec<(String, Tensor)> = base.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        f(&mut v);
        let p = d.join(name);
        Tensor::write_safetensors(&v, &p).unwrap();
        p
    };
    let load = |p: &Path| Params::from_safetensors(&tied, p).map(|_| ()).map_err(|e| e.to_string());
    // accepted as HF accepts them
    let alias = write("alias.safetensors", &|v| v.push(("lm_head.weight".into(), emb(v).copy())));
    assert_eq!(load(&alias), Ok(()));
    let buffers = write("buffers.safetensors", &|v| v.push(("model.layers.0.self_attn.rotary_emb.inv_freq".into(), Tensor::ones([4], (Kind::Float, tch::Device::Cpu)))));
    assert_eq!(load(&buffers), Ok(()));
    // refused
    let cases: Vec<(PathBuf, String)> = vec![
        (
            write("extra.safetensors", &|v| v.push(("model.layers.7.mlp.up_proj.weight".into(), Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu))))),
            "1 tensor(s) that model `tiny-llama-tied` has no parameter for (`model.layers.7.mlp.up_proj.weight`): weights of another model?".into(),
        ),
        (
            write("alias-shape.safetensors", &|v| v.push(("lm_head.weight".into(), emb(v).narrow(0, 0, 3)))),
            "parameter `lm_head.weight`: shape [3, 32]".into(),
        ),
        (
            write("int.safetensors", &|v| {
                let e = v.iter_mut().find(|(n, _)| n == "model.norm.weight").unwrap();
                e.1 = e.1.to_kind(Kind::Int64);
            }),
            "parameter `model.norm.weight`: dtype Int64".into(),
        ),
    ];
    for (p, want) in &cases {
        let e = load(p).unwrap_err();
        assert!(e.contains(want), "{}: `{e}` lacks `{want}`", p.display());
    }
    // cut short: the tensor whose bytes are missing is named
    let bytes = std::fs::read(&src).unwrap();
    let cut = d.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let e = load(&cut).unwrap_err();
    assert!(e.contains("cut.safetensors: tensor `") && e.contains("truncated"), "{e}");
    let json = d.join("config.safetensors");
    std::fs::copy(root().join("models/tiny-llama-tied.config.json"), &json).unwrap();
    let e = load(&json).unwrap_err();
    assert!(e.contains("config.safetensors: not a safetensors file: its first 8 bytes give a header of"), "{e}");
}
