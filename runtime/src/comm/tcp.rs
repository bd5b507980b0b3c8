//! [`TcpGroup`]: the [`Collective`] between CPU processes, over the rendezvous sockets (every
//! rank sends its tensor to rank 0, which computes exactly what [`crate::comm::CpuGroup`]
//! computes — concatenation, or the sum in rank order divided by the world size — and sends
//! each rank its result). A star through rank 0: meant for tests and small CPU jobs under
//! `fsdp-plan launch`, not for speed. Results are bit-identical to `CpuGroup`'s. A mesh's
//! subgroups (HSDP's shard and replicate groups, post-forward groups) exchange through the
//! same star, each rank receiving its members' tensors alone.

use crate::comm::Collective;
use crate::error::RtError;
use crate::rendezvous::{RdzvError, Rendezvous};
use std::time::Duration;
use tch::{Device, Kind, Tensor};

pub struct TcpGroup {
    rz: Rendezvous,
    /// Bounds each wait on a peer (`None`: wait for ever).
    timeout: Option<Duration>,
    /// Bytes this rank received in subgroup collectives ([`Collective::with_members`]).
    received: std::sync::atomic::AtomicU64,
}

const KINDS: [Kind; 8] = [Kind::Float, Kind::Double, Kind::BFloat16, Kind::Half, Kind::Int64, Kind::Int, Kind::Uint8, Kind::Int8];

fn encode(t: &Tensor) -> Vec<u8> {
    let t = t.detach().to_device(Device::Cpu).contiguous();
    let code = KINDS.iter().position(|k| *k == t.kind()).unwrap_or_else(|| panic!("TcpGroup: unsupported dtype {:?}", t.kind()));
    let dims = t.size();
    let numel = t.numel();
    let mut out = vec![code as u8, dims.len() as u8];
    for d in &dims {
        out.extend(d.to_be_bytes());
    }
    let at = out.len();
    out.resize(at + numel * t.kind().elt_size_in_bytes(), 0);
    t.copy_data_u8(&mut out[at..], numel);
    out
}

fn decode(b: &[u8]) -> Tensor {
    let kind = KINDS[b[0] as usize];
    let nd = b[1] as usize;
    let dims: Vec<i64> = (0..nd).map(|i| i64::from_be_bytes(b[2 + 8 * i..10 + 8 * i].try_into().unwrap())).collect();
    Tensor::from_data_size(&b[2 + 8 * nd..], &dims, kind)
}

fn sum_in_rank_order(all: &[Tensor]) -> Tensor {
    let mut acc = all[0].copy();
    for t in &all[1..] {
        acc += t;
    }
    acc
}

