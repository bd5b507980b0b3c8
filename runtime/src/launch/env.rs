//! Which rank this process is, as the launcher told it: torchrun's variables (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), else
//! SLURM's (`SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`, `SLURM_NODELIST`), else
//! Open MPI's (`OMPI_COMM_WORLD_*`). [`detect`] is a pure function over a map of variables;
//! [`from_process_env`] reads the real environment.
//!
//! Rules:
//! - torchrun: `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` are required;
//!   `LOCAL_RANK` / `LOCAL_WORLD_SIZE` default to `RANK` / `WORLD_SIZE` (one node).
//! - SLURM (when `SLURM_PROCID` is set, i.e. inside `srun`): `SLURM_PROCID`, `SLURM_NTASKS`,
//!   `SLURM_LOCALID` are required; the tasks on this node come from `SLURM_TASKS_PER_NODE`
//!   with `SLURM_NODEID` (`2(x3),1`), else `SLURM_NTASKS_PER_NODE`, else `SLURM_NTASKS`
//!   divided evenly over the nodelist. `MASTER_ADDR` defaults to the first host of
//!   `SLURM_NODELIST` (or `SLURM_JOB_NODELIST`), e.g. `node[03-05,07]` → `node03`;
//!   `MASTER_PORT` defaults to 29500.
//! - Open MPI: `OMPI_COMM_WORLD_RANK`, `_LOCAL_RANK`, `_SIZE`, `_LOCAL_SIZE` are required;
//!   `MASTER_ADDR` defaults to 127.0.0.1 when every rank is on this node and is required
//!   otherwise; `MASTER_PORT` defaults to 29500.

use std::collections::HashMap;

/// The port torchrun and this launcher use when none is given.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    Slurm,
    OpenMpi,
    /// No launcher: one process, world size 1.
    Single,
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "SLURM",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Single => "single process",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub launcher: Launcher,
}

impl LaunchEnv {
    /// World size 1 on this machine (no launcher).
    pub fn single() -> LaunchEnv {
        LaunchEnv {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_MASTER_PORT,
            launcher: Launcher::Single,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{launcher} environment: `{var}` is not set{hint}")]
    Missing { launcher: Launcher, var: String, hint: String },
    #[error("{launcher} environment: `{var}={value}`: {why}")]
    Invalid { launcher: Launcher, var: String, value: String, why: String },
    #[error("no distributed environment: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun / fsdp-plan launch), or run under srun (SLURM) or mpirun (Open MPI)")]
    NotDistributed,
}

struct Vars<'a> {
    env: &'a HashMap<String, String>,
    launcher: Launcher,
}

impl Vars<'_> {
    fn get(&self, var: &str) -> Option<&str> {
        self.env.get(var).map(|s| s.trim()).filter(|s| !s.is_empty())
    }
    fn missing(&self, var: &str, hint: &str) -> EnvError {
        EnvError::Missing { launcher: self.launcher, var: var.into(), hint: hint.into() }
    }
    fn invalid(&self, var: &str, value: &str, why: impl Into<String>) -> EnvError {
        EnvError::Invalid { launcher: self.launcher, var: var.into(), value: value.into(), why: why.into() }
    }
    fn num(&self, var: &str) -> Result<Option<usize>, EnvError> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => v.parse::<usize>().map(Some).map_err(|_| self.invalid(var, v, "expected a non-negative integer")),
        }
    }
    fn req(&self, var: &str) -> Result<usize, EnvError> {
        self.num(var)?.ok_or_else(|| self.missing(var, ""))
    }
    fn port(&self, var: &str, default: Option<u16>) -> Result<u16, EnvError> {
        match self.get(var) {
            None => default.ok_or_else(|| self.missing(var, "")),
            Some(v) => match v.parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(self.invalid(var, v, "expected a TCP port in 1..=65535")),
            },
        }
    }
}

/// The process's rank and rendezvous address from its launcher's variables.
/// `Err(EnvError::NotDistributed)` when no launcher's variables are present.
pub fn detect(env: &HashMap<String, String>) -> Result<LaunchEnv, EnvError> {
    let has = |v: &str| env.get(v).is_some_and(|s| !s.trim().is_empty());
    if has("RANK") || has("WORLD_SIZE") || has("LOCAL_RANK") {
        torchrun(&Vars { env, launcher: Launcher::Torchrun })
    } else if has("SLURM_PROCID") {
        slurm(&Vars { env, launcher: Launcher::Slurm })
    } else if has("OMPI_COMM_WORLD_RANK") || has("OMPI_COMM_WORLD_SIZE") {
        ompi(&Vars { env, launcher: Launcher::OpenMpi })
    } else {
        Err(EnvError::NotDistributed)
    }
}

