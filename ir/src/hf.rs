//! `import hf`: builds a model IR from a Hugging Face `config.json`.
//!
//! Parameter names, shapes, module paths and class names follow transformers 5.17.0;
//! keys missing from the config take that version's config-class defaults, so a partial
//! config imports to the parameters HF builds from it. Supported: GPT2LMHeadModel,
//! LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
//! MixtralForCausalLM, Qwen3MoeForCausalLM, Olmo2ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (also the text
//! model of a Gemma3ForConditionalGeneration config: its `text_config`).

use crate::error::IrError;
use crate::model::*;
use serde_json::Value;

/// The HF families this importer knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Gpt2,
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Mixtral,
    Qwen3Moe,
    Olmo2,
    Gemma2,
    Gemma3,
    Phi3,
    DeepseekV2,
    DeepseekV3,
}

impl Family {
    const ALL: [Family; 13] = [Family::Gpt2, Family::Llama, Family::Mistral, Family::Qwen2, Family::Qwen3, Family::Mixtral, Family::Qwen3Moe, Family::Olmo2, Family::Gemma2, Family::Gemma3, Family::Phi3, Family::DeepseekV2, Family::DeepseekV3];

    /// `not a supported model (supported: gpt2 (GPT2LMHeadModel), llama (…), …)`.
    fn unsupported() -> String {
        let known: Vec<String> = Family::ALL.iter().map(|f| format!("{} ({})", f.model_type(), f.architecture())).collect();
        format!("not a model this importer knows (it knows {})", known.join(", "))
    }
    /// HF's `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Mixtral => "mixtral",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Olmo2 => "olmo2",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3_text",
            Family::Phi3 => "phi3",
            Family::DeepseekV2 => "deepseek_v2",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }
    fn from_model_type(t: &str) -> Option<Family> {
        Some(match t {
            "gpt2" => Family::Gpt2,
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "mixtral" => Family::Mixtral,
            "qwen3_moe" => Family::Qwen3Moe,
            "olmo2" => Family::Olmo2,
            "gemma2" => Family::Gemma2,
            "gemma3_text" => Family::Gemma3,
            "phi3" => Family::Phi3,
            "deepseek_v2" => Family::DeepseekV2,
            "deepseek_v3" => Family::DeepseekV3,
            _ => return None,
        })
    }
    fn from_architecture(a: &str) -> Option<Family> {
        Some(match a {
            "GPT2LMHeadModel" => Family::Gpt2,
            "LlamaForCausalLM" => Family::Llama,
            "MistralForCausalLM" => Family::Mistral,
            "Qwen2ForCausalLM" => Family::Qwen2,
            "Qwen3ForCausalLM" => Family::Qwen3,
            "MixtralForCausalLM" => Family::Mixtral,
            "Qwen3MoeForCausalLM" => Family::Qwen3Moe,
            "Olmo2ForCausalLM" => Family::Olmo2,
            "Gemma2ForCausalLM" => Family::Gemma2,
            "Gemma3ForCausalLM" => Family::Gemma3,
            "Phi3ForCausalLM" => Family::Phi3,
            "DeepseekV2ForCausalLM" => Family::DeepseekV2,
            "DeepseekV3ForCausalLM" => Family::DeepseekV3,
            _ => return None,
        })
    }
    /// HF class-name prefix (`Llama`, `Mistral`, …).
    fn prefix(self) -> &'static str {
        match self {
            Family::Gpt2 => "GPT2",
            Family::Llama => "Llama",
            Family::Mistral => "Mistral",
            Family::Qwen2 => "Qwen2",
            Family::Qwen3 => "Qwen3",
            Family::Mixtral => "Mixtral",
            Family::Qwen3Moe => "Qwen3Moe",
            Family::Olmo2 => "Olmo2",
            Family::Gemma2 => "Gemma2",
            Family::Gemma3 => "Gemma3",
            Family::Phi3 => "Phi3",
            Family::DeepseekV2 => "DeepseekV2",
            Family::DeepseekV3 => "DeepseekV3",
        }
    }
    pub fn architecture(self) -> String {
        match self {
            Family::Gpt2 => "GPT2LMHeadModel".into(),
            f => format!("{}ForCausalLM", f.prefix()),
        }
    }
    /// The decoder-layer class (what `_no_split_modules` names).
    pub fn layer_class(self) -> String {
        match self {
            Family::Gpt2 => "GPT2Block".into(),
            f => format!("{}DecoderLayer", f.prefix()),
        }
    }
}

struct Cfg<'a> {
    v: &'a Value,
    file: &'a str,
    /// The keys the importer read, and those it gave transformers' default (with the value).
    used: std::cell::RefCell<std::collections::BTreeSet<String>>,
    defaulted: std::cell::RefCell<Vec<(String, String)>>,
}

/// Keys of HF's `PretrainedConfig` and of the supported families' configs that change no
/// parameter and no op of training (generation, tokenizer ids, initialization, aux losses):
/// read by nobody here, and no typo.
const IGNORED_KEYS: &[&str] = &[
    "_name_or_path", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "use_cache", "initializer_range", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "tie_encoder_decoder", "is_encoder_decoder", "is_decoder",
    "add_cross_attention", "chunk_size_feed_forward", "pruned_heads", "problem_type", "id2label", "label2id",
    "num_labels", "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "temperature", "top_k", "top_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "quantization_config", "attn_implementation", "_attn_implementation", "pretraining_tp",
    "max_position_embeddings", "n_ctx", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "layer_types", "use_mrope", "rope_scaling", "rope_parameters", "rope_theta", "torch_dtype", "dtype",
    "architectures", "model_type", "gradient_checkpointing", "use_bfloat16", "bias", "auto_map",
    "output_past", "max_window_layers",
    // DeepSeek's hub configs: transformers' DeepseekV3 reads none of them (its router is the
    // sigmoid, group-limited `noaux_tc` one; no multi-token-prediction layer is built)
    "ep_size", "moe_layer_freq", "num_nextn_predict_layers", "scoring_func", "topk_method", "aux_loss_alpha",
    "seq_aux", "num_mtp_layers",
];

/// The closest of `known` to `k` within two edits (Levenshtein), for "did you mean".
fn closest<'a>(k: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let d = |a: &str, b: &str| {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.iter().enumerate() {
            let mut cur = vec![i + 1];
            for (j, cb) in b.iter().enumerate() {
                cur.push((prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
            }
            prev = cur;
        }
        prev[b.len()]
    };
    known.map(|c| (d(k, c), c)).filter(|&(n, _)| n <= 2).min().map(|x| x.1)
}

impl Cfg<'_> {
    fn err(&self, msg: impl Into<String>) -> IrError {
        IrError::Import {
            file: self.file.to_string(),
            message: msg.into(),
        }
    }
    fn get(&self, k: &str) -> Option<&Value> {
        self.used.borrow_mut().insert(k.to_string());
        self.v.get(k).filter(|x| !x.is_null())
    }
    /// Records that `k` was absent and took `default`.
    fn default<T: std::fmt::Display>(&self, k: &str, default: T) -> T {
        self.defaulted.borrow_mut().push((k.to_string(), default.to_string()));
        default
    }
    fn u(&self, k: &str, default: u64) -> Result<u64, IrError> {
        match self.get(k) {
            None => Ok(self.default(k, default)),
            Some(x) => x
                .as_u64()
                .filter(|&n| n > 0)
                .ok_or_else(|| self.err(format!("`{k}` must be a positive integer, got {x}"))),
        }
    }
    fn opt_u(&self, k: &str) -> Result<Option<u64>, IrError> {
        match self.get(k) {
            None => Ok(None),
            Some(_) => self.u(k, 0).map(Some),
        }
    }
    fn f(&self, k: &str, default: f64) -> Result<f64, IrError> {
        match self.get(k) {
            None => Ok(self.default(k, default)),
            Some(x) => x
                .as_f64()
                .ok_or_else(|| self.err(format!("`{k}` must be a number, got {x}"))),
        }
    }
    fn b(&self, k: &str, default: bool) -> Result<bool, IrError> {
        match self.get(k) {
            None => Ok(self.default(k, default)),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| self.err(format!("`{k}` must be true or false, got {x}"))),
        }
    }
    fn s<'b>(&'b self, k: &str, default: &'b str) -> Result<&'b str, IrError> {
        match self.get(k) {
            None => {
                self.default(k, default);
                Ok(default)
            }
            Some(x) => x
                .as_str()
                .ok_or_else(|| self.err(format!("`{k}` must be a string, got {x}"))),
        }
    }
    /// `rope_scaling` (hub configs) or `rope_parameters` (transformers 5): `None` for the
    /// default rope, Llama 3.1's scaling, or an error naming a type we do not compute.
    fn rope_scaling(&self) -> Result<Option<RopeScaling>, IrError> {
        let r = match (self.get("rope_scaling"), self.get("rope_parameters")) {
            (Some(r), _) if !r.is_null() => ("rope_scaling", r),
            (_, Some(r)) if !r.is_null() => ("rope_parameters", r),
            _ => return Ok(None),
        };
        let (key, r) = r;
        let Some(o) = r.as_object() else { return Err(self.err(format!("`{key}` must be an object or null, got {r}"))) };
        let kind = o.get("rope_type").or_else(|| o.get("type")).map(|t| t.as_str().ok_or_else(|| self.err(format!("`{key}.rope_type` must be a string, got {t}")))).transpose()?;
        let num = |k: &str| -> Result<f64, IrError> {
            o.get(k).and_then(|x| x.as_f64()).ok_or_else(|| self.err(format!("`{key}.{k}` must be a number ({} rope scaling)", kind.unwrap_or("default"))))
        };
        match kind.unwrap_or("default") {
            "default" => Ok(None),
            "llama3" => Ok(Some(RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: o
                    .get("original_max_position_embeddings")
                    .and_then(|x| x.as_u64())
                    .ok_or_else(|| self.err(format!("`{key}.original_max_position_embeddings` must be a positive integer (llama3 rope scaling)")))?,
            })),
            "linear" => Ok(Some(RopeScaling::Linear { factor: num("factor")? })),
            "yarn" => {
                // transformers' `_compute_yarn_parameters`: the factor (else max positions over
                // the original ones), the cos/sin scale from `mscale` / `mscale_all_dim`
                let opt = |k: &str| o.get(k).filter(|x| !x.is_null()).map(|x| x.as_f64().ok_or_else(|| self.err(format!("`{key}.{k}` must be a number (yarn rope scaling)")))).transpose();
                let original = o
                    .get("original_max_position_embeddings")
                    .and_then(|x| x.as_u64())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| self.err(format!("`{key}.original_max_position_embeddings` must be a positive integer (yarn rope scaling)")))?;
                let factor = match opt("factor")? {
                    Some(f) => f,
                    None => self.u("max_position_embeddings", 4096)? as f64 / original as f64,
                };
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let attention_factor = match (opt("attention_factor")?, opt("mscale")?, opt("mscale_all_dim")?) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => get_mscale(factor, m) / get_mscale(factor, ma),
                    _ => get_mscale(factor, 1.0),
                };
                let truncate = match o.get("truncate") {
                    None | Some(Value::Null) => true,
                    Some(x) => x.as_bool().ok_or_else(|| self.err(format!("`{key}.truncate` must be true or false")))?,
                };
                Ok(Some(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: opt("beta_fast")?.filter(|&x| x != 0.0).unwrap_or(32.0),
                    beta_slow: opt("beta_slow")?.filter(|&x| x != 0.0).unwrap_or(1.0),
                    attention_factor,
                    truncate,
                }))
            }
            t => Err(self.err(format!("`{key}.rope_type` `{t}` is not supported (default, linear, llama3 or yarn)"))),
        }
    }
    fn rope_theta(&self, default: f64) -> Result<f64, IrError> {
        if let Some(t) = self.get("rope_parameters").and_then(|r| r.get("rope_theta")) {
            return t.as_f64().ok_or_else(|| self.err("`rope_parameters.rope_theta` must be a number"));
        }
        self.f("rope_theta", default)
    }
}

