//! The binary end to end: bad input gives a clear message and exit code 2; outputs are
//! written atomically; the default subcommand is `plan`.

use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fsdp-plan"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = bin().args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn bad_flags_exit_2_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["models/tiny-llama.ron", "--world-size", "0"], "--world-size"),
        (&["models/tiny-llama.ron", "--param-dtype", "bf17"], "unknown dtype `bf17`"),
        (&["models/tiny-llama.ron", "--policy", "transformer:NoSuchLayer"], "`NoSuchLayer` matches no module"),
        (&["models/tiny-llama.ron", "--policy", "modules:model.embed_tokens"], "tied"),
        (&["models/does-not-exist.ron"], "does-not-exist.ron"),
        (&["models/tiny-llama.ron", "--attn-implementation", "magic"], "magic"),
        (&["models/tiny-gpt2.ron", "--seq", "65"], "--seq: 65 exceeds the model's 64 learned positions (`transformer.wpe.weight`, n_positions)"),
    ];
    for (args, want) in cases {
        let (code, _, err) = run(args);
        // the tied case only applies to a tied model
        if want == &"tied" {
            let (code, _, err) = run(&["models/tiny-llama-tied.ron", "--policy", "modules:model.embed_tokens"]);
            assert_eq!(code, 2, "{err}");
            assert!(err.contains("lm_head.weight") && err.contains("model.embed_tokens.weight"), "{err}");
            continue;
        }
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: `{err}` lacks `{want}`");
    }
}

#[test]
fn syntax_error_names_file_line_col() {
    let dir = std::env::temp_dir().join(format!("fsdp-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.ron");
    std::fs::write(&bad, "(\n  name: \"x\",\n  architecture: ,\n)").unwrap();
    let (code, _, err) = run(&[bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.ron:3:"), "{err}");
    let badjson = dir.join("c.json");
    std::fs::write(&badjson, "{\"model_type\": \"llama\",\n \"hidden_size\": }").unwrap();
    let (code, _, err) = run(&["import", "hf", badjson.to_str().unwrap(), "-o", dir.join("o.ron").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("c.json:2:"), "{err}");
    assert!(!dir.join("o.ron").exists(), "nothing is written on error");
    let unk = dir.join("u.json");
    std::fs::write(&unk, "{\"model_type\": \"bert\"}").unwrap();
    let (code, _, err) = run(&["import", "hf", unk.to_str().unwrap(), "-o", dir.join("o.ron").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("unsupported model_type `bert`"), "{err}");
}

#[test]
fn plan_json_compile_and_diff() {
    let (code, out, err) = run(&["models/tiny-llama.ron", "--world-size", "2", "--seq", "32", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["units"].as_array().unwrap().len(), 3);
    assert_eq!(v["collectives"][0]["kind"], "all_gather");
    assert!(v["memory"]["peak_bytes"].as_u64().unwrap() > 0);
    let dir = std::env::temp_dir().join(format!("fsdp-plan-cli2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = dir.join("a.ron");
    let b = dir.join("b.ron");
    assert_eq!(run(&["compile", "models/tiny-llama.ron", "--world-size", "2", "-o", a.to_str().unwrap()]).0, 0);
    assert_eq!(run(&["compile", "models/tiny-llama.ron", "--world-size", "4", "--policy", "none", "-o", b.to_str().unwrap()]).0, 0);
    let (code, out, err) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("peak memory") && out.contains("units only in"), "{out}");
    let (code, out, _) = run(&["diff", "models/tiny-llama.ron", "--policy", "transformer:LlamaDecoderLayer", "--policy", "none"]);
    assert_eq!(code, 0);
    assert!(out.contains("transformer:LlamaDecoderLayer"), "{out}");
    // a corrupted plan is refused
    std::fs::write(&b, "(format_version: 1, garbage").unwrap();
    let (code, _, err) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
}