/// [`detect`] over this process's environment.
pub fn from_process_env() -> Result<LaunchEnv, EnvError> {
    detect(&std::env::vars().collect())
}

/// [`from_process_env`], or world size 1 when no launcher set anything.
pub fn from_process_env_or_single() -> Result<LaunchEnv, EnvError> {
    match from_process_env() {
        Err(EnvError::NotDistributed) => Ok(LaunchEnv::single()),
        r => r,
    }
}

fn check(v: &Vars, e: LaunchEnv, names: [&str; 4]) -> Result<LaunchEnv, EnvError> {
    let [rank, local_rank, world, local_world] = names;
    if e.world_size == 0 {
        return Err(v.invalid(world, "0", "the world size must be at least 1"));
    }
    if e.rank >= e.world_size {
        return Err(v.invalid(rank, &e.rank.to_string(), format!("must be less than {world}={}", e.world_size)));
    }
    if e.local_world_size == 0 || e.local_world_size > e.world_size {
        return Err(v.invalid(
            local_world,
            &e.local_world_size.to_string(),
            format!("must be between 1 and {world}={}", e.world_size),
        ));
    }
    if e.local_rank >= e.local_world_size {
        return Err(v.invalid(
            local_rank,
            &e.local_rank.to_string(),
            format!("must be less than {local_world}={}", e.local_world_size),
        ));
    }
    Ok(e)
}

