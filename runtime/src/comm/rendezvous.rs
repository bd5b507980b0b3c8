//! TCP rendezvous of a job's processes (std::net only): rank 0 listens on
//! `MASTER_ADDR:MASTER_PORT`, every other rank connects (retrying until a timeout) and says
//! its rank and world size; rank 0 checks them (world sizes agree, each rank once, in range)
//! and sends every rank the job's 128-byte id (the NCCL unique id; any 128 random bytes for
//! the CPU backend) and the world size. The sockets stay open: [`Rendezvous::barrier`] and
//! [`Rendezvous::exchange`] (gather to rank 0, one reply per rank) run over them.
//!
//! Wire format (big-endian): hello = `FSDPRDZV` u32 version u64 rank u64 world_size;
//! reply = `FSDPRDZV` u8 status, then (status 0) u64 world_size + 128-byte id, or
//! (status 1) u32 length + UTF-8 message of the error rank 0 hit. Messages after that:
//! u64 length + bytes.

use crate::launch_env::LaunchEnv;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

pub const ID_BYTES: usize = 128;
pub type UniqueId = [u8; ID_BYTES];
const MAGIC: &[u8; 8] = b"FSDPRDZV";
const VERSION: u32 = 1;

#[derive(Debug, Clone)]
pub struct Config {
    pub master_addr: String,
    pub master_port: u16,
    pub rank: usize,
    pub world_size: usize,
    /// How long rank 0 waits for every rank, and the others for rank 0.
    pub timeout: Duration,
}

impl Config {
    pub fn from_env(e: &LaunchEnv, timeout: Duration) -> Config {
        Config {
            master_addr: e.master_addr.clone(),
            master_port: e.master_port,
            rank: e.rank,
            world_size: e.world_size,
            timeout,
        }
    }
    fn addr(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdzvError {
    /// A rank other than 0 found nobody listening (or could not resolve the address).
    #[error("rank {rank}: no rendezvous at {addr} after {secs} ({last})")]
    NoRendezvous { rank: usize, addr: String, secs: String, last: String },
    /// Rank 0 gave up waiting for ranks.
    #[error("rank 0: only {joined} of {world_size} ranks joined the rendezvous at {addr} within {secs} (missing: rank {missing})")]
    Incomplete { addr: String, joined: usize, world_size: usize, missing: String, secs: String },
    /// A rank connected, but rank 0 did not answer in time.
    #[error("rank {rank}: connected to {addr}, but rank 0 did not complete the rendezvous within {secs} (are all ranks started?)")]
    NoReply { rank: usize, addr: String, secs: String },
    #[error("rank {rank} connected twice")]
    DuplicateRank { rank: usize },
    #[error("world size mismatch: rank {rank} has world size {theirs}, rank 0 has {ours}")]
    WorldSizeMismatch { rank: usize, theirs: usize, ours: usize },
    #[error("rank {rank} is out of range for world size {world_size}")]
    BadRank { rank: usize, world_size: usize },
    #[error("rank 0: cannot listen on {addr}: {error}")]
    Listen { addr: String, error: String },
    /// Rank 0 failed the rendezvous and told this rank why.
    #[error("rank {rank}: the rendezvous failed at rank 0: {message}")]
    Aborted { rank: usize, message: String },
    #[error("rank {rank}: {message}")]
    Protocol { rank: usize, message: String },
    #[error("rank {rank}: {what}: {error}")]
    Io { rank: usize, what: String, error: String },
    #[error("rank 0: making the job id failed: {0}")]
    Id(String),
    /// The ranks were started with different jobs (plan, steps, …): see [`Rendezvous::agree`].
    #[error("rank {rank}: the ranks were not started with the same job: {message}")]
    JobMismatch { rank: usize, message: String },
}

/// A finished rendezvous: this rank's place in the job, the job's id, and the open sockets.
pub struct Rendezvous {
    pub rank: usize,
    pub world_size: usize,
    pub id: UniqueId,
    /// Rank 0: one stream per rank (index 0 unused); others: the stream to rank 0.
    peers: Vec<Option<TcpStream>>,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rendezvous {{ rank: {}, world_size: {} }}", self.rank, self.world_size)
    }
}

/// 128 random bytes (from /dev/urandom; else hashed time, pid and address-space noise).
pub fn random_id() -> UniqueId {
    let mut id = [0u8; ID_BYTES];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id)).is_ok() {
        return id;
    }
    use std::hash::{BuildHasher, Hasher};
    let rs = std::collections::hash_map::RandomState::new();
    for (i, chunk) in id.chunks_mut(8).enumerate() {
        let mut h = rs.build_hasher();
        h.write_usize(i);
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
        h.write_u32(std::process::id());
        chunk.copy_from_slice(&h.finish().to_be_bytes()[..chunk.len()]);
    }
    id
}

