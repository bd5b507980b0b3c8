//! Checks any [`Collective`] against hand-computed results: what `fsdp-plan
//! rendezvous-selftest --collectives nccl` and the GPU test run on every rank, and what the
//! CPU tests run over [`crate::comm::CpuGroup`] threads.

use crate::comm::Collective;
use tch::{Device, Kind, Tensor};

/// Rank r's input: `[2n, 3]` with `base + 100·r` (base = 0, 1, … 6n−1): small integers, so
/// every f32 result is exact.
fn input(n: i64, r: i64, kind: Kind, dev: Device) -> Tensor {
    (Tensor::arange(6 * n, (Kind::Float, Device::Cpu)).reshape([2 * n, 3]) + 100.0 * r as f64).to_kind(kind).to_device(dev)
}

fn same(what: &str, kind: Kind, got: &Tensor, want: &Tensor) -> Result<(), String> {
    let g = got.to_device(Device::Cpu).to_kind(Kind::Double);
    let w = want.to_kind(Kind::Double);
    if g.size() != w.size() {
        return Err(format!("{what} ({kind:?}): shape {:?}, expected {:?}", g.size(), w.size()));
    }
    let err = (&g - &w).abs().max().double_value(&[]);
    // f32: exact sums of small integers, but NCCL's average multiplies each value by
    // float(1/n) before summing (1 ulp off when n is not a power of two): 1e-6 of the largest
    // value; bf16 (8-bit mantissa, sums rounded): 1%
    let big = w.abs().max().double_value(&[]);
    let tol = if kind == Kind::Float { 1e-6 * big } else { 0.01 * big };
    if err > tol {
        return Err(format!("{what} ({kind:?}): max |error| {err} (got {g:?}, expected {w:?})"));
    }
    Ok(())
}

/// The CPU device (for callers without a tch dependency of their own).
pub fn cpu() -> Device {
    Device::Cpu
}

/// Runs all-gather, reduce-scatter (avg) and all-reduce (avg) in f32 and bf16 on `dev` and
/// compares them with the expected values. Every rank must call it.
pub fn check_collectives(comm: &dyn Collective, dev: Device) -> Result<String, String> {
    let (n, r) = (comm.size() as i64, comm.rank() as i64);
    let mean_shift = 100.0 * (n - 1) as f64 / 2.0;
    for kind in [Kind::Float, Kind::BFloat16] {
        let x = input(n, r, kind, dev);
        let base = input(n, 0, Kind::Float, Device::Cpu);
        let ag = comm.all_gather(&x).map_err(|e| e.to_string())?;
        let want: Vec<Tensor> = (0..n).map(|k| input(n, k, Kind::Float, Device::Cpu)).collect();
        same("all-gather", kind, &ag, &Tensor::cat(&want, 0))?;
        let rs = comm.reduce_scatter_avg(&x).map_err(|e| e.to_string())?;
        same("reduce-scatter avg", kind, &rs, &(base.narrow(0, 2 * r, 2) + mean_shift))?;
        let ar = comm.all_reduce_avg(&x).map_err(|e| e.to_string())?;
        same("all-reduce avg", kind, &ar, &(&base + mean_shift))?;
        // the same, left in flight (NCCL: on its stream) and waited for; the input dropped
        // before the wait must stay valid until the collective has read it
        let e = |e: crate::RtError| e.to_string();
        let ag = comm.all_gather_start(&input(n, r, kind, dev)).map_err(e)?;
        let rs = comm.reduce_scatter_start(&input(n, r, kind, dev)).map_err(e)?;
        let ar = comm.all_reduce_start(&input(n, r, kind, dev)).map_err(e)?;
        same("all-gather (started)", kind, &ag.wait().map_err(e)?, &Tensor::cat(&want, 0))?;
        same("reduce-scatter avg (started)", kind, &rs.wait().map_err(e)?, &(base.narrow(0, 2 * r, 2) + mean_shift))?;
        same("all-reduce avg (started)", kind, &ar.wait().map_err(e)?, &(&base + mean_shift))?;
        // in place: this rank's input already in its row of the output (the post-forward
        // all-gather's copy-in)
        let out = Tensor::full([n * 2 * n, 3], -1.0, (kind, dev));
        out.narrow(0, r * 2 * n, 2 * n).copy_(&x);
        comm.all_gather_in_place(&out.view([-1])).map_err(e)?;
        same("all-gather in place", kind, &out, &Tensor::cat(&want, 0))?;
    }
    Ok(format!("rank {r}/{n}: collectives ok on {dev:?} (all-gather, reduce-scatter avg, all-reduce avg; at once and left in flight; all-gather in place; f32, bf16)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::CpuGroup;

    #[test]
    fn cpu_threads_pass_the_checks() {
        for n in [1, 2, 3] {
            let hs: Vec<_> = CpuGroup::new(n).into_iter().map(|g| std::thread::spawn(move || check_collectives(&g, Device::Cpu))).collect();
            for h in hs {
                let line = h.join().unwrap().unwrap();
                assert!(line.contains("collectives ok"), "{line}");
            }
        }
    }

    /// A collective that sums instead of averaging must be caught.
    struct Wrong(CpuGroup);
    impl Collective for Wrong {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn size(&self) -> usize {
            self.0.size()
        }
        fn all_gather(&self, input: &Tensor) -> Result<Tensor, crate::error::RtError> {
            self.0.all_gather(input)
        }
        fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, crate::error::RtError> {
            Ok(self.0.reduce_scatter_avg(input)? * self.0.size() as f64)
        }
        fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, crate::error::RtError> {
            self.0.all_reduce_avg(input)
        }
    }

    /// The subgroups of a world of 4 threads (pairs of consecutive ranks, and every other
    /// rank), read from the world's slots in place, and the thread groups of runs of 2.
    #[test]
    fn subgroups_and_runs_pass_the_checks() {
        let hs: Vec<_> = CpuGroup::new(4)
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let (pairs, strided) = crate::comm::SubGroup::mesh(&g, 2);
                    Ok::<_, String>([check_collectives(&pairs, Device::Cpu)?, check_collectives(&strided, Device::Cpu)?])
                })
            })
            .chain(crate::comm::cpu_runs(4, 2).unwrap().into_iter().map(|g| std::thread::spawn(move || Ok([check_collectives(&g, Device::Cpu)?, String::new()]))))
            .collect();
        for h in hs {
            for line in h.join().unwrap().unwrap().iter().filter(|l| !l.is_empty()) {
                assert!(line.contains("/2: collectives ok"), "{line}");
            }
        }
    }

    /// An in-place all-gather's output that is not 1-D, or not a whole number of rows, is an
    /// error before any rank enters the collective (so every rank fails alike, none waits).
    #[test]
    fn an_in_place_output_of_the_wrong_shape_is_an_error() {
        let g = CpuGroup::new(2);
        let (a, b) = (&g[0], &g[1]);
        for out in [Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)), Tensor::zeros([5], (Kind::Float, Device::Cpu))] {
            for r in [a, b] {
                let e = r.all_gather_in_place(&out).unwrap_err().to_string();
                assert!(e.contains("a 1-D output whose length is a multiple of the group's 2 ranks"), "{e}");
            }
        }
    }

    #[test]
    fn a_wrong_collective_is_caught() {
        let hs: Vec<_> = CpuGroup::new(2).into_iter().map(|g| std::thread::spawn(move || check_collectives(&Wrong(g), Device::Cpu))).collect();
        for h in hs {
            let e = h.join().unwrap().unwrap_err();
            assert!(e.starts_with("reduce-scatter avg (Float): max |error|"), "{e}");
        }
    }
}