fn torchrun(v: &Vars) -> Result<LaunchEnv, EnvError> {
    let rank = v.req("RANK")?;
    let world_size = v.req("WORLD_SIZE")?;
    let master_addr = v.get("MASTER_ADDR").ok_or_else(|| v.missing("MASTER_ADDR", " (rank 0's host)"))?.to_string();
    let master_port = v.port("MASTER_PORT", None)?;
    let e = LaunchEnv {
        rank,
        local_rank: v.num("LOCAL_RANK")?.unwrap_or(rank),
        world_size,
        local_world_size: v.num("LOCAL_WORLD_SIZE")?.unwrap_or(world_size),
        master_addr,
        master_port,
        launcher: Launcher::Torchrun,
    };
    check(v, e, ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"])
}

fn slurm(v: &Vars) -> Result<LaunchEnv, EnvError> {
    let rank = v.req("SLURM_PROCID")?;
    let world_size = v.req("SLURM_NTASKS")?;
    let local_rank = v.req("SLURM_LOCALID")?;
    let (nl_var, nodelist) = match (v.get("SLURM_NODELIST"), v.get("SLURM_JOB_NODELIST")) {
        (Some(n), _) => ("SLURM_NODELIST", Some(n)),
        (None, Some(n)) => ("SLURM_JOB_NODELIST", Some(n)),
        (None, None) => ("SLURM_NODELIST", None),
    };
    let hosts = match nodelist {
        Some(n) => Some(expand_nodelist(n).map_err(|why| v.invalid(nl_var, n, why))?),
        None => None,
    };
    let master_addr = match v.get("MASTER_ADDR") {
        Some(a) => a.to_string(),
        None => match &hosts {
            Some(h) => h[0].clone(),
            None => return Err(v.missing("SLURM_NODELIST", " (and MASTER_ADDR is not set either)")),
        },
    };
    let local_world_size = match (v.get("SLURM_TASKS_PER_NODE"), v.num("SLURM_NODEID")?) {
        (Some(tpn), Some(node)) => {
            let counts = expand_tasks_per_node(tpn).map_err(|why| v.invalid("SLURM_TASKS_PER_NODE", tpn, why))?;
            *counts.get(node).ok_or_else(|| {
                v.invalid("SLURM_NODEID", &node.to_string(), format!("SLURM_TASKS_PER_NODE={tpn} lists only {} nodes", counts.len()))
            })?
        }
        _ => match v.get("SLURM_NTASKS_PER_NODE") {
            Some(n) => n.parse().map_err(|_| v.invalid("SLURM_NTASKS_PER_NODE", n, "expected a non-negative integer"))?,
            None => match &hosts {
                Some(h) if world_size % h.len() == 0 => world_size / h.len(),
                _ => return Err(v.missing("SLURM_TASKS_PER_NODE", " (needed with SLURM_NODEID to know the tasks on this node)")),
            },
        },
    };
    let e = LaunchEnv {
        rank,
        local_rank,
        world_size,
        local_world_size,
        master_addr,
        master_port: v.port("MASTER_PORT", Some(DEFAULT_MASTER_PORT))?,
        launcher: Launcher::Slurm,
    };
    check(v, e, ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_TASKS_PER_NODE"])
}

fn ompi(v: &Vars) -> Result<LaunchEnv, EnvError> {
    let rank = v.req("OMPI_COMM_WORLD_RANK")?;
    let world_size = v.req("OMPI_COMM_WORLD_SIZE")?;
    let local_rank = v.req("OMPI_COMM_WORLD_LOCAL_RANK")?;
    let local_world_size = v.req("OMPI_COMM_WORLD_LOCAL_SIZE")?;
    let master_addr = match v.get("MASTER_ADDR") {
        Some(a) => a.to_string(),
        None if local_world_size == world_size => "127.0.0.1".into(),
        None => return Err(v.missing("MASTER_ADDR", " (ranks span several nodes: export rank 0's host, e.g. mpirun -x MASTER_ADDR=…)")),
    };
    let e = LaunchEnv {
        rank,
        local_rank,
        world_size,
        local_world_size,
        master_addr,
        master_port: v.port("MASTER_PORT", Some(DEFAULT_MASTER_PORT))?,
        launcher: Launcher::OpenMpi,
    };
    check(v, e, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"])
}

/// Splits at commas outside brackets.
fn top_level_items(s: &str) -> Result<Vec<&str>, String> {
    let mut items = vec![];
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => {
                depth += 1;
                if depth > 1 {
                    return Err("nested `[`".into());
                }
            }
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err("`]` without `[`".into());
                }
            }
            ',' if depth == 0 => {
                items.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed `[`".into());
    }
    items.push(&s[start..]);
    if items.iter().any(|i| i.trim().is_empty()) {
        return Err("empty host name".into());
    }
    Ok(items)
}

/// `03-05,07` → `03 04 05 07` (zero padding kept as written).
fn expand_ranges(body: &str) -> Result<Vec<String>, String> {
    let mut out = vec![];
    for part in body.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            None => {
                if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!("`{part}` in `[{body}]` is not a number or range"));
                }
                out.push(part.to_string());
            }
            Some((lo, hi)) => {
                let bad = || format!("`{part}` in `[{body}]` is not a range like 03-05");
                if lo.is_empty() || hi.is_empty() || !lo.bytes().chain(hi.bytes()).all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                let (a, b): (u64, u64) = (lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?);
                if b < a {
                    return Err(format!("range `{part}` in `[{body}]` runs backwards"));
                }
                if b - a > 100_000 {
                    return Err(format!("range `{part}` in `[{body}]` is too large"));
                }
                let width = lo.len();
                for n in a..=b {
                    out.push(format!("{n:0width$}"));
                }
            }
        }
    }
    Ok(out)
}

/// One nodelist item (`gpu[01-02]-ib[1,3]`) → its hosts, in order.
fn expand_item(item: &str) -> Result<Vec<String>, String> {
    let Some(open) = item.find('[') else {
        return Ok(vec![item.to_string()]);
    };
    let close = item[open..].find(']').map(|c| open + c).ok_or("unclosed `[`")?;
    let prefix = &item[..open];
    let mids = expand_ranges(&item[open + 1..close])?;
    let rests = expand_item(&item[close + 1..])?;
    let mut out = vec![];
    for m in &mids {
        for r in &rests {
            out.push(format!("{prefix}{m}{r}"));
        }
    }
    Ok(out)
}

/// SLURM's compressed host list → hosts in order: `node[03-05,07],gpu1` → node03 node04
/// node05 node07 gpu1.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, String> {
    let list = list.trim();
    if list.is_empty() {
        return Err("empty nodelist".into());
    }
    let mut hosts = vec![];
    for item in top_level_items(list)? {
        hosts.extend(expand_item(item.trim())?);
    }
    Ok(hosts)
}

/// The first host of a nodelist (MASTER_ADDR under SLURM).
pub fn first_host(list: &str) -> Result<String, String> {
    expand_nodelist(list).map(|h| h[0].clone())
}

