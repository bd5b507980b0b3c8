//! Training with one process per rank (`fsdp-plan run` under `fsdp-plan launch`, torchrun or
//! SLURM: [`run_process`]), on the CPU with collectives over the rendezvous sockets: the
//! losses equal the rank-thread run's bit for bit (full sharding, hybrid sharding through
//! world collectives, FSDP1's flat layout with gradient accumulation); a rank that dies or
//! hangs ends every other rank with an error naming it, within the timeout; the last
//! checkpoint stays valid and resuming from it continues the uninterrupted run bit for bit;
//! ranks started with different plans or run options stop before training, naming them.
//!
//! The test binary re-runs itself as the ranks: `child_entry` does nothing unless
//! `FSDP_TEST_CHILD` is set, and then trains as one rank and exits.

use fsdp_planner::{Device, Layout, Options, Strategy};
use fsdp_runtime::launch::free_port;
use fsdp_runtime::train::{run_cpu, run_process, Backend, RunConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CHILD_ARGS: [&str; 5] = ["--exact", "child_entry", "--nocapture", "--test-threads=1", "-q"];
const STEPS: usize = 4;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cases: (name, options) on tiny-llama, batch 2, seq 8.
fn setup(case: &str) -> (fsdp_ir::Model, fsdp_planner::Plan) {
    let cfg = "models/tiny-llama.config.json";
    let m = fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(cfg)).unwrap(), cfg, "tiny-llama").unwrap();
    let base = Options { batch: 2, seq: 8, device: Device::Cpu, ..Options::default() };
    let opts = match case {
        "ws1" => Options { world_size: 1, ..base },
        "ws2" => Options { world_size: 2, ..base },
        "ws2-sgd" => Options { world_size: 2, optimizer: fsdp_planner::Optimizer::Sgd, ..base },
        "hsdp4" => Options { world_size: 4, strategy: Strategy::HybridShard { shard_size: 2 }, ..base },
        // reshard_after_forward=2: the post-forward pairs' all-gathers through rank 0's star,
        // each rank receiving its pair's slices alone
        "raf2-4" => Options { world_size: 4, reshard_to: Some(2), ..base },
        "flat3-ga2" => Options { world_size: 3, layout: Layout::Flat, grad_accum: 2, ..base },
        "offload2-ga2" => Options { world_size: 2, offload: fsdp_planner::Offload::Cpu, grad_accum: 2, ..base },
        c => panic!("unknown case {c}"),
    };
    let plan = fsdp_planner::plan(&m, &opts).unwrap();
    (m, plan)
}

fn config() -> RunConfig {
    RunConfig::new(STEPS)
}

/// One rank: trains the case in FSDP_TEST_CASE as the rank the launcher variables say, prints
/// `LOSS step bits` per step (the f64's bits: compared exactly) or `TRAIN-ERR message`.
/// FSDP_TEST_SAVE / FSDP_TEST_SAVE_EVERY: checkpoints; FSDP_TEST_EXIT_AFTER=r:s: rank r
/// aborts after step s; FSDP_TEST_TIMEOUT_MS bounds every wait on a peer.
#[test]
fn child_entry() {
    let Ok(case) = std::env::var("FSDP_TEST_CHILD") else { return };
    let env = fsdp_runtime::launch_env::from_process_env().unwrap();
    let (m, plan) = setup(&case);
    let var = |k: &str| std::env::var(k).ok();
    let cfg = RunConfig {
        save: var("FSDP_TEST_SAVE").map(PathBuf::from),
        save_every: var("FSDP_TEST_SAVE_EVERY").and_then(|s| s.parse().ok()).unwrap_or(0),
        exit_after: var("FSDP_TEST_EXIT_AFTER").map(|s| {
            let (r, st) = s.split_once(':').unwrap();
            (r.parse().unwrap(), st.parse().unwrap())
        }),
        steps: var("FSDP_TEST_STEPS").and_then(|s| s.parse().ok()).unwrap_or(STEPS),
        ..config()
    };
    let timeout = Duration::from_millis(var("FSDP_TEST_TIMEOUT_MS").and_then(|s| s.parse().ok()).unwrap_or(60_000));
    tch::set_num_threads(1);
    let r = run_process(&plan, &m, &cfg, &env, Backend::Cpu, timeout, |s| {
        println!("LOSS {} {}", s.step, s.loss.to_bits());
    });
    match r {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            println!("TRAIN-ERR {e}");
            std::process::exit(1)
        }
    }
}

