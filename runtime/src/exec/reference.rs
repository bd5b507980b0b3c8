//! Single-device execution of a model's forward graph with autograd: the reference the
//! sharded executor must equal, and the path checked against HF transformers.

use crate::error::RtError;
use crate::ops::{forward, OpCx};
use fsdp_ir::Model;
use std::collections::HashMap;
use std::path::Path;
use tch::{Kind, Tensor};

/// Parameters by primary name.
pub struct Params {
    pub tensors: HashMap<String, Tensor>,
}

impl Params {
    /// Loads HF-named weights. Every primary parameter of `model` must be present with its
    /// shape and a floating-point dtype. A tied alias may be absent or present with its
    /// primary's shape (HF ties it to the primary after loading, as here); the non-parameter
    /// buffers older HF checkpoints hold (rotary `inv_freq`, GPT-2's attention `bias` /
    /// `masked_bias` masks) are skipped, as HF skips them. Any other tensor means weights of
    /// another model: refused, naming it.
    pub fn from_safetensors(model: &Model, path: &Path) -> Result<Params, RtError> {
        Self::from_safetensors_as(model, path, Kind::Float)
    }

    /// [`Params::from_safetensors`], cast to `kind` (e.g. float64 for exact comparisons).
    pub fn from_safetensors_as(model: &Model, path: &Path, kind: Kind) -> Result<Params, RtError> {
        let file = path.display().to_string();
        let mut by_name: HashMap<String, Tensor> = crate::st_file::read(path)?.into_iter().collect();
        let mut tensors = HashMap::new();
        for p in model.primary_params() {
            let t = by_name.remove(&p.name).ok_or_else(|| RtError::File {
                file: file.clone(),
                message: format!("missing parameter `{}`", p.name),
            })?;
            let want: Vec<i64> = p.shape.iter().map(|&d| d as i64).collect();
            if t.size() != want {
                return Err(RtError::Param {
                    name: p.name.clone(),
                    message: format!("shape {:?} in {file}, model says {:?}", t.size(), want),
                });
            }
            if !t.is_floating_point() {
                return Err(RtError::Param {
                    name: p.name.clone(),
                    message: format!("dtype {:?} in {file}: a parameter must be floating point", t.kind()),
                });
            }
            tensors.insert(p.name.clone(), t.to_kind(kind).set_requires_grad(p.requires_grad));
        }
        let mut unknown: Vec<&String> = vec![];
        for (name, t) in &by_name {
            match model.param(name).and_then(|a| a.tied_to.as_ref()).and_then(|primary| tensors.get(primary)) {
                Some(primary) if primary.size() == t.size() => {}
                Some(primary) => {
                    return Err(RtError::Param {
                        name: name.clone(),
                        message: format!("shape {:?} in {file}, but it is tied to a parameter of shape {:?}", t.size(), primary.size()),
                    })
                }
                None if HF_BUFFERS.iter().any(|b| name.ends_with(b)) => {}
                None => unknown.push(name),
            }
        }
        if !unknown.is_empty() {
            unknown.sort();
            let shown: Vec<String> = unknown.iter().take(3).map(|n| format!("`{n}`")).collect();
            return Err(RtError::File {
                file,
                message: format!(
                    "{} tensor(s) that model `{}` has no parameter for ({}{}): weights of another model?",
                    unknown.len(),
                    model.name,
                    shown.join(", "),
                    if unknown.len() > 3 { ", …" } else { "" }
                ),
            });
        }
        Ok(Params { tensors })
    }

    pub fn get<'a>(&'a self, model: &Model, name: &str) -> Result<&'a Tensor, RtError> {
        self.tensors.get(model.primary_of(name)).ok_or_else(|| RtError::Param {
            name: name.to_string(),
            message: "not loaded".into(),
        })
    }
}

/// Name endings of the non-parameter buffers older HF checkpoints store, which HF's
/// `from_pretrained` ignores (`_keys_to_ignore_on_load_unexpected`).
const HF_BUFFERS: &[&str] = &[".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"];

/// Runs the whole forward graph; returns the loss (the last op's output).
pub fn forward_loss(model: &Model, params: &Params, inputs: &HashMap<String, Tensor>, cx: &OpCx) -> Result<Tensor, RtError> {
    forward_until(model, params, inputs, cx, None)
}

/// The logits: the output of the op the loss reads (`lm_head`).
pub fn forward_logits(model: &Model, params: &Params, inputs: &HashMap<String, Tensor>, cx: &OpCx) -> Result<Tensor, RtError> {
    let logits = model.ops.last().and_then(|o| o.inputs.first()).ok_or_else(|| RtError::Plan("the model has no loss op".into()))?;
    forward_until(model, params, inputs, cx, Some(logits))
}

/// Runs the forward graph up to op `stop` (default: every op) and returns its output.
fn forward_until(model: &Model, params: &Params, inputs: &HashMap<String, Tensor>, cx: &OpCx, stop: Option<&str>) -> Result<Tensor, RtError> {
    let mut env: HashMap<&str, Tensor> = HashMap::new();
    let mut last = None;
    for op in &model.ops {
        let ins: Vec<&Tensor> = op
            .inputs
            .iter()
            .map(|n| {
                env.get(n.as_str()).or_else(|| inputs.get(n)).ok_or_else(|| RtError::Op {
                    op: op.name.clone(),
                    message: format!("input `{n}` has no value"),
                })
            })
            .collect::<Result<_, _>>()?;
        let ps: Vec<&Tensor> = op.params.iter().map(|p| params.get(model, p)).collect::<Result<_, _>>()?;
        let out = match cx.float8 && fsdp_planner::float8::is_float8_linear(model, op) {
            true => crate::float8::forward(ins[0], crate::float8::Weight::High(ps[0]), ps.get(1).copied(), crate::float8::Sac::Off, None, false)?.0,
            false => forward(cx, op, &ins, &ps)?,
        };
        env.insert(op.name.as_str(), out);
        last = Some(op.name.as_str());
        if stop == Some(op.name.as_str()) {
            break;
        }
    }
    let last = last.ok_or_else(|| RtError::Plan("model has no ops".into()))?;
    env.remove(last).ok_or_else(|| RtError::Plan("no loss".into()))
}
