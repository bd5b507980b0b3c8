//! `fsdp-plan launch`: starts N local processes like torchrun (`RANK`, `LOCAL_RANK`,
//! `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT` set for each;
//! with `nnodes` > 1 this node's ranks are `node_rank · N …`, as torchrun's static
//! rendezvous numbers them), forwards
//! their stdout and stderr line by line with a `[rank k]` prefix, and when a rank exits
//! non-zero or is killed, kills the others and reports that rank.

pub mod env;
pub mod watchdog;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the other ranks of a job get to exit on their own after one failed without being
/// the cause (see [`launch`]).
const CAUSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Ranks on this node.
    pub nproc: usize,
    /// Nodes in the job (each runs `launch` with the same `nproc`), and this node's index.
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    /// 0: pick a free port.
    pub master_port: u16,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Extra variables for every rank.
    pub env: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("launch: --nproc-per-node must be at least 1")]
    NoProcs,
    #[error("launch: --node-rank {node_rank} is not below --nnodes {nnodes}")]
    NodeRank { node_rank: usize, nnodes: usize },
    #[error("launch: with --nnodes {0} every node needs the same --master-port (0 picks one on this node only)")]
    PortOnMany(usize),
    #[error("launch: cannot start rank {rank} ({program}): {error}")]
    Spawn { rank: usize, program: String, error: String },
    #[error("launch: cannot pick a free port: {0}")]
    Port(String),
    #[error("launch: rank {rank} {how}{}", stopped(*others))]
    RankFailed {
        rank: usize,
        how: String,
        others: usize,
        /// The rank's exit code (`None`: killed by a signal, or not waited for).
        code: Option<i32>,
    },
}

fn stopped(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => "; stopped the other running rank".into(),
        n => format!("; stopped the other {n} running ranks"),
    }
}

fn describe(st: ExitStatus) -> String {
    if let Some(c) = st.code() {
        return format!("exited with code {c}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = st.signal() {
            return format!("was killed by signal {sig}{}", if sig == 9 { " (SIGKILL; out of memory?)" } else { "" });
        }
    }
    format!("ended: {st}")
}

/// A free TCP port on the loopback interface (bound then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn forward(rank: usize, src: impl std::io::Read + Send + 'static, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let mut buf = format!("[rank {rank}] ").into_bytes();
                    buf.extend_from_slice(&line);
                    if to_stderr {
                        let _ = std::io::stderr().lock().write_all(&buf);
                    } else {
                        let mut o = std::io::stdout().lock();
                        let _ = o.write_all(&buf);
                        let _ = o.flush();
                    }
                }
            }
        }
    })
}

/// Runs the job; returns when every rank has exited 0, or with the first rank that failed
/// (the others killed).
pub fn launch(spec: &LaunchSpec) -> Result<(), LaunchError> {
    if spec.nproc == 0 {
        return Err(LaunchError::NoProcs);
    }
    if spec.node_rank >= spec.nnodes.max(1) {
        return Err(LaunchError::NodeRank { node_rank: spec.node_rank, nnodes: spec.nnodes });
    }
    if spec.nnodes > 1 && spec.master_port == 0 {
        return Err(LaunchError::PortOnMany(spec.nnodes));
    }
    let world = spec.nproc * spec.nnodes.max(1);
    let port = if spec.master_port == 0 { free_port().map_err(|e| LaunchError::Port(e.to_string()))? } else { spec.master_port };
    let mut children: Vec<Option<Child>> = vec![];
    let mut pumps = vec![];
    let kill_all = |children: &mut Vec<Option<Child>>| {
        for c in children.iter_mut().flatten() {
            let _ = c.kill();
        }
        for c in children.iter_mut().flatten() {
            let _ = c.wait();
        }
    };
    for local in 0..spec.nproc {
        let rank = spec.node_rank * spec.nproc + local;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", spec.nproc.to_string())
            .env("GROUP_RANK", spec.node_rank.to_string())
            .env("MASTER_ADDR", &spec.master_addr)
            .env("MASTER_PORT", port.to_string())
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match cmd.spawn() {
            Ok(mut c) => {
                if let Some(o) = c.stdout.take() {
                    pumps.push(forward(rank, o, false));
                }
                if let Some(e) = c.stderr.take() {
                    pumps.push(forward(rank, e, true));
                }
                children.push(Some(c));
            }
            Err(e) => {
                kill_all(&mut children);
                return Err(LaunchError::Spawn { rank, program: spec.program.display().to_string(), error: e.to_string() });
            }
        }
    }
    let mut failed: Option<(usize, String, Option<i32>)> = None;
    let mut running = spec.nproc;
    // A rank that refused its input (exit 2) or stopped on a non-finite loss (3) is the cause;
    // a rank that exits otherwise may only have seen its peer go (it exits 1 "another rank
    // failed" a moment before the cause itself exits): after such a failure the others get
    // CAUSE_GRACE to exit on their own before they are stopped, and a cause among them is named.
    let is_cause = |code: Option<i32>| matches!(code, Some(2 | 3));
    let cause_found = |f: &Option<(usize, String, Option<i32>)>| f.as_ref().is_some_and(|x| is_cause(x.2));
    let mut deadline: Option<Instant> = None;
    while running > 0 && !cause_found(&failed) && deadline.is_none_or(|d| Instant::now() < d) {
        for (local, slot) in children.iter_mut().enumerate() {
            let rank = spec.node_rank * spec.nproc + local;
            let Some(c) = slot else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    *slot = None;
                    running -= 1;
                    if !st.success() && (failed.is_none() || (is_cause(st.code()) && !cause_found(&failed))) {
                        failed = Some((rank, describe(st), st.code()));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    if failed.is_none() {
                        failed = Some((rank, format!("could not be waited for ({e})"), None));
                    }
                }
            }
        }
        if failed.is_some() && deadline.is_none() {
            deadline = Some(Instant::now() + CAUSE_GRACE);
        }
        if running > 0 && !cause_found(&failed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let others = children.iter().flatten().count();
    kill_all(&mut children);
    for p in pumps {
        let _ = p.join();
    }
    match failed {
        None => Ok(()),
        Some((rank, how, code)) => Err(LaunchError::RankFailed { rank, how, others, code }),
    }
}