fn io(rank: usize, what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RdzvError {
    let what = what.into();
    move |e| RdzvError::Io { rank, what, error: e.to_string() }
}

fn resolve(cfg: &Config) -> Result<Vec<SocketAddr>, String> {
    let v: Vec<SocketAddr> = (cfg.master_addr.as_str(), cfg.master_port).to_socket_addrs().map_err(|e| e.to_string())?.collect();
    if v.is_empty() {
        Err(format!("`{}` resolves to no address", cfg.master_addr))
    } else {
        Ok(v)
    }
}

/// Rank 0 listens on a loopback MASTER_ADDR as given, on any other on every interface
/// (a hostname may resolve differently on the node itself).
fn listen(cfg: &Config) -> Result<TcpListener, RdzvError> {
    let fail = |e: String| RdzvError::Listen { addr: cfg.addr(), error: e };
    let addrs = resolve(cfg).map_err(fail)?;
    let bind: SocketAddr = if addrs.iter().all(|a| a.ip().is_loopback()) {
        addrs[0]
    } else if addrs[0].is_ipv6() {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), cfg.master_port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), cfg.master_port)
    };
    TcpListener::bind(bind).map_err(|e| fail(e.to_string()))
}

fn read_u64(s: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_error(mut s: &TcpStream, message: &str) {
    let mut buf = MAGIC.to_vec();
    buf.push(1);
    buf.extend((message.len() as u32).to_be_bytes());
    buf.extend(message.as_bytes());
    let _ = s.write_all(&buf);
    let _ = s.flush();
}

/// Runs the rendezvous. `make_id` is called on rank 0 only.
pub fn rendezvous(cfg: &Config, make_id: impl FnOnce() -> Result<UniqueId, String>) -> Result<Rendezvous, RdzvError> {
    if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
        return Err(RdzvError::BadRank { rank: cfg.rank, world_size: cfg.world_size });
    }
    if cfg.rank == 0 {
        root(cfg, make_id)
    } else {
        leaf(cfg)
    }
}

fn root(cfg: &Config, make_id: impl FnOnce() -> Result<UniqueId, String>) -> Result<Rendezvous, RdzvError> {
    let ws = cfg.world_size;
    let id = make_id().map_err(RdzvError::Id)?;
    let mut peers: Vec<Option<TcpStream>> = (0..ws).map(|_| None).collect();
    if ws == 1 {
        return Ok(Rendezvous { rank: 0, world_size: 1, id, peers });
    }
    let listener = listen(cfg)?;
    listener.set_nonblocking(true).map_err(io(0, "listener"))?;
    let deadline = Instant::now() + cfg.timeout;
    let abort = |peers: &[Option<TcpStream>], extra: Option<&TcpStream>, e: RdzvError| -> RdzvError {
        let msg = e.to_string();
        for s in peers.iter().flatten().chain(extra) {
            send_error(s, &msg);
        }
        e
    };
    let mut joined = 1;
    while joined < ws {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_nodelay(true);
                let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(200));
                let _ = s.set_read_timeout(Some(wait.min(Duration::from_secs(10))));
                let mut hello = [0u8; 28];
                if (&s).read_exact(&mut hello).is_err() || &hello[..8] != MAGIC {
                    // not one of ours (a port probe, a stale client): ignore it
                    continue;
                }
                let version = u32::from_be_bytes(hello[8..12].try_into().unwrap());
                let rank = u64::from_be_bytes(hello[12..20].try_into().unwrap()) as usize;
                let theirs = u64::from_be_bytes(hello[20..28].try_into().unwrap()) as usize;
                if version != VERSION {
                    let e = RdzvError::Protocol { rank: 0, message: format!("rank {rank} speaks rendezvous version {version}, rank 0 speaks {VERSION} (mixed fsdp-plan builds?)") };
                    return Err(abort(&peers, Some(&s), e));
                }
                if theirs != ws {
                    return Err(abort(&peers, Some(&s), RdzvError::WorldSizeMismatch { rank, theirs, ours: ws }));
                }
                if rank == 0 || rank >= ws {
                    if rank == 0 {
                        return Err(abort(&peers, Some(&s), RdzvError::DuplicateRank { rank }));
                    }
                    return Err(abort(&peers, Some(&s), RdzvError::BadRank { rank, world_size: ws }));
                }
                if peers[rank].is_some() {
                    return Err(abort(&peers, Some(&s), RdzvError::DuplicateRank { rank }));
                }
                let _ = s.set_read_timeout(None);
                peers[rank] = Some(s);
                joined += 1;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (1..ws).filter(|r| peers[*r].is_none()).map(|r| r.to_string()).collect();
                    let e = RdzvError::Incomplete { addr: cfg.addr(), joined, world_size: ws, missing: missing.join(", "), secs: secs(cfg.timeout) };
                    return Err(abort(&peers, None, e));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(abort(&peers, None, io(0, "accepting ranks")(e))),
        }
    }
    let mut ok = MAGIC.to_vec();
    ok.push(0);
    ok.extend((ws as u64).to_be_bytes());
    ok.extend(id);
    for (r, s) in peers.iter().enumerate().skip(1) {
        let mut s = s.as_ref().expect("all joined");
        s.write_all(&ok).map_err(io(0, format!("sending the id to rank {r}")))?;
    }
    Ok(Rendezvous { rank: 0, world_size: ws, id, peers })
}

