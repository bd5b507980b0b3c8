//! `tune` against brute force at real size: every (full, SAC) split of the blocks at the outer
//! points of tune's answer and first runner-ups, with their siblings (both prefetch modes, the
//! embeddings and head as units of their own or the root's) and the answer's kept-unit
//! neighbours (one unit kept more and one fewer; in one scenario every count), planned, timed
//! and replayed
//! through the allocator model. Prints tune's answer beside the best that fits there, and
//! how many rows of fixed `full` do not fit monotonically in `sac` (tune's bisection assumes
//! they do; the allocator replay need not). The planner's tests hold tune to brute force over
//! every per-block assignment on small models (`planner/tests/tune.rs`); this holds it at the
//! sizes users plan, on the prefix splits tune searches.
//!
//!     cargo bench --bench tune_oracle
//!
//! (`cargo test --all-targets` runs it without `--bench`, in a debug build: a 4-block model
//! only, its assertion a test.)

use fsdp_planner::tune::{self, Config, Limit, Outer};
use std::collections::BTreeSet;

#[path = "scenario.rs"]
mod scenario;

// (the binary's allocator and its options)
#[path = "../src/allocator.rs"]
mod allocator;

/// What brute force learns of one configuration: (step time, tokens/s/GPU, fits).
type Point = (Config, Option<(f64, f64, bool)>);