/// The sizes every decoder family reads first, in this order (the note of defaulted keys
/// lists them so): vocabulary, hidden, intermediate, layers (at most [`MAX_LAYERS`]), heads.
struct Sizes {
    vocab: u64,
    d: u64,
    inter: u64,
    layers: u64,
    heads: u64,
}

impl Cfg<'_> {
    /// [`Sizes`] with these defaults (the family's config class's).
    fn sizes(&self, vocab: u64, d: u64, inter: u64, layers: u64, heads: u64) -> Result<Sizes, IrError> {
        let s = Sizes {
            vocab: self.u("vocab_size", vocab)?,
            d: self.u("hidden_size", d)?,
            inter: self.u("intermediate_size", inter)?,
            layers: self.u("num_hidden_layers", layers)?,
            heads: 0,
        };
        if s.layers > MAX_LAYERS {
            return Err(self.err(format!("`num_hidden_layers` {}: at most {MAX_LAYERS}", s.layers)));
        }
        Ok(Sizes { heads: self.u("num_attention_heads", heads)?, ..s })
    }
    /// `hidden_size` a multiple of the heads.
    fn check_hidden(&self, d: u64, heads: u64) -> Result<(), IrError> {
        match d % heads {
            0 => Ok(()),
            _ => Err(self.err(format!("hidden_size {d} is not a multiple of num_attention_heads {heads}"))),
        }
    }
    /// The heads a multiple of the kv heads.
    fn check_kv(&self, heads: u64, kv: u64) -> Result<(), IrError> {
        match kv > 0 && heads.is_multiple_of(kv) {
            true => Ok(()),
            false => Err(self.err(format!("num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"))),
        }
    }
}

/// A rotary module's `inv_freq` and `original_inv_freq` buffers (float32, `head_dim / 2`),
/// names prefixed by `prefix` (Gemma 3's layer type).
fn rotary_buffers(b: &mut Builder, prefix: &str, hd: u64) {
    for n in ["inv_freq", "original_inv_freq"] {
        b.m.buffers.push(Buffer { name: format!("model.rotary_emb.{prefix}{n}"), shape: vec![hd / 2], dtype: DType::Float32, persistent: false });
    }
}

/// The most decoder layers a config may have (released models have at most ~130; the
/// planning benchmark's synthetic model has 10 000).
const MAX_LAYERS: u64 = 16384;

fn act_of(name: &str) -> Option<(Act, &'static str)> {
    Some(match name {
        "silu" | "swish" => (Act::Silu, "SiLUActivation"),
        "gelu_new" => (Act::GeluTanh, "NewGELUActivation"),
        "gelu_pytorch_tanh" => (Act::GeluPytorchTanh, "GELUTanh"),
        "gelu" => (Act::Gelu, "GELUActivation"),
        "relu" => (Act::Relu, "ReLU"),
        _ => return None,
    })
}

/// Accumulates modules, params and ops in HF order.
struct Builder {
    m: Model,
    dtype: DType,
}

fn sym(s: &str) -> Dim {
    Dim::Sym(s.into())
}
fn bsd(d: u64) -> Shape {
    vec![sym("batch"), sym("seq"), Dim::N(d)]
}

impl Builder {
    fn module(&mut self, path: &str, class: &str) {
        self.m.modules.push(Module {
            path: path.into(),
            class: class.into(),
        });
    }
    fn param(&mut self, name: String, shape: Vec<u64>) -> String {
        self.m.params.push(Param {
            name: name.clone(),
            shape,
            dtype: self.dtype,
            requires_grad: true,
            tied_to: None,
        });
        name
    }
    fn op(&mut self, name: &str, kind: OpKind, module: &str, inputs: &[&str], params: Vec<String>, shape: Shape) -> String {
        self.m.ops.push(Op {
            name: name.into(),
            kind,
            module: module.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            params,
            shape,
        });
        name.into()
    }
    /// A `Linear` module with its params (HF registers weight then bias).
    fn linear_module(&mut self, path: &str, class: &str, fan_in: u64, fan_out: u64, bias: bool, transposed: bool) -> Vec<String> {
        self.module(path, class);
        let w = if transposed { vec![fan_in, fan_out] } else { vec![fan_out, fan_in] };
        let mut ps = vec![self.param(format!("{path}.weight"), w)];
        if bias {
            ps.push(self.param(format!("{path}.bias"), vec![fan_out]));
        }
        ps
    }
    /// A decoder model's root, its base model, the token embeddings and the layers' list, in
    /// HF's registration order: the embedding weight and the embedding op's output.
    fn decoder_start(&mut self, arch: &str, base: &str, vocab: u64, d: u64) -> (String, String) {
        self.module("", arch);
        self.module("model", base);
        self.module("model.embed_tokens", "Embedding");
        let embed = self.param("model.embed_tokens.weight".into(), vec![vocab, d]);
        self.module("model.layers", "ModuleList");
        let x = self.op("model.embed_tokens", OpKind::Embedding, "model.embed_tokens", &["input_ids"], vec![embed.clone()], bsd(d));
        (embed, x)
    }
    /// The base model's final norm (`model.norm`, its module and weight) over `x`: its output.
    fn final_norm(&mut self, class: &str, kind: OpKind, x: &str, d: u64) -> String {
        self.module("model.norm", class);
        let nw = self.param("model.norm.weight".into(), vec![d]);
        self.op("model.norm", kind, "model.norm", &[x], vec![nw], bsd(d))
    }
    fn linear_op(&mut self, path: &str, x: &str, ps: Vec<String>, fan_out: u64, transposed: bool) -> String {
        let bias = ps.len() == 2;
        self.op(path, OpKind::Linear { bias, transposed, float32: false }, path, &[x], ps, bsd(fan_out))
    }
}

/// Imports an HF config.json text. `file` names the source in errors; `name` is the
/// model's name in the IR.
pub fn import_hf(text: &str, file: &str, name: &str) -> Result<Model, IrError> {
    import_hf_with(text, file, name, None)
}

/// [`import_hf`] with the parameter dtype forced (e.g. float32 master weights).
pub fn import_hf_with(text: &str, file: &str, name: &str, dtype_override: Option<DType>) -> Result<Model, IrError> {
    import_hf_report(text, file, name, dtype_override).map(|r| r.0)
}

