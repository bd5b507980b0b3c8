//! Forward kernels of every IR op kind, in tch, following HF transformers 5.17.0's
//! implementations (the same math, so losses and gradients match HF).

use crate::error::RtError;
use fsdp_ir::{Act, Op, OpKind};
use tch::{Kind, Tensor};

/// Attention implementation the runtime executes (the plan's `attn_implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attn {
    Sdpa,
    Eager,
}

/// Per-step context of the kernels.
#[derive(Debug, Clone, Copy)]
pub struct OpCx {
    pub attn: Attn,
    /// Compute dtype (the plan's param dtype).
    pub kind: Kind,
    /// Training mode: dropout draws its noise from this key. `None` is eval mode (dropout is
    /// the identity, as in HF's `model.eval()`).
    pub train: Option<Noise>,
    /// torchao float8 training (the plan's `--float8 tensorwise`): in single-device forwards
    /// ([`crate::reference`], the trainer's eval) the linears
    /// [`fsdp_planner::float8::is_float8_linear`] picks run as [`crate::float8`]'s (the sharded
    /// executor decides from the plan).
    pub float8: bool,
}

impl OpCx {
    /// Eval mode (no dropout).
    pub fn eval(attn: Attn, kind: Kind) -> OpCx {
        OpCx { attn, kind, train: None, float8: false }
    }
}

/// Where a dropout's noise comes from. The noise of batch row `r` of op `o` is a pure
/// function of (seed, step, micro-batch, `row0 + r`, o's name): every rank draws the rows of
/// the global batch it holds exactly as single-device training on the global batch does, a
/// recomputed (checkpointed) forward draws the same noise again, and a resumed run draws what
/// the uninterrupted one would have. (torch's global generator is shared by every rank
/// thread of the process, so it could give none of these.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noise {
    pub seed: u64,
    /// Optimizer step, counted from 0 over the whole run (resumes included).
    pub step: u64,
    pub micro: u64,
    /// Global batch row of this rank's first row.
    pub row0: u64,
}

/// SplitMix64's step: the mixed value of state `z` (the state then advances by the golden
/// gamma). The runtime's one source of deterministic randomness (dropout noise, initial
/// weights and synthetic data in `train`).
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// ATen's CPU dropout (`_dropout_impl`): `noise = bernoulli(1 - p) / (1 - p)` in the input's
/// dtype, `out = x * noise` (autograd saves the noise), with the noise drawn from `key`.
fn dropout(x: &Tensor, key: &Noise, op: &str, p: f64) -> Tensor {
    let shape = x.size();
    let rows = shape.first().copied().unwrap_or(1).max(1) as usize;
    let numel = shape.iter().product::<i64>().max(0) as usize;
    let per = numel / rows;
    let keep = 1.0 - p;
    // keep an element iff its 53-bit uniform draw is below keep
    let thresh = (keep * (1u64 << 53) as f64) as u64;
    let name = op.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01B3));
    let base = mix(key.seed ^ mix(name ^ mix(key.step ^ mix(key.micro))));
    let draw = |f: &mut dyn FnMut(usize, bool)| {
        for r in 0..rows {
            let mut s = mix(base ^ (key.row0 + r as u64));
            for e in 0..per {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                f(r * per + e, (mix(s) >> 11) < thresh);
            }
        }
    };
    let noise = if x.kind() == Kind::Double {
        let mut v = vec![0f64; numel];
        let s = 1.0 / keep;
        draw(&mut |i, k| v[i] = if k { s } else { 0.0 });
        Tensor::from_slice(&v)
    } else {
        let mut v = vec![0f32; numel];
        let s = (1.0 / keep) as f32;
        draw(&mut |i, k| v[i] = if k { s } else { 0.0 });
        Tensor::from_slice(&v).to_kind(x.kind())
    };
    x * noise.reshape(shape.as_slice()).to_device(x.device())
}

fn dims(t: &Tensor) -> Vec<i64> {
    t.size()
}

/// HF's `.float()` / `.to(torch.float32)` upcasts: low precision → float32; float32 and
/// float64 stay as they are (float64 runs are for exact comparisons).
fn up(t: &Tensor) -> Tensor {
    match t.kind() {
        Kind::Half | Kind::BFloat16 => t.to_kind(Kind::Float),
        _ => t.shallow_clone(),
    }
}

