//! AdamW (torch.optim.AdamW semantics, foreach=False) on flat tensors: the local shards in
//! the sharded executor, whole parameters in the reference.

use tch::Tensor;

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
}

impl AdamW {
    /// One step on `w` (updated in place, no grad), as torch's single-tensor AdamW.
    pub fn step(&self, w: &Tensor, g: &Tensor, st: &mut State) {
        tch::no_grad(|| {
            st.step += 1;
            let t = st.step as i32;
            let mut w = w.shallow_clone();
            let _ = w.g_mul_scalar_(1.0 - self.lr * self.weight_decay);
            let _ = st.m.lerp_(g, 1.0 - self.beta1);
            let _ = st.v.g_mul_scalar_(self.beta2);
            let _ = st.v.g_add_(&(g * g * (1.0 - self.beta2)));
            let bc1 = 1.0 - self.beta1.powi(t);
            let bc2 = 1.0 - self.beta2.powi(t);
            let step_size = self.lr / bc1;
            let denom = (st.v.sqrt() / bc2.sqrt()) + self.eps;
            let _ = w.g_sub_(&(&st.m / &denom * step_size));
        })
    }
}