/// [`import_hf_with`], and what a user should hear about the config: keys it does not know
/// (with the close name they may have meant) and the keys that took transformers' defaults.
/// A config that fails to import names its unknown keys in the error too (a misspelt
/// `hidden_size` surfaces as another key's error).
pub fn import_hf_report(text: &str, file: &str, name: &str, dtype_override: Option<DType>) -> Result<(Model, Vec<String>), IrError> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        let (line, col, message) = crate::error::json_position(&e);
        let message = match text.trim().is_empty() {
            true => "empty file (expected an HF config.json object)".to_string(),
            false => message,
        };
        IrError::Syntax { file: file.into(), line, col, message }
    })?;
    let (v, wrapper_note) = gemma3_text_of(v, file)?;
    let c = Cfg { v: &v, file, used: Default::default(), defaulted: Default::default() };
    let built = build(&c, name, dtype_override);
    let used = c.used.borrow();
    let unknown: Vec<String> = v
        .as_object()
        .map(|o| {
            o.keys()
                .filter(|k| !used.contains(k.as_str()) && !IGNORED_KEYS.contains(&k.as_str()))
                .map(|k| match closest(k, used.iter().map(String::as_str).chain(IGNORED_KEYS.iter().copied())) {
                    Some(m) => format!("unknown key `{k}` ignored (did you mean `{m}`?)"),
                    None => format!("unknown key `{k}` ignored"),
                })
                .collect()
        })
        .unwrap_or_default();
    match built {
        Ok(m) => {
            let mut notes = unknown;
            notes.extend(wrapper_note);
            let d = c.defaulted.borrow();
            if !d.is_empty() {
                notes.push(format!(
                    "{} keys not in the config took transformers 5.17's defaults: {}",
                    d.len(),
                    d.iter().map(|(k, v)| format!("{k} = {v}")).collect::<Vec<_>>().join(", ")
                ));
            }
            Ok((m, notes))
        }
        Err(e) => {
            // the likely typos: unknown keys close to a key the importer reads
            let typos: Vec<&String> = unknown.iter().filter(|n| n.contains("did you mean")).collect();
            if typos.is_empty() {
                return Err(e);
            }
            let text = e.to_string();
            let message = text.strip_prefix(&format!("{file}: ")).unwrap_or(&text);
            Err(IrError::Import { file: file.into(), message: format!("{message} (note: {})", typos.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")) })
        }
    }
}

/// A Gemma 3 multimodal config (`Gemma3ForConditionalGeneration`, model_type `gemma3`): its
/// `text_config` as a `Gemma3ForCausalLM` config (with the outer dtype when it has none), and
/// a note saying the vision tower is left out. Any other config passes through.
fn gemma3_text_of(v: Value, file: &str) -> Result<(Value, Option<String>), IrError> {
    let wrapper = v.get("model_type").and_then(|t| t.as_str()) == Some("gemma3")
        || v.get("architectures").and_then(|a| a.get(0)).and_then(|a| a.as_str()) == Some("Gemma3ForConditionalGeneration");
    if !wrapper {
        return Ok((v, None));
    }
    let mut text = match v.get("text_config") {
        Some(Value::Object(o)) => o.clone(),
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(x) => return Err(IrError::Import { file: file.into(), message: format!("`text_config` must be an object, got {x}") }),
    };
    for k in ["dtype", "torch_dtype"] {
        if let (false, Some(d)) = (text.contains_key("dtype") || text.contains_key("torch_dtype"), v.get(k)) {
            text.insert(k.into(), d.clone());
        }
    }
    text.insert("model_type".into(), Value::String("gemma3_text".into()));
    text.insert("architectures".into(), serde_json::json!(["Gemma3ForCausalLM"]));
    let note = "a Gemma 3 multimodal config (Gemma3ForConditionalGeneration): its text model (`text_config`) is imported as Gemma3ForCausalLM; the vision tower and the multimodal projector are left out".to_string();
    Ok((Value::Object(text), Some(note)))
}

fn build(c: &Cfg, name: &str, dtype_override: Option<DType>) -> Result<Model, IrError> {
    let (v, file) = (c.v, c.file);
    if !v.is_object() {
        return Err(c.err("config.json must be a JSON object"));
    }
    match v.get("architectures") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {}
        Some(a) => return Err(c.err(format!("`architectures` must be a list of class names, got {a}"))),
    }
    let arch = v
        .get("architectures")
        .and_then(|a| a.as_array())
        .and_then(|a| a.first())
        .and_then(|a| a.as_str());
    let model_type = v.get("model_type").and_then(|t| t.as_str());
    let family = match (arch, arch.and_then(Family::from_architecture), model_type) {
        // both named: they must agree (a config edited from another family's)
        (Some(a), Some(f), Some(t)) => match Family::from_model_type(t) {
            Some(g) if g == f => f,
            _ => return Err(c.err(format!("`model_type` `{t}` and `architectures` [{a}] name different models: fix one of them ({a} is model_type `{}`)", f.model_type()))),
        },
        (_, Some(f), _) => f,
        (_, None, Some(t)) => Family::from_model_type(t).ok_or_else(|| c.err(format!("{}: model_type `{t}`{}", Family::unsupported(), arch.map_or(String::new(), |a| format!(", architecture `{a}`")))))?,
        (Some(a), None, None) => return Err(c.err(format!("{}: architecture `{a}`, and no model_type", Family::unsupported()))),
        (None, _, None) => return Err(c.err("config has neither `architectures` nor `model_type`")),
    };
    // transformers 5.17's `from_config` builds the params in the config's `dtype` /
    // `torch_dtype` (float32 when absent); `dtype_override` is `import hf --dtype`.
    let dtype = match dtype_override {
        Some(d) => d,
        None => match c.get("dtype").or_else(|| c.get("torch_dtype")) {
            None => DType::Float32,
            Some(x) => x
                .as_str()
                .and_then(DType::parse)
                .filter(|d| d.is_float())
                .ok_or_else(|| c.err(format!("unsupported torch_dtype {x}")))?,
        },
    };
    let mut b = Builder {
        m: Model {
            name: name.into(),
            architecture: family.architecture(),
            attn_implementation: None,
            modules: vec![],
            params: vec![],
            buffers: vec![],
            inputs: vec![
                Input {
                    name: "input_ids".into(),
                    shape: vec![sym("batch"), sym("seq")],
                    dtype: DType::Int64,
                },
                Input {
                    name: "labels".into(),
                    shape: vec![sym("batch"), sym("seq")],
                    dtype: DType::Int64,
                },
            ],
            ops: vec![],
            alias_index: Default::default(),
        },
        dtype,
    };
    match family {
        Family::Gpt2 => gpt2(c, &mut b)?,
        Family::Olmo2 => olmo2(c, &mut b)?,
        f @ (Family::Gemma2 | Family::Gemma3) => gemma(c, f, &mut b)?,
        Family::Phi3 => phi3(c, &mut b)?,
        f @ (Family::DeepseekV2 | Family::DeepseekV3) => deepseek(c, f, &mut b)?,
        f => llama_like(c, f, &mut b)?,
    }
    let problems = crate::validate::validate(&b.m);
    if !problems.is_empty() {
        return Err(IrError::Invalid {
            file: file.into(),
            problems,
        });
    }
    Ok(b.m)
}

fn gpt2(c: &Cfg, b: &mut Builder) -> Result<(), IrError> {
    let vocab = c.u("vocab_size", 50257)?;
    let npos = c.u("n_positions", 1024)?;
    let d = c.u("n_embd", 768)?;
    let layers = c.u("n_layer", 12)?;
    if layers > MAX_LAYERS {
        return Err(c.err(format!("`n_layer` {layers}: at most {MAX_LAYERS}")));
    }
    let heads = c.u("n_head", 12)?;
    let inner = c.opt_u("n_inner")?.unwrap_or(4 * d);
    let eps = c.f("layer_norm_epsilon", 1e-5)?;
    let (act, act_class) = {
        let a = c.s("activation_function", "gelu_new")?;
        act_of(a).ok_or_else(|| c.err(format!("unsupported activation_function `{a}`")))?
    };
    let (resid_p, embd_p, attn_p) = (c.f("resid_pdrop", 0.1)?, c.f("embd_pdrop", 0.1)?, c.f("attn_pdrop", 0.1)?);
    let tie = c.b("tie_word_embeddings", true)?;
    if d % heads != 0 {
        return Err(c.err(format!("n_embd {d} is not a multiple of n_head {heads}")));
    }
    let hd = d / heads;
    b.module("", "GPT2LMHeadModel");
    b.module("transformer", "GPT2Model");
    b.module("transformer.wte", "Embedding");
    let wte = b.param("transformer.wte.weight".into(), vec![vocab, d]);
    b.module("transformer.wpe", "Embedding");
    let wpe = b.param("transformer.wpe.weight".into(), vec![npos, d]);
    b.module("transformer.drop", "Dropout");
    b.module("transformer.h", "ModuleList");
    let tok = b.op("transformer.wte", OpKind::Embedding, "transformer.wte", &["input_ids"], vec![wte.clone()], bsd(d));
    let pos = b.op(
        "transformer.wpe",
        OpKind::PositionEmbedding,
        "transformer.wpe",
        &["input_ids"],
        vec![wpe],
        vec![Dim::N(1), sym("seq"), Dim::N(d)],
    );
    let emb = b.op("transformer.embed_add", OpKind::Add, "transformer", &[&tok, &pos], vec![], bsd(d));
    let mut x = b.op("transformer.drop", OpKind::Dropout { p: embd_p }, "transformer.drop", &[&emb], vec![], bsd(d));
    for i in 0..layers {
        let p = format!("transformer.h.{i}");
        b.module(&p, "GPT2Block");
        b.module(&format!("{p}.ln_1"), "LayerNorm");
        let ln1 = vec![b.param(format!("{p}.ln_1.weight"), vec![d]), b.param(format!("{p}.ln_1.bias"), vec![d])];
        b.module(&format!("{p}.attn"), "GPT2Attention");
        let c_attn = b.linear_module(&format!("{p}.attn.c_attn"), "Conv1D", d, 3 * d, true, true);
        let c_proj = b.linear_module(&format!("{p}.attn.c_proj"), "Conv1D", d, d, true, true);
        b.module(&format!("{p}.attn.attn_dropout"), "Dropout");
        b.module(&format!("{p}.attn.resid_dropout"), "Dropout");
        b.module(&format!("{p}.ln_2"), "LayerNorm");
        let ln2 = vec![b.param(format!("{p}.ln_2.weight"), vec![d]), b.param(format!("{p}.ln_2.bias"), vec![d])];
        b.module(&format!("{p}.mlp"), "GPT2MLP");
        let c_fc = b.linear_module(&format!("{p}.mlp.c_fc"), "Conv1D", d, inner, true, true);
        let m_proj = b.linear_module(&format!("{p}.mlp.c_proj"), "Conv1D", inner, d, true, true);
        b.module(&format!("{p}.mlp.act"), act_class);
        b.module(&format!("{p}.mlp.dropout"), "Dropout");

        let h = b.op(&format!("{p}.ln_1"), OpKind::LayerNorm { eps }, &format!("{p}.ln_1"), &[&x], ln1, bsd(d));
        let qkv = b.linear_op(&format!("{p}.attn.c_attn"), &h, c_attn, 3 * d, true);
        let a = b.op(
            &format!("{p}.attn.sdpa"),
            OpKind::Attention {
                heads,
                kv_heads: heads,
                head_dim: hd,
                causal: true,
                dropout: attn_p,
                sliding_window: None,
                scaling: None,
                v_offset: None,
                softcap: None,
                mla: None,
            },
            &format!("{p}.attn"),
            &[&qkv],
            vec![],
            bsd(d),
        );
        let o = b.linear_op(&format!("{p}.attn.c_proj"), &a, c_proj, d, true);
        let o = b.op(&format!("{p}.attn.resid_dropout"), OpKind::Dropout { p: resid_p }, &format!("{p}.attn.resid_dropout"), &[&o], vec![], bsd(d));
        x = b.op(&format!("{p}.residual_attn"), OpKind::Add, &p, &[&o, &x], vec![], bsd(d));
        let h = b.op(&format!("{p}.ln_2"), OpKind::LayerNorm { eps }, &format!("{p}.ln_2"), &[&x], ln2, bsd(d));
        let f = b.linear_op(&format!("{p}.mlp.c_fc"), &h, c_fc, inner, true);
        let f = b.op(&format!("{p}.mlp.act"), OpKind::Activation { act }, &format!("{p}.mlp.act"), &[&f], vec![], bsd(inner));
        let f = b.linear_op(&format!("{p}.mlp.c_proj"), &f, m_proj, d, true);
        let f = b.op(&format!("{p}.mlp.dropout"), OpKind::Dropout { p: resid_p }, &format!("{p}.mlp.dropout"), &[&f], vec![], bsd(d));
        x = b.op(&format!("{p}.residual_mlp"), OpKind::Add, &p, &[&x, &f], vec![], bsd(d));
    }
    b.module("transformer.ln_f", "LayerNorm");
    let lnf = vec![b.param("transformer.ln_f.weight".into(), vec![d]), b.param("transformer.ln_f.bias".into(), vec![d])];
    let h = b.op("transformer.ln_f", OpKind::LayerNorm { eps }, "transformer.ln_f", &[&x], lnf, bsd(d));
    lm_head(b, &h, d, vocab, tie, &wte);
    Ok(())
}

fn lm_head(b: &mut Builder, h: &str, d: u64, vocab: u64, tie: bool, embed: &str) {
    b.module("lm_head", "Linear");
    b.m.params.push(Param {
        name: "lm_head.weight".into(),
        shape: vec![vocab, d],
        dtype: b.dtype,
        requires_grad: true,
        tied_to: tie.then(|| embed.to_string()),
    });
    let logits = b.linear_op("lm_head", h, vec!["lm_head.weight".into()], vocab, false);
    b.op("loss", OpKind::CrossEntropy { vocab }, "", &[&logits, "labels"], vec![], vec![]);
}

/// OLMo-2 (transformers' Olmo2): Llama's blocks with the norms after the sublayers
/// (`x + post_attention_layernorm(attn(x))`, `x + post_feedforward_layernorm(mlp(x))`, no
/// input norm), an RMSNorm over the whole q and k projections before RoPE, and every
/// RMSNorm multiplying its weight in float32 before the cast back.
fn olmo2(c: &Cfg, b: &mut Builder) -> Result<(), IrError> {
    let Sizes { vocab, d, inter, layers, heads } = c.sizes(50304, 4096, 11008, 32, 32)?;
    let kv = c.opt_u("num_key_value_heads")?.unwrap_or(heads);
    c.check_hidden(d, heads)?;
    let hd = c.opt_u("head_dim")?.unwrap_or(d / heads);
    c.check_kv(heads, kv)?;
    let eps = c.f("rms_norm_eps", 1e-5)?;
    let theta = c.rope_theta(10000.0)?;
    let scaling = c.rope_scaling()?;
    let tie = c.b("tie_word_embeddings", false)?;
    let bias = c.b("attention_bias", false)?;
    let attn_p = c.f("attention_dropout", 0.0)?;
    let (act, act_class) = {
        let a = c.s("hidden_act", "silu")?;
        act_of(a).ok_or_else(|| c.err(format!("unsupported hidden_act `{a}`")))?
    };
    let norm = |head_dim: Option<u64>| OpKind::RmsNorm { eps, head_dim, weight_f32: true, unit_offset: false, input_width: None };
    let (embed, mut x) = b.decoder_start("Olmo2ForCausalLM", "Olmo2Model", vocab, d);
    let rot = b.op("model.rotary_emb", OpKind::RotaryEmbedding { theta, head_dim: hd, scaling, f32_tables: true, complex: false }, "model.rotary_emb", &["input_ids"], vec![], vec![Dim::N(1), sym("seq"), Dim::N(hd)]);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let sa = format!("{p}.self_attn");
        b.module(&p, "Olmo2DecoderLayer");
        b.module(&sa, "Olmo2Attention");
        let q = b.linear_module(&format!("{sa}.q_proj"), "Linear", d, heads * hd, bias, false);
        let k = b.linear_module(&format!("{sa}.k_proj"), "Linear", d, kv * hd, bias, false);
        let v = b.linear_module(&format!("{sa}.v_proj"), "Linear", d, kv * hd, bias, false);
        let o = b.linear_module(&format!("{sa}.o_proj"), "Linear", heads * hd, d, bias, false);
        b.module(&format!("{sa}.q_norm"), "Olmo2RMSNorm");
        let qn = b.param(format!("{sa}.q_norm.weight"), vec![heads * hd]);
        b.module(&format!("{sa}.k_norm"), "Olmo2RMSNorm");
        let kn = b.param(format!("{sa}.k_norm.weight"), vec![kv * hd]);
        let mlp = format!("{p}.mlp");
        b.module(&mlp, "Olmo2MLP");
        let g = b.linear_module(&format!("{mlp}.gate_proj"), "Linear", d, inter, false, false);
        let u = b.linear_module(&format!("{mlp}.up_proj"), "Linear", d, inter, false, false);
        let dn = b.linear_module(&format!("{mlp}.down_proj"), "Linear", inter, d, false, false);
        b.module(&format!("{mlp}.act_fn"), act_class);
        b.module(&format!("{p}.post_attention_layernorm"), "Olmo2RMSNorm");
        let ln1 = b.param(format!("{p}.post_attention_layernorm.weight"), vec![d]);
        b.module(&format!("{p}.post_feedforward_layernorm"), "Olmo2RMSNorm");
        let ln2 = b.param(format!("{p}.post_feedforward_layernorm.weight"), vec![d]);

        let qo = b.linear_op(&format!("{sa}.q_proj"), &x, q, heads * hd, false);
        let ko = b.linear_op(&format!("{sa}.k_proj"), &x, k, kv * hd, false);
        let vo = b.linear_op(&format!("{sa}.v_proj"), &x, v, kv * hd, false);
        let (qs, ks) = (format!("{sa}.q_norm"), format!("{sa}.k_norm"));
        let qo = b.op(&qs, norm(None), &qs, &[&qo], vec![qn], bsd(heads * hd));
        let ko = b.op(&ks, norm(None), &ks, &[&ko], vec![kn], bsd(kv * hd));
        let qr = b.op(&format!("{sa}.rope_q"), OpKind::Rope { head_dim: hd, offset: None, pass_through: false, head_stride: None, interleave: false, complex: false }, &sa, &[&qo, &rot], vec![], bsd(heads * hd));
        let kr = b.op(&format!("{sa}.rope_k"), OpKind::Rope { head_dim: hd, offset: None, pass_through: false, head_stride: None, interleave: false, complex: false }, &sa, &[&ko, &rot], vec![], bsd(kv * hd));
        let attn = OpKind::Attention { heads, kv_heads: kv, head_dim: hd, causal: true, dropout: attn_p, sliding_window: None, scaling: None, v_offset: None, softcap: None, mla: None };
        let a = b.op(&format!("{sa}.sdpa"), attn, &sa, &[&qr, &kr, &vo], vec![], bsd(heads * hd));
        let ao = b.linear_op(&format!("{sa}.o_proj"), &a, o, d, false);
        let pa = format!("{p}.post_attention_layernorm");
        let ao = b.op(&pa, norm(None), &pa, &[&ao], vec![ln1], bsd(d));
        x = b.op(&format!("{p}.residual_attn"), OpKind::Add, &p, &[&x, &ao], vec![], bsd(d));
        let go = b.linear_op(&format!("{mlp}.gate_proj"), &x, g, inter, false);
        let ga = b.op(&format!("{mlp}.act_fn"), OpKind::Activation { act }, &format!("{mlp}.act_fn"), &[&go], vec![], bsd(inter));
        let uo = b.linear_op(&format!("{mlp}.up_proj"), &x, u, inter, false);
        let gu = b.op(&format!("{mlp}.mul"), OpKind::Mul, &mlp, &[&ga, &uo], vec![], bsd(inter));
        let m = b.linear_op(&format!("{mlp}.down_proj"), &gu, dn, d, false);
        let pf = format!("{p}.post_feedforward_layernorm");
        let m = b.op(&pf, norm(None), &pf, &[&m], vec![ln2], bsd(d));
        x = b.op(&format!("{p}.residual_mlp"), OpKind::Add, &p, &[&x, &m], vec![], bsd(d));
    }
    let h = b.final_norm("Olmo2RMSNorm", norm(None), &x, d);
    b.module("model.rotary_emb", "Olmo2RotaryEmbedding");
    rotary_buffers(b, "", hd);
    lm_head(b, &h, d, vocab, tie, &embed);
    Ok(())
}