/// Runs one op. `inputs` are the values of `op.inputs`, `params` the (unsharded) tensors of
/// `op.params`, in order.
pub fn forward(cx: &OpCx, op: &Op, inputs: &[&Tensor], params: &[&Tensor]) -> Result<Tensor, RtError> {
    let bad = |m: &str| RtError::Op {
        op: op.name.clone(),
        message: m.to_string(),
    };
    let need = |n: usize, p: usize| -> Result<(), RtError> {
        if inputs.len() < n || params.len() < p {
            Err(bad(&format!("needs {n} inputs and {p} params, got {} and {}", inputs.len(), params.len())))
        } else {
            Ok(())
        }
    };
    Ok(match &op.kind {
        OpKind::Embedding => {
            need(1, 1)?;
            Tensor::embedding(params[0], inputs[0], -1, false, false)
        }
        OpKind::PositionEmbedding => {
            need(1, 1)?;
            let s = dims(inputs[0])[1];
            let pos = Tensor::arange(s, (Kind::Int64, inputs[0].device())).unsqueeze(0);
            Tensor::embedding(params[0], &pos, -1, false, false)
        }
        OpKind::Linear { bias, transposed, float32: true } if !*transposed => {
            // DeepSeek-V3's router: F.linear(x.type(float32), w.type(float32)) on the tokens
            need(1, if *bias { 2 } else { 1 })?;
            let f = |t: &Tensor| t.to_kind(Kind::Float);
            let x = inputs[0];
            let d = *dims(x).last().unwrap_or(&1);
            let mut sh = dims(x);
            let y = f(&x.reshape([-1, d])).linear(&f(params[0]), bias.then(|| f(params[1])).as_ref());
            if let Some(l) = sh.last_mut() {
                *l = dims(params[0])[0];
            }
            y.reshape(sh.as_slice())
        }
        OpKind::Linear { bias, transposed, .. } => {
            need(1, if *bias { 2 } else { 1 })?;
            let b = if *bias { Some(params[1]) } else { None };
            if *transposed {
                // GPT-2 Conv1D: addmm(bias, x.view(-1, in), weight).view(..., out)
                let x = inputs[0];
                let mut shape = dims(x);
                let fan_in = *shape.last().ok_or_else(|| bad("0-dim input"))?;
                let out = dims(params[0])[1];
                let x2 = x.reshape([-1, fan_in]);
                let y = match b {
                    Some(b) => b.addmm(&x2, params[0]),
                    None => x2.matmul(params[0]),
                };
                if let Some(l) = shape.last_mut() {
                    *l = out;
                }
                y.reshape(shape.as_slice())
            } else {
                inputs[0].linear(params[0], b)
            }
        }
        OpKind::LayerNorm { eps } => {
            need(1, 2)?;
            let d = *dims(inputs[0]).last().unwrap_or(&1);
            inputs[0].layer_norm([d], Some(params[0]), Some(params[1]), *eps, true)
        }
        OpKind::RmsNorm { eps, head_dim, weight_f32, unit_offset, input_width } => {
            // HF LlamaRMSNorm: x32 * rsqrt(mean(x32^2) + eps), cast back, times weight.
            // Per head (Qwen3's q_norm / k_norm): on the input viewed [..., heads, head_dim].
            // (DeepSeek's kv_a_layernorm: on the first columns of its input, a split view)
            need(1, 1)?;
            let part;
            let input = match input_width {
                Some(_) => {
                    part = inputs[0].narrow(-1, 0, dims(params[0])[0]);
                    &part
                }
                None => inputs[0],
            };
            let dims_in = dims(input);
            let viewed;
            let x = match *head_dim {
                Some(hd) => {
                    let mut v = dims_in.clone();
                    let last = v.pop().unwrap_or(1);
                    v.extend([last / hd as i64, hd as i64]);
                    viewed = inputs[0].view(v.as_slice());
                    &viewed
                }
                None => input,
            };
            let x32 = up(x);
            let var = x32.pow_tensor_scalar(2).mean_dim(-1, true, None::<Kind>);
            let xn = &x32 * (var + *eps).rsqrt();
            // OLMo-2 multiplies in float32 and casts after; Gemma by `1 + weight.float()`;
            // Llama casts, then multiplies
            let out = if *unit_offset {
                (&xn * (up(params[0]) + 1.0)).to_kind(x.kind())
            } else if *weight_f32 {
                (params[0] * &xn).to_kind(x.kind())
            } else {
                params[0] * xn.to_kind(x.kind())
            };
            match head_dim {
                Some(_) => out.view(dims_in.as_slice()),
                None => out,
            }
        }
        OpKind::Add => {
            need(2, 0)?;
            inputs[0] + inputs[1]
        }
        OpKind::Mul => {
            need(2, 0)?;
            inputs[0] * inputs[1]
        }
        OpKind::Scale { factor, divide, buffer } => {
            // Gemma: `x * embed_scale.to(weight.dtype)`, the float32 scalar rounded to the
            // activations' dtype first (sqrt(3072) = 55.43 is 55.5 in bf16); Gemma 2's
            // soft-capping: `x / cap`, `x * cap` by a Python number
            need(1, 0)?;
            let x = inputs[0];
            match (*buffer, *divide) {
                (true, _) => x * Tensor::from(*factor as f32).to_kind(x.kind()).to_device(x.device()),
                (false, true) => x / *factor,
                (false, false) => x * *factor,
            }
        }
        OpKind::Activation { act } => {
            need(1, 0)?;
            activation(inputs[0], *act)
        }
        OpKind::GatedActivation { act } => {
            // Phi-3: gate, up = x.chunk(2, -1); up * act(gate)
            need(1, 0)?;
            let halves = inputs[0].chunk(2, -1);
            let [gate, up] = halves.as_slice() else {
                return Err(RtError::Op { op: op.name.clone(), message: "the fused input does not chunk in two".into() });
            };
            up * activation(gate, *act)
        }
        OpKind::Dropout { p } => {
            need(1, 0)?;
            match cx.train {
                Some(key) if *p > 0.0 => dropout(inputs[0], &key, &op.name, *p),
                _ => inputs[0].shallow_clone(),
            }
        }
        OpKind::RotaryEmbedding { theta, head_dim, scaling, complex, .. } => {
            // HF default rope: inv_freq = 1 / theta^(arange(0, hd, 2) / hd) (Llama 3.1's
            // scaling applied to it); freqs = pos ⊗ inv_freq (f32); emb = cat(freqs, freqs);
            // cos and sin stacked as [2, s, hd].
            need(1, 0)?;
            let s = dims(inputs[0])[1];
            let dev = inputs[0].device();
            let hd = *head_dim as i64;
            let fk = if cx.kind == Kind::Double { Kind::Double } else { Kind::Float };
            let exps = Tensor::arange_start_step(0, hd, 2, (Kind::Int64, dev)).to_kind(fk) / (hd as f64);
            let mut inv = (Tensor::from(*theta).to_kind(fk).to_device(dev).pow(&exps)).reciprocal();
            if let Some(fsdp_ir::RopeScaling::Llama3 { factor, low_freq_factor: lo, high_freq_factor: hi, original_max_position_embeddings: n }) = *scaling {
                // transformers' _compute_llama3_parameters, op for op (`a / t` in Python is
                // `t.reciprocal() * a`)
                let n = n as f64;
                let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
                let long = wavelen.gt(n / lo);
                let scaled = (&inv / factor).where_self(&long, &inv);
                let smooth = (wavelen.reciprocal() * n - lo) / (hi - lo);
                let smoothed = (-&smooth + 1.0) * &scaled / factor + &smooth * &scaled;
                let medium = wavelen.lt(n / hi).logical_not().logical_and(&long.logical_not());
                inv = smoothed.where_self(&medium, &scaled);
            }
            if let Some(fsdp_ir::RopeScaling::Linear { factor }) = *scaling {
                inv /= factor;
            }
            let mut attention_factor = None;
            if let Some(fsdp_ir::RopeScaling::Yarn { factor, original_max_position_embeddings: n, beta_fast, beta_slow, attention_factor: a, truncate }) = *scaling {
                // transformers' _compute_yarn_parameters, op for op
                inv = yarn_inv_freq(&exps, *theta, hd, factor, n as f64, beta_fast, beta_slow, truncate, fk, dev);
                attention_factor = Some(a);
            }
            let pos = Tensor::arange(s, (Kind::Int64, dev)).to_kind(fk);
            let freqs = pos.unsqueeze(1).matmul(&inv.unsqueeze(0));
            if *complex {
                // DeepSeek-V2: freqs_cis = polar(ones_like(freqs), freqs) * attention_scaling
                // (complex, [seq, head_dim / 2]; not cast)
                return Ok(Tensor::polar(&freqs.ones_like(), &freqs) * attention_factor.unwrap_or(1.0));
            }
            let emb = Tensor::cat(&[&freqs, &freqs], -1);
            let (cos, sin) = match attention_factor {
                Some(a) => (emb.cos() * a, emb.sin() * a),
                None => (emb.cos(), emb.sin()),
            };
            Tensor::stack(&[cos, sin], 0).to_kind(cx.kind)
        }
        OpKind::Rope { head_dim, offset, head_stride, interleave, complex, .. } if *interleave || *complex || head_stride.is_some() => {
            // DeepSeek: the rotary part of each head of q (`head_stride` wide, from `offset`)
            // or of k's one head (columns from `offset`), a split view of the projection;
            // rotated in pairs (`interleave`) or by halves
            need(2, 0)?;
            let hd = *head_dim as i64;
            let x = inputs[0];
            let sh = dims(x);
            let (b, s) = (sh[0], sh[1]);
            let off = offset.unwrap_or(0) as i64;
            let part = match head_stride {
                Some(hs) => x.view([b, s, -1, *hs as i64]).narrow(-1, off, hd),
                None => x.narrow(-1, off, hd).view([b, s, 1, hd]),
            };
            // (in the [b, s, heads, d] layout: the same elementwise products as HF's
            // [b, heads, s, d], and a contiguous result)
            if *complex {
                // DeepSeek-V2's apply_rotary_emb: view_as_complex(x.float().reshape(…, -1, 2))
                // times freqs_cis, view_as_real, flattened, type_as(x)
                let xc = part.to_kind(Kind::Float).reshape([b, s, -1, hd / 2, 2]).view_as_complex();
                let rotated = (xc * inputs[1].unsqueeze(0).unsqueeze(2)).view_as_real().flatten(3, -1);
                return Ok(rotated.to_kind(x.kind()).reshape([b, s, -1]));
            }
            let cos = inputs[1].get(0).unsqueeze(0).unsqueeze(2);
            let sin = inputs[1].get(1).unsqueeze(0).unsqueeze(2);
            let out = if *interleave {
                let (c, sn) = (cos.narrow(-1, 0, hd / 2), sin.narrow(-1, 0, hd / 2));
                let x1 = part.slice(-1, 0, None, 2);
                let x2 = part.slice(-1, 1, None, 2);
                Tensor::cat(&[&x1 * &c - &x2 * &sn, &x2 * &c + &x1 * &sn], -1)
            } else {
                let x1 = part.narrow(-1, 0, hd / 2);
                let x2 = part.narrow(-1, hd / 2, hd / 2);
                &part * cos + Tensor::cat(&[&(-x2), &x1], -1) * sin
            };
            out.reshape([b, s, -1])
        }
        OpKind::Rope { head_dim, offset, .. } => {
            need(2, 0)?;
            // (Phi-3: q or k is a column slice of the fused qkv projection, as wide as the
            // output; the partial-rotary path's concatenation of nothing changes no value)
            let sliced;
            let x = match offset {
                Some(off) => {
                    let width = match op.shape.last() {
                        Some(fsdp_ir::Dim::N(w)) => *w as i64,
                        _ => return Err(RtError::Op { op: op.name.clone(), message: "a sliced RoPE needs a fixed output width".into() }),
                    };
                    sliced = inputs[0].narrow(-1, *off as i64, width);
                    &sliced
                }
                None => inputs[0],
            };
            let hd = *head_dim as i64;
            let sh = dims(x);
            let (b, s) = (sh[0], sh[1]);
            let x4 = x.reshape([b, s, -1, hd]);
            let cos = inputs[1].get(0).unsqueeze(0).unsqueeze(2);
            let sin = inputs[1].get(1).unsqueeze(0).unsqueeze(2);
            let x1 = x4.narrow(-1, 0, hd / 2);
            let x2 = x4.narrow(-1, hd / 2, hd / 2);
            let rot = Tensor::cat(&[&(-x2), &x1], -1);
            (&x4 * cos + rot * sin).reshape(sh.as_slice())
        }
        OpKind::Attention { heads, head_dim, dropout, scaling, mla: Some(m), .. } => {
            need(4, 0)?;
            if *dropout > 0.0 && cx.train.is_some() {
                return Err(bad("attention dropout in latent attention is not supported by the runtime"));
            }
            mla_attention(cx, inputs, *heads as i64, *head_dim as i64, m.nope as i64, m.v_head_dim as i64, *scaling)?
        }
        OpKind::Attention {
            heads,
            kv_heads,
            head_dim,
            sliding_window,
            dropout,
            scaling,
            softcap,
            v_offset,
            ..
        } => {
            // (Phi-3: v is a column slice of the fused qkv projection)
            let v = v_offset.map(|off| inputs[2].narrow(-1, off as i64, (*kv_heads * *head_dim) as i64));
            let ins: Vec<&Tensor> = match &v {
                Some(v) => vec![inputs[0], inputs[1], v],
                None => inputs.to_vec(),
            };
            attention(cx, op, &ins, *heads as i64, *kv_heads as i64, *head_dim as i64, *sliding_window, *dropout, *scaling, *softcap)?
        }
        OpKind::Router { top_k, normalize, sigmoid: Some(g), .. } => {
            // DeepseekV3TopkRouter after its float32 linear: sigmoid scores; the experts chosen
            // by the scores plus e_score_correction_bias (zeros: HF initializes it so and it is
            // not trained) within the `topk_groups` groups whose best two sum highest; the
            // chosen sigmoid scores renormalized (in place) and scaled. Packed as the other
            // routers: [tokens, 2k] (weights, then the indices as the weights' dtype).
            need(1, 0)?;
            let l = inputs[0];
            let e = *dims(l).last().unwrap_or(&1);
            let (ng, k) = (g.groups as i64, *top_k as i64);
            let scores = l.reshape([-1, e]).sigmoid();
            let choice = &scores + Tensor::zeros([e], (scores.kind(), scores.device()));
            let group_scores = choice.view([-1, ng, e / ng]).topk(2, -1, true, true).0.sum_dim_intlist(-1, false, None::<Kind>);
            let group_idx = group_scores.topk(g.topk_groups as i64, -1, true, false).1;
            let group_mask = group_scores.zeros_like().scatter_value(1, &group_idx, 1);
            let score_mask = group_mask.unsqueeze(-1).expand([-1, ng, e / ng], false).reshape([-1, e]);
            let choice = choice.masked_fill(&score_mask.to_kind(Kind::Bool).logical_not(), f64::NEG_INFINITY);
            let idx = choice.topk(k, -1, true, false).1;
            let mut w = scores.gather(1, &idx, false);
            if *normalize {
                let denom = w.sum_dim_intlist(-1, true, None::<Kind>) + 1e-20;
                let _ = w.g_div_(&denom);
            }
            let w = w * g.scale;
            let kind = w.kind();
            Tensor::cat(&[w, idx.to_kind(kind)], -1)
        }
        OpKind::Router { top_k, scaled: Some(sc), .. } => {
            // DeepseekV2TopkRouter after its float32 linear: softmax; the top-k (greedy), or
            // (group_limited_greedy) the top-k of the scores of the best groups by their best
            // score, the others zeroed; times routed_scaling_factor. Packed as the others.
            need(1, 0)?;
            let l = inputs[0];
            let e = *dims(l).last().unwrap_or(&1);
            let k = *top_k as i64;
            let scores = l.reshape([-1, e]).softmax(-1, Kind::Float);
            let scores = match sc.groups {
                None => scores,
                Some((g, tg)) => {
                    let g = g as i64;
                    let group_scores = scores.view([-1, g, e / g]).max_dim(-1, false).0;
                    let group_idx = group_scores.topk(tg as i64, -1, true, false).1;
                    let group_mask = group_scores.zeros_like().scatter_value(1, &group_idx, 1);
                    let score_mask = group_mask.unsqueeze(-1).expand([-1, g, e / g], false).reshape([-1, e]);
                    scores.masked_fill(&score_mask.to_kind(Kind::Bool).logical_not(), 0.0)
                }
            };
            let (w, idx) = scores.topk(k, -1, true, false);
            let w = w * sc.scale;
            let kind = w.kind();
            Tensor::cat(&[w, idx.to_kind(kind)], -1)
        }
        OpKind::Router { top_k, normalize, cast, .. } => {
            // MixtralTopKRouter / Qwen3MoeTopKRouter after the gate's linear (its own op):
            // softmax(logits.float()), top-k,
            // renormalized (always / with norm_topk_prob), Qwen3-MoE's cast back to the
            // logits' dtype. The output packs the weights and the expert indices (as the
            // weights' dtype: exact for up to 256 experts): [tokens, 2k].
            need(1, 0)?;
            let l = inputs[0];
            let e = *dims(l).last().unwrap_or(&1);
            let logits = l.reshape([-1, e]);
            let probs = up(&logits).softmax(-1, None::<Kind>);
            let (vals, idx) = probs.topk(*top_k as i64, -1, true, true);
            let vals = if *normalize { &vals / vals.sum_dim_intlist(-1, true, None::<Kind>) } else { vals };
            let vals = if *cast { vals.to_kind(logits.kind()) } else { vals };
            let k = vals.kind();
            Tensor::cat(&[vals, idx.to_kind(k)], -1)
        }
        OpKind::Experts { experts, top_k, .. } => {
            // transformers 5.17 `grouped_mm_experts_forward`: the (token, expert) pairs sorted
            // by expert, their inputs gathered, one grouped gate_up and one grouped down
            // matmul, silu(gate) * up, scaled by the routing weight, put back in token order
            // and summed over the k choices.
            need(2, 2)?;
            let h = inputs[0];
            let sh = dims(h);
            let hd = *sh.last().unwrap_or(&1);
            let x = h.reshape([-1, hd]);
            let tokens = x.size()[0];
            let (k, ne) = (*top_k as i64, *experts as i64);
            let weights = inputs[1].narrow(-1, 0, k).reshape([-1]);
            let ids = inputs[1].narrow(-1, k, k).to_kind(Kind::Int64).reshape([-1]);
            let (ids_g, perm) = ids.sort(0, false);
            let xg = x.index_select(0, &perm.floor_divide_scalar(k));
            let wg = weights.index_select(0, &perm);
            let counts = ids_g.bincount(None::<Tensor>, ne);
            let offs = counts.cumsum(0, Kind::Int);
            // no expert parallelism here, so no sentinel rows: the masks are all false, but
            // masked like HF (autograd saves the mask)
            let sentinel = ids_g.ge(ne).unsqueeze(-1);
            let mut xg = xg;
            let _ = xg.masked_fill_(&sentinel, 0.0);
            let gu = crate::shim::grouped_mm(&xg, &params[0].transpose(-2, -1), &offs)?.masked_fill(&sentinel, 0.0);
            let parts = gu.chunk(2, -1);
            let act = parts[0].silu() * &parts[1];
            let down = crate::shim::grouped_mm(&act, &params[1].transpose(-2, -1), &offs)?.masked_fill(&sentinel, 0.0);
            let weighted = down * wg.unsqueeze(-1);
            let s_pairs = perm.size()[0];
            let inv = tch::no_grad(|| perm.empty_like().scatter(0, &perm, &Tensor::arange(s_pairs, (Kind::Int64, perm.device()))));
            let weighted = weighted.index_select(0, &inv);
            weighted.view([tokens, k, hd]).sum_dim_intlist(1, false, None::<Kind>).to_kind(h.kind()).reshape(sh.as_slice())
        }
        OpKind::CrossEntropy { vocab } => {
            // HF ForCausalLMLoss: logits.float(); labels padded with -100 and shifted; mean CE.
            need(2, 0)?;
            let v = *vocab as i64;
            let labels = inputs[1].pad([0, 1], "constant", -100.0);
            let s = dims(inputs[1])[1];
            let shift = labels.narrow(1, 1, s).contiguous().reshape([-1]);
            up(inputs[0])
                .reshape([-1, v])
                .cross_entropy_loss(&shift, None::<&Tensor>, tch::Reduction::Mean, -100, 0.0)
        }
    })
}