/// `SLURM_TASKS_PER_NODE` (`2(x3),1`) → tasks per node: 2 2 2 1.
pub fn expand_tasks_per_node(s: &str) -> Result<Vec<usize>, String> {
    let mut out = vec![];
    for part in s.split(',') {
        let part = part.trim();
        let (n, rep) = match part.split_once('(') {
            None => (part, 1usize),
            Some((n, r)) => {
                let r = r.strip_suffix(')').and_then(|r| r.strip_prefix('x')).ok_or_else(|| format!("`{part}` is not like 2(x3)"))?;
                (n, r.parse().map_err(|_| format!("`{part}` is not like 2(x3)"))?)
            }
        };
        let n: usize = n.parse().map_err(|_| format!("`{part}` is not a task count"))?;
        out.extend(std::iter::repeat_n(n, rep));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn torchrun_all_vars() {
        let e = detect(&env(&[
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29511"),
        ]))
        .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 5,
                local_rank: 1,
                world_size: 8,
                local_world_size: 4,
                master_addr: "10.1.2.3".into(),
                master_port: 29511,
                launcher: Launcher::Torchrun
            }
        );
    }

    #[test]
    fn torchrun_wins_over_slurm_and_local_defaults() {
        let e = detect(&env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "1234"),
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "16"),
        ]))
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.local_rank, e.world_size, e.local_world_size), (Launcher::Torchrun, 1, 1, 2, 2));
    }

    #[test]
    fn torchrun_errors_name_the_variable() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")];
        for skip in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            let kv: Vec<_> = base.iter().copied().filter(|(k, _)| *k != skip).collect();
            let e = detect(&env(&kv)).unwrap_err();
            assert!(matches!(&e, EnvError::Missing { var, .. } if var == skip), "{skip}: {e}");
            assert!(e.to_string().contains(&format!("`{skip}` is not set")), "{e}");
        }
        let mut kv = base.to_vec();
        kv[0] = ("RANK", "two");
        let e = detect(&env(&kv)).unwrap_err().to_string();
        assert_eq!(e, "torchrun environment: `RANK=two`: expected a non-negative integer");
        kv[0] = ("RANK", "2");
        let e = detect(&env(&kv)).unwrap_err().to_string();
        assert_eq!(e, "torchrun environment: `RANK=2`: must be less than WORLD_SIZE=2");
        kv[0] = ("RANK", "0");
        kv[3] = ("MASTER_PORT", "70000");
        let e = detect(&env(&kv)).unwrap_err().to_string();
        assert_eq!(e, "torchrun environment: `MASTER_PORT=70000`: expected a TCP port in 1..=65535");
        kv[3] = ("MASTER_PORT", "29500");
        kv[1] = ("WORLD_SIZE", "0");
        let e = detect(&env(&kv)).unwrap_err().to_string();
        assert_eq!(e, "torchrun environment: `WORLD_SIZE=0`: the world size must be at least 1");
        let mut kv = base.to_vec();
        kv.push(("LOCAL_RANK", "3"));
        kv.push(("LOCAL_WORLD_SIZE", "2"));
        let e = detect(&env(&kv)).unwrap_err().to_string();
        assert_eq!(e, "torchrun environment: `LOCAL_RANK=3`: must be less than LOCAL_WORLD_SIZE=2");
    }

    #[test]
    fn slurm_nodelist_master_and_default_port() {
        let e = detect(&env(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_NODEID", "1"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_NODELIST", "node[03-04]"),
            ("SLURM_JOB_ID", "42"),
        ]))
        .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 6,
                local_rank: 2,
                world_size: 8,
                local_world_size: 4,
                master_addr: "node03".into(),
                master_port: 29500,
                launcher: Launcher::Slurm
            }
        );
    }

    #[test]
    fn slurm_master_addr_and_port_override_and_uneven_nodes() {
        let e = detect(&env(&[
            ("SLURM_PROCID", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_NODEID", "2"),
            ("SLURM_TASKS_PER_NODE", "2(x2),1"),
            ("SLURM_JOB_NODELIST", "a[1-2],b7"),
            ("MASTER_ADDR", "head"),
            ("MASTER_PORT", "1234"),
        ]))
        .unwrap();
        assert_eq!((e.master_addr.as_str(), e.master_port, e.local_world_size), ("head", 1234, 1));
        // no per-node counts: NTASKS spread evenly over the nodelist
        let e = detect(&env(&[("SLURM_PROCID", "3"), ("SLURM_LOCALID", "1"), ("SLURM_NTASKS", "4"), ("SLURM_NODELIST", "gpu-[001-002]")])).unwrap();
        assert_eq!((e.master_addr.as_str(), e.local_world_size), ("gpu-001", 2));
        // SLURM_NTASKS_PER_NODE
        let e = detect(&env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_NTASKS_PER_NODE", "3"),
            ("SLURM_NODELIST", "n1"),
        ]))
        .unwrap();
        assert_eq!(e.local_world_size, 3);
    }

    #[test]
    fn slurm_errors() {
        let e = detect(&env(&[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_NODELIST", "n1")])).unwrap_err().to_string();
        assert_eq!(e, "SLURM environment: `SLURM_NTASKS` is not set");
        let e = detect(&env(&[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_NTASKS", "2")])).unwrap_err().to_string();
        assert_eq!(e, "SLURM environment: `SLURM_NODELIST` is not set (and MASTER_ADDR is not set either)");
        let e = detect(&env(&[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_NODELIST", "n[1-")]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "SLURM environment: `SLURM_NODELIST=n[1-`: unclosed `[`");
        let e = detect(&env(&[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_NTASKS", "3"), ("SLURM_NODELIST", "n[1-2]")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`SLURM_TASKS_PER_NODE` is not set"), "{e}");
        let e = detect(&env(&[("SLURM_PROCID", "5"), ("SLURM_LOCALID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_NODELIST", "n[1-2]")]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "SLURM environment: `SLURM_PROCID=5`: must be less than SLURM_NTASKS=2");
    }

    #[test]
    fn open_mpi() {
        let e = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ]))
        .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 3,
                local_rank: 3,
                world_size: 4,
                local_world_size: 4,
                master_addr: "127.0.0.1".into(),
                master_port: 29500,
                launcher: Launcher::OpenMpi
            }
        );
        let multi = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ];
        let e = detect(&env(&multi)).unwrap_err();
        assert!(matches!(&e, EnvError::Missing { var, launcher: Launcher::OpenMpi, .. } if var == "MASTER_ADDR"), "{e}");
        let mut kv = multi.to_vec();
        kv.push(("MASTER_ADDR", "node0"));
        kv.push(("MASTER_PORT", "4000"));
        let e = detect(&env(&kv)).unwrap();
        assert_eq!((e.master_addr.as_str(), e.master_port, e.local_rank), ("node0", 4000, 1));
        let e = detect(&env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "Open MPI environment: `OMPI_COMM_WORLD_LOCAL_RANK` is not set");
    }

    #[test]
    fn nothing_set() {
        assert_eq!(detect(&env(&[("PATH", "/bin"), ("SLURM_JOB_ID", "1")])), Err(EnvError::NotDistributed));
        assert_eq!(detect(&env(&[("RANK", "")])), Err(EnvError::NotDistributed));
    }

    #[test]
    fn nodelists() {
        assert_eq!(expand_nodelist("node[03-05,07]").unwrap(), ["node03", "node04", "node05", "node07"]);
        assert_eq!(first_host("node[03-05,07]").unwrap(), "node03");
        assert_eq!(expand_nodelist("n1").unwrap(), ["n1"]);
        assert_eq!(expand_nodelist("a[1-2],b7,c[09-10]").unwrap(), ["a1", "a2", "b7", "c09", "c10"]);
        assert_eq!(expand_nodelist("gpu[1-2]-ib[0,2]").unwrap(), ["gpu1-ib0", "gpu1-ib2", "gpu2-ib0", "gpu2-ib2"]);
        assert_eq!(expand_nodelist("x[8-10]").unwrap(), ["x8", "x9", "x10"]);
        assert_eq!(first_host(" h-[7] ").unwrap(), "h-7");
        for (bad, why) in [
            ("", "empty nodelist"),
            ("n[1-", "unclosed `[`"),
            ("n1]", "`]` without `[`"),
            ("n[5-3]", "range `5-3` in `[5-3]` runs backwards"),
            ("n[a-b]", "`a-b` in `[a-b]` is not a range like 03-05"),
            ("n[1,,2]", "`` in `[1,,2]` is not a number or range"),
            ("a,,b", "empty host name"),
            ("n[[1]]", "nested `[`"),
        ] {
            assert_eq!(expand_nodelist(bad).unwrap_err(), why, "{bad}");
        }
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert!(expand_tasks_per_node("2(3)").is_err());
    }
}