fn llama_like(c: &Cfg, f: Family, b: &mut Builder) -> Result<(), IrError> {
    use Family::*;
    let (vocab_d, inter_d, kv_d, eps_d, theta_d) = match f {
        Llama => (32000, 11008, None, 1e-6, 10000.0),
        Mistral => (32000, 14336, Some(8), 1e-6, 10000.0),
        Qwen2 | Qwen3 => (151936, 22016, None, 1e-6, 10000.0),
        Mixtral => (32000, 14336, Some(8), 1e-5, 1e6),
        Qwen3Moe => (151936, 6144, Some(4), 1e-6, 10000.0),
        Gpt2 | Olmo2 | Gemma2 | Gemma3 | Phi3 | DeepseekV2 | DeepseekV3 => unreachable!("gpt2, olmo2, gemma, phi3 and deepseek have their own builders"),
    };
    let (d_d, layers_d) = if f == Qwen3Moe { (2048, 24) } else { (4096, 32) };
    let Sizes { vocab, d, inter, layers, heads } = c.sizes(vocab_d, d_d, inter_d, layers_d, 32)?;
    let kv = c.opt_u("num_key_value_heads")?.or(kv_d).unwrap_or(heads);
    let hd = match c.opt_u("head_dim")? {
        Some(h) => h,
        // Qwen3Config's own default, whatever hidden_size / heads is
        None if f == Qwen3 => 128,
        None => {
            c.check_hidden(d, heads)?;
            d / heads
        }
    };
    c.check_kv(heads, kv)?;
    let eps = c.f("rms_norm_eps", eps_d)?;
    let theta = c.rope_theta(theta_d)?;
    let scaling = c.rope_scaling()?;
    let tie = c.b("tie_word_embeddings", false)?;
    let (attn_bias, o_bias) = match f {
        Qwen2 => (true, false),
        Llama | Qwen3 | Qwen3Moe => {
            let ab = c.b("attention_bias", false)?;
            (ab, ab)
        }
        _ => (false, false),
    };
    let mlp_bias = if f == Llama { c.b("mlp_bias", false)? } else { false };
    let attn_p = c.f("attention_dropout", 0.0)?;
    let (act, act_class) = {
        let a = c.s("hidden_act", "silu")?;
        act_of(a).ok_or_else(|| c.err(format!("unsupported hidden_act `{a}`")))?
    };
    let (experts, top_k) = match f {
        Mixtral => (c.u("num_local_experts", 8)?, c.u("num_experts_per_tok", 2)?),
        Qwen3Moe => (c.u("num_experts", 128)?, c.u("num_experts_per_tok", 8)?),
        _ => (0, 0),
    };
    // Qwen3-MoE: experts of their own width, renormalized only with norm_topk_prob, and MoE
    // on the layers `decoder_sparse_step` picks that `mlp_only_layers` does not name
    let (moe_inter, normalize) = match f {
        Qwen3Moe => (c.u("moe_intermediate_size", 768)?, c.b("norm_topk_prob", false)?),
        _ => (inter, true),
    };
    let sparse_step = if f == Qwen3Moe { c.u("decoder_sparse_step", 1)?.max(1) } else { 1 };
    let mlp_only: Vec<u64> = match c.get("mlp_only_layers") {
        Some(Value::Array(a)) => a.iter().map(|x| x.as_u64().ok_or_else(|| c.err("`mlp_only_layers` must be a list of layer indices"))).collect::<Result<_, _>>()?,
        Some(Value::Null) | None => vec![],
        Some(_) => return Err(c.err("`mlp_only_layers` must be a list of layer indices")),
    };
    let moe_layer = |i: u64| match f {
        Mixtral => true,
        Qwen3Moe => experts > 0 && !mlp_only.contains(&i) && (i + 1).is_multiple_of(sparse_step),
        _ => false,
    };
    // Sliding-window attention: Mistral (class default 4096, null = off); Qwen2 only with
    // use_sliding_window, from layer max_window_layers on.
    let sw = match (f, c.get("sliding_window")) {
        (Mistral, None) => Some(4096),
        (Mistral | Mixtral, Some(_)) => c.opt_u("sliding_window")?,
        (Qwen2 | Qwen3 | Qwen3Moe, _) if c.b("use_sliding_window", false)? => Some(c.opt_u("sliding_window")?.unwrap_or(4096)),
        _ => None,
    };
    let max_window_layers = if matches!(f, Qwen2 | Qwen3) { c.u("max_window_layers", 28)? } else { 0 };
    let window = |i: u64| sw.filter(|_| i >= max_window_layers);
    let pre = f.prefix();
    let (embed, mut x) = b.decoder_start(&f.architecture(), &format!("{pre}Model"), vocab, d);
    let rot = b.op(
        "model.rotary_emb",
        OpKind::RotaryEmbedding { theta, head_dim: hd, scaling, f32_tables: false, complex: false },
        "model.rotary_emb",
        &["input_ids"],
        vec![],
        vec![Dim::N(1), sym("seq"), Dim::N(hd)],
    );
    let norm_class = format!("{pre}RMSNorm");
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let sa = format!("{p}.self_attn");
        b.module(&p, &f.layer_class());
        b.module(&sa, &format!("{pre}Attention"));
        let q = b.linear_module(&format!("{sa}.q_proj"), "Linear", d, heads * hd, attn_bias, false);
        let k = b.linear_module(&format!("{sa}.k_proj"), "Linear", d, kv * hd, attn_bias, false);
        let v = b.linear_module(&format!("{sa}.v_proj"), "Linear", d, kv * hd, attn_bias, false);
        let o = b.linear_module(&format!("{sa}.o_proj"), "Linear", heads * hd, d, o_bias, false);
        // Qwen3: an RMSNorm over each head of q and of k, before RoPE
        let qk_norm = matches!(f, Qwen3 | Qwen3Moe).then(|| {
            b.module(&format!("{sa}.q_norm"), &norm_class);
            let qn = b.param(format!("{sa}.q_norm.weight"), vec![hd]);
            b.module(&format!("{sa}.k_norm"), &norm_class);
            let kn = b.param(format!("{sa}.k_norm.weight"), vec![hd]);
            (qn, kn)
        });
        let mlp = format!("{p}.mlp");
        let moe = moe_layer(i);
        let mlp_params = if moe {
            b.module(&mlp, &format!("{pre}SparseMoeBlock"));
            // (registration order: Mixtral's block makes its gate first, Qwen3-MoE's its experts)
            let gate = |b: &mut Builder| {
                b.module(&format!("{mlp}.gate"), &format!("{pre}TopKRouter"));
                b.param(format!("{mlp}.gate.weight"), vec![experts, d])
            };
            let g = if f == Mixtral { Some(gate(b)) } else { None };
            b.module(&format!("{mlp}.experts"), &format!("{pre}Experts"));
            let gu = b.param(format!("{mlp}.experts.gate_up_proj"), vec![experts, 2 * moe_inter, d]);
            let dn = b.param(format!("{mlp}.experts.down_proj"), vec![experts, d, moe_inter]);
            b.module(&format!("{mlp}.experts.act_fn"), act_class);
            let g = match g {
                Some(g) => g,
                None => gate(b),
            };
            vec![vec![g], vec![gu, dn]]
        } else {
            b.module(&mlp, &format!("{pre}MLP"));
            let g = b.linear_module(&format!("{mlp}.gate_proj"), "Linear", d, inter, mlp_bias, false);
            let u = b.linear_module(&format!("{mlp}.up_proj"), "Linear", d, inter, mlp_bias, false);
            let dn = b.linear_module(&format!("{mlp}.down_proj"), "Linear", inter, d, mlp_bias, false);
            b.module(&format!("{mlp}.act_fn"), act_class);
            vec![g, u, dn]
        };
        b.module(&format!("{p}.input_layernorm"), &norm_class);
        let ln1 = b.param(format!("{p}.input_layernorm.weight"), vec![d]);
        b.module(&format!("{p}.post_attention_layernorm"), &norm_class);
        let ln2 = b.param(format!("{p}.post_attention_layernorm.weight"), vec![d]);

        let h = b.op(&format!("{p}.input_layernorm"), OpKind::RmsNorm { eps, head_dim: None, weight_f32: false, unit_offset: false, input_width: None }, &format!("{p}.input_layernorm"), &[&x], vec![ln1], bsd(d));
        let qo = b.linear_op(&format!("{sa}.q_proj"), &h, q, heads * hd, false);
        let ko = b.linear_op(&format!("{sa}.k_proj"), &h, k, kv * hd, false);
        let vo = b.linear_op(&format!("{sa}.v_proj"), &h, v, kv * hd, false);
        let (qo, ko) = match qk_norm {
            Some((qn, kn)) => {
                let norm = OpKind::RmsNorm { eps, head_dim: Some(hd), weight_f32: false, unit_offset: false, input_width: None };
                let (qs, ks) = (format!("{sa}.q_norm"), format!("{sa}.k_norm"));
                (b.op(&qs, norm.clone(), &qs, &[&qo], vec![qn], bsd(heads * hd)), b.op(&ks, norm, &ks, &[&ko], vec![kn], bsd(kv * hd)))
            }
            None => (qo, ko),
        };
        let qr = b.op(&format!("{sa}.rope_q"), OpKind::Rope { head_dim: hd, offset: None, pass_through: false, head_stride: None, interleave: false, complex: false }, &sa, &[&qo, &rot], vec![], bsd(heads * hd));
        let kr = b.op(&format!("{sa}.rope_k"), OpKind::Rope { head_dim: hd, offset: None, pass_through: false, head_stride: None, interleave: false, complex: false }, &sa, &[&ko, &rot], vec![], bsd(kv * hd));
        let a = b.op(
            &format!("{sa}.sdpa"),
            OpKind::Attention {
                heads,
                kv_heads: kv,
                head_dim: hd,
                causal: true,
                dropout: attn_p,
                sliding_window: window(i),
                scaling: None,
                v_offset: None,
                softcap: None,
                mla: None,
            },
            &sa,
            &[&qr, &kr, &vo],
            vec![],
            bsd(heads * hd),
        );
        let ao = b.linear_op(&format!("{sa}.o_proj"), &a, o, d, false);
        x = b.op(&format!("{p}.residual_attn"), OpKind::Add, &p, &[&x, &ao], vec![], bsd(d));
        let h = b.op(
            &format!("{p}.post_attention_layernorm"),
            OpKind::RmsNorm { eps, head_dim: None, weight_f32: false, unit_offset: false, input_width: None },
            &format!("{p}.post_attention_layernorm"),
            &[&x],
            vec![ln2],
            bsd(d),
        );
        let m = if moe {
            let mut mp = mlp_params.into_iter();
            let gate = mp.next().unwrap_or_default();
            let ex = mp.next().unwrap_or_default();
            // the router: its linear (an `aten.mm` of its own: op-level SAC counts it), then
            // softmax, top-k and the renormalization
            let logits = b.linear_op(&format!("{mlp}.gate"), &h, gate, experts, false);
            let router = OpKind::Router { experts, top_k, normalize, cast: f == Qwen3Moe, sigmoid: None, scaled: None };
            let r = b.op(&format!("{mlp}.gate.route"), router, &format!("{mlp}.gate"), &[&logits], vec![], bsd(top_k));
            b.op(
                &format!("{mlp}.experts"),
                OpKind::Experts {
                    experts,
                    top_k,
                    intermediate: moe_inter,
                    act,
                },
                &format!("{mlp}.experts"),
                &[&h, &r],
                ex,
                bsd(d),
            )
        } else {
            let mut mp = mlp_params.into_iter();
            let (g, u, dn) = (mp.next().unwrap_or_default(), mp.next().unwrap_or_default(), mp.next().unwrap_or_default());
            let go = b.linear_op(&format!("{mlp}.gate_proj"), &h, g, inter, false);
            let ga = b.op(&format!("{mlp}.act_fn"), OpKind::Activation { act }, &format!("{mlp}.act_fn"), &[&go], vec![], bsd(inter));
            let uo = b.linear_op(&format!("{mlp}.up_proj"), &h, u, inter, false);
            let gu = b.op(&format!("{mlp}.mul"), OpKind::Mul, &mlp, &[&ga, &uo], vec![], bsd(inter));
            b.linear_op(&format!("{mlp}.down_proj"), &gu, dn, d, false)
        };
        x = b.op(&format!("{p}.residual_mlp"), OpKind::Add, &p, &[&x, &m], vec![], bsd(d));
    }
    let h = b.final_norm(&norm_class, OpKind::RmsNorm { eps, head_dim: None, weight_f32: false, unit_offset: false, input_width: None }, &x, d);
    b.module("model.rotary_emb", &format!("{pre}RotaryEmbedding"));
    rotary_buffers(b, "", hd);
    lm_head(b, &h, d, vocab, tie, &embed);
    Ok(())
}

