//! The model IR data types: what a `*.ron` model file holds.
//!
//! A model is plain data: the module tree (paths and class names, in `named_modules()`
//! pre-order), the parameters (shapes, dtypes, tied aliases), the buffers, and the forward
//! op graph with symbolic `batch`/`seq` shapes. Validation lives in [`crate::validate`];
//! the petgraph view of the ops in [`crate::graph`].

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element types, with torch's names (`float32`, `bfloat16`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Float32,
    Bfloat16,
    Float16,
    Int64,
    Int32,
    Uint8,
    Bool,
    /// torch.float8_e4m3fn: torchao's float8 weights and activations (all-gathered weights
    /// under `enable_fsdp_float8_all_gather`).
    #[serde(rename = "float8_e4m3fn")]
    Float8E4m3fn,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::Float32 | DType::Int32 => 4,
            DType::Bfloat16 | DType::Float16 => 2,
            DType::Int64 => 8,
            DType::Uint8 | DType::Bool | DType::Float8E4m3fn => 1,
        }
    }

    /// torch's name, as FSDP2 logs and fixtures record it.
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Bfloat16 => "bfloat16",
            DType::Float16 => "float16",
            DType::Int64 => "int64",
            DType::Int32 => "int32",
            DType::Uint8 => "uint8",
            DType::Bool => "bool",
            DType::Float8E4m3fn => "float8_e4m3fn",
        }
    }

    /// Parses torch's names and the usual short ones (`bf16`, `fp32`, `torch.float16`, …).
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("torch.").unwrap_or(&s);
        Some(match s {
            "float32" | "f32" | "fp32" | "float" => DType::Float32,
            "bfloat16" | "bf16" => DType::Bfloat16,
            "float16" | "f16" | "fp16" | "half" => DType::Float16,
            "int64" | "long" | "i64" => DType::Int64,
            "int32" | "int" | "i32" => DType::Int32,
            "uint8" | "u8" => DType::Uint8,
            "bool" => DType::Bool,
            "float8_e4m3fn" | "fp8" | "float8" => DType::Float8E4m3fn,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::Float32 | DType::Bfloat16 | DType::Float16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

/// One dimension of a shape: a constant or one of the symbols `batch` and `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    N(u64),
    Sym(String),
}

/// Values for the symbolic dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub batch: u64,
    pub seq: u64,
}

impl Dim {
    pub fn eval(&self, d: Dims) -> Option<u64> {
        match self {
            Dim::N(n) => Some(*n),
            Dim::Sym(s) if s == "batch" => Some(d.batch),
            Dim::Sym(s) if s == "seq" => Some(d.seq),
            Dim::Sym(_) => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::N(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// A shape with symbolic dims.
pub type Shape = Vec<Dim>;

/// Number of elements of a shape for given symbol values (None on overflow or unknown symbol).
pub fn numel(shape: &[Dim], d: Dims) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, x| acc.checked_mul(x.eval(d)?))
}

/// A node of the module tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Module {
    /// Fully qualified path; `""` is the root.
    pub path: String,
    /// Class name (HF's for imported models, e.g. `LlamaDecoderLayer`).
    pub class: String,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A parameter. An alias of a tied weight has `tied_to` set to the primary's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Param {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    #[serde(default = "yes")]
    pub requires_grad: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_to: Option<String>,
}

impl Param {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    /// The module that registers this parameter (its name minus the last component).
    pub fn module(&self) -> &str {
        self.name.rsplit_once('.').map(|(m, _)| m).unwrap_or("")
    }
}

/// A module buffer (e.g. rotary `inv_freq`), replicated on every rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buffer {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    #[serde(default = "yes")]
    pub persistent: bool,
}

/// A forward input of the model (token ids, labels).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pub name: String,
    pub shape: Shape,
    pub dtype: DType,
}