fn rank_cmd(case: &str, port: u16, rank: usize, ws: usize, extra: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(CHILD_ARGS).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for v in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FSDP_TEST_SAVE", "FSDP_TEST_SAVE_EVERY", "FSDP_TEST_EXIT_AFTER", "FSDP_TEST_TIMEOUT_MS", "FSDP_TEST_STEPS"] {
        c.env_remove(v);
    }
    c.env("FSDP_TEST_CHILD", case)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", ws.to_string())
        .env("LOCAL_WORLD_SIZE", ws.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    for (k, v) in extra {
        c.env(k, v);
    }
    c
}

fn start(case: &str, ws: usize, extra: &[(&str, String)]) -> Vec<Child> {
    let port = free_port().unwrap();
    (0..ws).map(|r| rank_cmd(case, port, r, ws, extra).spawn().expect("spawn a rank")).collect()
}

/// Waits for every rank (killing any still running after `limit`); with the seconds each took.
fn wait_all(kids: Vec<Child>, limit: Duration) -> Vec<(Output, f64)> {
    let t0 = Instant::now();
    kids.into_iter()
        .map(|mut k| {
            while k.try_wait().unwrap().is_none() && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = k.kill();
            let o = k.wait_with_output().unwrap();
            (o, t0.elapsed().as_secs_f64())
        })
        .collect()
}