/// Gemma 2 and Gemma 3's text model (transformers' `Gemma2ForCausalLM`,
/// `Gemma3ForCausalLM`): the embeddings times `sqrt(hidden_size)`, four RMSNorms per block
/// (before and after each sublayer) that multiply by `1 + weight` in float32, local
/// (sliding-window) and global layers (`layer_types`; by default Gemma 2 alternates, Gemma 3
/// has five local to one global), the softmax scaled by `query_pre_attn_scalar ** -0.5`, a
/// `gelu_pytorch_tanh` MLP, and the LM head tied to the embeddings. Gemma 2 soft-caps the
/// attention scores (`tanh(s / 50) · 50`, eager only) and the logits (`tanh(l / 30) · 30`);
/// Gemma 3 instead has per-head q/k norms and a rotary table per layer type.
fn gemma(c: &Cfg, f: Family, b: &mut Builder) -> Result<(), IrError> {
    let v3 = f == Family::Gemma3;
    let pre = f.prefix();
    let Sizes { vocab, d, inter, layers, heads } = c.sizes(if v3 { 262_208 } else { 256_000 }, 2304, 9216, 26, 8)?;
    let kv = c.u("num_key_value_heads", 4)?;
    let hd = c.u("head_dim", 256)?;
    c.check_hidden(d, heads)?;
    c.check_kv(heads, kv)?;
    let eps = c.f("rms_norm_eps", 1e-6)?;
    let tie = c.b("tie_word_embeddings", true)?;
    let bias = c.b("attention_bias", false)?;
    let attn_p = c.f("attention_dropout", 0.0)?;
    let qpas = c.f("query_pre_attn_scalar", 256.0)?;
    if !(qpas.is_finite() && qpas > 0.0) {
        return Err(c.err(format!("`query_pre_attn_scalar` must be a positive number, got {qpas}")));
    }
    let window = c.u("sliding_window", 4096)?;
    // (older configs carry `hidden_act` beside `hidden_activation`; Gemma3TextConfig reads the latter)
    let _ = c.get("hidden_act");
    let (act, act_class) = {
        let a = c.s("hidden_activation", "gelu_pytorch_tanh")?;
        act_of(a).ok_or_else(|| c.err(format!("unsupported hidden_activation `{a}`")))?
    };
    let bidirectional = match c.get("use_bidirectional_attention") {
        None => false,
        Some(_) => c.b("use_bidirectional_attention", false)?,
    };
    if bidirectional {
        return Err(c.err("`use_bidirectional_attention` true (an embedding model) is not a causal LM: not supported"));
    }
    let softcap = |k: &str, default: Option<f64>| -> Result<Option<f64>, IrError> {
        let v = match c.get(k) {
            None if c.v.get(k).is_some() => None, // explicitly null
            None => default.map(|d| c.default(k, d)),
            Some(_) => Some(c.f(k, 0.0)?),
        };
        match v {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(c.err(format!("`{k}` must be a positive number or null, got {x}"))),
            v => Ok(v),
        }
    };
    let final_cap = softcap("final_logit_softcapping", (!v3).then_some(30.0))?;
    // (Gemma3Attention does not pass it to the attention kernels: no effect in transformers 5.17)
    let attn_cap = softcap("attn_logit_softcapping", (!v3).then_some(50.0))?.filter(|_| !v3);
    // (released Gemma 2 configs carry both; transformers reads `sliding_window`)
    let _ = (c.get("cache_implementation"), c.get("sliding_window_size"));
    // layer types: explicit, or every `sliding_window_pattern`-th layer global
    let sliding: Vec<bool> = match c.get("layer_types") {
        Some(Value::Array(a)) => {
            if a.len() as u64 != layers {
                return Err(c.err(format!("`layer_types` has {} entries for {layers} layers", a.len())));
            }
            a.iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(c.err(format!("`layer_types` entry {t}: expected \"sliding_attention\" or \"full_attention\""))),
                })
                .collect::<Result<_, _>>()?
        }
        Some(x) => return Err(c.err(format!("`layer_types` must be a list, got {x}"))),
        None => {
            let pattern = if v3 { c.u("sliding_window_pattern", 6)? } else { 2 };
            (0..layers).map(|i| !(i + 1).is_multiple_of(pattern)).collect()
        }
    };
    // rotary: the global layers' theta and scaling (`rope_theta`, `rope_scaling`, or
    // transformers 5's per-layer-type `rope_parameters`), the local layers' theta
    // (`rope_local_base_freq`)
    let params = c.get("rope_parameters").and_then(|r| r.as_object());
    let typed = |t: &str| params.and_then(|p| p.get(t)).and_then(|x| x.as_object());
    let num_in = |o: &serde_json::Map<String, Value>, k: &str, what: &str| -> Result<Option<f64>, IrError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| c.err(format!("`{what}.{k}` must be a number, got {x}"))),
        }
    };
    let (global_theta, global_scaling) = match typed("full_attention").filter(|_| v3) {
        Some(o) => {
            let theta = num_in(o, "rope_theta", "rope_parameters.full_attention")?.unwrap_or(1e6);
            let scaling = match o.get("rope_type").and_then(|t| t.as_str()).unwrap_or("default") {
                "default" => None,
                "linear" => Some(RopeScaling::Linear {
                    factor: num_in(o, "factor", "rope_parameters.full_attention")?.ok_or_else(|| c.err("`rope_parameters.full_attention.factor` is missing (linear rope scaling)"))?,
                }),
                t => return Err(c.err(format!("`rope_parameters.full_attention.rope_type` `{t}` is not supported (default or linear)"))),
            };
            (theta, scaling)
        }
        None => {
            let theta = c.rope_theta(if v3 { 1e6 } else { 10000.0 })?;
            let scaling = match c.get("rope_scaling") {
                _ if !v3 => c.rope_scaling()?,
                Some(r) if r.is_object() => c.rope_scaling()?,
                _ => None,
            };
            (theta, scaling)
        }
    };
    let local_theta = match typed("sliding_attention") {
        _ if !v3 => global_theta,
        Some(o) => num_in(o, "rope_theta", "rope_parameters.sliding_attention")?.unwrap_or(10000.0),
        None => c.f("rope_local_base_freq", 10000.0)?,
    };
    if let Some(o) = typed("sliding_attention") {
        if o.get("rope_type").and_then(|t| t.as_str()).is_some_and(|t| t != "default") {
            return Err(c.err("`rope_parameters.sliding_attention.rope_type`: only the default rope is supported for local layers"));
        }
    }
    let norm = |head_dim: Option<u64>| OpKind::RmsNorm { eps, head_dim, weight_f32: false, unit_offset: true, input_width: None };
    let norm_class = format!("{pre}RMSNorm");
    let norm_class = norm_class.as_str();
    b.module("", &f.architecture());
    b.module("model", if v3 { "Gemma3TextModel" } else { "Gemma2Model" });
    b.module("model.embed_tokens", &format!("{pre}TextScaledWordEmbedding"));
    let embed = b.param("model.embed_tokens.weight".into(), vec![vocab, d]);
    b.m.buffers.push(Buffer { name: "model.embed_tokens.embed_scale".into(), shape: vec![], dtype: DType::Float32, persistent: false });
    b.module("model.layers", "ModuleList");
    let x0 = b.op("model.embed_tokens", OpKind::Embedding, "model.embed_tokens", &["input_ids"], vec![embed.clone()], bsd(d));
    let mut x = b.op("model.embed_tokens.scale", OpKind::Scale { factor: (d as f64).sqrt(), divide: false, buffer: true }, "model.embed_tokens", &[&x0], vec![], bsd(d));
    // the rotary tables of each layer type present (the model computes them in that order;
    // Gemma 2: one table for every layer)
    let types: Vec<(&str, bool)> = [("sliding_attention", true), ("full_attention", false)].into_iter().filter(|(_, s)| sliding.contains(s)).collect();
    let mut rot = std::collections::HashMap::new();
    if v3 {
        for &(t, s) in &types {
            let (theta, scaling) = if s { (local_theta, None) } else { (global_theta, global_scaling) };
            let name = format!("model.rotary_emb.{t}");
            let r = b.op(&name, OpKind::RotaryEmbedding { theta, head_dim: hd, scaling, f32_tables: false, complex: false }, "model.rotary_emb", &["input_ids"], vec![], vec![Dim::N(1), sym("seq"), Dim::N(hd)]);
            rot.insert(s, r);
        }
    } else {
        let r = b.op("model.rotary_emb", OpKind::RotaryEmbedding { theta: global_theta, head_dim: hd, scaling: global_scaling, f32_tables: false, complex: false }, "model.rotary_emb", &["input_ids"], vec![], vec![Dim::N(1), sym("seq"), Dim::N(hd)]);
        rot.insert(true, r.clone());
        rot.insert(false, r);
    }
    for (i, &is_sliding) in sliding.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let sa = format!("{p}.self_attn");
        b.module(&p, &f.layer_class());
        b.module(&sa, &format!("{pre}Attention"));
        let q = b.linear_module(&format!("{sa}.q_proj"), "Linear", d, heads * hd, bias, false);
        let k = b.linear_module(&format!("{sa}.k_proj"), "Linear", d, kv * hd, bias, false);
        let v = b.linear_module(&format!("{sa}.v_proj"), "Linear", d, kv * hd, bias, false);
        let o = b.linear_module(&format!("{sa}.o_proj"), "Linear", heads * hd, d, bias, false);
        let qk_norm = v3.then(|| {
            b.module(&format!("{sa}.q_norm"), norm_class);
            let qn = b.param(format!("{sa}.q_norm.weight"), vec![hd]);
            b.module(&format!("{sa}.k_norm"), norm_class);
            let kn = b.param(format!("{sa}.k_norm.weight"), vec![hd]);
            (qn, kn)
        });
        let mlp = format!("{p}.mlp");
        b.module(&mlp, &format!("{pre}MLP"));
        let g = b.linear_module(&format!("{mlp}.gate_proj"), "Linear", d, inter, false, false);
        let u = b.linear_module(&format!("{mlp}.up_proj"), "Linear", d, inter, false, false);
        let dn = b.linear_module(&format!("{mlp}.down_proj"), "Linear", inter, d, false, false);
        b.module(&format!("{mlp}.act_fn"), act_class);
        let mut ln = vec![];
        for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"] {
            b.module(&format!("{p}.{n}"), norm_class);
            ln.push(b.param(format!("{p}.{n}.weight"), vec![d]));
        }
        let mut ln = ln.into_iter();
        let mut next = || ln.next().unwrap_or_default();

        let pn = format!("{p}.input_layernorm");
        let h = b.op(&pn, norm(None), &pn, &[&x], vec![next()], bsd(d));
        let qo = b.linear_op(&format!("{sa}.q_proj"), &h, q, heads * hd, false);
        let ko = b.linear_op(&format!("{sa}.k_proj"), &h, k, kv * hd, false);
        let vo = b.linear_op(&format!("{sa}.v_proj"), &h, v, kv * hd, false);
        let (qo, ko) = match qk_norm {
            Some((qn, kn)) => {
                let (qs, ks) = (format!("{sa}.q_norm"), format!("{sa}.k_norm"));
                (b.op(&qs, norm(Some(hd)), &qs, &[&qo], vec![qn], bsd(heads * hd)), b.op(&ks, norm(Some(hd)), &ks, &[&ko], vec![kn], bsd(kv * hd)))
            }
            None => (qo, ko),
        };
        let r = rot.get(&is_sliding).cloned().unwrap_or_default();
        let qr = b.op(&format!("{sa}.rope_q"), OpKind::Rope { head_dim: hd, offset: None, pass_through: false, head_stride: None, interleave: false, complex: false }, &sa, &[&qo, &r], vec![], bsd(heads * hd));
        let kr = b.op(&format!("{sa}.rope_k"), OpKind::Rope { head_dim: hd, offset: None, pass_through: false, head_stride: None, interleave: false, complex: false }, &sa, &[&ko, &r], vec![], bsd(kv * hd));
        let attn = OpKind::Attention {
            heads,
            kv_heads: kv,
            head_dim: hd,
            causal: true,
            dropout: attn_p,
            sliding_window: is_sliding.then_some(window),
            scaling: Some(1.0 / qpas.sqrt()),
            v_offset: None,
            softcap: attn_cap,
            mla: None,
        };
        let a = b.op(&format!("{sa}.sdpa"), attn, &sa, &[&qr, &kr, &vo], vec![], bsd(heads * hd));
        let ao = b.linear_op(&format!("{sa}.o_proj"), &a, o, d, false);
        let pa = format!("{p}.post_attention_layernorm");
        let ao = b.op(&pa, norm(None), &pa, &[&ao], vec![next()], bsd(d));
        x = b.op(&format!("{p}.residual_attn"), OpKind::Add, &p, &[&x, &ao], vec![], bsd(d));
        let pf = format!("{p}.pre_feedforward_layernorm");
        let h = b.op(&pf, norm(None), &pf, &[&x], vec![next()], bsd(d));
        let go = b.linear_op(&format!("{mlp}.gate_proj"), &h, g, inter, false);
        let ga = b.op(&format!("{mlp}.act_fn"), OpKind::Activation { act }, &format!("{mlp}.act_fn"), &[&go], vec![], bsd(inter));
        let uo = b.linear_op(&format!("{mlp}.up_proj"), &h, u, inter, false);
        let gu = b.op(&format!("{mlp}.mul"), OpKind::Mul, &mlp, &[&ga, &uo], vec![], bsd(inter));
        let m = b.linear_op(&format!("{mlp}.down_proj"), &gu, dn, d, false);
        let pf = format!("{p}.post_feedforward_layernorm");
        let m = b.op(&pf, norm(None), &pf, &[&m], vec![next()], bsd(d));
        x = b.op(&format!("{p}.residual_mlp"), OpKind::Add, &p, &[&x, &m], vec![], bsd(d));
    }
    let h = b.final_norm(norm_class, norm(None), &x, d);
    b.module("model.rotary_emb", &format!("{pre}RotaryEmbedding"));
    // Gemma 3: registered per layer type in sorted order
    let mut names: Vec<String> = match v3 {
        true => types.iter().map(|t| format!("{}_", t.0)).collect(),
        false => vec![String::new()],
    };
    names.sort_unstable();
    for t in names {
        rotary_buffers(b, &t, hd);
    }
    match final_cap {
        None => lm_head(b, &h, d, vocab, tie, &embed),
        Some(cap) => {
            // logits / cap, tanh, * cap (in the model's forward), then the loss
            b.module("lm_head", "Linear");
            b.m.params.push(Param { name: "lm_head.weight".into(), shape: vec![vocab, d], dtype: b.dtype, requires_grad: true, tied_to: tie.then(|| embed.clone()) });
            let logits = b.linear_op("lm_head", &h, vec!["lm_head.weight".into()], vocab, false);
            let l = b.op("softcap.div", OpKind::Scale { factor: cap, divide: true, buffer: false }, "", &[&logits], vec![], bsd(vocab));
            let l = b.op("softcap.tanh", OpKind::Activation { act: Act::Tanh }, "", &[&l], vec![], bsd(vocab));
            let l = b.op("softcap.mul", OpKind::Scale { factor: cap, divide: false, buffer: false }, "", &[&l], vec![], bsd(vocab));
            b.op("loss", OpKind::CrossEntropy { vocab }, "", &[&l, "labels"], vec![], vec![]);
        }
    }
    Ok(())
}

