//! Architecture parity: with HF's own weights and batch (fixtures from
//! `harness/hf_parity.py`, transformers 5.17.0), the runtime's single-device loss, every
//! parameter gradient and the loss after one AdamW step equal HF's within 1e-5 relative.
//! Each optimizer a plan can name (AdamW, Adam, SGD) over three steps equals torch.optim on
//! this machine (`harness/optim_parity.py`, run by the test).

use fsdp_runtime::ops::{Attn, OpCx};
use fsdp_runtime::optim::{AdamW, Optim, State};
use fsdp_runtime::reference::{forward_loss, Params};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

const TOL: f64 = 1e-5;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}

/// The attention implementation HF ran the fixture with (`expected.json`): sdpa, or eager
/// (a `NAME.eager` fixture).
fn attn_of(d: &Path) -> Attn {
    let exp: Value = serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
    match exp["attn_implementation"].as_str() {
        Some("eager") => Attn::Eager,
        _ => Attn::Sdpa,
    }
}

/// `tests/fixtures/runtime/<name>/`, one per tiny architecture, sorted.
fn fixture_dirs() -> Vec<PathBuf> {
    let dir = root().join("tests/fixtures/runtime");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    names.sort();
    assert!(names.len() >= 9, "expected a fixture per tiny architecture");
    names
}

#[test]
fn loss_and_grads_equal_hf() {
    tch::set_num_threads(1);
    let names = fixture_dirs();
    let mut report = String::new();
    for d in names {
        let exp: Value = serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
        assert_eq!(exp["transformers_version"], "5.17.0");
        let config = exp["config"].as_str().unwrap();
        let text = std::fs::read_to_string(root().join(config)).unwrap();
        let model = fsdp_ir::hf::import_hf(&text, config, "m").unwrap();
        let params = Params::from_safetensors(&model, &d.join("weights.safetensors")).unwrap();
        let inputs: HashMap<String, Tensor> = Tensor::read_safetensors(d.join("inputs.safetensors")).unwrap().into_iter().collect();
        let cx = OpCx::eval(attn_of(&d), Kind::Float);
        let loss = forward_loss(&model, &params, &inputs, &cx).unwrap();
        let got = loss.double_value(&[]);
        let want = exp["loss"].as_f64().unwrap();
        assert!(rel(got, want) < TOL, "{config}: loss {got} vs HF {want}");
        loss.backward();
        let hf: HashMap<String, Tensor> = Tensor::read_safetensors(d.join("grads.safetensors")).unwrap().into_iter().collect();
        let mut worst: f64 = 0.0;
        for p in model.primary_params() {
            let g = params.tensors[&p.name].grad();
            let h = &hf[&p.name];
            let err = (&g - h).norm().double_value(&[]) / h.norm().double_value(&[]).max(1e-30);
            assert!(err < TOL, "{config}: grad of {} off by {err:e} (relative L2)", p.name);
            worst = worst.max(err);
        }
        // one step of the runtime's AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay
        // 0.01, as torch.optim.AdamW in the fixture), then the loss of the same batch again
        let opt = AdamW::default();
        for p in model.primary_params() {
            let w = &params.tensors[&p.name];
            opt.step(w, &w.grad(), &mut State::new(w)).unwrap();
        }
        let loss2 = tch::no_grad(|| forward_loss(&model, &params, &inputs, &cx).unwrap()).double_value(&[]);
        let want2 = exp["adamw_step1_loss2"].as_f64().unwrap();
        assert!(rel(loss2, want2) < TOL, "{config}: loss after AdamW {loss2} vs HF {want2}");
        report += &format!("{:<24} loss {got:.9} (HF {want:.9}, rel {:.1e})  worst grad rel L2 {worst:.1e}  loss2 rel {:.1e}\n", d.file_name().unwrap_or_default().to_string_lossy(), rel(got, want), rel(loss2, want2));
    }
    eprintln!("{report}");
}

