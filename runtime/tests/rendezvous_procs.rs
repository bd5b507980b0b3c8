//! Rendezvous and launch across real local processes (loopback only, free ports, bounded
//! time). The test binary re-runs itself as the ranks: `child_entry` does nothing unless
//! `FSDP_TEST_CHILD` is set, and then acts as one rank (or as a launcher) and exits.

use fsdp_runtime::launch::{free_port, launch, LaunchError, LaunchSpec};
use fsdp_runtime::launch_env;
use fsdp_runtime::rendezvous::{self, Config};
use std::ffi::OsString;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CHILD_ARGS: [&str; 5] = ["--exact", "child_entry", "--nocapture", "--test-threads=1", "-q"];

/// One rank: rendezvous with the launcher's variables, print the outcome, exit.
/// FSDP_TEST_TIMEOUT_MS bounds the rendezvous; FSDP_TEST_FAIL_RANK=k makes rank k exit 3
/// after it; FSDP_TEST_SLEEP_RANK=k makes rank k sleep 60 s; FSDP_TEST_CHILD=launch runs
/// the launcher over 3 ranks instead.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var("FSDP_TEST_CHILD") else { return };
    let num = |v: &str| std::env::var(v).ok().and_then(|s| s.parse::<usize>().ok());
    if mode == "launch" {
        let spec = LaunchSpec {
            nproc: 3,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            program: std::env::current_exe().unwrap(),
            args: CHILD_ARGS.iter().map(OsString::from).collect(),
            env: vec![("FSDP_TEST_CHILD".into(), "rank".into())],
        };
        // the launcher's own children must not inherit mode=launch
        match launch(&spec) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1)
            }
        }
    }
    let env = match launch_env::from_process_env() {
        Ok(e) => e,
        Err(e) => {
            println!("RDZV-ERR {e}");
            std::process::exit(2)
        }
    };
    // `FSDP_TEST_EXITS=RANK:CODE:MS,…`: those ranks exit with CODE after MS, the others sleep
    if let Ok(v) = std::env::var("FSDP_TEST_EXITS") {
        for e in v.split(',') {
            let f: Vec<u64> = e.split(':').map(|x| x.parse().unwrap()).collect();
            if f[0] as usize == env.rank {
                std::thread::sleep(Duration::from_millis(f[2]));
                std::process::exit(f[1] as i32)
            }
        }
        std::thread::sleep(Duration::from_secs(60));
    }
    let timeout = Duration::from_millis(num("FSDP_TEST_TIMEOUT_MS").unwrap_or(10_000) as u64);
    if num("FSDP_TEST_SLEEP_RANK") == Some(env.rank) {
        std::thread::sleep(Duration::from_secs(60));
    }
    if std::env::var("FSDP_TEST_COLLECTIVES").is_ok() {
        // the CPU collective across processes, checked against hand-computed results
        let cfg = Config::from_env(&env, timeout);
        let rz = rendezvous::rendezvous(&cfg, || Ok(rendezvous::random_id())).unwrap();
        let g = fsdp_runtime::comm_tcp::TcpGroup::new(rz, Some(timeout));
        match fsdp_runtime::selftest::check_collectives(&g, tch::Device::Cpu) {
            Ok(l) => println!("RDZV-OK {l}"),
            Err(e) => {
                println!("RDZV-ERR {e}");
                std::process::exit(1)
            }
        }
        std::process::exit(0)
    }
    match rendezvous::selftest(&Config::from_env(&env, timeout)) {
        Ok(line) => {
            println!("RDZV-OK {line}");
            if num("FSDP_TEST_FAIL_RANK") == Some(env.rank) {
                eprintln!("rank {} fails on purpose", env.rank);
                std::process::exit(3)
            }
            std::process::exit(0)
        }
        Err(e) => {
            println!("RDZV-ERR {e}");
            std::process::exit(1)
        }
    }
}