/// Phi-3 / Phi-4 (transformers' `Phi3ForCausalLM`): Llama's blocks with q, k and v from one
/// fused `qkv_proj` (views of its output: RoPE reads q and k from it, attention reads v) and
/// gate and up from one fused `gate_up_proj` (`up * act(gate)` over its two halves), HF's
/// partial-rotary code path (the rotated part sliced off and concatenated back), residual
/// dropouts, and a sliding window over every layer when the config sets one (one mask).
fn phi3(c: &Cfg, b: &mut Builder) -> Result<(), IrError> {
    let Sizes { vocab, d, inter, layers, heads } = c.sizes(32064, 3072, 8192, 32, 32)?;
    let kv = c.opt_u("num_key_value_heads")?.unwrap_or(heads);
    c.check_hidden(d, heads)?;
    let hd = d / heads;
    c.check_kv(heads, kv)?;
    let eps = c.f("rms_norm_eps", 1e-5)?;
    let theta = c.rope_theta(10000.0)?;
    let scaling = c.rope_scaling()?;
    let partial = match c.get("rope_parameters").and_then(|r| r.get("partial_rotary_factor")).or_else(|| c.get("partial_rotary_factor")) {
        None => 1.0,
        Some(x) => x.as_f64().ok_or_else(|| c.err(format!("`partial_rotary_factor` must be a number, got {x}")))?,
    };
    if partial != 1.0 {
        return Err(c.err(format!("`partial_rotary_factor` {partial}: only RoPE over the whole head is supported (Phi-3, Phi-4; not Phi-4-mini's 0.75)")));
    }
    let tie = c.b("tie_word_embeddings", false)?;
    let attn_p = c.f("attention_dropout", 0.0)?;
    let resid_p = c.f("resid_pdrop", 0.0)?;
    // (Phi3Model has no embedding dropout in transformers 5.17)
    let _ = (c.get("embd_pdrop"), c.get("original_max_position_embeddings"), c.get("attention_bias"));
    let window = c.opt_u("sliding_window")?;
    let (act, act_class) = {
        let a = c.s("hidden_act", "silu")?;
        act_of(a).ok_or_else(|| c.err(format!("unsupported hidden_act `{a}`")))?
    };
    let (embed, mut x) = b.decoder_start("Phi3ForCausalLM", "Phi3Model", vocab, d);
    let rot = b.op("model.rotary_emb", OpKind::RotaryEmbedding { theta, head_dim: hd, scaling, f32_tables: false, complex: false }, "model.rotary_emb", &["input_ids"], vec![], vec![Dim::N(1), sym("seq"), Dim::N(hd)]);
    let (qw, kvw) = (heads * hd, kv * hd);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let sa = format!("{p}.self_attn");
        b.module(&p, "Phi3DecoderLayer");
        b.module(&sa, "Phi3Attention");
        let o = b.linear_module(&format!("{sa}.o_proj"), "Linear", qw, d, false, false);
        let qkv = b.linear_module(&format!("{sa}.qkv_proj"), "Linear", d, qw + 2 * kvw, false, false);
        let mlp = format!("{p}.mlp");
        b.module(&mlp, "Phi3MLP");
        let gu = b.linear_module(&format!("{mlp}.gate_up_proj"), "Linear", d, 2 * inter, false, false);
        let dn = b.linear_module(&format!("{mlp}.down_proj"), "Linear", inter, d, false, false);
        b.module(&format!("{mlp}.activation_fn"), act_class);
        b.module(&format!("{p}.input_layernorm"), "Phi3RMSNorm");
        let ln1 = b.param(format!("{p}.input_layernorm.weight"), vec![d]);
        b.module(&format!("{p}.post_attention_layernorm"), "Phi3RMSNorm");
        let ln2 = b.param(format!("{p}.post_attention_layernorm.weight"), vec![d]);
        b.module(&format!("{p}.resid_attn_dropout"), "Dropout");
        b.module(&format!("{p}.resid_mlp_dropout"), "Dropout");

        let norm = OpKind::RmsNorm { eps, head_dim: None, weight_f32: false, unit_offset: false, input_width: None };
        let h = b.op(&format!("{p}.input_layernorm"), norm.clone(), &format!("{p}.input_layernorm"), &[&x], vec![ln1], bsd(d));
        let qkvo = b.linear_op(&format!("{sa}.qkv_proj"), &h, qkv, qw + 2 * kvw, false);
        let rope = |offset| OpKind::Rope { head_dim: hd, offset: Some(offset), pass_through: true, head_stride: None, interleave: false, complex: false };
        let qr = b.op(&format!("{sa}.rope_q"), rope(0), &sa, &[&qkvo, &rot], vec![], bsd(qw));
        let kr = b.op(&format!("{sa}.rope_k"), rope(qw), &sa, &[&qkvo, &rot], vec![], bsd(kvw));
        let attn = OpKind::Attention { heads, kv_heads: kv, head_dim: hd, causal: true, dropout: attn_p, sliding_window: window, scaling: None, v_offset: Some(qw + kvw), softcap: None, mla: None };
        let a = b.op(&format!("{sa}.sdpa"), attn, &sa, &[&qr, &kr, &qkvo], vec![], bsd(qw));
        let ao = b.linear_op(&format!("{sa}.o_proj"), &a, o, d, false);
        let ao = b.op(&format!("{p}.resid_attn_dropout"), OpKind::Dropout { p: resid_p }, &format!("{p}.resid_attn_dropout"), &[&ao], vec![], bsd(d));
        x = b.op(&format!("{p}.residual_attn"), OpKind::Add, &p, &[&x, &ao], vec![], bsd(d));
        let h = b.op(&format!("{p}.post_attention_layernorm"), norm, &format!("{p}.post_attention_layernorm"), &[&x], vec![ln2], bsd(d));
        let g = b.linear_op(&format!("{mlp}.gate_up_proj"), &h, gu, 2 * inter, false);
        let g = b.op(&format!("{mlp}.gated_act"), OpKind::GatedActivation { act }, &mlp, &[&g], vec![], bsd(inter));
        let m = b.linear_op(&format!("{mlp}.down_proj"), &g, dn, d, false);
        let m = b.op(&format!("{p}.resid_mlp_dropout"), OpKind::Dropout { p: resid_p }, &format!("{p}.resid_mlp_dropout"), &[&m], vec![], bsd(d));
        x = b.op(&format!("{p}.residual_mlp"), OpKind::Add, &p, &[&x, &m], vec![], bsd(d));
    }
    let h = b.final_norm("Phi3RMSNorm", OpKind::RmsNorm { eps, head_dim: None, weight_f32: false, unit_offset: false, input_width: None }, &x, d);
    b.module("model.rotary_emb", "Phi3RotaryEmbedding");
    rotary_buffers(b, "", hd);
    lm_head(b, &h, d, vocab, tie, &embed);
    Ok(())
}