fn losses_of(o: &Output) -> Vec<(usize, u64)> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("LOSS "))
        .map(|l| {
            let (s, b) = l.split_once(' ').unwrap();
            (s.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

fn describe(o: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn thread_losses(case: &str, cfg: &RunConfig) -> Vec<(usize, u64)> {
    let (m, plan) = setup(case);
    run_cpu(&plan, &m, cfg, |_| {}).unwrap().into_iter().map(|r| (r.step, r.loss.to_bits())).collect()
}

/// A scratch directory, removed when the guard drops (a failing test's too).
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("fsdp-procs-{name}-")).tempdir().unwrap()
}

#[test]
fn processes_train_exactly_like_rank_threads() {
    for (case, ws) in [("ws2", 2), ("hsdp4", 4), ("raf2-4", 4), ("flat3-ga2", 3), ("offload2-ga2", 2)] {
        let want = thread_losses(case, &config());
        assert_eq!(want.len(), STEPS);
        let outs = wait_all(start(case, ws, &[]), Duration::from_secs(240));
        for (r, (o, _)) in outs.iter().enumerate() {
            assert!(o.status.success(), "{case} rank {r}: {}", describe(o));
            // every rank reports the world's average loss
            assert_eq!(losses_of(o), want, "{case} rank {r}: losses differ from the rank-thread run");
        }
        eprintln!("{case}: {ws} processes, {STEPS} steps, losses bit-identical to {ws} rank threads: {:?}", want.iter().map(|l| f64::from_bits(l.1)).collect::<Vec<_>>());
    }
}

#[test]
fn a_rank_that_dies_ends_the_job_and_its_checkpoint_resumes_exactly() {
    let case = "ws2";
    let full = thread_losses(case, &config());
    let tmp = tmp("die");
    let dir = tmp.path();
    let extra = [("FSDP_TEST_SAVE", dir.display().to_string()), ("FSDP_TEST_SAVE_EVERY", "1".into()), ("FSDP_TEST_EXIT_AFTER", "1:2".into())];
    let outs = wait_all(start(case, 2, &extra), Duration::from_secs(120));
    let (r0, t0) = &outs[0];
    let (r1, _) = &outs[1];
    // rank 1 crashed (SIGABRT) after step 2; rank 0 learns it at its next collective
    assert!(!r1.status.success(), "{}", describe(r1));
    assert!(!r0.status.success(), "{}", describe(r0));
    let err = String::from_utf8_lossy(&r0.stdout).lines().find_map(|l| l.strip_prefix("TRAIN-ERR ").map(str::to_string)).unwrap_or_else(|| panic!("no error from rank 0: {}", describe(r0)));
    assert!(err.contains("rank 1 left (connection closed; did it exit?)"), "{err}");
    assert!(*t0 < 100.0, "rank 0 took {t0} s to notice");
    assert_eq!(losses_of(r0), full[..2].to_vec());
    eprintln!("rank 1 aborted after step 2; rank 0 ended after {t0:.1} s with: {err}");
    // the last committed checkpoint is step 2's, and resuming from it continues exactly
    assert_eq!(std::fs::read_to_string(dir.join("latest")).unwrap().trim(), "step-00000002");
    let resumed = thread_losses(case, &RunConfig { resume: Some(dir.to_path_buf()), ..config() });
    assert_eq!(resumed, full[2..].to_vec(), "resume after the crash must continue the uninterrupted run bit for bit");
}

#[test]
fn a_hung_rank_times_out_on_the_others() {
    use std::io::BufRead;
    let case = "ws2";
    // a long run (killed below), every wait on a peer bounded by 3 s
    let extra = [("FSDP_TEST_TIMEOUT_MS", "3000".into()), ("FSDP_TEST_STEPS", "100000".into())];
    let mut kids = start(case, 2, &extra);
    // once rank 1 has finished a step, freeze it (SIGSTOP: alive, silent)
    let out1 = kids[1].stdout.take().unwrap();
    let first = std::io::BufReader::new(out1).lines().map_while(Result::ok).find(|l| l.starts_with("LOSS ") || l.starts_with("TRAIN-ERR"));
    assert!(first.as_deref().is_some_and(|l| l.starts_with("LOSS 1 ")), "{first:?}");
    let pid = kids[1].id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let t = Instant::now();
    let r0 = kids.remove(0);
    let (o, _) = wait_all(vec![r0], Duration::from_secs(60)).pop().unwrap();
    let waited = t.elapsed().as_secs_f64();
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    let _ = kids[0].wait();
    assert!(!o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stdout).lines().find_map(|l| l.strip_prefix("TRAIN-ERR ").map(str::to_string)).unwrap_or_else(|| panic!("{}", describe(&o)));
    assert!(err.contains("rank 1 did not answer"), "{err}");
    assert!(waited < 30.0, "rank 0 waited {waited} s (timeout 3 s)");
    eprintln!("rank 1 stopped; rank 0 ended after {waited:.1} s with: {err}");
}

/// Ranks started with different plans (here another optimizer: the same collectives, so
/// nothing else would notice) and step counts: every rank stops before the first step with
/// an error naming the rank and the values that differ.
#[test]
fn ranks_started_with_different_jobs_stop_before_training() {
    let port = free_port().unwrap();
    let kids: Vec<Child> = [("ws2", 0, "4"), ("ws2-sgd", 1, "3")]
        .iter()
        .map(|&(case, r, steps)| rank_cmd(case, port, r, 2, &[("FSDP_TEST_STEPS", steps.into())]).spawn().expect("spawn a rank"))
        .collect();
    let (adam, sgd) = (setup("ws2").1.plan_hash, setup("ws2-sgd").1.plan_hash);
    assert_ne!(adam, sgd);
    for (r, (o, secs)) in wait_all(kids, Duration::from_secs(60)).iter().enumerate() {
        assert!(!o.status.success(), "rank {r}: {}", describe(o));
        assert!(losses_of(o).is_empty(), "rank {r} trained: {}", describe(o));
        let err = String::from_utf8_lossy(&o.stdout).lines().find_map(|l| l.strip_prefix("TRAIN-ERR ").map(str::to_string)).unwrap_or_else(|| panic!("rank {r}: {}", describe(o)));
        let want = format!("rank {r}: the ranks were not started with the same job: rank 1 has plan {sgd}, rank 0 has {adam}; rank 1 has steps 3, rank 0 has 4 (start every rank with the same plan file and run options)");
        assert!(err.ends_with(&want), "rank {r}: {err}\nwant: {want}");
        if r == 0 {
            eprintln!("rank 1 started with SGD and 3 steps: rank 0 stopped after {secs:.1} s with: {err}");
        }
    }
}

/// World size 1 in this process (what a one-GPU `run --backend cuda` does: a rendezvous of
/// one on a free port, groups of one), and a plan for another world size refused by name.
#[test]
fn a_job_of_one_process_trains_like_the_thread_run() {
    let want = thread_losses("ws1", &config());
    let (m, plan) = setup("ws1");
    let mut env = fsdp_runtime::launch_env::LaunchEnv::single();
    env.master_port = 0;
    tch::set_num_threads(1);
    let got: Vec<(usize, u64)> = run_process(&plan, &m, &config(), &env, Backend::Cpu, Duration::from_secs(30), |_| {}).unwrap().into_iter().map(|r| (r.step, r.loss.to_bits())).collect();
    assert_eq!(got, want);
    let (m2, plan2) = setup("ws2");
    let e = run_process(&plan2, &m2, &config(), &env, Backend::Cpu, Duration::from_secs(30), |_| {}).err().unwrap().to_string();
    assert!(e.contains("the plan is for world size 2, but") && e.contains("plan with --world-size 1"), "{e}");
}
