//! `import hf` against HF transformers 5.17.0: parameter names, shapes, tied aliases,
//! buffers and `sum(p.numel())` equal what `AutoModelForCausalLM.from_config` builds
//! (fixtures written by `harness/hf_params.py`), and the shipped `models/*.ron` are what
//! the importer makes from the config.json beside them.

use serde_json::Value;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn params_equal_hf() {
    let dir = root().join("tests/fixtures/hf_params");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let f: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(f["transformers_version"], "5.17.0", "{}", p.display());
        let config = f["config"].as_str().unwrap();
        let text = std::fs::read_to_string(root().join(config)).unwrap();
        let m = fsdp_ir::hf::import_hf(&text, config, "m").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.architecture, f["architecture"].as_str().unwrap(), "{config}");
        assert_eq!(m.total_numel(), f["total_numel"].as_u64().unwrap(), "{config}: sum(p.numel())");
        type P = (String, Vec<u64>, String, Option<String>);
        let want: Vec<P> = f["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect(),
                    p["dtype"].as_str().unwrap().to_string(),
                    p["tied_to"].as_str().map(String::from),
                )
            })
            .collect();
        let got: Vec<P> = m
            .params
            .iter()
            .map(|p| (p.name.clone(), p.shape.clone(), p.dtype.torch_name().to_string(), p.tied_to.clone()))
            .collect();
        assert_eq!(got, want, "{config}: parameters differ from HF");
        let want_b: Vec<(String, Vec<u64>)> = f["buffers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["name"].as_str().unwrap().to_string(), b["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()))
            .collect();
        let got_b: Vec<(String, Vec<u64>)> = m.buffers.iter().map(|b| (b.name.clone(), b.shape.clone())).collect();
        assert_eq!(got_b, want_b, "{config}: buffers differ from HF");
        let want_m: Vec<(String, String)> = f["modules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (x["path"].as_str().unwrap().to_string(), x["class"].as_str().unwrap().to_string()))
            .collect();
        let got_m: Vec<(String, String)> = m.modules.iter().map(|x| (x.path.clone(), x.class.clone())).collect();
        assert_eq!(got_m, want_m, "{config}: module tree differs from HF");
        n += 1;
    }
    let configs = std::fs::read_dir(root().join("models"))
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".config.json")))
        .count();
    assert_eq!(n, configs, "a fixture per shipped config (harness/hf_params.py NAME writes one)");
}

#[test]
fn shipped_models_are_generated_from_their_configs() {
    for e in std::fs::read_dir(root().join("models")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".config.json") else { continue };
        let text = std::fs::read_to_string(&p).unwrap();
        let m = fsdp_ir::hf::import_hf(&text, &name, stem).unwrap();
        let ron_path = root().join("models").join(format!("{stem}.ron"));
        let shipped = std::fs::read_to_string(&ron_path).unwrap_or_else(|_| panic!("{} missing", ron_path.display()));
        assert!(
            shipped == fsdp_ir::to_ron(&m),
            "{}: out of date; regenerate with `fsdp-plan import hf {} -o {}`",
            ron_path.display(),
            p.display(),
            ron_path.display()
        );
        fsdp_ir::parse_model(&shipped, &ron_path.display().to_string()).unwrap();
    }
}

/// Config values the importer cannot honour are refused by name: a rope scaling it does not
/// compute (the runtime would silently differ from HF), wrong types, absurd depths.
#[test]
fn unsupported_or_malformed_config_values_are_named() {
    let base: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join("models/tiny-llama.config.json")).unwrap()).unwrap();
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("rope_scaling", serde_json::json!({"rope_type": "dynamic", "factor": 4.0}), "`rope_scaling.rope_type` `dynamic` is not supported (default, linear, llama3 or yarn)"),
        ("rope_scaling", serde_json::json!({"rope_type": "yarn", "factor": 4.0}), "`rope_scaling.original_max_position_embeddings` must be a positive integer (yarn rope scaling)"),
        ("rope_scaling", serde_json::json!("yes"), "`rope_scaling` must be an object or null"),
        ("rope_scaling", serde_json::json!({"rope_type": "llama3", "factor": 8.0}), "`rope_scaling.low_freq_factor` must be a number"),
        ("architectures", serde_json::json!("LlamaForCausalLM"), "`architectures` must be a list of class names"),
        ("num_hidden_layers", serde_json::json!(1_000_000_000u64), "`num_hidden_layers` 1000000000: at most 16384"),
    ];
    for (k, v, want) in cases {
        let mut c = base.clone();
        c[k] = v;
        let e = fsdp_ir::hf::import_hf(&c.to_string(), "c.json", "c").unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("c.json"), "{k}: `{e}` lacks `{want}`");
    }
    // llama3 scaling is imported (and computed by the runtime: runtime/tests/hf_parity.rs, tiny-llama31)
    let mut c = base.clone();
    c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let m = fsdp_ir::hf::import_hf(&c.to_string(), "c.json", "c").unwrap();
    assert!(m.ops.iter().any(|o| matches!(o.kind, fsdp_ir::OpKind::RotaryEmbedding { scaling: Some(fsdp_ir::RopeScaling::Llama3 { factor, .. }), .. } if factor == 8.0)));
}

