//! `tune`'s search speed over its whole space (issue: Llama-3-8B on 8 GPUs in < 1 s,
//! Llama-3.1-405B at world size 16,384 in < 10 s, on 2 cores): each scenario searched three
//! times, the median printed as a Markdown row for bench/RESULTS.md.
//!
//!     cargo bench --bench tune

use fsdp_planner::tune::{self, Limit};

#[path = "scenario.rs"]
mod scenario;

// (the binary's allocator and its options)
#[path = "../src/allocator.rs"]
mod allocator;
use std::time::Instant;

fn main() {
    allocator::no_huge_pages();
    let hw = scenario::h100();
    // (Llama-3.1-405B at seq 4096, as the table's history has it: at 8192 nothing fit an 80 GB
    // H100 until the embeddings and the head were searched as units of their own; the last
    // rows: larger global batches, up to 8 and 32 micro-batches accumulated, each a longer
    // schedule — past `tune::REPLAY_ACCUM`, timed from plans of fewer)
    let scenarios: &[(&str, u64, u64, u64)] = &[("llama-3-8b", 8, 16, 8192), ("llama-3-8b", 8, 32, 8192), ("llama-3-70b", 64, 64, 8192), ("llama-3.1-405b", 2048, 2048, 4096), ("llama-3.1-405b", 16384, 16384, 4096), ("llama-3-8b", 8, 64, 4096), ("llama-3-8b", 8, 256, 4096)];
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it (a
    // debug build): there, one scenario once, a smoke test
    let full = std::env::args().any(|a| a == "--bench");
    let scenarios = if full { scenarios } else { &scenarios[..1] };
    println!("| model | GPUs | global batch × seq | configurations in the space | plans built | best tokens/s/GPU | median time |");
    println!("|---|---:|---|---:|---:|---:|---:|");
    for &(name, ws, gb, seq) in scenarios {
        let m = scenario::model(name);
        let base = scenario::options(ws, seq);
        let limit = Limit { bytes: hw.memory_bytes, reserve: None };
        let mut times = vec![];
        let mut last = None;
        for _ in 0..if full { 3 } else { 1 } {
            let t0 = Instant::now();
            let space = tune::space(&m, &base, ws, gb, hw.gpus_per_node).unwrap();
            let r = tune::search(&m, &base, &hw, &space, limit, 2, &|_, _, _| {});
            times.push(t0.elapsed().as_secs_f64());
            let size = tune::size(&space);
            last = Some((size, r.plans_built, r.best.map(|b| b.tokens_per_s_per_gpu)));
        }
        times.sort_by(f64::total_cmp);
        let (size, planned, best) = last.unwrap();
        println!("| {name} | {ws} | {gb} × {seq} | {size} | {planned} | {} | **{:.2} s** |", best.map_or("does not fit".into(), |b| format!("{b:.0}")), times[times.len() / 2]);
    }
}