/// DeepSeek-V3 and DeepSeek-V2 (transformers' `DeepseekV3ForCausalLM`,
/// `DeepseekV2ForCausalLM`): multi-head latent attention — q
/// through a low-rank `q_a_proj` → RMSNorm → `q_b_proj` (or one `q_proj` without
/// `q_lora_rank`), k and v from a shared latent (`kv_a_proj_with_mqa`: `kv_lora_rank` latent
/// columns, RMS-normed, then `kv_b_proj`, and `qk_rope_head_dim` columns of one rotary key
/// head shared by all heads), the rotary parts interleaved (`rope_interleave`), the softmax
/// scaled by `qk_head_dim ** -0.5` times YaRN's `mscale_all_dim` correction squared; dense
/// SwiGLU MLPs in the first `first_k_dense_replace` layers, MoE in the rest: a sigmoid router
/// in float32 choosing among the best groups, routed experts and `n_shared_experts` shared ones
/// (one MLP as wide as them together), summed. DeepSeek-V2 differs in its RoPE (complex
/// products in float32, `apply_rotary_emb`), its router (softmax, the top-k (`greedy`) or the
/// top-k within the best groups by their best score (`group_limited_greedy`), scaled, not
/// renormalized: no `e_score_correction_bias`), `mlp_bias`, and its config's defaults.
fn deepseek(c: &Cfg, f: Family, b: &mut Builder) -> Result<(), IrError> {
    let v2 = f == Family::DeepseekV2;
    let pre = f.prefix();
    let norm_class = format!("{pre}RMSNorm");
    let Sizes { vocab, d, inter, layers, heads } = if v2 { c.sizes(102400, 4096, 11008, 32, 32)? } else { c.sizes(129280, 7168, 18432, 61, 128)? };
    let kv = c.opt_u("num_key_value_heads")?.unwrap_or(heads);
    if kv != heads {
        return Err(c.err(format!("num_key_value_heads {kv} differs from num_attention_heads {heads}: DeepSeek's latent attention makes k and v for every head")));
    }
    let moe_inter = c.u("moe_intermediate_size", if v2 { 1407 } else { 2048 })?;
    let shared = c.u("n_shared_experts", if v2 { 2 } else { 1 })?;
    let experts = c.u("n_routed_experts", if v2 { 64 } else { 256 })?;
    let scale = c.f("routed_scaling_factor", if v2 { 1.0 } else { 2.5 })?;
    let kvr = c.u("kv_lora_rank", 512)?;
    // (an explicit null: one q_proj, DeepSeek-V2-Lite's; absent: the default rank)
    let _ = c.get("q_lora_rank");
    let qr = match c.v.get("q_lora_rank") {
        Some(Value::Null) => None,
        _ => Some(c.u("q_lora_rank", 1536)?),
    };
    let dr = c.u("qk_rope_head_dim", 64)?;
    let dv = c.u("v_head_dim", 128)?;
    let dn = c.u("qk_nope_head_dim", 128)?;
    // (DeepseekV2Config leaves n_group, topk_group and num_experts_per_tok None: greedy
    // routing needs no groups, and the experts per token must be given)
    let groups = match (v2, c.get("n_group")) {
        (true, None | Some(Value::Null)) => 1,
        _ => c.u("n_group", 8)?,
    };
    let topk_groups = match (v2, c.get("topk_group")) {
        (true, None | Some(Value::Null)) => 1,
        _ => c.u("topk_group", 4)?,
    };
    let top_k = match (v2, c.get("num_experts_per_tok")) {
        (true, None | Some(Value::Null)) => return Err(c.err("`num_experts_per_tok` must be set (DeepseekV2Config's default is None)")),
        _ => c.u("num_experts_per_tok", 8)?,
    };
    let first_dense = c.u("first_k_dense_replace", if v2 { 0 } else { 3 })?;
    // (DeepSeek-V2's router reads no norm_topk_prob)
    let normalize = if v2 { c.b("norm_topk_prob", false).map(|_| false)? } else { c.b("norm_topk_prob", true)? };
    let group_limited = v2
        && match c.s("topk_method", "greedy")? {
            "greedy" => false,
            "group_limited_greedy" => true,
            m => return Err(c.err(format!("`topk_method` `{m}` is not one DeepseekV2TopkRouter has (greedy, group_limited_greedy)"))),
        };
    let mlp_bias = v2 && c.b("mlp_bias", false)?;
    let (act, act_class) = {
        let a = c.s("hidden_act", "silu")?;
        act_of(a).ok_or_else(|| c.err(format!("unsupported hidden_act `{a}`")))?
    };
    let eps = c.f("rms_norm_eps", 1e-6)?;
    let tie = c.b("tie_word_embeddings", false)?;
    let interleave = !v2 && c.b("rope_interleave", true)?;
    let bias = c.b("attention_bias", false)?;
    let attn_p = c.f("attention_dropout", 0.0)?;
    let theta = c.rope_theta(10000.0)?;
    let scaling = c.rope_scaling()?;
    if dr == 0 || !dr.is_multiple_of(2) {
        return Err(c.err(format!("qk_rope_head_dim {dr} must be even and positive")));
    }
    let min_group = if v2 { 1 } else { 2 };
    if experts > 0 && (groups == 0 || !experts.is_multiple_of(groups) || experts / groups < min_group) {
        return Err(c.err(format!("n_routed_experts {experts} must split into n_group {groups} groups of at least {min_group} experts")));
    }
    if topk_groups == 0 || topk_groups > groups {
        return Err(c.err(format!("topk_group {topk_groups} must be between 1 and n_group {groups}")));
    }
    if top_k == 0 || top_k > topk_groups * (experts / groups.max(1)) {
        return Err(c.err(format!("num_experts_per_tok {top_k} must be between 1 and the experts of the topk_group {topk_groups} best groups ({})", topk_groups * (experts / groups.max(1)))));
    }
    let dqk = dn + dr;
    // `yarn_apply_mscale`: qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) squared
    // under YaRN
    let mut softmax_scale = (dqk as f64).powf(-0.5);
    if let Some(RopeScaling::Yarn { factor, .. }) = scaling {
        let all_dim = ["rope_scaling", "rope_parameters"].iter().find_map(|k| c.get(k).and_then(|r| r.get("mscale_all_dim")).and_then(|x| x.as_f64())).unwrap_or(0.0);
        if all_dim != 0.0 && factor > 1.0 {
            let m = 0.1 * all_dim * factor.ln() + 1.0;
            softmax_scale *= m * m;
        }
    }
    let (embed, mut x) = b.decoder_start(&f.architecture(), &format!("{pre}Model"), vocab, d);
    // (the rotary tables are `qk_rope_head_dim` wide: the config's `head_dim`)
    let rot = b.op("model.rotary_emb", OpKind::RotaryEmbedding { theta, head_dim: dr, scaling, f32_tables: false, complex: v2 }, "model.rotary_emb", &["input_ids"], vec![], vec![Dim::N(1), sym("seq"), Dim::N(dr)]);
    let norm = |eps: f64, input_width: Option<u64>| OpKind::RmsNorm { eps, head_dim: None, weight_f32: false, unit_offset: false, input_width };
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let sa = format!("{p}.self_attn");
        b.module(&p, &f.layer_class());
        b.module(&sa, &format!("{pre}Attention"));
        let q_params = match qr {
            None => vec![b.linear_module(&format!("{sa}.q_proj"), "Linear", d, heads * dqk, false, false)],
            Some(r) => {
                let a = b.linear_module(&format!("{sa}.q_a_proj"), "Linear", d, r, bias, false);
                b.module(&format!("{sa}.q_a_layernorm"), &norm_class);
                let n = b.param(format!("{sa}.q_a_layernorm.weight"), vec![r]);
                let bb = b.linear_module(&format!("{sa}.q_b_proj"), "Linear", r, heads * dqk, false, false);
                vec![a, vec![n], bb]
            }
        };
        let kva = b.linear_module(&format!("{sa}.kv_a_proj_with_mqa"), "Linear", d, kvr + dr, bias, false);
        b.module(&format!("{sa}.kv_a_layernorm"), &norm_class);
        let kvn = b.param(format!("{sa}.kv_a_layernorm.weight"), vec![kvr]);
        let kvb = b.linear_module(&format!("{sa}.kv_b_proj"), "Linear", kvr, heads * (dn + dv), false, false);
        let o = b.linear_module(&format!("{sa}.o_proj"), "Linear", heads * dv, d, bias, false);
        let mlp = format!("{p}.mlp");
        let moe = i >= first_dense;
        let mlp_class = format!("{pre}MLP");
        let swiglu_params = |b: &mut Builder, path: &str, class: &str, width: u64| {
            b.module(path, class);
            let g = b.linear_module(&format!("{path}.gate_proj"), "Linear", d, width, mlp_bias, false);
            let u = b.linear_module(&format!("{path}.up_proj"), "Linear", d, width, mlp_bias, false);
            let dn = b.linear_module(&format!("{path}.down_proj"), "Linear", width, d, mlp_bias, false);
            b.module(&format!("{path}.act_fn"), act_class);
            [g, u, dn]
        };
        let (routed, mlp_params) = if moe {
            b.module(&mlp, if v2 { "DeepseekV2Moe" } else { "DeepseekV3MoE" });
            b.module(&format!("{mlp}.experts"), &format!("{pre}Experts"));
            let gu = b.param(format!("{mlp}.experts.gate_up_proj"), vec![experts, 2 * moe_inter, d]);
            let dnp = b.param(format!("{mlp}.experts.down_proj"), vec![experts, d, moe_inter]);
            b.module(&format!("{mlp}.experts.act_fn"), act_class);
            b.module(&format!("{mlp}.gate"), &format!("{pre}TopkRouter"));
            let g = b.param(format!("{mlp}.gate.weight"), vec![experts, d]);
            if !v2 {
                b.m.buffers.push(Buffer { name: format!("{mlp}.gate.e_score_correction_bias"), shape: vec![experts], dtype: b.dtype, persistent: true });
            }
            let sh = swiglu_params(b, &format!("{mlp}.shared_experts"), &mlp_class, moe_inter * shared);
            (Some((g, vec![gu, dnp])), sh)
        } else {
            (None, swiglu_params(b, &mlp, &mlp_class, inter))
        };
        b.module(&format!("{p}.input_layernorm"), &norm_class);
        let ln1 = b.param(format!("{p}.input_layernorm.weight"), vec![d]);
        b.module(&format!("{p}.post_attention_layernorm"), &norm_class);
        let ln2 = b.param(format!("{p}.post_attention_layernorm.weight"), vec![d]);

        let h = b.op(&format!("{p}.input_layernorm"), norm(eps, None), &format!("{p}.input_layernorm"), &[&x], vec![ln1], bsd(d));
        let mut qp = q_params.into_iter();
        let q = match qr {
            None => b.linear_op(&format!("{sa}.q_proj"), &h, qp.next().unwrap_or_default(), heads * dqk, false),
            Some(r) => {
                let qa = b.linear_op(&format!("{sa}.q_a_proj"), &h, qp.next().unwrap_or_default(), r, false);
                // (DeepseekV3RMSNorm's own eps default: the config's rms_norm_eps is not passed)
                let qn = b.op(&format!("{sa}.q_a_layernorm"), norm(1e-6, None), &format!("{sa}.q_a_layernorm"), &[&qa], qp.next().unwrap_or_default(), bsd(r));
                b.linear_op(&format!("{sa}.q_b_proj"), &qn, qp.next().unwrap_or_default(), heads * dqk, false)
            }
        };
        let ckv = b.linear_op(&format!("{sa}.kv_a_proj_with_mqa"), &h, kva, kvr + dr, false);
        let kv_nope = b.op(&format!("{sa}.kv_a_layernorm"), norm(1e-6, Some(kvr + dr)), &format!("{sa}.kv_a_layernorm"), &[&ckv], vec![kvn], bsd(kvr));
        let rope = |offset: u64, head_stride: Option<u64>| OpKind::Rope { head_dim: dr, offset: Some(offset), pass_through: false, head_stride, interleave, complex: v2 };
        let q_rot = b.op(&format!("{sa}.rope_q"), rope(dn, Some(dqk)), &sa, &[&q, &rot], vec![], bsd(heads * dr));
        let k_rot = b.op(&format!("{sa}.rope_k"), rope(kvr, None), &sa, &[&ckv, &rot], vec![], bsd(dr));
        let kvo = b.linear_op(&format!("{sa}.kv_b_proj"), &kv_nope, kvb, heads * (dn + dv), false);
        let attn = OpKind::Attention {
            heads,
            kv_heads: heads,
            head_dim: dqk,
            causal: true,
            dropout: attn_p,
            sliding_window: None,
            scaling: Some(softmax_scale),
            v_offset: None,
            softcap: None,
            mla: Some(Mla { nope: dn, v_head_dim: dv }),
        };
        let a = b.op(&format!("{sa}.sdpa"), attn, &sa, &[&q, &q_rot, &kvo, &k_rot], vec![], bsd(heads * dv));
        let ao = b.linear_op(&format!("{sa}.o_proj"), &a, o, d, false);
        x = b.op(&format!("{p}.residual_attn"), OpKind::Add, &p, &[&x, &ao], vec![], bsd(d));
        let h = b.op(&format!("{p}.post_attention_layernorm"), norm(eps, None), &format!("{p}.post_attention_layernorm"), &[&x], vec![ln2], bsd(d));
        let swiglu = |b: &mut Builder, path: &str, [g, u, dn]: [Vec<String>; 3], width: u64| {
            let go = b.linear_op(&format!("{path}.gate_proj"), &h, g, width, false);
            let ga = b.op(&format!("{path}.act_fn"), OpKind::Activation { act }, &format!("{path}.act_fn"), &[&go], vec![], bsd(width));
            let uo = b.linear_op(&format!("{path}.up_proj"), &h, u, width, false);
            let gu = b.op(&format!("{path}.mul"), OpKind::Mul, path, &[&ga, &uo], vec![], bsd(width));
            b.linear_op(&format!("{path}.down_proj"), &gu, dn, d, false)
        };
        let m = match routed {
            Some((g, ex)) => {
                // the router: F.linear in float32 (an `aten.mm`: op-level SAC counts it), then
                // sigmoid, the group-limited top-k and the renormalized, scaled weights
                let gate = format!("{mlp}.gate");
                let logits = b.op(&gate, OpKind::Linear { bias: false, transposed: false, float32: true }, &gate, &[&h], vec![g], bsd(experts));
                let router = match v2 {
                    true => OpKind::Router { experts, top_k, normalize, cast: false, sigmoid: None, scaled: Some(ScaledTopK { scale, groups: group_limited.then_some((groups, topk_groups)) }) },
                    false => OpKind::Router { experts, top_k, normalize, cast: false, sigmoid: Some(GroupedTopK { groups, topk_groups, scale }), scaled: None },
                };
                let r = b.op(&format!("{gate}.route"), router, &gate, &[&logits], vec![], bsd(top_k));
                let e = b.op(&format!("{mlp}.experts"), OpKind::Experts { experts, top_k, intermediate: moe_inter, act }, &format!("{mlp}.experts"), &[&h, &r], ex, bsd(d));
                let s = swiglu(b, &format!("{mlp}.shared_experts"), mlp_params, moe_inter * shared);
                b.op(&format!("{mlp}.add"), OpKind::Add, &mlp, &[&e, &s], vec![], bsd(d))
            }
            None => swiglu(b, &mlp, mlp_params, inter),
        };
        x = b.op(&format!("{p}.residual_mlp"), OpKind::Add, &p, &[&x, &m], vec![], bsd(d));
    }
    let h = b.final_norm(&norm_class, norm(eps, None), &x, d);
    b.module("model.rotary_emb", &format!("{pre}RotaryEmbedding"));
    rotary_buffers(b, "", dr);
    lm_head(b, &h, d, vocab, tie, &embed);
    Ok(())
}
