//! `tune` and `fit` end to end: the answer's flags re-planned by `plan` predict what tune
//! said; every runner-up and Pareto entry is a command `plan` accepts; nothing fits → what
//! would; `fit`'s micro-batch fits and one more does not; bad input exits 2.

use std::path::Path;
use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(Path::new(env!("CARGO_MANIFEST_DIR"))).args(args).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
}

fn json(args: &[&str]) -> serde_json::Value {
    let (code, out, err) = run(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}\n{out}"))
}

/// `plan MODEL FLAGS --format json`: (fits, needed bytes, peak bytes, tokens/s/GPU). The
/// flags carry a `--memory-limit` given to tune (so that `plan` judges the fit against it
/// too); else `limit` is the profile's, given here.
fn replan(model: &str, flags: &[String], limit: &str) -> (bool, u64, u64, f64) {
    let mut a: Vec<&str> = vec!["plan", model];
    a.extend(flags.iter().map(String::as_str));
    match flags.iter().position(|f| f == "--memory-limit") {
        Some(at) => assert_eq!(flags[at + 1], limit, "{flags:?}"),
        None => a.extend(["--memory-limit", limit]),
    }
    a.extend(["--format", "json"]);
    let v = json(&a);
    (
        v["fits"]["fits"].as_bool().unwrap(),
        v["fits"]["needed_bytes"].as_u64().unwrap(),
        v["memory"]["peak_bytes"].as_u64().unwrap(),
        v["time"]["tokens_per_s_per_gpu"].as_f64().unwrap(),
    )
}