/// transformers' `_compute_yarn_parameters`: `inv_freq` blended between interpolation
/// (`/ factor`) and extrapolation along a linear ramp over the correction range; `exps` is
/// `arange(0, dim, 2) / dim` in `fk`.
#[allow(clippy::too_many_arguments)]
fn yarn_inv_freq(exps: &Tensor, theta: f64, dim: i64, factor: f64, original: f64, beta_fast: f64, beta_slow: f64, truncate: bool, fk: Kind, dev: tch::Device) -> Tensor {
    let pos_freqs = Tensor::from(theta).to_kind(fk).to_device(dev).pow(exps);
    let extrapolation = pos_freqs.reciprocal();
    let interpolation = (&pos_freqs * factor).reciprocal();
    let d = dim as f64;
    let correction_dim = |rot: f64| (d * (original / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
    if low == high {
        high += 0.001;
    }
    let ramp = ((Tensor::arange(dim / 2, (Kind::Float, dev)) - low) / (high - low)).clamp(0.0, 1.0).to_kind(fk);
    let extrapolation_factor = -ramp + 1.0;
    interpolation * (-&extrapolation_factor + 1.0) + extrapolation * extrapolation_factor
}

/// DeepSeek's multi-head latent attention (transformers' `DeepseekV3Attention` after its
/// projections and RoPE): q = cat(q_pass, q_rot); k = new_empty + copy_(k_nope) +
/// copy_(k_rot expanded to every head); v a view of kv_b_proj's output; SDPA (causal) or
/// eager attention; the output's heads merged.
fn mla_attention(cx: &OpCx, inputs: &[&Tensor], h: i64, dqk: i64, nope: i64, dv: i64, scaling: Option<f64>) -> Result<Tensor, RtError> {
    let sh = dims(inputs[0]);
    let (b, s) = (sh[0], sh[1]);
    let dr = dqk - nope;
    let q_pass = inputs[0].view([b, s, h, dqk]).transpose(1, 2).narrow(-1, 0, nope);
    let q_rot = inputs[1].view([b, s, h, dr]).transpose(1, 2);
    let query = Tensor::cat(&[&q_pass, &q_rot], -1);
    let kv = inputs[2].view([b, s, h, nope + dv]).transpose(1, 2);
    let k_nope = kv.narrow(-1, 0, nope);
    let value = kv.narrow(-1, nope, dv);
    let k_rot = inputs[3].view([b, 1, s, dr]).expand([-1, h, -1, -1], false);
    let key = kv.new_empty([b, h, s, dqk], (kv.kind(), kv.device()));
    key.narrow(-1, 0, nope).copy_(&k_nope);
    key.narrow(-1, nope, dr).copy_(&k_rot);
    let scale = scaling.unwrap_or((dqk as f64).powf(-0.5));
    let o = match cx.attn {
        Attn::Sdpa => Tensor::scaled_dot_product_attention(&query, &key, &value, None::<&Tensor>, 0.0, true, Some(scale), false),
        Attn::Eager => {
            let scores = query.matmul(&key.transpose(-1, -2)) * scale;
            let ones = Tensor::ones([s, s], (Kind::Bool, query.device()));
            let m = Tensor::zeros([s, s], (cx.kind, query.device())).masked_fill(&ones.triu(1), f64::NEG_INFINITY);
            let probs = up(&(scores + m)).softmax(-1, None::<Kind>).to_kind(cx.kind);
            probs.matmul(&value)
        }
    };
    Ok(o.transpose(1, 2).reshape([b, s, h * dv]))
}

/// An activation function as HF's modules compute it.
fn activation(x: &Tensor, act: Act) -> Tensor {
    match act {
        Act::Silu => x.silu(),
        Act::Relu => x.relu(),
        Act::Gelu => x.gelu("none"),
        Act::GeluPytorchTanh => x.gelu("tanh"),
        Act::Tanh => x.tanh(),
        // NewGELUActivation, literally.
        Act::GeluTanh => {
            let c = (2.0f64 / std::f64::consts::PI).sqrt();
            (x * 0.5) * ((((x + x.pow_tensor_scalar(3.0) * 0.044715) * c).tanh()) + 1.0)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attention(cx: &OpCx, op: &Op, inputs: &[&Tensor], h: i64, kv: i64, hd: i64, window: Option<u64>, p: f64, scaling: Option<f64>, softcap: Option<f64>) -> Result<Tensor, RtError> {
    // Attention dropout in training: SDPA on CPU takes the math path, which computes (and
    // saves) what the eager path does, with the probabilities dropped before `@ v`.
    let drop = cx.train.filter(|_| p > 0.0);
    let attn = if drop.is_some() { Attn::Eager } else { cx.attn };
    let (q, k, v) = match inputs.len() {
        1 => {
            let parts = inputs[0].split(h * hd, -1);
            if parts.len() != 3 {
                return Err(RtError::Op {
                    op: op.name.clone(),
                    message: "fused qkv does not split in three".into(),
                });
            }
            (parts[0].shallow_clone(), parts[1].shallow_clone(), parts[2].shallow_clone())
        }
        3 => (inputs[0].shallow_clone(), inputs[1].shallow_clone(), inputs[2].shallow_clone()),
        n => {
            return Err(RtError::Op {
                op: op.name.clone(),
                message: format!("attention takes 1 or 3 inputs, got {n}"),
            })
        }
    };
    let sh = q.size();
    let (b, s) = (sh[0], sh[1]);
    let heads = |t: &Tensor, n: i64| t.reshape([b, s, n, hd]).transpose(1, 2);
    let (q, mut k, mut v) = (heads(&q, h), heads(&k, kv), heads(&v, kv));
    let mask = window.filter(|&w| s as u64 > w).map(|w| {
        // HF sliding window: key j visible from query i iff j <= i and j > i - w.
        let i = Tensor::arange(s, (Kind::Int64, q.device())).unsqueeze(1);
        let j = Tensor::arange(s, (Kind::Int64, q.device())).unsqueeze(0);
        let ok = j.le_tensor(&i).logical_and(&j.gt_tensor(&(&i - w as i64)));
        // HF's sdpa_attention_forward materializes the [b, 1, s, s] float mask per layer
        // (and SDPA saves it)
        Tensor::zeros([s, s], (cx.kind, q.device())).masked_fill(&ok.logical_not(), f64::NEG_INFINITY).expand([b, 1, s, s], false).contiguous()
    });
    let rep = h / kv;
    if rep > 1 && (attn == Attn::Eager || mask.is_some()) {
        k = k.repeat_interleave_self_int(rep, 1, None);
        v = v.repeat_interleave_self_int(rep, 1, None);
    }
    let o = match attn {
        Attn::Sdpa => {
            let gqa = rep > 1 && mask.is_none();
            let causal = mask.is_none();
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), 0.0, causal, scaling, gqa)
        }
        Attn::Eager => {
            let scale = scaling.unwrap_or((hd as f64).powf(-0.5));
            // SDPA with dropout on the CPU is its math kernel, which upcasts half/bf16 to
            // float32: q scaled and k, v copied in f32, softmax, dropout and `@ v` in f32, the
            // output cast back (what PyTorch computes and saves; the planner's model of it).
            // Eager scales the scores instead, in the activation dtype.
            let math_up = drop.is_some() && cx.attn == Attn::Sdpa && q.device() == tch::Device::Cpu && matches!(cx.kind, Kind::Half | Kind::BFloat16);
            let wk = if math_up { Kind::Float } else { cx.kind };
            let scores = match math_up {
                true => (q.to_kind(wk) * scale).matmul(&k.to_kind(wk).transpose(-1, -2)),
                false => q.matmul(&k.transpose(-1, -2)) * scale,
            };
            // Gemma 2's soft-capping (HF's eager path; its SDPA path ignores it)
            let scores = match softcap {
                Some(c) => (scores / c).tanh() * c,
                None => scores,
            };
            let m = match mask {
                Some(m) => m.to_kind(wk),
                None => {
                    let ones = Tensor::ones([s, s], (Kind::Bool, q.device()));
                    Tensor::zeros([s, s], (wk, q.device())).masked_fill(&ones.triu(1), f64::NEG_INFINITY)
                }
            };
            let scores = scores + m;
            let probs = up(&scores).softmax(-1, None::<Kind>).to_kind(wk);
            let probs = match &drop {
                Some(key) => dropout(&probs, key, &op.name, p),
                None => probs,
            };
            probs.matmul(&v.to_kind(wk)).to_kind(cx.kind)
        }
    };
    Ok(o.transpose(1, 2).reshape([b, s, h * hd]))
}
