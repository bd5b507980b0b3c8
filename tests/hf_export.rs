//! `consolidate --hf DIR` makes what transformers loads: a model trained by `run` on 2 ranks
//! and exported is read by `AutoModelForCausalLM.from_pretrained(DIR)` (the project venv's
//! transformers 5.17.0), whose logits equal the runtime's on the same weights within 1e-5
//! (relative L2), and which generates.
#![cfg(feature = "runtime")]

use fsdp_runtime::tch;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(root()).env("OMP_NUM_THREADS", "1").args(args).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
}

/// A scratch directory, removed when the guard drops (a failing test's too).
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fsdp-hf-export-{name}-")).tempdir().unwrap()
}

const HF_SIDE: &str = r#"
import sys, torch
from transformers import AutoModelForCausalLM
from safetensors.torch import save_file
d = sys.argv[1]
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
m.eval()
ids = torch.tensor([[3, 17, 200, 5, 9, 101, 44, 7], [150, 1, 2, 3, 4, 5, 6, 7]])
with torch.no_grad():
    logits = m(input_ids=ids).logits
save_file({"logits": logits.contiguous(), "ids": ids}, d + "/hf_logits.safetensors")
out = m.generate(ids[:1, :4], max_new_tokens=6, do_sample=False, pad_token_id=0)
print("generated", out.shape[1] - 4, "tokens:", out[0, 4:].tolist())
"#;

#[test]
fn an_exported_model_loads_in_transformers_with_the_runtimes_logits() {
    let py = root().join(".venv/bin/python");
    assert!(py.exists(), "the project venv (bash scripts/setup-venv.sh) is needed: {}", py.display());
    for model in ["tiny-llama", "tiny-gpt2"] {
        let tmp = scratch(model);
        let d = tmp.path();
        let ck = d.join("ck");
        let mfile = format!("models/{model}.ron");
        let (code, _, err) = run(&["run", &mfile, "--world-size", "2", "--batch", "2", "--seq", "8", "--steps", "2", "--lr", "1e-2", "--save", ck.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        let out = d.join("hf");
        let (code, _, err) = run(&["consolidate", ck.to_str().unwrap(), "--hf", out.to_str().unwrap()]);
        assert!(code == 0 && err.contains("from_pretrained loads it"), "{err}");
        for f in ["config.json", "model.safetensors", "generation_config.json"] {
            assert!(out.join(f).exists(), "{f}");
        }
        let o = Command::new(&py).args(["-c", HF_SIDE, out.to_str().unwrap()]).env("HF_HUB_OFFLINE", "1").env("TRANSFORMERS_OFFLINE", "1").output().unwrap();
        let said = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && said.contains("generated 6 tokens"), "{model}: {said}");
        // the runtime's logits on the exported weights (the model as the runtime knows it)
        let m = fsdp_ir::parse_model(&std::fs::read_to_string(root().join(&mfile)).unwrap(), model).unwrap();
        let params = fsdp_runtime::reference::Params::from_safetensors(&m, &out.join("model.safetensors")).unwrap();
        let hf: std::collections::HashMap<String, tch::Tensor> = tch::Tensor::read_safetensors(out.join("hf_logits.safetensors")).unwrap().into_iter().collect();
        let ids = &hf["ids"];
        let inputs = std::collections::HashMap::from([("input_ids".to_string(), ids.shallow_clone()), ("labels".to_string(), ids.shallow_clone())]);
        let cx = fsdp_runtime::ops::OpCx::eval(fsdp_runtime::ops::Attn::Sdpa, tch::Kind::Float);
        let ours = tch::no_grad(|| fsdp_runtime::reference::forward_logits(&m, &params, &inputs, &cx)).unwrap();
        let want = &hf["logits"];
        assert_eq!(ours.size(), want.size(), "{model}");
        let e = (&ours - want).norm().double_value(&[]) / want.norm().double_value(&[]);
        assert!(e < 1e-5, "{model}: logits off by {e:e} (relative L2)");
        eprintln!("{model}: transformers loads the export; logits within {e:.1e}; {}", said.lines().find(|l| l.contains("generated")).unwrap_or(""));
        // a config of another model is refused
        let (code, _, err) = run(&["consolidate", ck.to_str().unwrap(), "--hf", d.join("x").to_str().unwrap(), "--config", "models/tiny-llama-gqa.config.json"]);
        assert!(code == 2 && err.contains("describes another model"), "{err}");
    }
}