/// Activation functions used by the op kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    Silu,
    /// GPT-2's `NewGELUActivation` (`gelu_new`): the tanh approximation in Python, eight kernels.
    GeluTanh,
    /// `gelu_pytorch_tanh` (HF `GELUTanh`): `F.gelu(x, approximate="tanh")`, one kernel.
    GeluPytorchTanh,
    Gelu,
    Relu,
    /// `torch.tanh` (Gemma 2's logit soft-capping): autograd saves its output.
    Tanh,
}

/// A RoPE frequency scaling (HF `rope_scaling.rope_type`). It changes the rotary tables'
/// values only: no shape, FLOP or byte.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum RopeScaling {
    /// Llama 3.1's: `inv_freq` divided by `factor` for wavelengths past
    /// `original_max_position_embeddings / low_freq_factor`, kept below `… / high_freq_factor`,
    /// smoothly interpolated between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: u64 },
    /// Linear position interpolation (`rope_type: linear`, Gemma 3's global layers):
    /// `inv_freq / factor`.
    Linear { factor: f64 },
    /// YaRN (`rope_type: yarn`, DeepSeek-V3): `inv_freq` blended between `inv_freq / factor`
    /// and `inv_freq` along a linear ramp over the dimensions between the correction range of
    /// `beta_fast` and `beta_slow` rotations at `original_max_position_embeddings` (`truncate`:
    /// its bounds rounded outwards), the tables times `attention_factor`.
    Yarn { factor: f64, original_max_position_embeddings: u64, beta_fast: f64, beta_slow: f64, attention_factor: f64, truncate: bool },
}

/// DeepSeek's multi-head latent attention (transformers' `DeepseekV3Attention`), after its
/// projections. Inputs: `q_b_proj`'s output (each head `nope + rope` wide; q's first `nope`
/// columns per head are read as a view), q's rotated part (a [`OpKind::Rope`]), `kv_b_proj`'s
/// output (each head `nope + v_head_dim` wide: k's first part and v, views) and k's rotated
/// part (one head, broadcast to all). q is `torch.cat` of its two parts; k is made with
/// `new_empty` and two `copy_` (its parts, the rotated one expanded); v stays a strided view.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mla {
    pub nope: u64,
    pub v_head_dim: u64,
}

/// The expert selection of DeepSeek-V3's router: `groups` groups of experts, each scored by
/// the sum of its best two biased scores; the best `topk_groups` groups are kept and the
/// top-k experts chosen among theirs; the chosen sigmoid scores are renormalized (with
/// `normalize`) and multiplied by `scale` (`routed_scaling_factor`). The bias is the gate's
/// `e_score_correction_bias` buffer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupedTopK {
    pub groups: u64,
    pub topk_groups: u64,
    pub scale: f64,
}

/// DeepSeek-V2's expert choice: the top-k of the softmax scores (`greedy`), or
/// (`group_limited_greedy`: `groups` = (n_group, topk_group)) of the scores of the `topk_group`
/// groups whose best score is highest, the others zeroed; the chosen scores times `scale`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaledTopK {
    pub scale: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<(u64, u64)>,
}

