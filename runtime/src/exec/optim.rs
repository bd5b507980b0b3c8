//! The optimizers a plan can name, as torch's single-tensor (foreach=False) paths on flat
//! tensors: AdamW / Adam (AdamW with weight decay 0, which is torch's Adam at its default
//! weight decay 0) and SGD (no momentum: no state); the local shards in the sharded executor,
//! whole parameters in the reference.

use crate::error::RtError;
use tch::Tensor;

/// The optimizer a run steps its shards with.
#[derive(Debug, Clone, Copy)]
pub enum Optim {
    Adam(AdamW),
    /// torch.optim.SGD with its defaults (no momentum, no weight decay).
    Sgd { lr: f64 },
    /// No step (the plan's `--optimizer none`).
    None,
}

/// Hyper-parameters a run may set (`run --weight-decay --beta1 --beta2 --eps`): torch's
/// defaults otherwise.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hyper {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// AdamW's decoupled weight decay (`None`: torch's 0.01; Adam: none).
    pub weight_decay: Option<f64>,
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: None }
    }
}

impl Optim {
    /// The plan's optimizer at learning rate `lr` with `h`.
    pub fn with(o: fsdp_planner::Optimizer, lr: f64, h: &Hyper) -> Optim {
        match o {
            fsdp_planner::Optimizer::Adam => Optim::Adam(AdamW { lr, beta1: h.beta1, beta2: h.beta2, eps: h.eps, weight_decay: 0.0 }),
            fsdp_planner::Optimizer::AdamW => Optim::Adam(AdamW { lr, beta1: h.beta1, beta2: h.beta2, eps: h.eps, weight_decay: h.weight_decay.unwrap_or(0.01) }),
            o => Optim::of_plan(o, lr),
        }
    }

    /// What the plan's `optimizer` option names, at learning rate `lr` and torch's defaults.
    pub fn of_plan(o: fsdp_planner::Optimizer, lr: f64) -> Optim {
        match o {
            fsdp_planner::Optimizer::Adam => Optim::Adam(AdamW { lr, weight_decay: 0.0, ..AdamW::default() }),
            fsdp_planner::Optimizer::AdamW => Optim::Adam(AdamW { lr, ..AdamW::default() }),
            fsdp_planner::Optimizer::Sgd => Optim::Sgd { lr },
            fsdp_planner::Optimizer::None => Optim::None,
        }
    }
    /// One step on `w` over the flat `(offset, len)` ranges `pieces` (see [`AdamW::step_pieces`]).
    pub fn step_pieces(&self, w: &Tensor, g: &Tensor, st: &mut State, pieces: &[(i64, i64)]) -> Result<(), RtError> {
        match self {
            Optim::Adam(a) => a.step_pieces(w, g, st, pieces),
            Optim::Sgd { lr } => {
                st.step += 1;
                let (wf, gf) = (w.view([-1]), g.view([-1]));
                for &(o, n) in pieces {
                    if n > 0 {
                        // torch.optim.sgd._single_tensor_sgd: param.add_(grad, alpha=-lr)
                        crate::shim::add_scaled_(&wf.narrow(0, o, n), &gf.narrow(0, o, n), -lr)?;
                    }
                }
                Ok(())
            }
            Optim::None => Ok(()),
        }
    }
}

impl From<&AdamW> for Optim {
    fn from(a: &AdamW) -> Optim {
        Optim::Adam(*a)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Optimizer state of one tensor.
pub struct State {
    pub m: Tensor,
    pub v: Tensor,
    pub step: i64,
}

impl State {
    pub fn new(like: &Tensor) -> State {
        State {
            m: like.zeros_like(),
            v: like.zeros_like(),
            step: 0,
        }
    }
    /// The state of an optimizer that keeps none (SGD, none): empty tensors, no bytes.
    pub fn empty(like: &Tensor) -> State {
        let e = Tensor::empty([0], (like.kind(), like.device()));
        State { m: e.shallow_clone(), v: e, step: 0 }
    }
    /// The state the plan's optimizer starts with for the shard `like`: exp_avg and
    /// exp_avg_sq for Adam(W), empty for one that keeps none.
    pub fn for_optim(opt: fsdp_planner::Optimizer, like: &Tensor) -> State {
        if opt.keeps_state() {
            State::new(like)
        } else {
            State::empty(like)
        }
    }
}

impl AdamW {
    /// One step on `w` (updated in place, no grad), as torch's single-tensor AdamW.
    pub fn step(&self, w: &Tensor, g: &Tensor, st: &mut State) -> Result<(), RtError> {
        let n = w.numel() as i64;
        self.step_pieces(w, g, st, &[(0, n)])
    }

    /// One step on `w` run piece by piece over the flat `(offset, len)` ranges `pieces` (one
    /// optimizer step: the step count advances once). FSDP2's optimizer sees one tensor per
    /// parameter, so its temporaries are the size of the largest parameter's shard, not of
    /// the unit's.
    pub fn step_pieces(&self, w: &Tensor, g: &Tensor, st: &mut State, pieces: &[(i64, i64)]) -> Result<(), RtError> {
        tch::no_grad(|| {
            st.step += 1;
            // torch.optim.adam._single_tensor_adam (foreach=False, not capturable), op for op
            // and with its scalars computed as Python computes them (`beta ** step` is libm's
            // pow, `bias_correction2 ** 0.5` too), so that the same libtorch kernels give the
            // same bits
            let t = st.step as f64;
            let bc1 = 1.0 - self.beta1.powf(t);
            let bc2_sqrt = (1.0 - self.beta2.powf(t)).powf(0.5);
            let step_size = self.lr / bc1;
            let (wf, gf, mf, vf) = (w.view([-1]), g.view([-1]), st.m.view([-1]), st.v.view([-1]));
            for &(o, n) in pieces {
                if n == 0 {
                    continue;
                }
                let (mut w, g, mut m, mut v) = (wf.narrow(0, o, n), gf.narrow(0, o, n), mf.narrow(0, o, n), vf.narrow(0, o, n));
                if self.weight_decay != 0.0 {
                    // decoupled weight decay (torch skips it at 0: plain Adam)
                    let _ = w.g_mul_scalar_(1.0 - self.lr * self.weight_decay);
                }
                let _ = m.lerp_(&g, 1.0 - self.beta1);
                let _ = v.g_mul_scalar_(self.beta2);
                crate::shim::addcmul_(&v, &g, &g, 1.0 - self.beta2)?;
                let mut denom = v.sqrt() / bc2_sqrt;
                let _ = denom.g_add_scalar_(self.eps);
                crate::shim::addcdiv_(&w, &m, &denom, -step_size)?;
            }
            Ok(())
        })
    }
}