fn main() {
    allocator::no_huge_pages();
    let hw = scenario::h100();
    let full = std::env::args().any(|a| a == "--bench");
    // (model, world size, global batch, seq, the limit: the device's judged by the allocator
    // model, or for the 4-block model a tensor peak that makes its checkpointing bind — its
    // allocator replay is all 20 MiB segments)
    let device = Limit { bytes: hw.memory_bytes, reserve: None };
    // (and how many of tune's best outer points to take: the answer's and the first three
    // runner-ups', or for Llama-3-70B's 80 blocks, 3,321 splits per outer point, the answer's;
    // and whether every kept-unit count of the answer's outer point is brute-forced — on 256
    // GPUs at seq 2048 under 36 GiB, where the answer keeps units — or its neighbours only)
    let gib36 = Limit { bytes: 36 << 30, reserve: None };
    let scenarios: Vec<(&str, u64, u64, u64, Limit, usize, bool)> = if full {
        vec![("llama-3-8b", 8, 16, 8192, device, 4, false), ("llama-3-8b", 8, 32, 8192, device, 4, false), ("llama-3-8b", 16, 64, 4096, device, 4, false), ("llama-3-70b", 64, 64, 8192, device, 1, false), ("llama-3-8b", 256, 256, 2048, gib36, 1, true)]
    } else {
        vec![("tiny-llama-4l", 2, 4, 1024, Limit { bytes: 12 << 20, reserve: Some(0) }, 4, true)]
    };
    println!("| model | GPUs | global batch × seq | outer points | configurations | tune's best tokens/s/GPU | brute force's | tune vs brute force | rows not monotone in SAC |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for (name, ws, gb, seq, limit, top, every_count) in scenarios {
        let m = scenario::model(name);
        let base = scenario::options(ws, seq);
        let space = tune::space(&m, &base, ws, gb, hw.gpus_per_node).unwrap();
        let r = tune::search(&m, &base, &hw, &space, limit, 2, &|_, _, _| {});
        let valid: BTreeSet<Outer> = tune::outers(&space).into_iter().chain(tune::keep_outers(&space)).collect();
        let sp = &space;
        let mut outers: BTreeSet<Outer> = r
            .per_outer
            .iter()
            .take(top)
            .flat_map(|e| sp.prefetch.iter().flat_map(move |&p| sp.edges.iter().map(move |&edges| Outer { prefetch: p, edges, ..e.config.outer })))
            .filter(|o| valid.contains(o))
            .collect();
        // and the answer's kept-unit neighbours: one unit kept more and one fewer (or, where
        // it keeps none of the counts, the fewest and the most), what the third pass's skips
        // would miss first — or every count, and all / all but the last / none
        if let Some(b) = &r.best {
            let o = b.config.outer;
            let u = tune::units_of(sp, &o);
            let near = match (every_count, o.reshard) {
                (true, _) => (2..u).map(tune::Reshard::Keep).chain([tune::Reshard::All, tune::Reshard::AllButLast, tune::Reshard::None]).collect(),
                (false, tune::Reshard::Keep(k)) => vec![tune::Reshard::Keep(k - 1), tune::Reshard::Keep(k + 1)],
                (false, _) => vec![tune::Reshard::Keep(2), tune::Reshard::Keep(u - 1)],
            };
            outers.extend(near.into_iter().map(|reshard| Outer { reshard, ..o }).filter(|o| valid.contains(o)));
        }
        // (counted from the front and from the back: what reads the same both ways once; with
        // every choice of the minor units, where the blocks differ)
        let mut configs: Vec<Config> = outers
            .iter()
            .flat_map(|&o| {
                let l = sp.main_blocks(o.group) as u32;
                sp.minor_codes(o.group).into_iter().flat_map(move |m| (0..=l).flat_map(move |f| (0..=if sp.sac { l - f } else { 0 }).flat_map(move |s| [false, true].map(|back| Config::new(o, f, s, back, l, m)))))
            })
            .collect();
        configs.sort();
        configs.dedup();
        let mut points: Vec<Point> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|t| {
                    let (m, base, hw, space, configs) = (&m, &base, &hw, &space, &configs);
                    s.spawn(move || {
                        configs
                            .iter()
                            .skip(t)
                            .step_by(2)
                            .map(|&c| {
                                let got = fsdp_planner::plan_unchecked(m, &tune::options(base, space, &c)).ok().map(|plan| {
                                    let e = tune::evaluate(&plan, m, hw, limit, c);
                                    (e.step_time_s, e.tokens_per_s_per_gpu, e.fits)
                                });
                                (c, got)
                            })
                            .collect::<Vec<Point>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        points.sort_by_key(|p| p.0);
        let brute = points.iter().filter_map(|(c, p)| p.filter(|x| x.2).map(|x| (x.0, x.1, *c))).min_by(|a, b| a.0.total_cmp(&b.0));
        // rows (outer, full) whose fit along sac is not false…false, true…true
        let (mut rows_not_monotone, mut rows) = (0, 0);
        for &o in &outers {
            for m in sp.minor_codes(o.group) {
                for f in 0..=sp.main_blocks(o.group) as u32 {
                    // (counted from the front: the rows tune's bisection walks that way)
                    let fits: Vec<bool> = points.iter().filter(|(c, _)| c.outer == o && c.minor == m && c.full == f && !c.back).map(|(_, p)| p.is_some_and(|x| x.2)).collect();
                    if fits.windows(2).any(|w| w[0] && !w[1]) {
                        rows_not_monotone += 1;
                    }
                    rows += 1;
                }
            }
        }
        let tuned = r.best.as_ref().map(|b| (b.step_time_s, b.tokens_per_s_per_gpu));
        let gap = match (tuned, brute) {
            (Some(t), Some(b)) => format!("{:+.2}%", (t.1 / b.1 - 1.0) * 100.0),
            (None, None) => "neither fits".into(),
            _ => "differs".into(),
        };
        println!(
            "| {name} | {ws} | {gb} × {seq} | {} | {} | {} | {} | {gap} | {rows_not_monotone} of {rows} |",
            outers.len(),
            configs.len(),
            tuned.map_or("—".into(), |t| format!("{:.0}", t.1)),
            brute.map_or("—".into(), |b| format!("{:.0}", b.1))
        );
        // (what brute force found faster, where it did)
        if let (Some(t), Some(b)) = (tuned, brute) {
            if b.0 < t.0 {
                eprintln!("{name}: brute force's best {:?}", b.2);
            }
        }
        // tune's answer is within 0.5% of the best that fits where brute force looked
        match (tuned, brute) {
            (Some(t), Some(b)) => assert!(t.0 <= b.0 * 1.005, "{name}: tune {} s vs brute force {} s ({:?})", t.0, b.0, b.2),
            (None, None) => {}
            (t, b) => panic!("{name}: tune {t:?} vs brute force {b:?}"),
        }
    }
}