fn leaf(cfg: &Config) -> Result<Rendezvous, RdzvError> {
    let rank = cfg.rank;
    let start = Instant::now();
    let deadline = start + cfg.timeout;
    let mut last = String::from("nothing tried");
    let mut s = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(RdzvError::NoRendezvous { rank, addr: cfg.addr(), secs: secs(cfg.timeout), last });
        }
        match resolve(cfg) {
            Err(e) => last = e,
            Ok(addrs) => {
                let mut got = None;
                for a in addrs {
                    match TcpStream::connect_timeout(&a, remaining.min(Duration::from_secs(2))) {
                        Ok(s) => {
                            got = Some(s);
                            break;
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                if let Some(s) = got {
                    break s;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50).min(deadline.saturating_duration_since(Instant::now())));
    };
    let _ = s.set_nodelay(true);
    let mut hello = MAGIC.to_vec();
    hello.extend(VERSION.to_be_bytes());
    hello.extend((rank as u64).to_be_bytes());
    hello.extend((cfg.world_size as u64).to_be_bytes());
    s.write_all(&hello).map_err(io(rank, format!("sending hello to {}", cfg.addr())))?;
    // Rank 0 was listening when we connected, so it answers (the id, or why it gave up)
    // within its own timeout from now: wait that long plus a margin.
    s.set_read_timeout(Some(cfg.timeout + Duration::from_secs(2))).map_err(io(rank, "socket"))?;
    let mut head = [0u8; 9];
    if let Err(e) = s.read_exact(&mut head) {
        return Err(match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => RdzvError::NoReply { rank, addr: cfg.addr(), secs: secs(cfg.timeout) },
            _ => RdzvError::Protocol { rank, message: format!("{} closed the connection during the rendezvous ({e})", cfg.addr()) },
        });
    }
    if &head[..8] != MAGIC {
        return Err(RdzvError::Protocol { rank, message: format!("{} is not an fsdp-plan rendezvous (bad handshake)", cfg.addr()) });
    }
    match head[8] {
        0 => {
            let ws = read_u64(&mut s).map_err(io(rank, "reading the world size"))? as usize;
            let mut id = [0u8; ID_BYTES];
            s.read_exact(&mut id).map_err(io(rank, "reading the id"))?;
            if ws != cfg.world_size {
                return Err(RdzvError::WorldSizeMismatch { rank, theirs: cfg.world_size, ours: ws });
            }
            s.set_read_timeout(None).map_err(io(rank, "socket"))?;
            let mut peers: Vec<Option<TcpStream>> = (0..cfg.world_size).map(|_| None).collect();
            peers[0] = Some(s);
            Ok(Rendezvous { rank, world_size: ws, id, peers })
        }
        1 => {
            let mut n = [0u8; 4];
            s.read_exact(&mut n).map_err(io(rank, "reading rank 0's error"))?;
            let mut msg = vec![0u8; u32::from_be_bytes(n) as usize];
            s.read_exact(&mut msg).map_err(io(rank, "reading rank 0's error"))?;
            Err(RdzvError::Aborted { rank, message: String::from_utf8_lossy(&msg).into_owned() })
        }
        x => Err(RdzvError::Protocol { rank, message: format!("unknown rendezvous status {x} from {}", cfg.addr()) }),
    }
}

fn write_msg(mut s: &TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u64).to_be_bytes())?;
    s.write_all(b)
}