fn child(vars: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(CHILD_ARGS).env("FSDP_TEST_CHILD", "rank").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for v in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FSDP_TEST_FAIL_RANK", "FSDP_TEST_SLEEP_RANK", "FSDP_TEST_COLLECTIVES", "FSDP_TEST_EXITS"] {
        c.env_remove(v);
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

fn rank(port: u16, rank: usize, ws: usize, timeout_ms: u64) -> Command {
    child(&[
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", ws.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("FSDP_TEST_TIMEOUT_MS", timeout_ms.to_string()),
    ])
}

/// Starts every command, then waits for all (killing any still running after 60 s).
fn run_all(cmds: Vec<Command>) -> Vec<Output> {
    let kids: Vec<_> = cmds.into_iter().map(|mut c| c.spawn().expect("spawn a rank")).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    kids.into_iter()
        .map(|mut k| {
            while k.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = k.kill();
            k.wait_with_output().unwrap()
        })
        .collect()
}

fn line(o: &Output) -> String {
    let s = String::from_utf8_lossy(&o.stdout);
    s.lines().find(|l| l.starts_with("RDZV-")).unwrap_or_else(|| panic!("no RDZV line in {s:?} / {:?}", String::from_utf8_lossy(&o.stderr))).to_string()
}

#[test]
fn four_processes_meet_and_share_one_id() {
    let port = free_port().unwrap();
    let outs = run_all((0..4).map(|r| rank(port, r, 4, 20_000)).collect());
    let mut ids = vec![];
    for (r, o) in outs.iter().enumerate() {
        let l = line(o);
        assert!(o.status.success(), "rank {r}: {l}");
        assert!(l.starts_with(&format!("RDZV-OK rank {r}/4: rendezvous ok (id ")), "{l}");
        ids.push(l.split("(id ").nth(1).unwrap().to_string());
    }
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
}

#[test]
fn a_missing_rank_times_out_on_the_others() {
    let port = free_port().unwrap();
    let t0 = Instant::now();
    let outs = run_all(vec![rank(port, 0, 3, 1500), rank(port, 1, 3, 1500)]);
    assert!(t0.elapsed() < Duration::from_secs(30));
    let (l0, l1) = (line(&outs[0]), line(&outs[1]));
    assert!(!outs[0].status.success() && !outs[1].status.success());
    assert_eq!(l0, format!("RDZV-ERR rank 0: only 2 of 3 ranks joined the rendezvous at 127.0.0.1:{port} within 1.5 s (missing: rank 2)"));
    assert_eq!(l1, format!("RDZV-ERR rank 1: the rendezvous failed at rank 0: rank 0: only 2 of 3 ranks joined the rendezvous at 127.0.0.1:{port} within 1.5 s (missing: rank 2)"));
}

#[test]
fn no_rank_zero_is_a_timeout_naming_the_address() {
    let port = free_port().unwrap();
    let outs = run_all(vec![rank(port, 1, 2, 1000)]);
    let l = line(&outs[0]);
    assert!(l.starts_with(&format!("RDZV-ERR rank 1: no rendezvous at 127.0.0.1:{port} after 1 s (")), "{l}");
    assert_eq!(outs[0].status.code(), Some(1));
}

#[test]
fn a_wrong_world_size_fails_the_rendezvous() {
    let port = free_port().unwrap();
    let outs = run_all(vec![rank(port, 0, 3, 6000), rank(port, 1, 3, 6000), rank(port, 2, 4, 6000)]);
    let msg = "world size mismatch: rank 2 has world size 4, rank 0 has 3";
    assert_eq!(line(&outs[0]), format!("RDZV-ERR {msg}"));
    assert_eq!(line(&outs[2]), format!("RDZV-ERR rank 2: the rendezvous failed at rank 0: {msg}"));
    // rank 1 either got the same message or, if it came late, found nobody listening
    assert!(outs.iter().all(|o| !o.status.success()));
}

#[test]
fn a_rank_connecting_twice_fails_the_rendezvous() {
    let port = free_port().unwrap();
    let outs = run_all(vec![rank(port, 0, 3, 6000), rank(port, 1, 3, 6000), rank(port, 1, 3, 6000)]);
    assert_eq!(line(&outs[0]), "RDZV-ERR rank 1 connected twice");
    assert!(outs.iter().all(|o| !o.status.success()));
    let both: Vec<String> = outs[1..].iter().map(line).collect();
    assert!(both.iter().any(|l| l == "RDZV-ERR rank 1: the rendezvous failed at rank 0: rank 1 connected twice"), "{both:?}");
}

#[test]
fn bad_environment_is_reported_by_name() {
    let outs = run_all(vec![child(&[("RANK", "0".into()), ("WORLD_SIZE", "2".into()), ("MASTER_ADDR", "127.0.0.1".into())])]);
    assert_eq!(line(&outs[0]), "RDZV-ERR torchrun environment: `MASTER_PORT` is not set");
}

fn spec(vars: &[(&str, &str)]) -> LaunchSpec {
    let mut env = vec![("FSDP_TEST_CHILD".to_string(), "rank".to_string())];
    env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    LaunchSpec {
        nproc: 3,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        program: std::env::current_exe().unwrap(),
        args: CHILD_ARGS.iter().map(OsString::from).collect(),
        env,
    }
}

#[test]
fn launch_runs_every_rank_and_prefixes_their_output() {
    let outs = run_all(vec![child(&[("FSDP_TEST_CHILD", "launch".into())])]);
    let out = String::from_utf8_lossy(&outs[0].stdout);
    assert!(outs[0].status.success(), "{out}\n{}", String::from_utf8_lossy(&outs[0].stderr));
    for r in 0..3 {
        assert!(out.lines().any(|l| l.starts_with(&format!("[rank {r}] RDZV-OK rank {r}/3: rendezvous ok"))), "{out}");
    }
}

#[test]
fn launch_stops_the_job_when_a_rank_fails_and_names_it() {
    let e = launch(&spec(&[("FSDP_TEST_FAIL_RANK", "1")])).unwrap_err();
    match &e {
        LaunchError::RankFailed { rank, how, code, .. } => assert_eq!((*rank, how.as_str(), *code), (1, "exited with code 3", Some(3))),
        e => panic!("{e}"),
    }
    assert!(e.to_string().starts_with("launch: rank 1 exited with code 3"), "{e}");
}

/// A rank that exits 1 because its peer failed ("another rank failed to start") may exit a
/// moment before the peer whose input was bad (exit 2): the launcher names the cause, and
/// stops the rank still running after its grace.
#[test]
fn launch_names_the_rank_that_refused_its_input_even_when_a_peer_exits_first() {
    let t0 = Instant::now();
    let e = launch(&spec(&[("FSDP_TEST_EXITS", "0:1:0,1:2:100")])).unwrap_err();
    match &e {
        // (rank 2 is stopped; so is rank 0 when, on a loaded machine, it had not started and
        // exited yet when rank 1's exit came)
        LaunchError::RankFailed { rank, code, others, .. } => assert!((*rank, *code) == (1, Some(2)) && (1..=2).contains(others), "{e}"),
        e => panic!("{e}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}", t0.elapsed());
    // a cause that does not come within the grace: the first failure is named
    let e = launch(&spec(&[("FSDP_TEST_EXITS", "0:1:0")])).unwrap_err();
    assert!(matches!(e, LaunchError::RankFailed { rank: 0, code: Some(1), others: 2, .. }), "{e}");
}

#[test]
fn launch_kills_the_others_when_one_fails() {
    // rank 0 sleeps 60 s before the rendezvous; rank 2 fails at once (bad timeout → it
    // times out waiting for rank 0 after 0.5 s); launch must not wait for rank 0.
    let t0 = Instant::now();
    let mut s = spec(&[("FSDP_TEST_SLEEP_RANK", "0"), ("FSDP_TEST_TIMEOUT_MS", "500")]);
    s.nproc = 3;
    let e = launch(&s).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}", t0.elapsed());
    match e {
        e @ LaunchError::RankFailed { .. } => {
            let LaunchError::RankFailed { rank, ref how, others, .. } = e else { unreachable!() };
            assert!(rank == 1 || rank == 2, "{rank}");
            assert_eq!(how, "exited with code 1");
            // rank 0 was still asleep and got killed
            assert!(others >= 1, "{others}");
            assert!(e.to_string().contains("; stopped the other"), "{e}");
        }
        e => panic!("{e}"),
    }
}

#[test]
fn tcp_collectives_across_processes() {
    let port = free_port().unwrap();
    let cmds = (0..3)
        .map(|r| {
            let mut c = rank(port, r, 3, 20_000);
            c.env("FSDP_TEST_COLLECTIVES", "1");
            c
        })
        .collect();
    for (r, o) in run_all(cmds).iter().enumerate() {
        let l = line(o);
        assert!(o.status.success(), "rank {r}: {l}");
        assert_eq!(l, format!("RDZV-OK rank {r}/3: collectives ok on Cpu (all-gather, reduce-scatter avg, all-reduce avg; at once and left in flight; all-gather in place; f32, bf16)"));
    }
}

#[test]
fn launch_reports_a_missing_program() {
    let mut s = spec(&[]);
    s.program = "/nonexistent/fsdp-plan".into();
    let e = launch(&s).unwrap_err().to_string();
    assert!(e.starts_with("launch: cannot start rank 0 (/nonexistent/fsdp-plan): "), "{e}");
}

#[test]
fn ranks_in_threads_use_the_same_protocol() {
    let port = free_port().unwrap();
    let hs: Vec<_> = (0..3)
        .map(|r| {
            std::thread::spawn(move || {
                rendezvous::selftest(&Config { master_addr: "localhost".into(), master_port: port, rank: r, world_size: 3, timeout: Duration::from_secs(20) })
            })
        })
        .collect();
    for h in hs {
        assert!(h.join().unwrap().unwrap().contains("rendezvous ok"));
    }
}
