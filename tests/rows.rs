//! The time model ranks configurations as measured runs do: across the published rows of one
//! model, world size, GPU and FSDP kind (AC none / selective / full, compile or not, batch 8
//! vs 16), every pair whose measured tokens/s differ by more than 3% (below that the sources'
//! own run-to-run noise) is predicted in the same order. The truth is the measured figures in
//! `bench/data/*.json`; the predictions are `fsdp-plan rows`'s.

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

fn predictions(file: &str) -> BTreeMap<String, f64> {
    let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(env!("CARGO_MANIFEST_DIR")).args(["rows", file, "--format", "json"]).output().unwrap();
    assert!(o.status.success(), "fsdp-plan rows {file}: {}", String::from_utf8_lossy(&o.stderr));
    let v: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    v.iter().filter_map(|r| Some((r["id"].as_str()?.to_string(), r["predicted_tokens_per_s_per_gpu"].as_f64()?))).collect()
}

#[test]
fn predicted_order_is_the_measured_order_within_a_source() {
    let mut pairs = 0;
    let mut wrong = vec![];
    for file in ["bench/data/published-rows.json", "bench/data/extra-rows.json"] {
        let pred = predictions(file);
        let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        let rows: Vec<Value> = serde_json::from_str(&text).unwrap();
        let mut groups: BTreeMap<String, Vec<(String, f64, f64)>> = BTreeMap::new();
        for r in &rows {
            let id = r["id"].as_str().unwrap().to_string();
            let (Some(&p), Some(m)) = (pred.get(&id), r["measured"]["tokens_per_s_per_gpu"].as_f64()) else { continue };
            let key = format!("{} {} {} {}", r["model"]["planner_config"], r["hardware"]["world_size"], r["hardware"]["gpu"], r["parallelism"]["kind"]);
            groups.entry(key).or_default().push((id, m, p));
        }
        for g in groups.values() {
            for (i, a) in g.iter().enumerate() {
                for b in &g[i + 1..] {
                    if (a.1 - b.1).abs() / a.1.min(b.1) < 0.03 {
                        continue;
                    }
                    pairs += 1;
                    if (a.1 > b.1) != (a.2 > b.2) {
                        wrong.push(format!("{} ({} measured, {:.0} predicted) vs {} ({}, {:.0})", a.0, a.1, a.2, b.0, b.1, b.2));
                    }
                }
            }
        }
    }
    println!("{pairs} pairs compared");
    assert!(pairs >= 20, "only {pairs} pairs compared: the rows files lost their groups?");
    assert!(wrong.is_empty(), "predicted order differs from the measured one:\n{}", wrong.join("\n"));
}

/// `--compile` changes the predicted time and what the blocks save (inductor's partitioner),
/// never the collectives.
#[test]
fn compile_changes_time_and_what_blocks_save() {
    let args = ["models/llama-3.1-8b.ron", "--world-size", "8", "--batch", "2", "--seq", "8192", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--master-dtype", "f32", "--checkpoint", "LlamaDecoderLayer", "--ac-mode", "selective-op", "--hardware", "h100-sxm", "--format", "json"];
    let run = |extra: &[&str]| -> Value {
        let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(env!("CARGO_MANIFEST_DIR")).args(args).args(extra).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (eager, compiled) = (run(&[]), run(&["--compile"]));
    assert_eq!(eager["collectives"], compiled["collectives"]);
    // (inductor's partitioner keeps less than eager's SAC: no `down_proj` output, 128 MiB a
    // block here; tests/conformance.rs holds it against the partitioner itself)
    let peak = |v: &Value| v["memory"]["peak_bytes"].as_u64().unwrap();
    assert!(peak(&compiled) + 32 * (128 << 20) <= peak(&eager), "compile: {} B vs eager {} B", peak(&compiled), peak(&eager));
    let t = |v: &Value| v["time"]["step_time_s"].as_f64().unwrap();
    assert!(t(&compiled) < 0.95 * t(&eager), "compile: {} s vs eager {} s", t(&compiled), t(&eager));
}

/// `--compile`'s memory model applies to the blocks made of what was measured under
/// inductor's partitioner (tests/fixtures/fsdp2_compile/); the others keep eager's memory.
#[test]
fn compile_models_the_memory_of_measured_blocks_only() {
    let blocks = |name: &str, seq: u64| {
        let path = format!("{}/models/{name}.ron", env!("CARGO_MANIFEST_DIR"));
        let m = fsdp_ir::parse_model(&std::fs::read_to_string(path).unwrap(), name).unwrap();
        (fsdp_planner::activation::compiled_memory_blocks(&m, seq).len(), fsdp_planner::activation::compiled_blocks(&m).len())
    };
    for measured in ["llama-3-8b", "qwen3-8b", "qwen2-7b", "phi-3-mini-4k", "olmo-2-7b", "mixtral-8x7b"] {
        let (mem, all) = blocks(measured, 2047);
        assert!(all > 0 && mem == all, "{measured}: {mem} of {all} blocks");
    }
    // LayerNorm, GELU and dropout; Gemma's scaled norms and soft-capping; Qwen3-MoE's router
    // (its weights cast back); latent attention; Phi-3's 2047-token window over a longer sequence
    for (eager, seq) in [("gpt2", 1024), ("gemma-2-9b", 4096), ("qwen3-30b-a3b", 4096), ("deepseek-v2-lite", 4096), ("phi-3-mini-4k", 4096)] {
        assert_eq!(blocks(eager, seq).0, 0, "{eager}");
    }
}

/// `rows FILE --fit OUT.ron` writes a profile `plan` loads, fitted closer to the rows than
/// the one it started from; rows of several profiles and unknown held-out ids are refused.
#[test]
fn fit_writes_a_loadable_profile_and_refuses_what_it_cannot_fit() {
    let bin = env!("CARGO_BIN_EXE_fsdp-plan");
    // removed when the guard drops (a failing assertion's too)
    let tmp = tempfile::Builder::new().prefix("fsdp-plan-rows-fit-").tempdir().unwrap();
    let dir = tmp.path();
    let out = dir.join("fit.ron");
    let run = |args: &[&str]| Command::new(bin).current_dir(env!("CARGO_MANIFEST_DIR")).args(args).output().unwrap();
    let o = run(&["rows", "bench/data/published-rows.json", "--fit", out.to_str().unwrap(), "--holdout", "tt-h100-l31-8b-w128-fsdp"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("| tt-h100-l31-8b-w128-fsdp | held out |"), "{text}");
    // "RMS log error of the fitted rows A% → B%": B below A
    let (a, b) = text.split_once("fitted rows ").unwrap().1.split_once(" · written").unwrap().0.split_once(" → ").unwrap();
    let pct = |s: &str| s.trim_end_matches('%').parse::<f64>().unwrap();
    assert!(pct(b) < pct(a), "{text}");
    let o = run(&["plan", "models/llama-3.1-8b.ron", "--hardware", out.to_str().unwrap(), "--summary"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("-fit (rank 0)"), "{}", String::from_utf8_lossy(&o.stderr));
    // A100 and H100 rows in one fit
    let o = run(&["rows", "bench/data/extra-rows.json", "--fit", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("several profiles (a100-80gb, h100-sxm)"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["rows", "bench/data/published-rows.json", "--fit", out.to_str().unwrap(), "--holdout", "no-such-row"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no row `no-such-row`"));
}