/// The plan's optimizer named by a fixture key of `harness/optim_parity.py`, with its
/// hyper-parameters checked against the ones the runtime uses (torch's defaults), so that a
/// fixture made with other settings fails here rather than passing by luck.
fn plan_optimizer(kind: &str, h: &Value) -> (fsdp_planner::Optimizer, f64) {
    let lr = h["lr"].as_f64().unwrap();
    let o = match kind {
        "adamw" => fsdp_planner::Optimizer::AdamW,
        "adam" => fsdp_planner::Optimizer::Adam,
        "sgd" => fsdp_planner::Optimizer::Sgd,
        _ => panic!("unknown optimizer {kind} in optim.json"),
    };
    match Optim::of_plan(o, lr) {
        Optim::Adam(a) => {
            let betas: Vec<f64> = h["betas"].as_array().unwrap().iter().map(|b| b.as_f64().unwrap()).collect();
            assert_eq!((betas[0], betas[1], h["eps"].as_f64().unwrap(), h["weight_decay"].as_f64().unwrap()), (a.beta1, a.beta2, a.eps, a.weight_decay), "{kind}: fixture hyper-parameters differ from the runtime's");
        }
        Optim::Sgd { .. } => {
            assert_eq!((h["momentum"].as_f64(), h["dampening"].as_f64(), h["weight_decay"].as_f64(), h["nesterov"].as_bool()), (Some(0.0), Some(0.0), Some(0.0), Some(false)), "sgd: the runtime's SGD is torch's default SGD");
        }
        Optim::None => unreachable!(),
    }
    (o, lr)
}

