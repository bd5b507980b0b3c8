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
        // sizes that would overflow the byte counts are refused, not wrapped
        (&["models/tiny-llama.ron", "--world-size", "18446744073709551615"], "--world-size: 18446744073709551615 is more than 1048576 ranks"),
        (&["models/tiny-llama.ron", "--batch", "18446744073709551615"], "is more than 4294967296 tokens per micro-batch"),
        (&["models/tiny-llama.ron", "--seq", "4294967296"], "--seq: 4294967296 is more than 1048576 tokens"),
        (&["models/tiny-llama.ron", "--grad-accum", "4000000000"], "--grad-accum: 4000000000 is more than 1024 micro-batches"),
        (&["models/llama-3.1-405b.ron", "--world-size", "1", "--strategy", "no-shard", "--policy", "none", "--batch", "4096", "--seq", "1048576", "--attn-implementation", "eager"], "the step's buffers add up to more than 4 EiB"),
        // a class the model lacks would checkpoint nothing
        (&["models/tiny-mixtral.ron", "--checkpoint", "LlamaDecoderLayer"], "--checkpoint: `LlamaDecoderLayer` is neither a module class nor a module path of tiny-mixtral"),
        // a policy that wraps nothing leaves only the root to set
        (&["models/tiny-llama.ron", "--policy", "none", "--unit-reshard", "last=false"], "--unit-reshard: `last`: this plan has no FSDP unit but the root (its wrap policy wraps no module): only `root` can be set"),
        // unit groups: a group's blocks checkpointed alike; FSDP2 only; a sane size
        (&["models/tiny-llama-4l.ron", "--unit-group", "2", "--checkpoint", "model.layers.1"], "the unit group model.layers.0 + model.layers.1 is checkpointed unlike (model.layers.0: none, model.layers.1: full)"),
        (&["models/tiny-llama-4l.ron", "--unit-group", "2", "--layout", "flat"], "--unit-group: unit groups are FSDP2's"),
        (&["models/tiny-llama-4l.ron", "--unit-group", "0"], "--unit-group: 0: blocks per unit, 1 to 1024"),
        // a unit of several modules (`a+b`): paths side by side, each in one unit, FSDP2 only
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.norm+nope"], "wrap policy `modules:model.norm+nope`: no module at path `nope`"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.layers.*+lm_head"], "names each by its path (`model.norm+lm_head`), not by a pattern"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.layers.0+model.layers.0.mlp"], "`model.layers.0.mlp` is inside `model.layers.0`"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.norm+lm_head,lm_head"], "`lm_head` is both in a unit of several modules and a unit of its own (`lm_head`)"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.embed_tokens+lm_head"], "`model.embed_tokens+lm_head`: its modules do not run forward one after the other (`model.rotary_emb` runs between them)"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.layers.*,model.layers.0.mlp+model.layers.1.mlp"], "`model.layers.0.mlp` is inside model.layers.0 but `model.layers.1.mlp` inside model.layers.1"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.norm+", "--seq", "8"], "`model.norm+`: an empty module path"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.norm+lm_head", "--unit-group", "2"], "--unit-group 2: every wrapped module is in a unit of several modules"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.norm+lm_head", "--checkpoint", "lm_head"], "the unit group model.norm + lm_head is checkpointed unlike"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.layers.*,model.norm+lm_head", "--unit-reshard", "model.norm+model.layers.0=false"], "(units: root, model.layers.0, model.layers.1, model.layers.2, model.layers.3, model.norm+lm_head"),
        (&["models/tiny-llama-4l.ron", "--policy", "modules:model.norm+lm_head", "--layout", "flat"], "--policy: `model.norm+lm_head`: a unit of several modules (`a+b`) is FSDP2's"),
        // reshard_after_forward=int: a proper divisor of the world size, FSDP2 full-shard
        (&["models/tiny-llama-4l.ron", "--world-size", "8", "--reshard-after-forward", "3"], "--reshard-after-forward: 3: an int reshards to groups of that many ranks"),
        (&["models/tiny-llama-4l.ron", "--world-size", "8", "--reshard-after-forward", "8"], "a divisor of the world size (8) other than 1 and itself"),
        (&["models/tiny-llama-4l.ron", "--reshard-after-forward", "maybe"], "`maybe`: expected true, false or a number of ranks"),
        // a unit name or pattern that names no unit
        (&["models/tiny-llama-4l.ron", "--unit-reshard", "model.layers.{7..9}=false"], "--unit-reshard: `model.layers.{7..9}` is not an FSDP unit of this plan (units: root, model.layers.0"),
        (&["models/tiny-llama-4l.ron", "--unit-reshard", "model.layers.9=false"], "`model.layers.9` is not an FSDP unit"),
        // per-unit ints: each unit its own (the one that is no divisor named), never on the root
        (&["models/tiny-llama-4l.ron", "--world-size", "8", "--unit-reshard", "model.layers.0=2", "--unit-reshard", "model.layers.1=3"], "--unit-reshard: model.layers.1=3: an int reshards to groups of that many ranks"),
        (&["models/tiny-llama-4l.ron", "--world-size", "8", "--unit-reshard", "root=2"], "--unit-reshard: root=N: the root's reshard_after_forward is true or false"),
        (&["models/tiny-llama-4l.ron", "--world-size", "8", "--unit-reshard", "model.layers.0=3"], "an int reshards to groups of that many ranks"),
        (&["models/tiny-llama-4l.ron", "--unit-reshard", "model.layers.0=maybe"], "expected UNIT=true, UNIT=false or UNIT=N"),
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
fn reshard_ints_differ_per_unit_and_show_per_unit() {
    // (FSDP2-exact in fake mode: harness case llama_unit_raf2_raf4_ws8)
    let args = ["models/tiny-llama-4l.ron", "--world-size", "8", "--unit-reshard", "model.layers.{0..1}=2", "--unit-reshard", "model.layers.{2..3}=4"];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model.layers.{0..1}: 2 × LlamaDecoderLayer") && out.contains("reshard to 2 after forward"), "{out}");
    assert!(out.contains("model.layers.{2..3}: 2 × LlamaDecoderLayer") && out.contains("reshard to 4 after forward"), "{out}");
    let (code, out, err) = run(&[&args[..], &["--format", "json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ints: Vec<(String, Option<u64>)> = v["units"].as_array().unwrap().iter().map(|u| (u["name"].as_str().unwrap().to_string(), u["reshard_to"].as_u64())).collect();
    assert_eq!(ints.iter().filter(|(n, _)| n.starts_with("model.layers.")).map(|(_, r)| *r).collect::<Vec<_>>(), [Some(2), Some(2), Some(4), Some(4)], "{ints:?}");
}

#[test]
fn syntax_error_names_file_line_col() {
    let tmp = tempfile::Builder::new().prefix("fsdp-plan-cli-").tempdir().unwrap();
    let dir = tmp.path();
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
    assert!(err.contains("not a model this importer knows (it knows gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM), qwen3 (Qwen3ForCausalLM), mixtral (MixtralForCausalLM), qwen3_moe (Qwen3MoeForCausalLM), olmo2 (Olmo2ForCausalLM), gemma2 (Gemma2ForCausalLM), gemma3_text (Gemma3ForCausalLM), phi3 (Phi3ForCausalLM), deepseek_v2 (DeepseekV2ForCausalLM), deepseek_v3 (DeepseekV3ForCausalLM)): model_type `bert`"), "{err}");
}

#[test]
fn plan_json_compile_and_diff() {
    let (code, out, err) = run(&["models/tiny-llama.ron", "--world-size", "2", "--seq", "32", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["units"].as_array().unwrap().len(), 3);
    assert_eq!(v["collectives"][0]["kind"], "all_gather");
    assert!(v["memory"]["peak_bytes"].as_u64().unwrap() > 0);
    let tmp = tempfile::Builder::new().prefix("fsdp-plan-cli2-").tempdir().unwrap();
    let dir = tmp.path();
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
    // a unit of several modules is named by all of them
    let (code, out, _) = run(&["diff", "models/tiny-llama.ron", "--policy", "modules:model.layers.*,lm_head", "--policy", "modules:model.layers.*,model.norm+lm_head"]);
    assert_eq!(code, 0);
    assert!(out.contains("units only in modules:model.layers.*,model.norm+lm_head: model.norm+lm_head\n"), "{out}");
    // a corrupted plan is refused
    std::fs::write(&b, "(format_version: 1, garbage").unwrap();
    let (code, _, err) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
}

/// A scratch directory, removed when the guard drops (a failing test's too).
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fsdp-cli-{name}-")).tempdir().unwrap()
}

/// A compiled plan is what `compile` makes of its model and options: an edited one (a buffer
/// id, a unit id, an offset, the world size) is refused at its line, never drawn or diffed.
#[test]
fn an_edited_plan_is_refused_at_its_line() {
    let tmp = scratch("edited");
    let d = tmp.path();
    let plan = d.join("plan.ron");
    let (code, _, err) = run(&["compile", "models/tiny-llama.ron", "--world-size", "2", "--batch", "2", "--seq", "8", "-o", plan.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&plan).unwrap();
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let cases = [
        ("events: [Alloc(11)]", "events: [Alloc(99999)]", "Alloc(99999)"),
        ("AllGather(unit: 0,", "AllGather(unit: 77,", "AllGather(unit: 77"),
        ("offset: 0)", "offset: 99999999999)", "offset: 99999999999"),
    ];
    for (from, to, shown) in cases {
        let edited = d.join("edited.ron");
        std::fs::write(&edited, text.replacen(from, to, 1)).unwrap();
        for cmd in [vec!["trace", edited.to_str().unwrap(), "-o", d.join("t.json").to_str().unwrap()], vec!["diff", plan.to_str().unwrap(), edited.to_str().unwrap()]] {
            let (code, _, err) = run(&cmd);
            assert_eq!(code, 2, "{cmd:?}: {err}");
            let want = format!("edited.ron:{}: `", line_of(from));
            assert!(err.contains(&want) && err.contains(shown) && err.contains("the plan was edited (recompile it)"), "{cmd:?}: `{err}` lacks `{want}`…`{shown}`");
        }
    }
    assert!(!d.join("t.json").exists());
    // options edited: the hash no longer matches them; invalid ones are named
    std::fs::write(d.join("ws3.ron"), text.replacen("world_size: 2,", "world_size: 3,", 1)).unwrap();
    let (code, _, err) = run(&["trace", d.join("ws3.ron").to_str().unwrap(), "-o", d.join("t.json").to_str().unwrap()]);
    assert!(code == 2 && err.contains("is not the hash of its model and options"), "{err}");
    std::fs::write(d.join("ws0.ron"), text.replacen("world_size: 2,", "world_size: 0,", 1)).unwrap();
    let (code, _, err) = run(&["diff", plan.to_str().unwrap(), d.join("ws0.ron").to_str().unwrap()]);
    assert!(code == 2 && err.contains("ws0.ron: the plan's options: invalid option --world-size"), "{err}");
    // the wrong model for a plan is refused, not used
    let (code, _, err) = run(&["diff", plan.to_str().unwrap(), plan.to_str().unwrap(), "--model", "models/tiny-gpt2.ron"]);
    assert!(code == 2 && err.contains("not the model the plan was compiled from"), "{err}");
    // a plan given where a model is expected says so
    let (code, _, err) = run(&[plan.to_str().unwrap()]);
    assert!(code == 2 && err.contains("this is a compiled plan, not a model"), "{err}");
}

/// `compile --format json` writes the same plan as JSON, which every plan reader takes; a
/// planning option typed beside a compiled plan (which carries its own) is refused by name.
#[test]
fn json_plans_and_options_beside_a_plan() {
    let tmp = scratch("jsonplan");
    let d = tmp.path();
    let (j, r) = (d.join("p.json"), d.join("p.ron"));
    let args = ["models/tiny-llama.ron", "--world-size", "2", "--batch", "2", "--seq", "8"];
    let (code, _, err) = run(&[&["compile"][..], &args, &["--format", "json", "-o", j.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(run(&[&["compile"][..], &args, &["-o", r.to_str().unwrap()]].concat()).0, 0);
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    let hash = doc["plan_hash"].as_str().unwrap();
    assert!(std::fs::read_to_string(&r).unwrap().contains(&format!("plan_hash: \"{hash}\"")));
    // read back and verified (hash, then replanned line by line) like the RON one
    let (code, out, err) = run(&["diff", j.to_str().unwrap(), r.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("peak"), "{out}");
    let t = d.join("t.json");
    assert_eq!(run(&["trace", j.to_str().unwrap(), "-o", t.to_str().unwrap()]).0, 0);
    let edited = d.join("edited.json");
    std::fs::write(&edited, std::fs::read_to_string(&j).unwrap().replacen("\"world_size\": 2,", "\"world_size\": 3,", 1)).unwrap();
    let (code, _, err) = run(&["trace", edited.to_str().unwrap(), "-o", t.to_str().unwrap()]);
    assert!(code == 2 && err.contains("is not the hash of its model and options"), "{err}");
    let (code, _, err) = run(&["plot", j.to_str().unwrap(), "-o", j.to_str().unwrap()]);
    assert!(code == 2 && err.contains("that is the input"), "{err}");
    // options beside a plan: every command that takes one
    let out = d.join("x.svg");
    let cases: &[(&[&str], &str)] = &[
        (&["trace", r.to_str().unwrap(), "--world-size", "4", "--seq", "16", "-o", out.to_str().unwrap()], "--world-size, --seq would be ignored"),
        (&["plot", j.to_str().unwrap(), "--policy", "none", "-o", out.to_str().unwrap()], "--policy would be ignored"),
        (&["diff", r.to_str().unwrap(), j.to_str().unwrap(), "--param-dtype", "bf16"], "--param-dtype would be ignored"),
        (&["run", r.to_str().unwrap(), "--batch", "4", "--steps", "1"], "--batch would be ignored"),
        (&["run", j.to_str().unwrap(), "--checkpoint", "LlamaDecoderLayer", "--steps", "1"], "--checkpoint would be ignored"),
    ];
    for (cmd, want) in cases {
        let (code, _, err) = run(cmd);
        assert!(code == 2 && err.contains(want) && err.contains("a compiled plan carries its own options"), "{cmd:?}: {err}");
    }
    assert!(!out.exists());
    // the defaults typed out are still typed: a plan's options are its own
    let (code, _, err) = run(&["trace", r.to_str().unwrap(), "--world-size", "8", "-o", out.to_str().unwrap()]);
    assert!(code == 2 && err.contains("--world-size would be ignored"), "{err}");
    // two models are not two plans: said so, and the options are not blamed
    let (code, _, err) = run(&["diff", "models/tiny-llama.ron", "models/tiny-gpt2.ron", "--world-size", "4"]);
    assert!(code == 2 && err.contains("models/tiny-llama.ron: not a compiled plan") && !err.contains("would be ignored"), "{err}");
    // JSON errors at a line:column counted from 1, the empty file said so
    let e = d.join("empty.json");
    std::fs::write(&e, "").unwrap();
    let (code, _, err) = run(&[e.to_str().unwrap()]);
    assert!(code == 2 && err.contains("empty.json:1:1: empty file"), "{err}");
    std::fs::write(&e, "{\"plan_hash\": 1, \"format_version\": 1}").unwrap();
    let (code, _, err) = run(&["trace", e.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(code == 2 && err.contains("empty.json:1:15: not a valid plan: invalid type: integer `1`") && !err.contains("at line"), "{err}");
}

/// An output path that is an input would replace it: refused before anything is written.
#[test]
fn an_output_that_is_an_input_is_refused() {
    let tmp = scratch("self");
    let d = tmp.path();
    let m = d.join("m.ron");
    std::fs::copy(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-llama.ron"), &m).unwrap();
    let before = std::fs::read(&m).unwrap();
    let (code, _, err) = run(&["compile", m.to_str().unwrap(), "-o", m.to_str().unwrap()]);
    assert!(code == 2 && err.contains("that is the input"), "{err}");
    let (code, _, err) = run(&["trace", m.to_str().unwrap(), "-o", m.to_str().unwrap()]);
    assert!(code == 2 && err.contains("that is the input"), "{err}");
    assert_eq!(std::fs::read(&m).unwrap(), before);
    // an -o in a missing directory names the output, not a temp file
    let out = d.join("nodir/x.ron");
    let (code, _, err) = run(&["compile", m.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(code == 2 && err.contains(&format!("{}: No such file", out.display())) && !err.contains(".tmp"), "{err}");
}

/// Model files: unknown fields (a misspelt `tied_to` would untie silently), values no kernel
/// can use, and a graph without its loss are refused by name.
#[test]
fn bad_model_values_are_named() {
    let tmp = scratch("model");
    let d = tmp.path();
    let tied = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-llama-tied.ron")).unwrap();
    let llama = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-llama.ron")).unwrap();
    // the loss op removed: the graph ends in lm_head
    let loss_at = llama.rfind("    (\n      name: \"loss\"").unwrap();
    let no_loss = format!("{}  ],\n)\n", &llama[..loss_at]);
    let cases: Vec<(String, String)> = vec![
        (tied.replacen("tied_to:", "tied_too:", 1), "Unexpected field named `tied_too`".into()),
        (llama.replacen("eps: ", "bogus: 1, eps: ", 1), "Unexpected field named `bogus`".into()),
        (llama.replacen("RmsNorm(eps: ", "RmsNorm(eps: -", 1), "eps -".into()),
        (llama.replacen("theta: ", "theta: -", 1), "rope theta -".into()),
        (llama.replacen("dtype: int64", "dtype: float32", 1), "holds token ids but has dtype float32".into()),
        (no_loss, "op lm_head: the last op must be the loss (cross_entropy)".into()),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        assert_ne!(text, &llama, "case {i} edits nothing");
        let f = d.join(format!("m{i}.ron"));
        std::fs::write(&f, text).unwrap();
        let (code, _, err) = run(&[f.to_str().unwrap(), "--world-size", "2"]);
        assert_eq!(code, 2, "case {i}: {err}");
        assert!(err.contains(want.as_str()) && err.contains(&format!("m{i}.ron")), "case {i}: `{err}` lacks `{want}`");
    }
}

/// `calibrate` fits to a measured trace of the very plan it is given: a predicted trace, or
/// one of another plan, is refused.
#[test]
fn calibrate_refuses_a_predicted_trace() {
    let tmp = scratch("calib");
    let d = tmp.path();
    let t = d.join("predicted.json");
    let (code, _, err) = run(&["trace", "models/tiny-llama.ron", "--world-size", "2", "--batch", "2", "--seq", "8", "--device", "cpu", "-o", t.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let out = d.join("fit.ron");
    let (code, _, err) = run(&["calibrate", "models/tiny-llama.ron", "--world-size", "2", "--batch", "2", "--seq", "8", "--trace", t.to_str().unwrap(), "--hardware", "cpu", "-o", out.to_str().unwrap()]);
    assert!(code == 2 && err.contains("a predicted trace") && err.contains("calibrate from `run --trace`"), "{err}");
    // marked measured, but of another plan (world size 2 vs 4)
    let doc = std::fs::read_to_string(&t).unwrap().replacen("\"hardware\":\"", "\"hardware\":\"measured: ", 1);
    std::fs::write(&t, doc).unwrap();
    let (code, _, err) = run(&["calibrate", "models/tiny-llama.ron", "--world-size", "4", "--batch", "2", "--seq", "8", "--trace", t.to_str().unwrap(), "--hardware", "cpu", "-o", out.to_str().unwrap()]);
    assert!(code == 2 && err.contains("measured for plan") && err.contains("give the options of the run that wrote it"), "{err}");
    assert!(!out.exists());
}

/// What a new user hit first (issue 27): sizes as people write them, contradictions refused,
/// GPT-2's positions respected, `| head` quiet, lists in `sweep`, a verdict on the peak.
#[test]
fn a_new_users_first_commands() {
    // `--memory-limit 80G` (= GiB) and the verdict with its headroom, text and JSON
    let (code, out, err) = run(&["models/llama-3-8b.ron", "--summary", "--memory-limit", "80G", "--param-dtype", "bf16"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("fits in 80.00 GiB (--memory-limit) with"), "{out}");
    assert!(!out.contains("schedule ("), "--summary prints no schedule: {out}");
    let (code, out, err) = run(&["models/llama-3-8b.ron", "--format", "json", "--memory-limit", "10GiB"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["fits"]["fits"], false);
    assert_eq!(v["fits"]["memory_limit_bytes"], 10u64 << 30);
    assert!(v["fits"]["headroom_bytes"].as_i64().unwrap() < 0);
    let (code, _, err) = run(&["models/tiny-llama.ron", "--memory-limit", "80Q"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--memory-limit `80Q`: unknown unit `q`"), "{err}");
    // contradictory options are an error, not silently full-shard
    let (code, _, err) = run(&["models/tiny-llama.ron", "--strategy", "shard-grad-op", "--reshard-after-forward", "true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reshard-after-forward: true contradicts --strategy shard-grad-op"), "{err}");
    // GPT-2's 1024 learned positions bound the default sequence length
    let (code, out, err) = run(&["models/gpt2.ron", "--summary"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("batch 1 × seq 1024 per rank"), "{out}");
    // the header names options as the flags take them
    assert!(out.contains("layout fsdp2 · strategy full-shard") && out.contains("optimizer adamw") && out.contains("device cuda"), "{out}");
    // a size policy that splits a tied weight says which policy did
    let (code, _, err) = run(&["models/tiny-llama-tied.ron", "--policy", "size:1000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("wrap policy `size:1000`"), "{err}");
    // `plan … | head`: the reader leaves early; the plan ends quietly
    let mut child = bin().args(["models/llama-3-8b.ron", "--full-schedule"]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    {
        use std::io::BufRead;
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        assert!(first.starts_with("plan for llama-3-8b"), "{first}");
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"), "{}", String::from_utf8_lossy(&o.stderr));
    // sweep takes lists of batch, seq, checkpointing, reshard and dtypes
    let (code, out, err) = run(&["sweep", "models/tiny-llama.ron", "--world-size", "2", "--batch", "1,2", "--seq", "16,32", "--checkpoint", "none,LlamaDecoderLayer", "--reshard-after-forward", "true,false", "--param-dtype", "none,bf16", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 2 * 2 * 2 * 2 * 2);
}

/// `diff`: `--policy` twice (a third is refused by name), the options that differ shown for
/// compiled plans, `--format json`, and a hint when a compiled plan's model is found by name
/// but is another file.
#[test]
fn diff_shows_differing_options_and_speaks_json() {
    let (code, _, err) = run(&["diff", "models/tiny-llama.ron", "--policy", "auto", "--policy", "none", "--policy", "size:1000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("give --policy twice (got 3: auto, none, size:1000)"), "{err}");
    let tmp = tempfile::Builder::new().prefix("fsdp-plan-diff-").tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = (dir.join("a.ron"), dir.join("b.ron"));
    assert_eq!(run(&["compile", "models/tiny-llama.ron", "--world-size", "2", "-o", a.to_str().unwrap()]).0, 0);
    assert_eq!(run(&["compile", "models/tiny-llama.ron", "--world-size", "2", "--checkpoint", "LlamaDecoderLayer", "--reshard-after-forward", "false", "-o", b.to_str().unwrap()]).0, 0);
    let (code, out, err) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = |k: &str| v["rows"].as_array().unwrap().iter().find(|r| r["key"] == k).cloned().unwrap_or_else(|| panic!("no row {k}: {out}"));
    assert_eq!(row("checkpoint")["b"], "LlamaDecoderLayer");
    assert_eq!(row("reshard after forward")["b"], "false");
    assert_eq!(row("peak memory")["differs"], true);
    // an imported config named like a shipped model: the shipped file is not its model
    let cfg = dir.join("tiny-llama.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("models/tiny-llama.config.json").unwrap()).unwrap();
    c["num_hidden_layers"] = 3.into();
    std::fs::write(&cfg, c.to_string()).unwrap();
    let p = dir.join("c.ron");
    assert_eq!(run(&["compile", cfg.to_str().unwrap(), "--world-size", "2", "-o", p.to_str().unwrap()]).0, 0);
    let (code, _, err) = run(&["trace", p.to_str().unwrap(), "-o", dir.join("t.json").to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("pass that one with --model FILE"), "{err}");
    assert_eq!(run(&["trace", p.to_str().unwrap(), "--model", cfg.to_str().unwrap(), "-o", dir.join("t.json").to_str().unwrap()]).0, 0);
}

/// `--float8` (torchao float8 linears): weights gathered in float8 halve the layers'
/// all-gather bytes (the exact collectives and peaks are tests/conformance.rs's fixtures);
/// refused on a part without float8 tensor cores, without --float8 for --float8-all-gather,
/// on a linear `_scaled_mm` cannot take, and by the runtime.
#[test]
fn float8_is_planned_and_refused_where_it_cannot_run() {
    let base = ["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--batch", "1", "--seq", "4096", "--param-dtype", "bf16", "--format", "json"];
    let ag = |extra: &[&str]| -> f64 {
        let (code, out, err) = run(&[&base[..], extra].concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let size = |d: &str| match d {
            "bfloat16" => 2.0,
            "uint8" | "float8_e4m3fn" => 1.0,
            other => panic!("{other}"),
        };
        v["collectives"].as_array().unwrap().iter().filter(|c| c["kind"] == "all_gather").map(|c| c["numel"].as_f64().unwrap() * size(c["dtype"].as_str().unwrap())).sum()
    };
    let (plain, f8) = (ag(&[]), ag(&["--float8", "tensorwise", "--float8-all-gather"]));
    assert!(f8 < 0.8 * plain && f8 > 0.45 * plain, "{f8} vs {plain}");
    let (code, _, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--hardware", "a100-80gb", "--float8", "tensorwise"]);
    assert!(code == 2 && err.contains("a100-80gb has no float8 tensor cores"), "{err}");
    for cmd in ["trace", "sweep"] {
        let mut args = vec![cmd, "models/llama-3.1-8b.ron", "--world-size", "8", "--hardware", "a100-80gb", "--float8", "tensorwise"];
        if cmd == "trace" {
            args.extend(["-o", "/dev/null"]);
        }
        let (code, _, err) = run(&args);
        assert!(code == 2 && err.contains("no float8 tensor cores"), "{cmd}: {err}");
    }
    let (code, _, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--float8-all-gather"]);
    assert!(code == 2 && err.contains("--float8"), "{err}");
    let (code, _, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--float8", "rowwise", "--float8-all-gather"]);
    assert!(code == 2 && err.contains("tensorwise scaling only"), "{err}");
    // float8 weights whose dim 0 splits unevenly over the shard group: FSDP2 + torchao cannot
    // gather them (4,096 rows over 3 ranks; and over HSDP's shard groups of 3)
    for extra in [&["--world-size", "3"][..], &["--world-size", "6", "--strategy", "hybrid-shard", "--shard-group-size", "3"][..]] {
        let (code, _, err) = run(&[&["plan", "models/llama-3.1-8b.ron", "--float8", "tensorwise", "--float8-all-gather"][..], extra].concat());
        assert!(code == 2 && err.contains("`model.layers.0.self_attn.q_proj.weight`'s dim 0 (4096) does not split evenly over the shard group's 3 ranks"), "{extra:?}: {err}");
    }
    assert!(ag(&["--float8", "rowwise"]) == plain);
    let (code, _, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--float8", "tensorwise", "--float8-all-gather", "--checkpoint", "LlamaDecoderLayer", "--ac-mode", "selective-op"]);
    assert!(code == 2 && err.contains("--float8-all-gather") && err.contains("--ac-wrapper torchtitan"), "{err}");
    // torchtitan's float8 recipe under its op-level SAC: the checkpoint wrapper inside fully_shard
    let (code, out, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--float8", "tensorwise", "--float8-all-gather", "--checkpoint", "LlamaDecoderLayer", "--ac-mode", "selective-op", "--ac-wrapper", "torchtitan", "--summary"]);
    assert!(code == 0 && out.contains("float8 linears (tensorwise") && out.contains("checkpoints: torchtitan's checkpoint_wrapper"), "{out}{err}");
    let (code, out, err) = run(&["plan", "models/llama-2-7b.ron", "--world-size", "8", "--train-loop", "torchtitan-2024", "--summary"]);
    assert!(code == 0 && out.contains("training loop: torchtitan-2024"), "{out}{err}");
    // float8 linears whose weights are gathered as they are: under op-level SAC too
    let (code, out, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--float8", "tensorwise", "--checkpoint", "LlamaDecoderLayer", "--ac-mode", "selective-op", "--summary"]);
    assert!(code == 0 && out.contains("float8 linears (tensorwise)\n"), "{out}{err}");
    let (code, out, err) = run(&["plan", "models/llama-3.1-8b.ron", "--world-size", "8", "--float8", "rowwise", "--summary"]);
    assert!(code == 0 && out.contains("float8 linears (rowwise)\n"), "{out}{err}");
    // torchtitan's filter: a linear whose dims are not multiples of 16 stays in high precision
    let (code, _, err) = run(&["plan", "models/tiny-qwen3.ron", "--world-size", "2", "--float8", "tensorwise", "--summary"]);
    assert!(code == 0 && err.contains("linear(s) left in high precision") && err.contains("model.layers.0.self_attn.q_proj"), "{err}");
}

/// `--offload cpu` (FSDP2's CPUOffloadPolicy): the device keeps no shards, grads or optimizer
/// state (FSDP2-exact: tests/conformance.rs), the host's share is printed beside the device's
/// peak; under `--device cpu` it plans the CPU runtime's host, measured apart from its device
/// (runtime/tests/memory_parity.rs); what is not modelled yet is refused by name.
#[test]
fn offload_moves_the_sharded_state_to_the_host_and_refuses_what_it_cannot_plan() {
    let base = ["plan", "models/llama-3-8b.ron", "--world-size", "8", "--batch", "1", "--seq", "4096", "--param-dtype", "bf16", "--reduce-dtype", "f32"];
    let peak = |extra: &[&str]| -> serde_json::Value {
        let (code, out, err) = run(&[&base[..], extra, &["--format", "json"]].concat());
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["memory"].clone()
    };
    let (on, off) = (peak(&["--offload", "cpu"]), peak(&[]));
    for c in ["sharded_param", "optstate"] {
        assert!(off["breakdown"][c].as_u64().unwrap() > 1 << 30 && on["breakdown"][c].as_u64() == Some(0), "{c}: {on} vs {off}");
    }
    let host = &on["host"];
    assert_eq!(host["sharded_param"], off["breakdown"]["sharded_param"], "{host}");
    assert!(off["host"].is_null() && host["peak_bytes"].as_u64().unwrap() > host["sharded_param"].as_u64().unwrap() * 3, "{host}");
    let (code, out, err) = run(&[&base[..], &["--offload", "cpu", "--summary"]].concat());
    assert!(code == 0 && out.contains("offload: CPUOffloadPolicy") && out.contains("host memory (CPU offload, rank 0)"), "{out}{err}");
    let on_cpu = peak(&["--offload", "cpu", "--device", "cpu"]);
    assert!(on_cpu["breakdown"]["sharded_param"].as_u64() == Some(0) && on_cpu["host"]["sharded_param"] == host["sharded_param"], "{on_cpu}");
    for (extra, why) in [
        (&["--layout", "flat"][..], "not with --layout flat"),
        (&["--strategy", "shard-grad-op"][..], "full-shard or hybrid-shard only"),
    ] {
        let (code, _, err) = run(&[&base[..], &["--offload", "cpu"], extra].concat());
        assert!(code == 2 && err.contains("--offload") && err.contains(why), "{extra:?}: {err}");
    }
}

/// A plan whose tensors outgrow the device: the caching-allocator replay stops at the device's
/// size (its reserved peak is then no measure), and the verdict says it does not fit — in
/// text and in JSON — by at least the tensor peak over the device.
#[test]
fn a_plan_past_the_device_does_not_fit() {
    let m = format!("{}/models/llama-3.1-405b.ron", env!("CARGO_MANIFEST_DIR"));
    let (code, out, err) = run(&[&m, "--world-size", "8", "--batch", "1", "--seq", "4096", "--summary"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("a request fails: CUDA out of memory") && out.contains("does not fit in 79.65 GiB (h100-sxm)"), "{out}");
    let (code, out, err) = run(&[&m, "--world-size", "8", "--batch", "1", "--seq", "4096", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["fits"]["fits"], false, "{}", v["fits"]);
    assert!(v["fits"]["needed_bytes"].as_u64().unwrap() >= v["memory"]["peak_bytes"].as_u64().unwrap(), "{}", v["fits"]);
}

/// FSDP2 shards on dim 0: Mixtral's experts (8 stacked on dim 0) over 64 ranks leave every
/// rank a whole expert of each — 1/8, not 1/64 — which `plan` notes on stderr with the bytes
/// (worked by hand: per layer, one expert's row of gate_up_proj [8, 28672, 4096], down_proj
/// [8, 4096, 14336] and the router [8, 4096] in bf16, less the even 8/64 of a row, times 32
/// layers); nothing is noted where every dim 0 covers the group.
#[test]
fn plan_notes_parameters_shorter_than_the_shard_group() {
    let (code, _, err) = run(&["models/mixtral-8x7b.ron", "--world-size", "64", "--summary"]);
    assert_eq!(code, 0, "{err}");
    // a rank's extra: one row of each where an even split holds 8/64 of a row, 2 bytes per
    // element
    let row = (28672 * 4096 + 4096 * 14336 + 4096) * 2u64;
    let extra = 32 * (row - row * 8 / 64);
    assert_eq!(extra, 9_865_232_384);
    let gib = format!("({:.2} GiB more per rank than an even 1/64)", extra as f64 / (1u64 << 30) as f64);
    assert!(err.contains("96 parameter(s) have dim 0 below the shard group of 64 ranks") && err.contains(&gib) && err.contains("32 × model.layers.*.mlp.experts.gate_up_proj [8, 28672, 4096]"), "{gib}: {err}");
    let (code, _, err) = run(&["models/mixtral-8x7b.ron", "--world-size", "8", "--summary"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("Shard(0)"), "{err}");
}