/// What an op computes. Attributes are what FLOPs, saved bytes and execution need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum OpKind {
    /// Row gather from `params[0]` by integer ids (`inputs[0]`).
    Embedding,
    /// GPT-2's learned positions: gather rows `0..seq` of `params[0]`.
    PositionEmbedding,
    /// `x @ W^T (+ b)`; `transposed` is GPT-2's Conv1D (`W` stored `[in, out]`).
    /// `float32`: computed in float32 on float32 copies of the input and the weight, whatever
    /// their dtype (DeepSeek-V3's router: `F.linear(x.type(torch.float32), w.type(torch.float32))`).
    Linear {
        bias: bool,
        transposed: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        float32: bool,
    },
    LayerNorm { eps: f64 },
    /// HF's RMSNorm (`x32 · rsqrt(mean(x32²) + eps)`, cast back, times the weight) over the
    /// last dim, or with `head_dim` over each head's `head_dim` elements of it (Qwen3's
    /// `q_norm` / `k_norm` on the projection viewed `[…, heads, head_dim]`).
    RmsNorm {
        eps: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        head_dim: Option<u64>,
        /// OLMo-2's order: the weight multiplies the float32 normalized values, then the
        /// product is cast back (`(weight * x32n).to(dtype)`), where Llama casts first.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        weight_f32: bool,
        /// Gemma's: the weight is stored as an offset from one, and the float32 normalized
        /// values are multiplied by `1 + weight.float()` before the cast back
        /// (`(xn * (1 + w32)).type_as(x)`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unit_offset: bool,
        /// The input is this wide and the norm reads its first `shape[-1]` columns: a
        /// `torch.split` view (DeepSeek's `kv_a_layernorm` over the latent part of
        /// `kv_a_proj_with_mqa`'s output).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_width: Option<u64>,
    },
    /// Element-wise sum of two inputs.
    Add,
    /// Element-wise product of two inputs.
    Mul,
    /// The input times a constant, `x * factor` (`divide`: `x / factor`, the first step of
    /// Gemma 2's soft-capping), by a Python number; with `buffer`, by a 0-dim float32 buffer
    /// cast to the input's dtype (Gemma's embeddings times `sqrt(hidden_size)`: a copy made,
    /// and saved, when the dtypes differ).
    Scale {
        factor: f64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        divide: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        buffer: bool,
    },
    Activation { act: Act },
    /// A gated activation over a fused gate/up projection (Phi-3's `gate_up_proj`): the input
    /// chunked in two halves, `up * act(gate)` (gate the first half).
    GatedActivation { act: Act },
    /// Dropout with probability `p` (saves a mask when `p > 0`).
    Dropout { p: f64 },
    /// The rotary tables `cos` and `sin`, `[1, seq, head_dim]` each, from the `inv_freq`
    /// buffer (input: token ids, for `seq`). Computed once and shared by all layers.
    RotaryEmbedding {
        theta: f64,
        head_dim: u64,
        /// HF `rope_scaling` (`rope_parameters`) other than the default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scaling: Option<RopeScaling>,
        /// The tables stay float32 (OLMo-2's rotary module does not cast them to the
        /// activations' dtype; under FSDP2 mixed precision each layer's forward-input cast
        /// makes its own low-precision copy).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        f32_tables: bool,
        /// DeepSeek-V2's: one complex64 table `polar(1, freqs)` `[1, seq, head_dim / 2]`
        /// (float32 parts, as many bytes as a float32 `[1, seq, head_dim]`), not cos and sin.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        complex: bool,
    },
    /// Applies RoPE to q or k (inputs: the projection, the `RotaryEmbedding` output).
    /// `offset`: the projection is a fused one (Phi-3's `qkv_proj`) and q or k is the view of
    /// its columns from `offset` on, as wide as the output. `pass_through`: HF's partial-rotary
    /// code path (Phi-3), which slices the rotated part off and concatenates the rest back.
    Rope {
        head_dim: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pass_through: bool,
        /// The input's heads are this wide and the rotated part is `head_dim` columns of each
        /// from `offset` on (DeepSeek's `q_rot`: the last `qk_rope_head_dim` columns of every
        /// `qk_head_dim`-wide head of `q_b_proj`'s output, a `torch.split` view).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        head_stride: Option<u64>,
        /// DeepSeek's `apply_rotary_pos_emb_interleave`: the pairs `(x0, x1), (x2, x3), …`
        /// rotate together (even and odd strided slices, the two results concatenated), where
        /// HF's default rotates `x[i]` with `x[i + d/2]`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interleave: bool,
        /// DeepSeek-V2's `apply_rotary_emb`: the pairs viewed as complex numbers (in float32)
        /// times the complex table, viewed back as real and cast to the input's dtype.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        complex: bool,
    },
    /// Scaled dot-product attention. Inputs: q, k, v (after RoPE, q and k packed in one
    /// input when it comes from `Rope`), or one fused `qkv` input (GPT-2).
    Attention {
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        causal: bool,
        dropout: f64,
        /// Sliding-window attention (Mistral): HF builds an explicit mask when seq > window.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sliding_window: Option<u64>,
        /// The softmax scale when it is not `1/sqrt(head_dim)` (Gemma's
        /// `query_pre_attn_scalar ** -0.5`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scaling: Option<f64>,
        /// v is the view of the third input's columns from this offset on (Phi-3's fused
        /// `qkv_proj` output), `kv_heads · head_dim` wide.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        v_offset: Option<u64>,
        /// Gemma 2's `attn_logit_softcapping`: the scaled scores become `tanh(s / c) · c`
        /// before the mask. HF applies it in eager attention (and flash-attention); its SDPA
        /// path ignores it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        softcap: Option<f64>,
        /// DeepSeek's multi-head latent attention ([`Mla`]); `head_dim` is then the q/k head
        /// width (`qk_nope_head_dim + qk_rope_head_dim`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mla: Option<Mla>,
    },
    /// MoE router over the gate's logits (input: the `Linear` of the router's weight):
    /// softmax over `experts` in float32, top-k selection,
    /// renormalized over the k (`normalize`: Mixtral always, Qwen3-MoE's `norm_topk_prob`),
    /// the weights cast back to the logits' dtype (`cast`: Qwen3-MoE) or kept in float32.
    Router {
        experts: u64,
        top_k: u64,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        normalize: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cast: bool,
        /// DeepSeek-V3's scoring (`DeepseekV3TopkRouter`): sigmoid instead of softmax, the
        /// experts chosen by `scores + e_score_correction_bias` within the best groups, the
        /// weights gathered from the sigmoid scores ([`GroupedTopK`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sigmoid: Option<GroupedTopK>,
        /// DeepSeek-V2's (`DeepseekV2TopkRouter`, after its float32 linear): the softmax
        /// scores' top-k ([`ScaledTopK`]), times `scale`, not renormalized.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scaled: Option<ScaledTopK>,
    },
    /// MoE experts: SwiGLU per expert over routed tokens. Inputs: hidden, router output.
    /// Params: `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`.
    Experts {
        experts: u64,
        top_k: u64,
        intermediate: u64,
        act: Act,
    },
    /// Causal-LM loss: shift, upcast logits to float32, cross-entropy (mean).
    CrossEntropy { vocab: u64 },
}