#[test]
fn tune_answers_with_flags_plan_accepts() {
    let model = "models/tiny-llama-4l.ron";
    // a limit between the least and the most memory the space needs
    let limit = "900MiB";
    // ranked as run under torch.compile: the answer's flags say so and re-plan to its numbers
    let v = json(&["tune", model, "--world-size", "4", "--global-batch", "8", "--seq", "64", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--compile", "--memory-limit", limit, "--format", "json"]);
    let best = &v["best"];
    let flags: Vec<String> = best["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert!(flags.iter().any(|f| f == "--compile"), "{flags:?}");
    let (fits, needed, peak, tps) = replan(model, &flags, limit);
    assert!(fits, "{flags:?}");
    assert_eq!(Some(needed), best["predicted"]["needed_bytes"].as_u64());
    assert_eq!(Some(peak), best["predicted"]["peak_bytes"].as_u64());
    assert_eq!(Some(tps), best["predicted"]["tokens_per_s_per_gpu"].as_f64());
    for e in v["pareto"].as_array().unwrap().iter().chain(v["runner_ups"].as_array().unwrap()) {
        let f: Vec<String> = e["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
        let (_, _, _, t) = replan(model, &f, limit);
        assert_eq!(Some(t), e["predicted"]["tokens_per_s_per_gpu"].as_f64());
        // nothing that fits is faster than the answer
        if e["predicted"]["needed_bytes"].as_u64().is_some_and(|n| n <= 900 << 20) {
            assert!(t <= tps, "{f:?} fits and is faster");
        }
    }
    assert!(v["searched"].as_u64().unwrap() > 0 && v["elapsed_s"].as_f64().is_some());
    // float8 linears, weights gathered in float8: kept in the answer's flags, which re-plan
    // to its numbers
    let v = json(&["tune", model, "--world-size", "4", "--global-batch", "8", "--seq", "64", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--float8", "tensorwise", "--float8-all-gather", "--memory-limit", limit, "--format", "json"]);
    let flags: Vec<String> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert!(flags.windows(2).any(|w| w[0] == "--float8" && w[1] == "tensorwise") && flags.iter().any(|f| f == "--float8-all-gather"), "{flags:?}");
    let (fits, _, peak, tps) = replan(model, &flags, limit);
    assert!(fits && Some(peak) == v["best"]["predicted"]["peak_bytes"].as_u64() && Some(tps) == v["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64(), "{flags:?}");
    // the text form names the command
    let (code, out, _) = run(&["tune", model, "--world-size", "4", "--global-batch", "8", "--seq", "64", "--memory-limit", limit]);
    assert_eq!(code, 0);
    assert!(out.contains("best:") && out.contains("fsdp-plan plan models/tiny-llama-4l.ron --world-size 4") && out.contains("Pareto front"), "{out}");
}

/// tune's best answer (`v`, its JSON) has this `--policy` and re-plans, under the H100's
/// limit, to the peak and tokens/s it predicted.
fn best_replans_with_policy(model: &str, v: &serde_json::Value, want: &str) {
    let flags: Vec<String> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let policy = flags.iter().position(|f| f == "--policy").map(|i| flags[i + 1].as_str());
    assert_eq!(policy, Some(want), "{flags:?}");
    let (fits, _, peak, tps) = replan(model, &flags, "79.65GiB");
    assert!(fits, "{flags:?}");
    assert_eq!(Some(peak), v["best"]["predicted"]["peak_bytes"].as_u64());
    assert_eq!(Some(tps), v["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64());
}

#[test]
fn tune_searches_embeddings_and_head_as_their_own_units() {
    // Llama-3-8B at world size 8: with the embeddings and the head their own units the root
    // no longer holds them unsharded through the step; the answer takes them, and its
    // `--policy modules:…` re-plans to its numbers
    let model = "models/llama-3-8b.ron";
    let v = json(&["tune", model, "--world-size", "8", "--global-batch", "16", "--seq", "8192", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--master-dtype", "f32", "--optimizer", "adamw", "--hardware", "h100-sxm", "--embed-head-units", "--format", "json"]);
    best_replans_with_policy(model, &v, "modules:model.embed_tokens,model.layers.*,lm_head");
    // a tied head shares the embeddings' weight: one unit, said and refused
    let (code, _, err) = run(&["tune", "models/tiny-llama-tied.ron", "--world-size", "2", "--global-batch", "2", "--seq", "32", "--embed-head-units"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--embed-head-units") && err.contains("tied"), "{err}");
    let (code, _, err) = run(&["tune", "models/tiny-llama-tied.ron", "--world-size", "2", "--global-batch", "2", "--seq", "32", "--separate-edge-units"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--separate-edge-units"), "{err}");
    // either alone a unit of its own too: more configurations, each a policy plan accepts
    let args = ["tune", "models/tiny-llama-4l.ron", "--world-size", "4", "--global-batch", "8", "--seq", "64", "--memory-limit", "900MiB", "--format", "json"];
    let both = json(&[&args[..], &["--embed-head-units"]].concat());
    let apart = json(&[&args[..], &["--separate-edge-units"]].concat());
    assert!(apart["searched"].as_u64().unwrap() > both["searched"].as_u64().unwrap() * 3 / 2);
    // (this model's embeddings and head are 28% of its params, under tune::EDGE_SEARCH_SHARE:
    // without a flag, both or neither)
    let default = json(&args);
    assert_eq!((default["searched"].as_u64(), &default["best"]["flags"]), (both["searched"].as_u64(), &both["best"]["flags"]));
    // (tiny-llama's are 44%, over it: without a flag every edge choice is searched, as both
    // flags search them — which add nothing to it — and more than both-or-neither)
    let over = ["tune", "models/tiny-llama.ron", "--world-size", "4", "--global-batch", "8", "--seq", "64", "--memory-limit", "900MiB", "--format", "json"];
    let default = json(&over);
    let every = json(&[&over[..], &["--separate-edge-units", "--norm-head-unit"]].concat());
    let one = json(&[&over[..], &["--separate-edge-units"]].concat());
    let narrow = json(&[&over[..], &["--embed-head-units"]].concat());
    assert_eq!((default["searched"].as_u64(), &default["best"]["flags"]), (every["searched"].as_u64(), &every["best"]["flags"]));
    assert_eq!(default["searched"].as_u64(), one["searched"].as_u64());
    assert!(default["searched"].as_u64().unwrap() > narrow["searched"].as_u64().unwrap() * 2);
    for e in apart["pareto"].as_array().unwrap() {
        let f: Vec<String> = e["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
        let (_, _, _, t) = replan("models/tiny-llama-4l.ron", &f, "900MiB");
        assert_eq!(Some(t), e["predicted"]["tokens_per_s_per_gpu"].as_f64(), "{f:?}");
    }
    // the final norm in the head's unit too (torchtitan's wrapping): on Llama-3-8B at
    // 16 × 8192 the answer takes it, and its policy and kept units (the group named by its
    // head) re-plan to its numbers; a model with a tied head or no final norm refuses it
    let v = json(&["tune", model, "--world-size", "8", "--global-batch", "16", "--seq", "8192", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--hardware", "h100-sxm", "--norm-head-unit", "--format", "json"]);
    best_replans_with_policy(model, &v, "modules:model.embed_tokens,model.layers.*,model.norm+lm_head");
    let (code, _, err) = run(&["tune", "models/tiny-gpt2.ron", "--world-size", "2", "--global-batch", "2", "--seq", "32", "--norm-head-unit"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--norm-head-unit: models/tiny-gpt2.ron has no untied LM head"), "{err}");
}

#[test]
fn tune_says_what_would_fit() {
    // activations bind: a shorter sequence fits (more GPUs shard only the params)
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "1024", "--memory-limit", "3MiB", "--reserve", "0"]);
    assert_eq!(code, 0);
    assert!(out.contains("does not fit") && out.contains("--seq 512 fits") && out.contains("offload"), "{out}");
    // params bind: CPU offload (FSDP2's CPUOffloadPolicy) is what fits on a GPU with a host
    // behind it …
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "64", "--memory-limit", "600KiB", "--reserve", "0"]);
    assert_eq!(code, 0);
    assert!(!out.contains("does not fit") && out.contains("--offload cpu") && out.contains("· CPU offload ·"), "{out}");
    // its flags re-plan to its numbers, the reserve judged the same way
    let v = json(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "64", "--memory-limit", "600KiB", "--reserve", "0", "--format", "json"]);
    let flags: Vec<String> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert!(flags.windows(2).any(|w| w[0] == "--offload" && w[1] == "cpu"), "{flags:?}");
    let mut a: Vec<&str> = vec!["plan", "models/tiny-llama-4l.ron"];
    a.extend(flags.iter().map(String::as_str));
    a.extend(["--format", "json"]);
    let p = json(&a);
    assert_eq!(p["memory"]["peak_bytes"], v["best"]["predicted"]["peak_bytes"]);
    assert_eq!(p["time"]["tokens_per_s_per_gpu"], v["best"]["predicted"]["tokens_per_s_per_gpu"]);
    assert!(p["memory"]["host"]["peak_bytes"].as_u64().unwrap() > 0, "{}", p["memory"]);
    // … and where there is none to offload to (the CPU profile), more GPUs fit: 4 with the
    // embeddings and the head units of their own (`plan … --world-size 4 --checkpoint
    // 'model.layers.{0..3}=full' --policy modules:…`: 544 KiB), 8 left to the root (632 KiB
    // at 4)
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "64", "--memory-limit", "600KiB", "--reserve", "0", "--hardware", "cpu"]);
    assert_eq!(code, 0);
    assert!(out.contains("does not fit") && out.contains("- 4 GPUs") && !out.contains("--offload"), "{out}");
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "64", "--memory-limit", "600KiB", "--reserve", "0", "--hardware", "cpu", "--no-embed-head-units"]);
    assert_eq!(code, 0);
    assert!(out.contains("does not fit") && out.contains("- 8 GPUs") && !out.contains("units of their own fit"), "{out}");
    // neither more GPUs nor a shorter sequence alone, both: seq 128 on 4 GPUs (the
    // embeddings and the head units of their own, every block checkpointed: 765,952 B, where
    // 2 GPUs need 961,024 B at seq 128), and nothing under 600 KiB
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "1024", "--memory-limit", "900KiB", "--reserve", "0", "--hardware", "cpu"]);
    assert_eq!(code, 0);
    assert!(out.contains("even 128 GPUs do not fit") && out.contains("--seq 128 on 4 GPUs (micro-batch 1, every block checkpointed) fits"), "{out}");
    let peak = |ws: &str| json(&["plan", "models/tiny-llama-4l.ron", "--world-size", ws, "--seq", "128", "--policy", "modules:model.embed_tokens,model.layers.*,lm_head", "--checkpoint", "model.layers.{0..3}=full", "--hardware", "cpu", "--format", "json"])["memory"]["peak_bytes"].as_u64().unwrap();
    assert!(peak("4") <= 900 << 10 && peak("2") > 900 << 10);
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "2", "--global-batch", "2", "--seq", "1024", "--memory-limit", "600KiB", "--reserve", "0", "--hardware", "cpu"]);
    assert_eq!(code, 0);
    assert!(out.contains("no sequence of 128 tokens or more fits on up to 128 GPUs either"), "{out}");
    // left to the root where units of their own would fit: said
    let (code, out, _) = run(&["tune", "models/tiny-llama-4l.ron", "--world-size", "4", "--global-batch", "4", "--seq", "64", "--memory-limit", "600KiB", "--reserve", "0", "--hardware", "cpu", "--no-embed-head-units"]);
    assert_eq!(code, 0);
    assert!(out.contains("does not fit") && out.contains("units of their own fit"), "{out}");
}

/// CPU offload must fit the node's host too: Llama-3.1-405B with f32 masters and AdamW keeps
/// at least 405.8e9 × (4 + 4 + 8) B / 8 = 812 GB per rank on the host (shards, grads,
/// moments), 6.5 TB for a node's 8 ranks, over an H100 node's 2 TiB: the device alone would
/// fit it, the node cannot. Where the profile does not know its host's memory, offload fits.
#[test]
fn offload_fits_only_what_the_nodes_host_holds() {
    let base = ["models/llama-3.1-405b.ron", "--world-size", "8", "--seq", "4096", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--master-dtype", "f32"];
    let (code, out, err) = run(&[&["tune"][..], &base, &["--global-batch", "8", "--hardware", "h100-sxm"]].concat());
    assert!(code == 0 && out.contains("does not fit: no configuration in the space fits the limit"), "{out}{err}");
    assert!(out.contains("CPU offload (FSDP2's CPUOffloadPolicy, in the space searched) fits the device but not the node's host") && out.contains("× 8 ranks") && out.contains("of its 2.00 TiB"), "{out}");
    // `plan` says the same of the offloaded configuration
    let v = json(&[&["plan"][..], &base, &["--batch", "1", "--offload", "cpu", "--checkpoint", "LlamaDecoderLayer", "--hardware", "h100-sxm", "--format", "json"]].concat());
    let per_rank = v["memory"]["host"]["peak_bytes"].as_u64().unwrap();
    assert!(per_rank as f64 > 405.8e9 * 16.0 / 8.0, "{per_rank}");
    assert_eq!(v["fits"]["host_needed_bytes"].as_u64(), Some(8 * per_rank));
    assert_eq!(v["fits"]["host_memory_bytes"].as_u64(), Some(2 << 40));
    assert!(v["fits"]["needed_bytes"].as_u64().unwrap() <= v["fits"]["memory_limit_bytes"].as_u64().unwrap() && v["fits"]["fits"] == false, "{}", v["fits"]);
    let (_, out, _) = run(&[&["plan"][..], &base, &["--batch", "1", "--offload", "cpu", "--checkpoint", "LlamaDecoderLayer", "--hardware", "h100-sxm", "--summary"]].concat());
    assert!(out.contains("host: ") && out.contains("per rank × 8 ranks: does not fit in 2.00 TiB (the node's host memory, h100-sxm)"), "{out}");
    // `sweep` too: on 64 GPUs each rank keeps an eighth as much, a node's 8 ranks fit
    let (code, out, err) = run(&[&["sweep"][..], &base, &["--world-size", "64", "--batch", "1", "--offload", "cpu", "--checkpoint", "LlamaDecoderLayer", "--hardware", "h100-sxm"]].concat());
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("transformer:LlamaDecoderLayer")).collect();
    assert!(code == 0 && rows.len() == 2 && rows[0].contains(" no (host) ") && rows[1].contains(" yes "), "{out}{err}");
    // `fit` names the host as what does not fit
    let (code, _, err) = run(&[&["fit"][..], &base, &["--offload", "cpu", "--checkpoint", "LlamaDecoderLayer", "--hardware", "h100-sxm"]].concat());
    assert!(code == 2 && err.contains("under --offload cpu the node's host cannot hold its ranks' share") && err.contains("of its 2.00 TiB (h100-sxm)"), "{err}");
    // a node with more host memory (--host-memory): offload is the answer again
    let v = json(&[&["tune"][..], &base, &["--global-batch", "8", "--hardware", "h100-sxm", "--host-memory", "8TiB", "--format", "json"]].concat());
    let flags: Vec<String> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert!(flags.iter().any(|f| f == "--offload") && flags.windows(2).any(|w| w == ["--host-memory", "8TiB"]), "{flags:?}");
    // its flags re-plan to a plan that fits, the host's 8 TiB included
    let (fits, _, _, _) = replan("models/llama-3.1-405b.ron", &flags, "79.65GiB");
    assert!(fits);
    for (extra, why) in [(&["--host-memory", "1x"][..], "--host-memory `1x`: unknown unit"), (&["--hardware", "cpu", "--host-memory", "1TiB"][..], "--host-memory: the profile `cpu` has no host")] {
        let (code, _, err) = run(&[&["plan", "models/tiny-llama.ron", "--world-size", "2"][..], extra].concat());
        assert!(code == 2 && err.contains(why), "{extra:?}: {err}");
    }
    // torchtitan's H100 96 GB nodes: their host's memory is not published, nothing is checked
    let v = json(&[&["tune"][..], &base, &["--global-batch", "8", "--hardware", "h100-96gb-500w", "--format", "json"]].concat());
    assert!(v["best"]["flags"].as_array().unwrap().iter().any(|f| f == "--offload"), "{}", v["best"]);
}

#[test]
fn tune_shards_experts_on_dim_1_where_the_group_outnumbers_them() {
    // Mixtral-8x7B on 64 H100s: FSDP2's Shard(0) leaves every rank 1/8 of the eight experts
    // (its answer was CPU offload, 121 tokens/s/GPU); the answer shards them and the router on
    // dim 1, and its flags re-plan to its numbers
    let model = "models/mixtral-8x7b.ron";
    let v = json(&["tune", model, "--world-size", "64", "--global-batch", "128", "--seq", "4096", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--hardware", "h100-sxm", "--format", "json"]);
    let flags: Vec<String> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let dims: Vec<&str> = flags.windows(2).filter(|w| w[0] == "--shard-dim").map(|w| w[1].as_str()).collect();
    assert_eq!(dims, ["model.layers.*.mlp.gate.weight=1", "model.layers.*.mlp.experts.gate_up_proj=1", "model.layers.*.mlp.experts.down_proj=1"], "{flags:?}");
    assert!(!flags.iter().any(|f| f == "--offload"), "{flags:?}");
    let (fits, _, peak, tps) = replan(model, &flags, "79.65GiB");
    assert!(fits && tps > 4000.0, "{tps}");
    assert_eq!(Some(peak), v["best"]["predicted"]["peak_bytes"].as_u64());
    assert_eq!(Some(tps), v["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64());
}

#[test]
fn tune_searches_unit_groups_by_default() {
    // GPT-2 on 64 GPUs: a block's all-gather is small, the collectives' latency dominates —
    // several blocks per unit are in the default space's answer, faster than one per unit
    let args = ["tune", "models/gpt2.ron", "--world-size", "64", "--global-batch", "64", "--seq", "1024", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--hardware", "h100-sxm", "--format", "json"];
    let v = json(&args);
    let one = json(&[&args[..], &["--unit-groups", "1"]].concat());
    let flags: Vec<&str> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    let k: u32 = flags.windows(2).find(|w| w[0] == "--unit-group").map(|w| w[1].parse().unwrap()).unwrap_or(1);
    let tps = |v: &serde_json::Value| v["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64().unwrap();
    assert!(k > 1 && 12 % k == 0 && tps(&v) > tps(&one), "{flags:?}: {} vs {} tokens/s/GPU with one block per unit", tps(&v), tps(&one));
}

#[test]
fn tune_keeps_the_last_units_after_forward() {
    // Llama-3-8B on 256 GPUs at seq 2048 under 36 GiB: the backward's all-gathers cost time the
    // memory can buy back — keeping the last units unsharded after forward (more than the
    // last one, fewer than all) is faster than any of all / all but the last / none (what
    // --no-keep-units leaves), and its flags re-plan to tune's numbers
    let model = "models/llama-3-8b.ron";
    let args = ["tune", model, "--world-size", "256", "--global-batch", "256", "--seq", "2048", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--hardware", "h100-sxm", "--memory-limit", "36GiB", "--format", "json"];
    let keep = json(&args);
    let v = json(&[&args[..], &["--no-keep-units"]].concat());
    let tps = |v: &serde_json::Value| v["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64().unwrap();
    let flags: Vec<String> = keep["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let kept: Vec<&String> = flags.windows(2).filter(|w| w[0] == "--unit-reshard").map(|w| &w[1]).collect();
    assert!(kept.iter().any(|k| k.starts_with("model.layers.{")), "{flags:?}");
    assert!(tps(&keep) > tps(&v) * 1.01, "{flags:?}: {} vs {} tokens/s/GPU", tps(&keep), tps(&v));
    let (fits, needed, _, t) = replan(model, &flags, "36GiB");
    assert!(fits);
    assert_eq!((Some(needed), Some(t)), (keep["best"]["predicted"]["needed_bytes"].as_u64(), keep["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64()));
    assert!(keep["searched"].as_u64() > v["searched"].as_u64());
    let without: Vec<&str> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(!without.iter().any(|f| f.starts_with("model.layers.{")), "{without:?}");
}

#[test]
fn tune_refuses_bad_input() {
    for (args, want) in [
        (vec!["tune", "models/tiny-llama-4l.ron", "--world-size", "3", "--global-batch", "8"], "--global-batch"),
        (vec!["tune", "models/tiny-llama-4l.ron", "--global-batch", "8", "--memory-limit", "80 parsecs"], "--memory-limit"),
        (vec!["tune", "models/nope.ron", "--global-batch", "8"], "nope.ron"),
        (vec!["tune", "models/tiny-llama-4l.ron", "--global-batch", "8", "--param-dtype", "f12"], "--param-dtype"),
        (vec!["tune", "models/tiny-llama-4l.ron", "--global-batch", "8", "--unit-groups", "1,3"], "divisors of 4 (1, 2, 4)"),
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn fit_finds_the_largest_micro_batch() {
    let model = "models/tiny-llama-4l.ron";
    let limit = "6MiB";
    let v = json(&["fit", model, "--world-size", "2", "--seq", "64", "--memory-limit", limit, "--reserve", "0", "--format", "json"]);
    let n = v["largest"].as_u64().unwrap();
    assert!(n >= 2, "{v}");
    let peak = |b: u64| json(&["plan", model, "--world-size", "2", "--seq", "64", "--batch", &b.to_string(), "--format", "json"])["memory"]["peak_bytes"].as_u64().unwrap();
    assert!(peak(n) <= 6 << 20 && peak(n + 1) > 6 << 20, "{n}");
    // every cell of the accumulation table is planned: a micro-batch that fits alone may not
    // once the micro-batches before the last keep their unsharded gradients
    let peak_at = |b: u64, k: u64| json(&["plan", model, "--world-size", "2", "--seq", "64", "--batch", &b.to_string(), "--grad-accum", &k.to_string(), "--format", "json"])["memory"]["peak_bytes"].as_u64().unwrap();
    let mut seen = (0, 0);
    for row in v["table"].as_array().unwrap() {
        let b = row["value"].as_u64().unwrap();
        for cell in row["accumulation"].as_array().unwrap() {
            let k = cell["grad_accum"].as_u64().unwrap();
            assert_eq!(cell["global_batch"].as_u64(), Some(b * k * 2), "{cell}");
            let fits = cell["fits"].as_bool().unwrap();
            assert_eq!(fits, peak_at(b, k) <= 6 << 20, "micro-batch {b} at accumulation {k}: {cell}");
            if fits { seen.0 += 1 } else { seen.1 += 1 }
        }
    }
    assert!(seen.0 > 0 && seen.1 > 0, "both kinds of cell: {seen:?}");
    let (code, _, err) = run(&["fit", model, "--memory-limit", "1KiB", "--reserve", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("not even"), "{err}");
    // a reserve that leaves nothing of the limit is an error, not a search of the space
    let tune = ["tune", model, "--global-batch", "8", "--memory-limit", "1GiB", "--reserve", "4GiB"];
    let fit = ["fit", model, "--memory-limit", "1GiB", "--reserve", "4GiB"];
    for args in [&tune[..], &fit[..]] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("--reserve") && err.contains("1.00 GiB"), "{args:?}: {err}");
    }
    // options the planner refuses are named, not taken for a size that does not fit
    let (code, _, err) = run(&["fit", model, "--checkpoint", "NoSuchLayer"]);
    assert_eq!(code, 2);
    assert!(err.contains("--checkpoint") && err.contains("NoSuchLayer") && !err.contains("not even"), "{err}");
}

#[test]
fn tune_checkpoints_the_last_blocks_where_their_recompute_is_hidden() {
    // 4 Llama-3.2-1B blocks (the head untied) on 4 H100s two to a node: the last two blocks'
    // recompute runs beside the first ones' all-gather across nodes, prefetched — free —
    // where the first two's is not (a profile as a .ron file, the model from its config)
    let tmp = tempfile::Builder::new().prefix("fsdp-tune-back-").tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = std::fs::read_to_string(root.join("models/llama-1b.config.json")).unwrap();
    let cfg = cfg.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 4").replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    let hw = std::fs::read_to_string(root.join("models/hardware/h100-sxm.ron")).unwrap().replace("gpus_per_node: 8,", "gpus_per_node: 2,");
    assert!(cfg.contains("\"num_hidden_layers\": 4") && hw.contains("gpus_per_node: 2,"));
    let (cfg_path, model, hw_path) = (tmp.path().join("l1b4.config.json"), tmp.path().join("l1b4.ron"), tmp.path().join("h100x2.ron"));
    std::fs::write(&cfg_path, cfg).unwrap();
    std::fs::write(&hw_path, hw).unwrap();
    let (code, _, err) = run(&["import", "hf", cfg_path.to_str().unwrap(), "-o", model.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (model, hw) = (model.to_str().unwrap(), hw_path.to_str().unwrap());
    // judged by the tensor peak (--reserve 0): the flags carry it, and plan judges so too
    let v = json(&["tune", model, "--world-size", "4", "--global-batch", "8", "--seq", "1024", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--hardware", hw, "--memory-limit", "6.1GiB", "--reserve", "0", "--format", "json"]);
    let flags: Vec<String> = v["best"]["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    assert!(flags.windows(2).any(|w| w == ["--reserve", "0"]), "{flags:?}");
    // (the last block checkpointed, not the first; described in block order)
    let n = |c: &str| -> Vec<u32> { c.split(['{', '}', '.', '=']).filter_map(|x| x.parse().ok()).collect() };
    let ck: Vec<u32> = flags.windows(2).filter(|w| w[0] == "--checkpoint").flat_map(|w| n(&w[1])).collect();
    assert!(ck.contains(&3) && !ck.contains(&0), "{flags:?}");
    assert!(v["best"]["config"].as_str().unwrap().contains(" none / "), "{}", v["best"]["config"]);
    let (fits, needed, peak, tps) = replan(model, &flags, "6.1GiB");
    assert!(fits && needed == peak && Some(peak) == v["best"]["predicted"]["peak_bytes"].as_u64() && Some(tps) == v["best"]["predicted"]["tokens_per_s_per_gpu"].as_f64(), "{flags:?}");
    // the same modes on the first blocks: a slower step
    let mirrored: Vec<String> = flags
        .iter()
        .map(|f| match f.split_once('=') {
            Some((blocks, mode)) if blocks.starts_with("model.layers.") => {
                let b = n(blocks);
                let (lo, hi) = (3 - b[b.len() - 1], 3 - b[0]);
                if lo == hi { format!("model.layers.{lo}={mode}") } else { format!("model.layers.{{{lo}..{hi}}}={mode}") }
            }
            _ => f.clone(),
        })
        .collect();
    assert_ne!(mirrored, flags);
    let (_, _, _, front) = replan(model, &mirrored, "6.1GiB");
    assert!(front < tps * 0.99, "{mirrored:?}: {front} tokens/s against {tps}");
}

/// A dense block among MoE ones (tiny Qwen3-MoE's middle block, its `mlp_only_layers`) is
/// checkpointed on its own where that is the fastest that fits: the answer's flags and the
/// text name the block, and `plan` re-plans the flags to the answer's numbers.
#[test]
fn tune_checkpoints_a_block_unlike_the_rest_by_name() {
    let model = "models/tiny-qwen3-moe.ron";
    let limit = "328KiB";
    // (the embeddings and the head as units of their own or the root's: searched apart, or
    // with the final norm in the head's unit — the default for this model, 38% of whose
    // params they are — a configuration without checkpointing fits: offloaded)
    let args = ["tune", model, "--world-size", "2", "--global-batch", "2", "--seq", "32", "--param-dtype", "bf16", "--reduce-dtype", "f32", "--reserve", "0B", "--memory-limit", limit, "--embed-head-units"];
    let v = json(&[&args[..], &["--format", "json"]].concat());
    let best = &v["best"];
    let flags: Vec<String> = best["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
    let ck: Vec<&str> = flags.windows(2).filter(|w| w[0] == "--checkpoint").map(|w| w[1].as_str()).collect();
    assert_eq!(ck, ["model.layers.1=selective-op"], "{flags:?}");
    let (fits, _, peak, tps) = replan(model, &flags, limit);
    assert!(fits && Some(peak) == best["predicted"]["peak_bytes"].as_u64() && Some(tps) == best["predicted"]["tokens_per_s_per_gpu"].as_f64(), "{flags:?}");
    let (code, out, _) = run(&args);
    assert_eq!(code, 0);
    assert!(out.contains("AC 0 full / 1 SAC / 2 none: model.layers.1=selective-op"), "{out}");
}