fn read_msg(mut s: &TcpStream) -> std::io::Result<Vec<u8>> {
    let n = read_u64(&mut s)? as usize;
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

impl Rendezvous {
    /// Every rank sends `payload` to rank 0; rank 0 calls `reply` with all payloads in rank
    /// order and sends element r back to rank r. Returns this rank's reply. `timeout` bounds
    /// each wait on a socket (`None`: wait for ever).
    pub fn exchange(&self, payload: Vec<u8>, timeout: Option<Duration>, reply: impl FnOnce(Vec<Vec<u8>>) -> Vec<Vec<u8>>) -> Result<Vec<u8>, RdzvError> {
        let rank = self.rank;
        let closed = |peer: usize, e: std::io::Error| RdzvError::Io {
            rank,
            what: format!("rank {peer} {}", if e.kind() == ErrorKind::UnexpectedEof { "left (connection closed; did it exit?)" } else { "did not answer" }),
            error: e.to_string(),
        };
        if self.rank == 0 {
            let mut all = vec![payload];
            for (r, s) in self.peers.iter().enumerate().skip(1) {
                let s = s.as_ref().expect("rank 0 holds every peer");
                s.set_read_timeout(timeout).map_err(io(0, "socket"))?;
                all.push(read_msg(s).map_err(|e| closed(r, e))?);
            }
            let mut out = reply(all);
            if out.len() != self.world_size {
                return Err(RdzvError::Protocol { rank: 0, message: format!("exchange made {} replies for {} ranks", out.len(), self.world_size) });
            }
            for (r, s) in self.peers.iter().enumerate().skip(1) {
                write_msg(s.as_ref().expect("rank 0 holds every peer"), &out[r]).map_err(|e| closed(r, e))?;
            }
            Ok(out.swap_remove(0))
        } else {
            let s = self.peers[0].as_ref().expect("the stream to rank 0");
            write_msg(s, &payload).map_err(|e| closed(0, e))?;
            s.set_read_timeout(timeout).map_err(io(rank, "socket"))?;
            read_msg(s).map_err(|e| closed(0, e))
        }
    }

    /// Checks that every rank was started with the same job: `job` is this rank's `(name,
    /// value)` pairs (the plan's hash, the step count, …), and rank 0 compares every rank's
    /// with its own. On a difference every rank returns [`RdzvError::JobMismatch`] naming the
    /// ranks and the values that differ (a stale plan file on one node would otherwise train
    /// with mismatched collectives or, worse, silently with another optimizer).
    pub fn agree(&self, job: &[(&str, String)], timeout: Option<Duration>) -> Result<(), RdzvError> {
        let n = self.world_size;
        let text: String = job.iter().map(|(k, v)| format!("{k}\t{v}\n")).collect();
        let reply = self.exchange(text.into_bytes(), timeout, |all| {
            let pairs = |b: &[u8]| -> Vec<(String, String)> {
                String::from_utf8_lossy(b).lines().map(|l| l.split_once('\t').map(|(k, v)| (k.to_string(), v.to_string())).unwrap_or((l.to_string(), String::new()))).collect()
            };
            let ours = pairs(&all[0]);
            let mut diffs = vec![];
            let get = |v: &[(String, String)], k: &str| v.iter().find(|(n, _)| n == k).map_or("(none)".to_string(), |(_, x)| x.clone());
            for (r, b) in all.iter().enumerate().skip(1) {
                let theirs = pairs(b);
                // rank 0's names in its order, then any only this rank sent
                let mut seen = std::collections::HashSet::new();
                for (k, _) in ours.iter().chain(&theirs).filter(|(k, _)| seen.insert(k.as_str())) {
                    let (a, b) = (get(&ours, k), get(&theirs, k));
                    if a != b {
                        diffs.push(format!("rank {r} has {k} {b}, rank 0 has {a}"));
                    }
                }
            }
            let msg = if diffs.is_empty() { String::new() } else { format!("{} (start every rank with the same plan file and run options)", diffs.join("; ")) };
            vec![msg.into_bytes(); n]
        })?;
        match reply.is_empty() {
            true => Ok(()),
            false => Err(RdzvError::JobMismatch { rank: self.rank, message: String::from_utf8_lossy(&reply).into_owned() }),
        }
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self, timeout: Option<Duration>) -> Result<(), RdzvError> {
        let n = self.world_size;
        self.exchange(vec![], timeout, |_| vec![vec![]; n]).map(|_| ())
    }
}

/// `rendezvous-selftest`: rendezvous, compare the id across ranks, barrier. Returns a line
/// to print.
pub fn selftest(cfg: &Config) -> Result<String, RdzvError> {
    let r = rendezvous(cfg, || Ok(random_id()))?;
    let n = r.world_size;
    // every rank sends back the id it got; rank 0 checks they all equal its own
    let id = r.id;
    let mut bad = vec![];
    let verdicts = r.exchange(r.id.to_vec(), Some(cfg.timeout), |all| {
        bad = all.iter().enumerate().filter(|(_, got)| got.as_slice() != id.as_slice()).map(|(k, _)| k).collect();
        vec![if bad.is_empty() { b"ok".to_vec() } else { b"id mismatch".to_vec() }; n]
    })?;
    if verdicts != b"ok" {
        return Err(RdzvError::Protocol { rank: r.rank, message: format!("ranks {bad:?} received a different id") });
    }
    r.barrier(Some(cfg.timeout))?;
    let hex: String = r.id[..4].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("rank {}/{}: rendezvous ok (id {hex}…)", r.rank, r.world_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn cfg(port: u16, rank: usize, ws: usize, ms: u64) -> Config {
        Config { master_addr: "127.0.0.1".into(), master_port: port, rank, world_size: ws, timeout: Duration::from_millis(ms) }
    }

    /// Rendezvous `ws` rank threads (id `[7; 16]`) and run `f(rank, its rendezvous)` on each;
    /// the results in rank order.
    fn on_ranks<T: Send + 'static>(ws: usize, f: impl Fn(usize, Rendezvous) -> T + Send + Copy + 'static) -> Vec<T> {
        let port = free_port();
        let hs: Vec<_> = (0..ws)
            .map(|r| {
                std::thread::spawn(move || {
                    let rz = rendezvous(&cfg(port, r, ws, 10_000), || Ok([7u8; ID_BYTES])).unwrap();
                    f(r, rz)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn threads_rendezvous_barrier_exchange() {
        let ws = 4;
        let out = on_ranks(ws, |r, rz| {
            rz.barrier(Some(Duration::from_secs(10))).unwrap();
            let got = rz
                .exchange(vec![r as u8], Some(Duration::from_secs(10)), |all| all.iter().map(|p| vec![p[0] * 10, all.len() as u8]).collect())
                .unwrap();
            (rz.rank, rz.world_size, rz.id, got)
        });
        for (r, (rank, world, id, got)) in out.into_iter().enumerate() {
            assert_eq!((rank, world, id, got), (r, ws, [7u8; ID_BYTES], vec![r as u8 * 10, ws as u8]));
        }
    }

    #[test]
    fn ranks_started_with_other_jobs_are_named_on_every_rank() {
        let out = on_ranks(3, |r, rz| {
            let same = [("plan", "ab12".to_string()), ("steps", "4".to_string())];
            let ok = rz.agree(&same, Some(Duration::from_secs(10)));
            let steps = if r == 2 { "3" } else { "4" };
            let job = [("plan", if r == 1 { "cd34" } else { "ab12" }.to_string()), ("steps", steps.to_string())];
            (ok, rz.agree(&job, Some(Duration::from_secs(10))))
        });
        for (r, (ok, bad)) in out.into_iter().enumerate() {
            assert_eq!(ok, Ok(()));
            let e = bad.unwrap_err();
            assert_eq!(e, RdzvError::JobMismatch { rank: r, message: "rank 1 has plan cd34, rank 0 has ab12; rank 2 has steps 3, rank 0 has 4 (start every rank with the same plan file and run options)".into() }, "rank {r}");
        }
    }

    #[test]
    fn world_size_one_needs_no_socket() {
        let rz = rendezvous(&cfg(1, 0, 1, 10), || Ok([1u8; ID_BYTES])).unwrap();
        rz.barrier(None).unwrap();
        assert_eq!(rz.exchange(vec![5], None, |a| a).unwrap(), vec![5]);
    }

    #[test]
    fn no_rank_zero_times_out() {
        let port = free_port();
        let e = rendezvous(&cfg(port, 3, 4, 300), || unreachable!()).unwrap_err();
        assert!(e.to_string().starts_with(&format!("rank 3: no rendezvous at 127.0.0.1:{port} after 0.3 s (")), "{e}");
    }

    #[test]
    fn bad_config() {
        assert_eq!(rendezvous(&cfg(1, 2, 2, 10), || unreachable!()).unwrap_err(), RdzvError::BadRank { rank: 2, world_size: 2 });
    }

    #[test]
    fn random_ids_differ() {
        assert_ne!(random_id(), random_id());
    }
}