impl OpKind {
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Embedding => "embedding",
            OpKind::PositionEmbedding => "position_embedding",
            OpKind::Linear { .. } => "linear",
            OpKind::LayerNorm { .. } => "layer_norm",
            OpKind::RmsNorm { .. } => "rms_norm",
            OpKind::Add => "add",
            OpKind::Mul => "mul",
            OpKind::Scale { .. } => "scale",
            OpKind::GatedActivation { .. } => "gated_activation",
            OpKind::Activation { .. } => "activation",
            OpKind::Dropout { .. } => "dropout",
            OpKind::RotaryEmbedding { .. } => "rotary_embedding",
            OpKind::Rope { .. } => "rope",
            OpKind::Attention { .. } => "attention",
            OpKind::Router { .. } => "router",
            OpKind::Experts { .. } => "experts",
            OpKind::CrossEntropy { .. } => "cross_entropy",
        }
    }
}

/// One op of the forward graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// Unique name; other ops refer to this op's output by it.
    pub name: String,
    pub kind: OpKind,
    /// Path of the module whose forward runs this op.
    pub module: String,
    /// Op names or model input names.
    pub inputs: Vec<String>,
    /// Parameter names (aliases allowed) this op reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<String>,
    /// Output shape.
    pub shape: Shape,
}

