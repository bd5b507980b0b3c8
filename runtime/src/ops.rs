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
pub struct OpCx {
    pub attn: Attn,
    /// Compute dtype (the plan's param dtype).
    pub kind: Kind,
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
        OpKind::Linear { bias, transposed } => {
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
        OpKind::RmsNorm { eps } => {
            // HF LlamaRMSNorm: x32 * rsqrt(mean(x32^2) + eps), cast back, times weight.
            need(1, 1)?;
            let x = inputs[0];
            let x32 = up(x);
            let var = x32.pow_tensor_scalar(2).mean_dim(-1, true, None::<Kind>);
            let xn = &x32 * (var + *eps).rsqrt();
            params[0] * xn.to_kind(x.kind())
        }
        OpKind::Add => {
            need(2, 0)?;
            inputs[0] + inputs[1]
        }
        OpKind::Mul => {
            need(2, 0)?;
            inputs[0] * inputs[1]
        }
        OpKind::Activation { act } => {
            need(1, 0)?;
            let x = inputs[0];
            match act {
                Act::Silu => x.silu(),
                Act::Relu => x.relu(),
                Act::Gelu => x.gelu("none"),
                // NewGELUActivation, literally.
                Act::GeluTanh => {
                    let c = (2.0f64 / std::f64::consts::PI).sqrt();
                    (x * 0.5) * ((((x + x.pow_tensor_scalar(3.0) * 0.044715) * c).tanh()) + 1.0)
                }
            }
        }
        // Dropout is run with p = 0 (deterministic training; see README).
        OpKind::Dropout { .. } => {
            need(1, 0)?;
            inputs[0].shallow_clone()
        }
        OpKind::RotaryEmbedding { theta, head_dim } => {
            // HF default rope: inv_freq = 1 / theta^(arange(0, hd, 2) / hd); freqs = pos ⊗
            // inv_freq (f32); emb = cat(freqs, freqs); cos and sin stacked as [2, s, hd].
            need(1, 0)?;
            let s = dims(inputs[0])[1];
            let dev = inputs[0].device();
            let hd = *head_dim as i64;
            let fk = if cx.kind == Kind::Double { Kind::Double } else { Kind::Float };
            let exps = Tensor::arange_start_step(0, hd, 2, (Kind::Int64, dev)).to_kind(fk) / (hd as f64);
            let inv = (Tensor::from(*theta).to_kind(fk).to_device(dev).pow(&exps)).reciprocal();
            let pos = Tensor::arange(s, (Kind::Int64, dev)).to_kind(fk);
            let freqs = pos.unsqueeze(1).matmul(&inv.unsqueeze(0));
            let emb = Tensor::cat(&[&freqs, &freqs], -1);
            Tensor::stack(&[emb.cos(), emb.sin()], 0).to_kind(cx.kind)
        }
        OpKind::Rope { head_dim } => {
            need(2, 0)?;
            let x = inputs[0];
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
        OpKind::Attention {
            heads,
            kv_heads,
            head_dim,
            sliding_window,
            ..
        } => attention(cx, op, inputs, *heads as i64, *kv_heads as i64, *head_dim as i64, *sliding_window)?,
        OpKind::Router { top_k, .. } => {
            // MixtralTopKRouter: softmax(linear(h).float()), top-k, renormalized. The output
            // packs the weights and the expert indices (as float): [tokens, 2k].
            need(1, 1)?;
            let h = inputs[0];
            let hd = *dims(h).last().unwrap_or(&1);
            let logits = h.reshape([-1, hd]).linear(params[0], None::<&Tensor>);
            let probs = up(&logits).softmax(-1, None::<Kind>);
            let (vals, idx) = probs.topk(*top_k as i64, -1, true, true);
            let vals = &vals / vals.sum_dim_intlist(-1, true, None::<Kind>);
            let k = vals.kind();
            Tensor::cat(&[vals, idx.to_kind(k)], -1)
        }
        OpKind::Experts { experts, top_k, .. } => {
            // out[t] = Σ_k w[t,k] · down_e(silu(gate_e x_t) · up_e x_t), e = idx[t,k].
            need(2, 2)?;
            let h = inputs[0];
            let sh = dims(h);
            let hd = *sh.last().unwrap_or(&1);
            let x = h.reshape([-1, hd]);
            let k = *top_k as i64;
            let w = inputs[1].narrow(-1, 0, k);
            let idx = inputs[1].narrow(-1, k, k).to_kind(Kind::Int64);
            let mut out = x.zeros_like();
            for e in 0..*experts as i64 {
                let hit = idx.eq(e);
                let pos = hit.nonzero();
                if pos.size()[0] == 0 {
                    continue;
                }
                let tok = pos.select(1, 0);
                let slot = pos.select(1, 1);
                let xs = x.index_select(0, &tok);
                let gu = xs.matmul(&params[0].get(e).transpose(0, 1));
                let parts = gu.chunk(2, -1);
                let y = (parts[0].silu() * &parts[1]).matmul(&params[1].get(e).transpose(0, 1));
                let ws = w.index_select(0, &tok).gather(1, &slot.unsqueeze(1), false);
                out = out.index_add(0, &tok, &(y * ws.to_kind(cx.kind)));
            }
            out.reshape(sh.as_slice())
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

fn attention(cx: &OpCx, op: &Op, inputs: &[&Tensor], h: i64, kv: i64, hd: i64, window: Option<u64>) -> Result<Tensor, RtError> {
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
        Tensor::zeros([s, s], (cx.kind, q.device())).masked_fill(&ok.logical_not(), f64::NEG_INFINITY)
    });
    let rep = h / kv;
    if rep > 1 && (cx.attn == Attn::Eager || mask.is_some()) {
        k = k.repeat_interleave_self_int(rep, 1, None);
        v = v.repeat_interleave_self_int(rep, 1, None);
    }
    let o = match cx.attn {
        Attn::Sdpa => {
            let gqa = rep > 1 && mask.is_none();
            let causal = mask.is_none();
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), 0.0, causal, None::<f64>, gqa)
        }
        Attn::Eager => {
            let scale = (hd as f64).powf(-0.5);
            let mut scores = q.matmul(&k.transpose(-1, -2)) * scale;
            let m = match mask {
                Some(m) => m,
                None => {
                    let ones = Tensor::ones([s, s], (Kind::Bool, q.device()));
                    Tensor::zeros([s, s], (cx.kind, q.device())).masked_fill(&ones.triu(1), f64::NEG_INFINITY)
                }
            };
            scores = scores + m;
            up(&scores).softmax(-1, None::<Kind>).to_kind(cx.kind).matmul(&v)
        }
    };
    Ok(o.transpose(1, 2).reshape([b, s, h * hd]))
}
