//! What `tune`'s space leaves out, held against its answer at real size:
//! 1. `reshard_after_forward` ints other than a node's GPUs: tune searched again with each
//!    N (2, 4 and, past 16 GPUs, 16 and 32) in the node's place (`Space::node`: resharding to
//!    groups of N, with or without the last unit kept);
//! 2. mixed checkpointing patterns: the answer's per-block AC (so many blocks fully
//!    checkpointed, so many under op-level SAC) placed on blocks drawn at random (a seeded
//!    shuffle), planned, timed and judged by the allocator model — tune searches the blocks
//!    counted from the front and from the back only;
//! 3. the embeddings or the head alone a unit of its own (`tune --separate-edge-units`).
//!
//! Each line prints tune's answer and the best each probe found, as a change of tokens/s/GPU.
//!
//!     cargo bench --bench tune_space
//!
//! (`cargo test --all-targets` runs it without `--bench`, in a debug build: one small
//! scenario, few shuffles, a smoke test.)

use fsdp_planner::tune::{self, Limit, Reshard};

#[path = "scenario.rs"]
mod scenario;

/// A seeded shuffle (xorshift64*): the same draws on every machine.
fn shuffle<T>(v: &mut [T], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed ^= *seed >> 12;
        *seed ^= *seed << 25;
        *seed ^= *seed >> 27;
        let r = seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
        v.swap(i, (r % (i as u64 + 1)) as usize);
    }
}

fn main() {
    let hw = scenario::h100();
    let full = std::env::args().any(|a| a == "--bench");
    let scenarios: &[(&str, u64, u64, u64)] = if full {
        &[("llama-3-8b", 8, 16, 8192), ("llama-3-8b", 16, 32, 8192), ("llama-3-70b", 64, 64, 8192), ("llama-3-8b", 256, 256, 4096), ("llama-1b", 512, 512, 2048), ("llama-3.1-405b", 2048, 2048, 4096)]
    } else {
        &[("llama-3-8b", 8, 8, 8192)]
    };
    let draws = if full { 20 } else { 2 };
    let limit = Limit { bytes: hw.memory_bytes, reserve: None };
    let pct = |a: f64, b: f64| format!("{:+.3}%", 100.0 * (a / b - 1.0));
    println!("| model | GPUs | global batch × seq | tune's answer, tokens/s/GPU | other ints (N: best) | the answer's AC at random blocks ({draws} draws: fit, best) | either edge alone a unit |");
    println!("|---|---:|---|---:|---|---|---:|");
    for &(name, ws, gb, seq) in scenarios {
        let m = scenario::model(name);
        let base = scenario::options(ws, seq);
        let space = tune::space(&m, &base, ws, gb, hw.gpus_per_node).unwrap();
        let quiet = |_: usize, _: usize, _: usize| {};
        let r = tune::search(&m, &base, &hw, &space, limit, 2, &quiet);
        let Some(best) = r.best else {
            println!("| {name} | {ws} | {gb} × {seq} | does not fit | | | |");
            continue;
        };
        let t0 = best.tokens_per_s_per_gpu;
        // 1. other ints in the node's place
        let mut ints = vec![];
        for n in [2u64, 4, 16, 32] {
            if n >= ws || !ws.is_multiple_of(n) || n == hw.gpus_per_node {
                continue;
            }
            let mut s = space.clone();
            s.node = n;
            s.reshard.retain(|r| !matches!(r, Reshard::ToNode | Reshard::ToNodeButLast));
            s.reshard.extend([Reshard::ToNode, Reshard::ToNodeButLast]);
            let t = tune::search(&m, &base, &hw, &s, limit, 2, &quiet).best.map_or(0.0, |b| b.tokens_per_s_per_gpu);
            ints.push(format!("{n}: {}", pct(t, t0)));
        }
        // 2. the answer's AC counts at random blocks, each planned in full and judged as the
        // answer itself is here (the control: the answer's own placement, the first draw)
        let modes = tune::block_modes(&space, &best.config);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let checkpointed = modes.iter().any(|&x| x != 0) && modes.iter().any(|&x| x != modes[0]);
        let judge = |p: &[u8]| -> Option<(bool, f64)> {
            let mut opts = tune::options(&base, &space, &best.config);
            opts.checkpoint = tune::checkpoint_entries_of(&space.blocks, p);
            // (a placement plan refuses counts as not fitting; the label is the answer's)
            let plan = fsdp_planner::plan(&m, &opts).ok()?;
            let e = tune::evaluate(&plan, &m, &hw, limit, best.config);
            Some((e.fits, e.tokens_per_s_per_gpu))
        };
        let mixed = if !checkpointed {
            "— (every block alike)".to_string()
        } else {
            let control = judge(&modes);
            let (mut fit, mut fastest) = (0, f64::MIN);
            for _ in 0..draws {
                let mut p = modes.clone();
                shuffle(&mut p, &mut seed);
                if let Some((true, t)) = judge(&p) {
                    fit += 1;
                    fastest = fastest.max(t);
                }
            }
            let c = match control {
                Some((true, t)) => format!("the answer's own: fits, {}", pct(t, t0)),
                Some((false, _)) => "the answer's own: does not fit".into(),
                None => "the answer's own: refused".into(),
            };
            if fit == 0 { format!("{c}; 0 of {draws} fit") } else { format!("{c}; {fit} of {draws} fit, best {}", pct(fastest, t0)) }
        };
        // 3. the embeddings or the head alone a unit (where they are untied)
        let sep = if space.edge_policy.is_none() {
            "— (tied)".to_string()
        } else {
            let mut s = space.clone();
            for e in [tune::Edges::Embeddings, tune::Edges::Head] {
                if !s.edges.contains(&e) {
                    s.edges.push(e);
                }
            }
            pct(tune::search(&m, &base, &hw, &s, limit, 2, &quiet).best.map_or(0.0, |b| b.tokens_per_s_per_gpu), t0)
        };
        println!("| {name} | {ws} | {gb} × {seq} | {t0:.0} | {} | {mixed} | {sep} |", if ints.is_empty() { "—".into() } else { ints.join(", ") });
    }
}