/// A whole model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub name: String,
    /// HF architecture (e.g. `LlamaForCausalLM`), or a free name for hand-written models.
    pub architecture: String,
    /// HF `attn_implementation` default for this model (`sdpa`, `eager`, `flash_attention_2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_implementation: Option<String>,
    /// Modules in `named_modules()` pre-order; the first is the root `""`.
    pub modules: Vec<Module>,
    pub params: Vec<Param>,
    #[serde(default)]
    pub buffers: Vec<Buffer>,
    pub inputs: Vec<Input>,
    /// Forward ops in execution order.
    pub ops: Vec<Op>,
    /// Alias → primary index, built on first use (a model is not mutated after that).
    #[serde(skip)]
    pub alias_index: AliasIndex,
}

/// Lazily built name indexes (alias → primary, name → param, module path → module); always
/// equal to any other (they are caches).
#[derive(Debug, Clone, Default)]
pub struct AliasIndex(
    std::sync::OnceLock<rustc_hash::FxHashMap<String, String>>,
    std::sync::OnceLock<rustc_hash::FxHashMap<String, usize>>,
    std::sync::OnceLock<rustc_hash::FxHashMap<String, usize>>,
);

impl PartialEq for AliasIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Model {
    /// The model with every floating-point parameter in `dtype` (what HF's `from_config`
    /// builds with `dtype=`). So are its persistent floating-point buffers (made in the default
    /// dtype: DeepSeek's `e_score_correction_bias`); the non-persistent ones (the rotary
    /// `inv_freq`, Gemma's `embed_scale`: float32 by construction) keep theirs.
    pub fn with_param_dtype(&self, dtype: DType) -> Model {
        let mut m = self.clone();
        for p in m.params.iter_mut().filter(|p| p.dtype.is_float()) {
            p.dtype = dtype;
        }
        for b in m.buffers.iter_mut().filter(|b| b.persistent && b.dtype.is_float()) {
            b.dtype = dtype;
        }
        m
    }

    /// Distinct parameter storages (aliases excluded).
    pub fn primary_params(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| p.tied_to.is_none())
    }

    /// `sum(p.numel() for p in model.parameters())`: aliases counted once.
    pub fn total_numel(&self) -> u64 {
        self.primary_params().map(Param::numel).sum()
    }

    /// The primary name of a parameter name (itself unless it is a tied alias). O(1) after
    /// the first call.
    pub fn primary_of<'a>(&'a self, name: &'a str) -> &'a str {
        let idx = self.alias_index.0.get_or_init(|| {
            self.params
                .iter()
                .filter_map(|p| p.tied_to.as_ref().map(|t| (p.name.clone(), t.clone())))
                .collect()
        });
        idx.get(name).map(String::as_str).unwrap_or(name)
    }

    /// The parameter (or alias entry) with this name. O(1) after the first call.
    pub fn param(&self, name: &str) -> Option<&Param> {
        let idx = self
            .alias_index
            .1
            .get_or_init(|| self.params.iter().enumerate().map(|(i, p)| (p.name.clone(), i)).collect());
        idx.get(name).and_then(|&i| self.params.get(i))
    }

    /// The class of the module at `path` (indexed on first use).
    pub fn module_class(&self, path: &str) -> Option<&str> {
        let idx = self
            .alias_index
            .2
            .get_or_init(|| self.modules.iter().enumerate().map(|(i, m)| (m.path.clone(), i)).collect());
        idx.get(path).and_then(|&i| self.modules.get(i)).map(|m| m.class.as_str())
    }
}

/// Is `path` equal to `ancestor` or inside it?
pub fn is_within(path: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || path == ancestor
        || (path.len() > ancestor.len()
            && path.starts_with(ancestor)
            && path.as_bytes()[ancestor.len()] == b'.')
}

/// Parent path of a module path (`None` for the root).
pub fn parent_path(path: &str) -> Option<&str> {
    if path.is_empty() {
        None
    } else {
        Some(path.rsplit_once('.').map(|(p, _)| p).unwrap_or(""))
    }
}