/// DeepSeek configs the latent attention or the routers cannot take are refused by name.
#[test]
fn deepseek_configs_refused_by_name() {
    let v3: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join("models/tiny-deepseek-v3.config.json")).unwrap()).unwrap();
    let v2: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join("models/tiny-deepseek-v2.config.json")).unwrap()).unwrap();
    let cases: Vec<(&serde_json::Value, &str, serde_json::Value, &str)> = vec![
        (&v3, "num_key_value_heads", serde_json::json!(2), "num_key_value_heads 2 differs from num_attention_heads 4"),
        (&v3, "qk_rope_head_dim", serde_json::json!(3), "qk_rope_head_dim 3 must be even"),
        (&v3, "n_group", serde_json::json!(8), "must split into n_group 8 groups of at least 2 experts"),
        (&v3, "topk_group", serde_json::json!(3), "topk_group 3 must be between 1 and n_group 2"),
        (&v2, "num_experts_per_tok", serde_json::Value::Null, "`num_experts_per_tok` must be set"),
        (&v2, "topk_method", serde_json::json!("noaux_tc"), "`topk_method` `noaux_tc` is not one DeepseekV2TopkRouter has"),
    ];
    for (base, k, v, want) in cases {
        let mut c = base.clone();
        c[k] = v;
        let e = fsdp_ir::hf::import_hf(&c.to_string(), "c.json", "c").unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("c.json"), "{k}: `{e}` lacks `{want}`");
    }
    // an explicit null q_lora_rank is one q_proj (V2-Lite); absent, the default rank's latent
    let mut c = v2.clone();
    c.as_object_mut().unwrap().remove("q_lora_rank");
    let m = fsdp_ir::hf::import_hf(&c.to_string(), "c.json", "c").unwrap();
    assert!(m.params.iter().any(|p| p.name == "model.layers.0.self_attn.q_a_proj.weight" && p.shape == vec![1536, 32]));
    let m = fsdp_ir::hf::import_hf(&v2.to_string(), "c.json", "c").unwrap();
    assert!(m.params.iter().any(|p| p.name == "model.layers.0.self_attn.q_proj.weight"));
}

/// What `import hf` says of a config: nothing unknown in any shipped config; a misspelt key
/// named with the key it resembles (also inside the error it causes); the keys that took
/// transformers' defaults; a model_type contradicting the architecture refused.
#[test]
fn import_names_unknown_and_defaulted_keys() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for e in std::fs::read_dir(root.join("models")).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().ends_with(".config.json") {
            let text = std::fs::read_to_string(&p).unwrap();
            let (_, notes) = fsdp_ir::hf::import_hf_report(&text, "c", "m", None).unwrap();
            assert!(notes.iter().all(|n| !n.starts_with("unknown key")), "{}: {notes:?}", p.display());
        }
    }
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("models/tiny-llama.config.json")).unwrap()).unwrap();
    let hidden = c["hidden_size"].take();
    c.as_object_mut().unwrap().remove("hidden_size");
    c["hiden_size"] = hidden;
    // the default hidden size (4096) does not divide into the config's heads' widths… or does:
    // either way the typo is named
    match fsdp_ir::hf::import_hf_report(&c.to_string(), "c.json", "m", None) {
        Ok((_, notes)) => {
            assert!(notes.iter().any(|n| n == "unknown key `hiden_size` ignored (did you mean `hidden_size`?)"), "{notes:?}");
            assert!(notes.iter().any(|n| n.contains("took transformers 5.17's defaults") && n.contains("hidden_size = 4096")), "{notes:?}");
        }
        Err(e) => assert!(e.to_string().contains("did you mean `hidden_size`?"), "{e}"),
    }
    let mut q: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("models/qwen2-7b.config.json")).unwrap()).unwrap();
    q["model_type"] = "gemma2".into();
    let e = fsdp_ir::hf::import_hf_report(&q.to_string(), "q.json", "m", None).unwrap_err().to_string();
    assert!(e.contains("`model_type` `gemma2` and `architectures` [Qwen2ForCausalLM] name different models"), "{e}");
}
