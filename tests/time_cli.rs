//! The time-prediction commands end to end: hardware profiles (shipped ones parse; bad ones
//! are refused with file:line:col and exit 2), the time section of `plan` (text and JSON),
//! `diff`'s time rows, `trace`, `plot` and `sweep`.

use fsdp_planner::hardware::Hardware;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_in(root(), args)
}

fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(dir).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

/// A scratch directory, removed when the guard drops (a failing test's too).
fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fsdp-plan-time-{tag}-")).tempdir().unwrap()
}

#[test]
fn shipped_hardware_profiles_parse() {
    let mut names = vec![];
    for e in std::fs::read_dir(root().join("models/hardware")).unwrap() {
        let p = e.unwrap().path();
        let hw: Hardware = ron::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(Some(hw.name.as_str()), p.file_stem().and_then(|s| s.to_str()), "{}: name is the file stem", p.display());
        assert!(hw.peak_flops.bf16 >= hw.peak_flops.fp32 && hw.memory_bytes > 0);
        names.push(hw.name);
    }
    names.sort();
    assert_eq!(names, ["a100-40gb", "a100-80gb", "cpu", "h100-96gb-500w", "h100-sxm", "h200"]);
}

#[test]
fn bad_hardware_is_a_clear_error() {
    let tmp = tmp("hw");
    let d = tmp.path();
    let bad = d.join("bad.ron");
    std::fs::write(&bad, "(\n  name: \"x\",\n  peak_flops: (bf16: 1e12, fp16: 1e12, tf32: 1e12, fp32: ),\n)").unwrap();
    let (code, _, err) = run(&["models/tiny-llama.ron", "--seq", "32", "--hardware", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.ron:3:"), "{err}");
    // a value out of range is reported where it stands: the shipped profile with one edit,
    // refused at that line with `says` in the message
    let h100 = std::fs::read_to_string(root().join("models/hardware/h100-sxm.ron")).unwrap();
    let refused_at = |file: &str, from: &str, to: &str, says: &str| {
        let p = d.join(file);
        std::fs::write(&p, h100.replace(from, to)).unwrap();
        let line = h100.lines().position(|l| l.contains(from)).unwrap() + 1;
        let (code, _, err) = run(&["models/tiny-llama.ron", "--seq", "32", "--hardware", p.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("{file}:{line}:")) && err.contains(says), "{err}");
    };
    refused_at("eff.ron", "matmul: 0.7,", "matmul: 1.7,", "(0, 1]");
    // a power limit whose rates would scale by no power at all
    refused_at("idle.ron", "idle_w: 88.0", "idle_w: 800.0", "must exceed idle_w (800)");
    let unknown = d.join("unknown.ron");
    std::fs::write(&unknown, h100.replace("gpus_per_node: 8,", "gpus_per_node: 8,\n    nvlink: true,")).unwrap();
    let (code, _, err) = run(&["models/tiny-llama.ron", "--seq", "32", "--hardware", unknown.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown.ron:") && err.contains("nvlink"), "{err}");
    let (code, _, err) = run(&["models/tiny-llama.ron", "--hardware", "tpu-v9"]);
    assert_eq!(code, 2);
    assert!(err.contains("tpu-v9") && err.contains("h100-sxm"), "lists the known profiles: {err}");
    let (code, _, err) = run(&["models/tiny-llama.ron", "--hardware", "h"]);
    assert_eq!(code, 2);
    assert!(err.contains("ambiguous"), "{err}");
    let (code, _, err) = run(&["models/tiny-llama.ron", "--hardware", d.join("missing.ron").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("missing.ron"), "{err}");
}

#[test]
fn plan_shows_the_time_and_names_resolve_from_anywhere() {
    let (code, out, err) = run(&["models/tiny-llama.ron", "--world-size", "2", "--seq", "32"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("predicted step time on h100-sxm") && out.contains("tokens/s/GPU") && out.contains("MFU"), "{out}");
    assert!(out.contains("exposed comm"), "{out}");
    // a unique prefix names a profile; the repo's models/hardware is found from another dir
    let tmp = tmp("cwd");
    let elsewhere = tmp.path();
    let model = root().join("models/tiny-llama.ron");
    let (code, out, err) = run_in(elsewhere, &[model.to_str().unwrap(), "--world-size", "2", "--seq", "32", "--hardware", "a100-8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("predicted step time on a100-80gb"), "{out}");
    let (code, out, err) = run(&["models/tiny-llama.ron", "--world-size", "2", "--seq", "32", "--format", "json", "--hardware", "cpu"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["time"];
    assert_eq!(t["hardware"], "cpu");
    for k in ["step_time_s", "compute_s", "comm_s", "exposed_comm_s", "mfu", "tokens_per_s_per_gpu", "model_flops"] {
        assert!(t[k].as_f64().is_some_and(|x| x.is_finite() && x >= 0.0), "{k}: {t}");
    }
    assert!(t["step_time_s"].as_f64().unwrap() > 0.0);
    assert_eq!(t["tokens_per_step"], 32);
}

#[test]
fn diff_has_time_rows() {
    let (code, out, err) = run(&["diff", "models/tiny-llama.ron", "--seq", "32", "--policy", "transformer:LlamaDecoderLayer", "--policy", "none"]);
    assert_eq!(code, 0, "{err}");
    for row in ["step time (h100-sxm)", "exposed comm", "MFU", "tokens/s/GPU"] {
        assert!(out.contains(row), "{row}: {out}");
    }
    // compiled plans: the model is found in models/ by name and checked by hash
    let tmp = tmp("diff");
    let d = tmp.path();
    let (a, b) = (d.join("a.ron"), d.join("b.ron"));
    assert_eq!(run(&["compile", "models/tiny-llama.ron", "--seq", "32", "--world-size", "2", "-o", a.to_str().unwrap()]).0, 0);
    assert_eq!(run(&["compile", "models/tiny-llama.ron", "--seq", "32", "--world-size", "4", "-o", b.to_str().unwrap()]).0, 0);
    let (code, out, err) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--hardware", "h200"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("step time (h200)"), "{out}");
    // the wrong model: refused (a plan is checked against its model before it is diffed)
    let (code, _, err) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--model", "models/tiny-gpt2.ron"]);
    assert_eq!(code, 2);
    assert!(err.contains("tiny-gpt2.ron: not the model the plan was compiled from (model hash differs)"), "{err}");
}

#[test]
fn trace_and_plot_write_files_atomically() {
    let tmp = tmp("view");
    let d = tmp.path();
    let trace = d.join("trace.json");
    let (code, _, err) = run(&["trace", "models/tiny-llama.ron", "--world-size", "2", "--seq", "32", "-o", trace.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    assert!(ev.iter().any(|e| e["ph"] == "X") && ev.iter().any(|e| e["ph"] == "C"));
    // from a compiled plan
    let plan = d.join("p.ron");
    assert_eq!(run(&["compile", "models/tiny-gpt2.ron", "--seq", "32", "--world-size", "2", "-o", plan.to_str().unwrap()]).0, 0);
    let svg = d.join("memory.svg");
    let (code, _, err) = run(&["plot", plan.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    // no temp files left behind
    let left: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).filter(|n| n.contains(".tmp")).collect();
    assert!(left.is_empty(), "{left:?}");
    // an error writes nothing
    let bad = d.join("never.json");
    let (code, _, _) = run(&["trace", "models/tiny-llama.ron", "--world-size", "0", "-o", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(!bad.exists());
}

#[test]
fn sweep_table_and_json() {
    let args = [
        "sweep",
        "models/tiny-llama.ron",
        "--world-size",
        "2,4,16",
        "--policy",
        "transformer:LlamaDecoderLayer;none",
        "--policy",
        "size:1000",
        "--seq",
        "32",
        "--hardware",
        "h100-s",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("world size") && out.contains("fits?") && out.contains("tokens/s/GPU"), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("yes")).count(), 9, "{out}");
    let mut j: Vec<&str> = args.to_vec();
    j.extend(["--format", "json", "--memory-limit", "1MiB"]);
    let (code, out, err) = run(&j);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 9);
    assert_eq!(v["memory_limit_bytes"], 1 << 20);
    for r in rows {
        let fits = r["needed_bytes"].as_u64().unwrap() <= 1 << 20;
        assert!(r["needed_bytes"].as_u64().unwrap() >= r["peak_bytes"].as_u64().unwrap());
        assert_eq!(r["fits"], fits);
        assert!(r["step_time_s"].as_f64().unwrap() > 0.0 && r["tokens_per_s_per_gpu"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(rows[0]["world_size"], 2);
    assert_eq!(rows[8]["world_size"], 16);
    assert_eq!(rows[1]["policy"], "none");
    // `transformer:A,size:1e8` is ambiguous: refused with the fix
    let (code, _, err) = run(&["sweep", "models/tiny-llama.ron", "--policy", "transformer:LlamaDecoderLayer,size:1e8"]);
    assert_eq!(code, 2);
    assert!(err.contains("`;`"), "{err}");
    let (code, _, err) = run(&["sweep", "models/tiny-llama.ron", "--memory-limit", "80 parsecs"]);
    assert_eq!(code, 2);
    assert!(err.contains("parsecs"), "{err}");
}