/// torch.optim's three steps for every fixture, computed now by `harness/optim_parity.py`
/// with the `.venv` libtorch this runtime links (same CPU capability, same MKL branch: the
/// environment is inherited), into a fresh directory: `<dir>/<name>/optim.<cap>.json` (removed
/// when the returned guard drops).
fn torch_optim_now() -> tempfile::TempDir {
    let out = tempfile::Builder::new().prefix("fsdp-plan-optim-parity-").tempdir().unwrap();
    let python = root().join(".venv/bin/python");
    let run = std::process::Command::new(&python)
        .arg(root().join("harness/optim_parity.py"))
        .arg("--out")
        .arg(out.path())
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (bash scripts/setup-venv.sh installs it)", python.display()));
    assert!(run.status.success(), "harness/optim_parity.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
    out
}

/// Three training steps with each optimizer a plan can name (AdamW, Adam, SGD) from HF's
/// weights on HF's batch, stepping every parameter in three uneven pieces as a shard is
/// stepped (`Optim::step_pieces`): every loss, and per parameter the norm and sum of the
/// update (final − initial), equal torch.optim's (`harness/optim_parity.py`, foreach=False);
/// for tiny-llama-tied the final parameters themselves too. torch's figures are computed on
/// this machine when the test runs (`torch_optim_now`): Adam's update of a gradient that is
/// rounding noise (GPT-2's and Qwen2's key biases) differs between kernel widths and between
/// machines at one width, by more than the tolerance in torch itself.
#[test]
fn optimizers_over_three_steps_equal_torch() {
    tch::set_num_threads(1);
    let names = fixture_dirs();
    let cap = fsdp_runtime::shim::cpu_capability();
    let torch_out = torch_optim_now();
    let torch = torch_out.path();
    let mut report = String::new();
    let mut finals_checked = 0;
    for d in names {
        let name = d.file_name().unwrap_or_default().to_owned();
        let file = torch.join(&name).join(format!("optim.{cap}.json"));
        let exp: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e} (torch.optim's figures at CPU capability {cap}, from harness/optim_parity.py)", file.display()))).unwrap();
        assert_eq!(exp["transformers_version"], "5.17.0");
        assert_eq!(exp["cpu_capability"], cap.as_str());
        let config = exp["config"].as_str().unwrap();
        let model = fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(config)).unwrap(), config, "m").unwrap();
        let inputs: HashMap<String, Tensor> = Tensor::read_safetensors(d.join("inputs.safetensors")).unwrap().into_iter().collect();
        let final_file = torch.join(&name).join(format!("optim_final.{cap}.safetensors"));
        let finals: Option<HashMap<String, Tensor>> = final_file.exists().then(|| Tensor::read_safetensors(&final_file).unwrap().into_iter().collect());
        let steps = exp["steps"].as_u64().unwrap() as usize;
        let cx = OpCx::eval(attn_of(&d), Kind::Float);
        let optims = exp["optimizers"].as_object().unwrap();
        assert_eq!(optims.len(), 3, "{config}: AdamW, Adam and SGD");
        for (kind, h) in optims {
            let (o, lr) = plan_optimizer(kind, h);
            let opt = Optim::of_plan(o, lr);
            let params = Params::from_safetensors(&model, &d.join("weights.safetensors")).unwrap();
            let start: HashMap<String, Tensor> = params.tensors.iter().map(|(n, t)| (n.clone(), t.detach().copy())).collect();
            let mut state: HashMap<String, State> = params.tensors.iter().map(|(n, t)| (n.clone(), State::for_optim(o, t))).collect();
            let mut losses = vec![];
            for _ in 0..steps {
                let loss = forward_loss(&model, &params, &inputs, &cx).unwrap();
                losses.push(loss.double_value(&[]));
                loss.backward();
                for (n, w) in &params.tensors {
                    let g = w.grad();
                    let len = w.numel() as i64;
                    let (a, b) = (len / 3, len / 3 + len / 2);
                    opt.step_pieces(w, &g, state.get_mut(n).unwrap(), &[(0, a), (a, b - a), (b, len - b)]).unwrap();
                    let _ = g.detach().zero_();
                }
            }
            losses.push(tch::no_grad(|| forward_loss(&model, &params, &inputs, &cx).unwrap()).double_value(&[]));
            let want: Vec<f64> = h["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
            assert_eq!(losses.len(), want.len());
            let mut worst_loss: f64 = 0.0;
            for (i, (g, w)) in losses.iter().zip(&want).enumerate() {
                assert!(rel(*g, *w) < TOL, "{config} {kind}: loss {i} {g} vs torch {w}");
                worst_loss = worst_loss.max(rel(*g, *w));
            }
            // The update's norm within 1e-5 relative; its sum, which can be near 0, within 1e-5
            // of the update's L1 scale (norm · √numel bounds |sum| from above).
            let (mut worst_norm, mut worst_sum): (f64, f64) = (0.0, 0.0);
            for p in model.primary_params() {
                let w = &params.tensors[&p.name];
                let delta = (w.detach().to_kind(Kind::Double) - start[&p.name].to_kind(Kind::Double)).view([-1]);
                let hd = &h["delta"][&p.name];
                let (hn, hs) = (hd["norm"].as_f64().unwrap(), hd["sum"].as_f64().unwrap());
                let (n, s) = (delta.norm().double_value(&[]), delta.sum(Kind::Double).double_value(&[]));
                assert!(hn > 0.0, "{config} {kind}: {} not moved by torch", p.name);
                let en = rel(n, hn);
                let es = (s - hs).abs() / (hn * (delta.numel() as f64).sqrt());
                assert!(en < TOL && es < TOL, "{config} {kind}: update of {}: norm {n:e} vs torch {hn:e} (rel {en:.1e}), sum {s:e} vs {hs:e} ({es:.1e} of scale)", p.name);
                worst_norm = worst_norm.max(en);
                worst_sum = worst_sum.max(es);
                if let Some(f) = &finals {
                    let hf = &f[&format!("{kind}.{}", p.name)];
                    let e = (w - hf).norm().double_value(&[]) / hf.norm().double_value(&[]);
                    let eu = (w - hf).norm().double_value(&[]) / hn;
                    assert!(e < TOL, "{config} {kind}: final {} off by {e:e} (relative L2)", p.name);
                    assert!(eu < 1e-3, "{config} {kind}: final {} off by {eu:e} of torch's update (relative L2)", p.name);
                    finals_checked += 1;
                }
            }
            report += &format!("{:<24} {kind:<5} losses {:.6}..{:.6} worst rel {worst_loss:.1e}  update norm rel {worst_norm:.1e}  sum {worst_sum:.1e}\n", d.file_name().unwrap_or_default().to_string_lossy(), losses[0], losses[steps]);
        }
    }
    assert!(finals_checked > 0, "no optim_final.safetensors checked");
    eprintln!("CPU capability {cap}\n{report}final parameters checked: {finals_checked}");
}
