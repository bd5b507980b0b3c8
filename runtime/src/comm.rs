//! Collectives. [`Collective`] is what the executor calls (the NCCL backend implements the
//! same trait); [`CpuGroup`] runs it between rank threads of one process.

use std::sync::{Arc, Barrier, Mutex};
use tch::Tensor;

pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Concatenation of every rank's `input` (equal sizes), in rank order.
    fn all_gather(&self, input: &Tensor) -> Tensor;
    /// This rank's chunk of the element-wise average of every rank's `input`.
    fn reduce_scatter_avg(&self, input: &Tensor) -> Tensor;
    /// Element-wise average of every rank's `input`.
    fn all_reduce_avg(&self, input: &Tensor) -> Tensor;
}

struct Shared {
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

/// One rank's handle on a group of threads.
pub struct CpuGroup {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

impl CpuGroup {
    /// Handles for `size` ranks (give one to each thread).
    pub fn new(size: usize) -> Vec<CpuGroup> {
        let shared = Arc::new(Shared {
            slots: Mutex::new((0..size).map(|_| None).collect()),
            barrier: Barrier::new(size),
        });
        (0..size)
            .map(|rank| CpuGroup {
                rank,
                size,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Publish `t`, wait for all, run `f` over every rank's tensor, wait again.
    fn exchange<R>(&self, t: &Tensor, f: impl FnOnce(&[Tensor]) -> R) -> R {
        {
            let mut s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            s[self.rank] = Some(t.shallow_clone());
        }
        self.shared.barrier.wait();
        let out = {
            let s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            let all: Vec<Tensor> = s.iter().map(|x| x.as_ref().map(|t| t.shallow_clone()).unwrap_or_else(|| Tensor::zeros([0], tch::kind::FLOAT_CPU))).collect();
            f(&all)
        };
        self.shared.barrier.wait();
        out
    }
}

fn sum_in_rank_order(all: &[Tensor]) -> Tensor {
    let mut acc = all[0].copy();
    for t in &all[1..] {
        acc += t;
    }
    acc
}

impl Collective for CpuGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_gather(&self, input: &Tensor) -> Tensor {
        tch::no_grad(|| self.exchange(input, |all| Tensor::cat(all, 0)))
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Tensor {
        let n = self.size as i64;
        let r = self.rank as i64;
        tch::no_grad(|| {
            self.exchange(input, |all| {
                let chunk = input.size()[0] / n;
                let parts: Vec<Tensor> = all.iter().map(|t| t.narrow(0, r * chunk, chunk)).collect();
                sum_in_rank_order(&parts) / (n as f64)
            })
        })
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Tensor {
        let n = self.size as f64;
        tch::no_grad(|| self.exchange(input, |all| sum_in_rank_order(all) / n))
    }
}