impl TcpGroup {
    pub fn new(rz: Rendezvous, timeout: Option<Duration>) -> TcpGroup {
        TcpGroup { rz, timeout, received: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Bytes received in subgroup collectives so far (their replies from rank 0).
    pub fn subgroup_bytes_received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn rendezvous(&self) -> &Rendezvous {
        &self.rz
    }

    /// Sends `t` to rank 0, which applies `f` to every rank's tensor (rank order) and returns
    /// one tensor per rank.
    fn exchange(&self, t: &Tensor, f: impl FnOnce(Vec<Tensor>) -> Vec<Tensor>) -> Result<Tensor, RdzvError> {
        tch::no_grad(|| {
            let reply = self.rz.exchange(encode(t), self.timeout, |all| f(all.iter().map(|b| decode(b)).collect()).iter().map(encode).collect())?;
            Ok(decode(&reply))
        })
    }

    pub fn try_all_gather(&self, input: &Tensor) -> Result<Tensor, RdzvError> {
        let n = self.rz.world_size;
        self.exchange(input, |all| {
            let out = Tensor::cat(&all, 0);
            (0..n).map(|_| out.shallow_clone()).collect()
        })
    }

    pub fn try_reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RdzvError> {
        let n = self.rz.world_size as i64;
        self.exchange(input, |all| {
            let chunk = all[0].size()[0] / n;
            (0..n)
                .map(|r| {
                    let parts: Vec<Tensor> = all.iter().map(|t| t.narrow(0, r * chunk, chunk)).collect();
                    sum_in_rank_order(&parts) / (n as f64)
                })
                .collect()
        })
    }

    pub fn try_all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RdzvError> {
        let n = self.rz.world_size;
        self.exchange(input, |all| {
            let out = sum_in_rank_order(&all) / (n as f64);
            (0..n).map(|_| out.shallow_clone()).collect()
        })
    }
}

/// `with_members`' request: the member ranks (count, then each, u32 big-endian), then this
/// rank's tensor; `None` where it is malformed.
fn members_request(b: &[u8]) -> Option<(Vec<usize>, &[u8])> {
    let n = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let ranks = b.get(4..4 + 4 * n)?.chunks_exact(4).map(|c| c.try_into().map(|c| u32::from_be_bytes(c) as usize)).collect::<Result<Vec<_>, _>>().ok()?;
    Some((ranks, &b[4 + 4 * n..]))
}

/// Rank 0's replies to `with_members`' requests: to each rank its members' tensors as they
/// came (each its length, u64 big-endian, then its bytes); an empty reply to a rank whose
/// request is malformed or names a rank outside the group (it then fails with a clear error).
fn members_replies(all: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let requests: Vec<Option<(Vec<usize>, &[u8])>> = all.iter().map(|b| members_request(b)).collect();
    requests
        .iter()
        .map(|req| {
            let Some((members, _)) = req else { return vec![] };
            let parts: Option<Vec<&[u8]>> = members.iter().map(|&m| requests.get(m)?.as_ref().map(|(_, t)| *t)).collect();
            let Some(parts) = parts else { return vec![] };
            let mut out = Vec::with_capacity(parts.iter().map(|p| 8 + p.len()).sum());
            for p in parts {
                out.extend((p.len() as u64).to_be_bytes());
                out.extend_from_slice(p);
            }
            out
        })
        .collect()
}

impl Collective for TcpGroup {
    /// Through rank 0, each rank sending its tensor and its members' ranks and receiving only
    /// those members' tensors (not every rank's, as the default's all-gather of the world):
    /// HSDP's shard and replicate groups and `reshard_after_forward=N`'s post-forward groups
    /// of a process job move their own bytes alone.
    fn with_members(&self, input: &Tensor, members: &[usize], f: &mut dyn FnMut(&[Tensor]) -> Tensor) -> Result<Tensor, RtError> {
        let mut payload = Vec::with_capacity(4 + 4 * members.len());
        payload.extend((members.len() as u32).to_be_bytes());
        for &m in members {
            payload.extend((m as u32).to_be_bytes());
        }
        payload.extend(encode(input));
        let reply = self.rz.exchange(payload, self.timeout, |all| members_replies(&all)).map_err(|e| RtError::Comm(format!("subgroup collective: {e}")))?;
        self.received.fetch_add(reply.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut parts = vec![];
        let mut at = 0;
        while at + 8 <= reply.len() {
            let n = u64::from_be_bytes(reply[at..at + 8].try_into().unwrap_or_default()) as usize;
            let Some(b) = (at + 8).checked_add(n).and_then(|end| reply.get(at + 8..end)) else { break };
            parts.push(decode(b));
            at += 8 + n;
        }
        if parts.len() != members.len() || at != reply.len() {
            return Err(RtError::Comm(format!("subgroup collective: rank 0 answered {} tensors for the {} members {members:?} (a member outside the group of {}?)", parts.len(), members.len(), self.rz.world_size)));
        }
        Ok(tch::no_grad(|| f(&parts)))
    }
    fn rank(&self) -> usize {
        self.rz.rank
    }
    fn size(&self) -> usize {
        self.rz.world_size
    }
    fn all_gather(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.try_all_gather(input).map_err(|e| RtError::Comm(format!("all-gather: {e}")))
    }
    fn reduce_scatter_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.try_reduce_scatter_avg(input).map_err(|e| RtError::Comm(format!("reduce-scatter: {e}")))
    }
    fn all_reduce_avg(&self, input: &Tensor) -> Result<Tensor, RtError> {
        self.try_all_reduce_avg(input).map_err(|e| RtError::Comm(format!("all-reduce: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::CpuGroup;
    use crate::rendezvous::{random_id, rendezvous, Config};

    fn groups(n: usize) -> Vec<TcpGroup> {
        let port = crate::launch::free_port().unwrap();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let cfg = Config { master_addr: "127.0.0.1".into(), master_port: port, rank: r, world_size: n, timeout: Duration::from_secs(20) };
                    TcpGroup::new(rendezvous(&cfg, || Ok(random_id())).unwrap(), Some(Duration::from_secs(20)))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn round_trip_keeps_dtype_shape_and_bits() {
        for kind in [Kind::Float, Kind::Double, Kind::BFloat16, Kind::Int64] {
            let t = (Tensor::randn([3, 4, 2], (Kind::Float, Device::Cpu)) * 100.0).to_kind(kind);
            let u = decode(&encode(&t));
            assert_eq!((u.kind(), u.size()), (kind, vec![3, 4, 2]));
            assert!(u.equal(&t));
        }
    }

    #[test]
    fn same_results_as_cpu_threads_bit_for_bit() {
        let n = 3;
        let inputs: Vec<Tensor> = (0..n).map(|r| Tensor::randn([6, 5], (Kind::Float, Device::Cpu)) * (r as f64 + 1.0)).collect();
        let run = |gs: Vec<Box<dyn Collective>>| -> Vec<(Tensor, Tensor, Tensor)> {
            let hs: Vec<_> = gs
                .into_iter()
                .zip(inputs.iter().map(|t| t.copy()))
                .map(|(g, x)| std::thread::spawn(move || (g.all_gather(&x).unwrap(), g.reduce_scatter_avg(&x).unwrap(), g.all_reduce_avg(&x).unwrap())))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        };
        let tcp = run(groups(n).into_iter().map(|g| Box::new(g) as Box<dyn Collective>).collect());
        let cpu = run(CpuGroup::new(n).into_iter().map(|g| Box::new(g) as Box<dyn Collective>).collect());
        for ((a, b, c), (x, y, z)) in tcp.iter().zip(&cpu) {
            assert!(a.equal(x) && b.equal(y) && c.equal(z));
        }
        assert_eq!(tcp[1].1.size(), vec![2, 5]);
    }

    /// HSDP's mesh over 4 processes (shard groups of 2) and post-forward pairs: the subgroups'
    /// collectives equal the threads' bit for bit, and each rank receives its members' tensors
    /// alone (2 of the 4 ranks' bytes, not the world's).
    #[test]
    fn subgroups_equal_cpu_threads_and_move_their_members_bytes_alone() {
        let n = 4;
        let inputs: Vec<Tensor> = (0..n).map(|r| Tensor::randn([8, 3], (Kind::Float, Device::Cpu)) * (r as f64 + 1.0)).collect();
        fn run(g: &dyn Collective, x: &Tensor) -> Vec<Tensor> {
            let (shard, replicate) = crate::comm::SubGroup::mesh(g, 2);
            vec![shard.all_gather(x).unwrap(), shard.reduce_scatter_avg(x).unwrap(), replicate.all_reduce_avg(x).unwrap(), replicate.all_gather(x).unwrap()]
        }
        let tcp: Vec<(Vec<Tensor>, u64)> = groups(n)
            .into_iter()
            .zip(inputs.iter().map(|t| t.copy()))
            .map(|(g, x)| std::thread::spawn(move || (run(&g, &x), g.subgroup_bytes_received())))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let cpu: Vec<Vec<Tensor>> = CpuGroup::new(n).into_iter().zip(inputs.iter().map(|t| t.copy())).map(|(g, x)| std::thread::spawn(move || run(&g, &x))).collect::<Vec<_>>().into_iter().map(|h| h.join().unwrap()).collect();
        for ((t, _), c) in tcp.iter().zip(&cpu) {
            assert!(t.iter().zip(c).all(|(a, b)| a.equal(b)));
        }
        // 4 collectives, each 2 members' 8 × 3 floats with their headers
        let one = encode(&inputs[0]).len() as u64 + 8;
        for (_, received) in &tcp {
            assert_eq!(*received, 4 * 2 * one);
        }
    }

    #[test]
    fn passes_the_collective_selfcheck() {
        let hs: Vec<_> = groups(2).into_iter().map(|g| std::thread::spawn(move || crate::selftest::check_collectives(&g, Device::Cpu))).collect();
        for h in hs {
            assert!(h.join().unwrap().unwrap().contains("collectives ok"));
        }
    }
}
