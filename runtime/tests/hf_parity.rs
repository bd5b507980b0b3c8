//! Architecture parity: with HF's own weights and batch (fixtures from
//! `harness/hf_parity.py`, transformers 5.17.0), the runtime's single-device loss, every
//! parameter gradient and the loss after one AdamW step equal HF's within 1e-5 relative.

use fsdp_runtime::ops::{Attn, OpCx};
use fsdp_runtime::optim::{AdamW, State};
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

#[test]
fn loss_and_grads_equal_hf() {
    tch::set_num_threads(1);
    let dir = root().join("tests/fixtures/runtime");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    names.sort();
    assert!(names.len() >= 7, "expected a fixture per tiny architecture");
    let mut report = String::new();
    for d in names {
        let exp: Value = serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
        assert_eq!(exp["transformers_version"], "5.17.0");
        let config = exp["config"].as_str().unwrap();
        let text = std::fs::read_to_string(root().join(config)).unwrap();
        let model = fsdp_ir::hf::import_hf(&text, config, "m").unwrap();
        let params = Params::from_safetensors(&model, &d.join("weights.safetensors")).unwrap();
        let inputs: HashMap<String, Tensor> = Tensor::read_safetensors(d.join("inputs.safetensors")).unwrap().into_iter().collect();
        let cx = OpCx::eval(Attn::Sdpa, Kind::Float);
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
            opt.step(w, &w.grad(), &mut State::new(w));
        }
        let loss2 = tch::no_grad(|| forward_loss(&model, &params, &inputs, &cx).unwrap()).double_value(&[]);
        let want2 = exp["adamw_step1_loss2"].as_f64().unwrap();
        assert!(rel(loss2, want2) < TOL, "{config}: loss after AdamW {loss2} vs HF {want2}");
        report += &format!("{config:<40} loss {got:.9} (HF {want:.9}, rel {:.1e})  worst grad rel L2 {worst:.1e}  loss2 rel {:.1e}\n", rel(got, want), rel(loss2, want2));
    }
    eprintln!("{report}");
}
