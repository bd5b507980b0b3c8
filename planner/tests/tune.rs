//! `tune` against brute force: on spaces small enough to enumerate — every assignment of
//! {none, full, op-SAC} to each block (not only tune's prefix patterns), every reshard and
//! prefetch choice, shard group and micro-batch split — no configuration that fits predicts
//! a shorter step than tune's answer (within 0.5%), at limits across the whole range.

use fsdp_planner::hardware::Hardware;
use fsdp_planner::tune::{self, Config, Limit, Outer};
use fsdp_planner::Options;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn model(name: &str) -> fsdp_ir::Model {
    fsdp_ir::parse_model(&std::fs::read_to_string(root().join(format!("models/{name}.ron"))).unwrap(), name).unwrap()
}

fn hw(name: &str) -> Hardware {
    ron::from_str(&std::fs::read_to_string(root().join(format!("models/hardware/{name}.ron"))).unwrap()).unwrap()
}

/// Every configuration of the brute-force space: (outer, per-block mode 0 none / 1 full / 2 SAC).
/// (outer, per-block modes, tensor peak, what the device needs by the allocator model, step time)
type Point = (Outer, Vec<u8>, u64, u64, f64);

fn brute(m: &fsdp_ir::Model, base: &Options, h: &Hardware, space: &tune::Space) -> Vec<Point> {
    let l = space.blocks.len();
    let mut out = vec![];
    // (the kept-unit counts too, where the space searches them)
    for o in tune::outers(space).into_iter().chain(tune::keep_outers(space)) {
        for code in 0..3usize.pow(l as u32) {
            let modes: Vec<u8> = (0..l).map(|i| ((code / 3usize.pow(i as u32)) % 3) as u8).collect();
            let mut opts = tune::options(base, space, &Config { outer: o, full: 0, sac: 0, back: false, minor: 0 });
            opts.checkpoint = modes
                .iter()
                .zip(&space.blocks)
                .filter(|(m, _)| **m > 0)
                .map(|(m, b)| format!("{b}={}", if *m == 1 { "full" } else { "selective-op" }))
                .collect();
            let Ok(plan) = fsdp_planner::plan_unchecked(m, &opts) else { continue };
            let t = fsdp_planner::timeline::predict(&plan, m, h);
            let need = fsdp_planner::reserved::predict(&plan, h).needed_bytes(&plan);
            out.push((o, modes, plan.memory.peak_bytes, need, t.step_time_s));
        }
    }
    out
}

/// How much of a step what keeping units saves with checkpointing may exceed what it saves
/// without (ARCHITECTURE.md, "How tune finds the optimum", property 4).
const SAVING_SLACK: f64 = 1e-4;

/// The memory of each point of the Pareto front of (memory, step time) points, least memory
/// first: the limits at which the fastest of them that fits changes.
fn pareto_limits(points: impl Iterator<Item = (u64, f64)>) -> Vec<u64> {
    let mut by_mem: Vec<(u64, f64)> = points.collect();
    by_mem.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let (mut limits, mut fastest) = (vec![], f64::INFINITY);
    for (m, t) in by_mem {
        if t < fastest {
            fastest = t;
            limits.push(m);
        }
    }
    limits
}

fn check(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool) {
    check_groups(name, ws, global_batch, base, allocator, None, false);
}

/// [`check`] with CPU offload left out of the space.
fn check_without_offload(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool) {
    check_space(name, ws, global_batch, base, allocator, None, false, false);
}

/// [`check`] with the kept-unit counts, tune's default (within their tolerance).
fn check_kept(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool) -> usize {
    check_groups(name, ws, global_batch, base, allocator, None, true)
}

/// [`check`] with `groups`, when given, as a user's `--unit-groups` list (every one searched),
/// and with every count of kept units (tune's default third pass) when `keep`: the number of
/// limits at which brute force's best keeps units.
fn check_groups(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool, groups: Option<Vec<u32>>, keep: bool) -> usize {
    check_space(name, ws, global_batch, base, allocator, groups, keep, true)
}

/// [`check_groups`], CPU offload in the space where the options allow it when `offload`.
#[allow(clippy::too_many_arguments)]
fn check_space(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool, groups: Option<Vec<u32>>, keep: bool, offload: bool) -> usize {
    check_limits(name, ws, global_batch, base, allocator, groups, keep, offload, false)
}

/// Answers whose minor units ([`tune::Space::minor_units`]) are checkpointed, over every check.
static MINOR_ANSWERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`check_space`], at every limit of brute force's Pareto front (and a byte below each) too
/// where `every_front`.
#[allow(clippy::too_many_arguments)]
fn check_limits(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool, groups: Option<Vec<u32>>, keep: bool, offload: bool, every_front: bool) -> usize {
    check_edges(name, ws, global_batch, base, allocator, groups, keep, offload, every_front, false)
}

/// [`check_limits`], the final norm in the head's unit in the space too where `norm_head`
/// (`tune --norm-head-unit`).
#[allow(clippy::too_many_arguments)]
fn check_edges(name: &str, ws: u64, global_batch: u64, base: Options, allocator: bool, groups: Option<Vec<u32>>, keep: bool, offload: bool, every_front: bool, norm_head: bool) -> usize {
    let m = model(name);
    let h = hw("h100-sxm");
    let base = Options { world_size: ws, ..base };
    let mut space = tune::space(&m, &base, ws, global_batch, h.gpus_per_node).unwrap();
    space.keep = keep;
    // CPU offload is in the space the oracle enumerates (where the options allow it)
    assert_eq!(space.offload.contains(&true), Options { offload: fsdp_planner::Offload::Cpu, ..base.clone() }.check().is_ok(), "{name}");
    if !offload {
        space.offload = vec![false];
    }
    // unit groups: the default space's (1, 2 or 4 blocks per unit for 4 blocks, tune's line
    // search along them held to brute force over all of them); resharding to "nodes" of two
    // ranks after forward (reshard_after_forward=2) where the world has two of them
    match groups {
        Some(g) => {
            space.groups = g;
            space.every_group = true;
        }
        None => assert_eq!(space.groups, (1..=space.blocks.len() as u32).filter(|&k| (space.blocks.len() as u32).is_multiple_of(k)).collect::<Vec<_>>(), "{name}"),
    }
    if ws == 4 {
        space.node = 2;
        space.reshard.extend([tune::Reshard::ToNode, tune::Reshard::ToNodeButLast]);
    }
    // the embeddings and the head as units of their own, where they are untied (the space's
    // default), and the final norm in the head's unit (`tune --norm-head-unit`; either alone
    // too: the hand-written enumerations below)
    if space.edge_policy.is_some() {
        assert_eq!(space.edges, [tune::Edges::Root, tune::Edges::Both], "{name}");
        if norm_head {
            space.edges.push(tune::Edges::EmbeddingsNormHead);
        }
    }
    assert!(space.blocks.len() <= 4, "brute force is 3^blocks per outer point");
    let all = brute(&m, &base, &h, &space);
    if keep {
        // what the third pass's skips take (`tune::KEEP_TOLERANCE`): keeping one more unit
        // never slows the step nor lowers the tensor peak (`None`, every unit kept, included)
        // by more than one unit's params — FSDP2 copies a unit's all-gather output into its
        // params, so a unit gathered in backward briefly holds both where a kept one does not
        // (2-block models with accumulation: 10 KiB lower); the allocator replay's need is not
        // held to it (its fragmentation need not grow with the units kept: Llama-3-8B on 8
        // GPUs, 1 × 8192 × 2, every block fully checkpointed, 26 kept needs 1.0 GB less than
        // 25; the search judges fit by it and stops on the tensor peak only) — and
        // what keeping r units rather than r0 < r (resharding all: 0; all but the last: 1)
        // saves with any checkpointing is at most what it saves without (to within
        // `SAVING_SLACK` of the step: exact here; 0.003% on Llama-3-8B on 256 GPUs, 16 units
        // kept against none, over five checkpoint choices)
        let index: std::collections::HashMap<(tune::Outer, &[u8]), &Point> = all.iter().map(|x| ((x.0, x.1.as_slice()), x)).collect();
        let at = |o: tune::Outer, modes: &[u8]| index.get(&(o, modes)).copied();
        let none = vec![0u8; space.blocks.len()];
        let kept = |o: &tune::Outer| match o.reshard {
            tune::Reshard::All => Some(0),
            tune::Reshard::AllButLast => Some(1),
            tune::Reshard::Keep(r) => Some(r),
            tune::Reshard::None => Some(tune::units_of(&space, o)),
            tune::Reshard::ToNode | tune::Reshard::ToNodeButLast => None,
        };
        // (the unit one more kept keeps is a block group: the head is kept first, the
        // embeddings never)
        let mut owned: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for p in &m.params {
            if let Some(b) = space.blocks.iter().find(|b| p.name.starts_with(&format!("{b}."))) {
                *owned.entry(b.as_str()).or_default() += p.numel() * base.param_dtype.map_or(p.dtype.size(), |d| d.size());
            }
        }
        let unit_bytes = owned.values().copied().max().unwrap_or(0);
        // every pair of kept counts of an outer point, at every checkpoint choice
        type Counts<'a> = std::collections::HashMap<(tune::Outer, &'a [u8]), Vec<(u32, &'a Point)>>;
        let mut counts: Counts = std::collections::HashMap::new();
        for x in &all {
            if let Some(r) = kept(&x.0) {
                counts.entry((tune::Outer { reshard: tune::Reshard::All, ..x.0 }, x.1.as_slice())).or_default().push((r, x));
            }
        }
        // (and, what the pass's stop takes, the tensor peak of more kept at most a unit's
        // params under that of fewer; time no longer with more kept — all and none included;
        // the saving where both counts' configurations with nothing checkpointed plan)
        let (mut pairs, mut savings) = (0, 0);
        for v in counts.values() {
            for &(r0, p) in v {
                for &(_, x) in v.iter().filter(|(r, _)| *r > r0) {
                    assert!(x.4 <= p.4 * (1.0 + 1e-9), "{name} {:?} -> {:?} {:?}: {} s keeping more, {} s keeping fewer", p.0.reshard, x.0, x.1, x.4, p.4);
                    assert!(x.2 + unit_bytes * u64::from(x.0.group) >= p.2, "{name} {:?} -> {:?} {:?}: peaks at {} B keeping more, {} keeping fewer", p.0.reshard, x.0, x.1, x.2, p.2);
                    pairs += 1;
                    let (Some(p00), Some(x00)) = (at(p.0, &none), at(x.0, &none)) else { continue };
                    assert!((p.4 - x.4) - (p00.4 - x00.4) <= SAVING_SLACK * p.4, "{name} {:?} -> {:?} {:?}: saves {} s checkpointed, {} s without", p.0.reshard, x.0, x.1, p.4 - x.4, p00.4 - x00.4);
                    savings += 1;
                }
            }
        }
        // (every pair of distinct counts compared — one unit: all but the last and none are
        // the same count — the saving for every pair whose counts plan with nothing
        // checkpointed, and every point keeping units in some pair)
        let distinct = |rs: &[u32]| -> usize { rs.iter().enumerate().map(|(i, a)| rs[i + 1..].iter().filter(|b| *b != a).count()).sum() };
        let all_pairs: usize = counts.values().map(|v| distinct(&v.iter().map(|(r, _)| *r).collect::<Vec<_>>())).sum();
        let all_savings: usize = counts.values().map(|v| distinct(&v.iter().filter(|(_, x)| at(x.0, &none).is_some()).map(|(r, _)| *r).collect::<Vec<_>>())).sum();
        let kept_points = all.iter().filter(|x| matches!(x.0.reshard, tune::Reshard::Keep(_))).count();
        let paired = counts.values().filter(|v| v.iter().any(|(r, _)| *r != v[0].0)).flat_map(|v| v.iter()).filter(|(_, x)| matches!(x.0.reshard, tune::Reshard::Keep(_))).count();
        assert!(kept_points > 0 && paired == kept_points && pairs == all_pairs && savings == all_savings && savings > 0, "{name}: {paired} of {kept_points} points keeping units paired, {pairs} of {all_pairs} pairs, {savings} of {all_savings} savings");
    }
    // the memory judged: the tensor peak (reserve 0) or the allocator model's need
    let mem = |x: &Point| if allocator { x.3 } else { x.2 };
    let (lo, hi) = (all.iter().map(mem).min().unwrap(), all.iter().map(mem).max().unwrap());
    // limits from below the least to above the most; with kept units also every limit at
    // which the fastest configuration keeping units that fits changes (the Pareto front of
    // memory against time of those keeping units: each of its points the best of them at its
    // own limit)
    let mut limits: Vec<u64> = (0..=8u64).map(|k| lo - (hi - lo) / 16 + k * (hi - lo) / 7).collect();
    if keep {
        limits.extend(pareto_limits(all.iter().filter(|x| matches!(x.0.reshard, tune::Reshard::Keep(_))).map(|x| (mem(x), x.4))));
    }
    if every_front {
        limits.extend(pareto_limits(all.iter().map(|x| (mem(x), x.4))).iter().flat_map(|&p| [p, p - 1]));
    }
    // (the kept-unit pass is within its tolerance of the best over every count; the rest exact,
    // and held to the 0.5%)
    let tolerance = if keep { tune::KEEP_TOLERANCE + SAVING_SLACK } else { 0.005 };
    let (mut checked, mut kept_best, mut proxied) = (0, 0, 0);
    // (brute force's point of a configuration tune evaluated)
    let point = |c: &Config| {
        // (counted from the back: the last `full` fully, the `sac` before them; the minor
        // units as `c.minor` says)
        let modes = tune::block_modes(&space, c);
        all.iter().find(|x| x.0 == c.outer && x.1 == modes).unwrap()
    };
    for bytes in limits {
        let limit = Limit { bytes, reserve: if allocator { None } else { Some(0) } };
        let tuned = tune::search(&m, &base, &h, &space, limit, 2, &|_, _, _| {});
        // the Pareto front `tune` prints (what ties with it to float rounding planned in
        // full) is the front of its evaluations as brute force planned them in full
        let mut settled = tuned.evaluated.clone();
        let (front, _) = tune::settled_pareto(&m, &base, &h, &space, limit, &mut settled);
        let exact: Vec<tune::Eval> = tuned
            .evaluated
            .iter()
            .map(|e| {
                let x = point(&e.config);
                tune::Eval { step_time_s: x.4, tokens_per_s_per_gpu: e.tokens_per_s_per_gpu * e.step_time_s / x.4, ..e.clone() }
            })
            .collect();
        let configs = |v: &[tune::Eval]| v.iter().map(|e| e.config).collect::<Vec<_>>();
        assert_eq!(configs(&front), configs(&tune::pareto(&exact)), "{name} limit {bytes}");
        // every configuration tune evaluated — planned from units, schedule preludes and cost
        // models it made once for many — is what planning it from scratch gives
        for e in &tuned.evaluated {
            let x = point(&e.config);
            // (timed from a plan of fewer micro-batches: to float rounding, `tune::SHORT_ACCUM`)
            if e.proxied {
                assert!(e.peak_bytes == x.2 && (e.step_time_s / x.4 - 1.0).abs() < 1e-9, "{name} {:?}: {} B, {} s vs {} B, {} s", e.config, e.peak_bytes, e.step_time_s, x.2, x.4);
                proxied += 1;
            } else {
                assert_eq!((e.peak_bytes, e.step_time_s), (x.2, x.4), "{name} {:?}", e.config);
            }
            match e.needed_bytes {
                Some(n) => assert!(!allocator || n == x.3, "{name} {:?}: needs {n} vs {}", e.config, x.3),
                None => assert!(mem(x) > limit.bytes, "{name} {:?}", e.config),
            }
        }
        let best_brute = all.iter().filter(|x| mem(x) <= limit.bytes).map(|x| x.4).fold(f64::INFINITY, f64::min);
        kept_best += all.iter().any(|x| mem(x) <= limit.bytes && x.4 == best_brute && matches!(x.0.reshard, tune::Reshard::Keep(_))) as usize;
        match &tuned.best {
            None => assert!(best_brute.is_infinite(), "{name} limit {}: brute force fits at {best_brute} s, tune found nothing", limit.bytes),
            Some(b) => {
                assert!(b.fits && b.needed_bytes.is_some_and(|n| n <= limit.bytes));
                MINOR_ANSWERS.fetch_add(usize::from(b.config.minor != 0), std::sync::atomic::Ordering::Relaxed);
                assert!(b.step_time_s <= best_brute * (1.0 + tolerance), "{name} limit {}: tune {} s ({:?}) vs brute force {best_brute} s ({:?})", limit.bytes, b.step_time_s, b.config, all.iter().find(|x| mem(x) <= limit.bytes && x.4 == best_brute).map(|x| (x.0, &x.1, x.2, x.3)));
                // what `plan` predicts for the emitted options is what tune reported
                let p = fsdp_planner::plan(&m, &tune::options(&base, &space, &b.config)).unwrap();
                let t = fsdp_planner::timeline::predict(&p, &m, &h);
                assert_eq!((p.memory.peak_bytes, t.step_time_s), (b.peak_bytes, b.step_time_s));
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "{name}: too few limits with an answer ({checked})");
    // (a space accumulating more than tune plans in full has some timed from fewer — without
    // CPU offload, whose configurations syncing each micro-batch, never timed from fewer,
    // answer the tiny models' lower limits and pass by the rest: `timeline::predict_longer`)
    let longest = space.batches.iter().map(|b| b.1).max().unwrap_or(1);
    assert!(proxied == 0 || longest > tune::REPLAY_ACCUM, "{name}: {proxied} evaluations from fewer micro-batches");
    if !space.offload.contains(&true) {
        assert_eq!(proxied > 0, longest > tune::REPLAY_ACCUM, "{name}: {proxied} evaluations from fewer micro-batches");
    }
    kept_best
}

#[test]
fn tune_equals_brute_force_on_a_4_block_llama() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let base = Options { seq: 64, param_dtype: bf16, reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    check("tiny-llama-4l", 4, 8, base.clone(), false);
    check("tiny-llama-4l", 4, 8, base, true);
}

/// torchtitan's [norm, head] unit in the space (`tune --norm-head-unit`): the root then holds
/// no params when the embeddings are a unit too. Under the allocator's need, where the norm's
/// placement shows (its allocation order; the tensor peaks alone: 24 s more of CI).
#[test]
fn tune_equals_brute_force_with_the_norm_in_the_heads_unit() {
    let base = Options { seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    check_edges("tiny-llama-4l", 4, 8, base, true, None, true, false, false, true);
}

/// A global batch of 16 micro-batches per rank (more than `tune::REPLAY_ACCUM`): timed from
/// plans of 6 (`tune::SHORT_ACCUM`), held to the allocator from plans of 12 where their
/// replay shows the longer one's — the same answers as brute force, which plans every
/// accumulation in full; with CPU offload in the space too (syncing each micro-batch
/// offloaded, whose CPU waits for the GPU, is always planned in full).
#[test]
fn tune_equals_brute_force_over_long_accumulations() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let base = Options { seq: 32, param_dtype: bf16, reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    check_without_offload("tiny-llama", 2, 32, base.clone(), false);
    check_without_offload("tiny-llama", 2, 32, base.clone(), true);
    check("tiny-llama", 2, 32, base, true);
}

/// A user's `--unit-groups` list is searched in full (no line search along it).
#[test]
fn tune_equals_brute_force_over_every_unit_group_a_user_lists() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let base = Options { seq: 64, param_dtype: bf16, reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    check_groups("tiny-llama-4l", 4, 8, base.clone(), false, Some(vec![1, 2, 4]), false);
    check_groups("tiny-llama-4l", 4, 8, base, true, Some(vec![1, 2, 4]), false);
}

/// The kept-unit counts: every count of units kept after forward from the end, beside all / all
/// but the last / none — within `tune::KEEP_TOLERANCE` of brute force over all of them.
#[test]
fn tune_with_every_count_of_kept_units_is_within_tolerance_of_brute_force() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let base = Options { seq: 64, param_dtype: bf16, reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    // (where the tensor peak is judged, keeping units is the best at some limits — 4 here; the
    // allocator model's 2 MiB rounding hides these tiny blocks' params: none there)
    let kept_best = check_kept("tiny-llama-4l", 4, 8, base.clone(), false);
    assert!(kept_best >= 2, "keeping units the best at {kept_best} limits");
    check_kept("tiny-llama-4l", 4, 8, base, true);
}

/// The kept-unit counts where they matter: a Llama of 8 tiny blocks on 8 ranks (the
/// embeddings and head units of their own: 10 units, 2 to 9 kept), against every count of
/// kept units with every split of the blocks into fully checkpointed, op-level SAC and none
/// from the front (the patterns tune searches, position-free as the 4-block tests hold), at
/// every limit where the fastest configuration keeping units changes (judged by the tensor
/// peak: the allocator's rounding hides tiny blocks' params).
#[test]
fn tune_over_kept_counts_of_8_blocks_is_within_tolerance_of_every_count() {
    let cfg = root().join("models/tiny-llama-4l.config.json");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 8");
    let m = fsdp_ir::hf::import_hf(&text, "tiny-llama-8l.config.json", "tiny-llama-8l").unwrap();
    let h = hw("h100-sxm");
    let base = Options { world_size: 8, seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    let mut space = tune::space(&m, &base, 8, 16, h.gpus_per_node).unwrap();
    space.keep = true;
    (space.groups, space.every_group, space.edges, space.offload) = (vec![1], true, vec![tune::Edges::Both], vec![false]);
    let l = space.blocks.len() as u32;
    assert_eq!(l, 8);
    let mut all: Vec<(Config, u64, f64)> = vec![];
    for o in tune::outers(&space).into_iter().chain(tune::keep_outers(&space)) {
        for full in 0..=l {
            for sac in 0..=l - full {
                let c = Config { outer: o, full, sac, back: false, minor: 0 };
                let Ok(plan) = fsdp_planner::plan_unchecked(&m, &tune::options(&base, &space, &c)) else { continue };
                let t = fsdp_planner::timeline::predict(&plan, &m, &h);
                all.push((c, plan.memory.peak_bytes, t.step_time_s));
            }
        }
    }
    let limits = pareto_limits(all.iter().filter(|x| matches!(x.0.outer.reshard, tune::Reshard::Keep(_))).map(|x| (x.1, x.2)));
    let mut kept_answers = 0;
    for &bytes in &limits {
        let limit = Limit { bytes, reserve: Some(0) };
        let best = all.iter().filter(|x| x.1 <= bytes).map(|x| x.2).fold(f64::INFINITY, f64::min);
        let tuned = tune::search(&m, &base, &h, &space, limit, 2, &|_, _, _| {});
        let b = tuned.best.unwrap();
        let x = all.iter().find(|x| x.0 == b.config).unwrap();
        assert!(x.1 <= bytes && x.2 == b.step_time_s, "{:?}", b.config);
        assert!(b.step_time_s <= best * (1.0 + tune::KEEP_TOLERANCE + SAVING_SLACK), "limit {bytes}: tune {} s ({:?}) vs every count {best} s", b.step_time_s, b.config);
        kept_answers += matches!(b.config.outer.reshard, tune::Reshard::Keep(_)) as usize;
    }
    assert!(limits.len() >= 20 && kept_answers >= 5, "{} limits, {kept_answers} answers keeping units", limits.len());
}

#[test]
fn tune_equals_brute_force_with_float8_linears() {
    // torchao's float8 linears (tensorwise, weights gathered as they are): op-level SAC keeps
    // the casts' abs and max besides every other GEMM's output
    let f8 = fsdp_planner::Float8 { recipe: fsdp_planner::Float8Recipe::Tensorwise, all_gather: false };
    let base = Options { seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), float8: Some(f8), ..Options::default() };
    check_kept("tiny-llama-wide", 2, 4, base.clone(), true);
    // torchtitan's float8 recipe: weights all-gathered in float8, its checkpoint wrapper
    let f8ag = fsdp_planner::Float8 { all_gather: true, ..f8 };
    check_kept("tiny-llama-wide", 2, 4, Options { float8: Some(f8ag), ac_wrapper: fsdp_planner::AcWrapper::Torchtitan, ..base.clone() }, true);
    // ... under --compile (the partitioner keeps no cast's abs)
    check_kept("tiny-llama-wide", 2, 4, Options { float8: Some(f8ag), ac_wrapper: fsdp_planner::AcWrapper::Torchtitan, compile: true, ..base }, true);
}

/// Where the planner refuses op-level SAC (float8 all-gather under HF's checkpointing), a
/// space that lists it anyway (`Space` is public) answers as the space without it (the
/// search leaves out SAC the options refuse: its walks and floors take SAC's configurations
/// as plannable) — at 25 limits each on three batch splits.
#[test]
fn a_space_listing_refused_sac_answers_as_one_without_it() {
    let f8ag = fsdp_planner::Float8 { recipe: fsdp_planner::Float8Recipe::Tensorwise, all_gather: true };
    let m = model("tiny-llama-wide");
    let h = hw("h100-sxm");
    let mut answers = 0;
    for (ws, gb) in [(2u64, 4u64), (2, 8), (4, 16)] {
        let base = Options { world_size: ws, seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), float8: Some(f8ag), ..Options::default() };
        let space = tune::space(&m, &base, ws, gb, h.gpus_per_node).unwrap();
        assert!(!space.sac, "the planner refuses SAC with float8 all-gather under HF's wrapper");
        let listed = tune::Space { sac: true, ..space.clone() };
        // limits from where only every block fully checkpointed fits to where nothing need be
        let l = space.blocks.len() as u32;
        let peaks: Vec<u64> = tune::outers(&space)
            .iter()
            .flat_map(|&outer| [0, l].map(|full| fsdp_planner::plan(&m, &tune::options(&base, &space, &Config { outer, full, sac: 0, back: false, minor: 0 })).map_or(0, |p| p.memory.peak_bytes)))
            .filter(|&p| p > 0)
            .collect();
        let (lo, hi) = (*peaks.iter().min().unwrap(), *peaks.iter().max().unwrap());
        for k in 0..=24u64 {
            let limit = Limit { bytes: lo + k * (hi - lo) / 24, reserve: Some(0) };
            let a = tune::search(&m, &base, &h, &space, limit, 2, &|_, _, _| {});
            let b = tune::search(&m, &base, &h, &listed, limit, 2, &|_, _, _| {});
            assert_eq!(a.best.as_ref().map(|e| (e.config, e.step_time_s)), b.best.as_ref().map(|e| (e.config, e.step_time_s)), "ws {ws} gb {gb} limit {}", limit.bytes);
            assert!(b.evaluated.iter().all(|e| e.config.sac == 0));
            answers += a.best.as_ref().is_some_and(|e| e.config.full > 0) as usize;
        }
    }
    assert!(answers >= 10, "{answers} limits where the answer checkpoints");
}

#[test]
fn tune_equals_brute_force_under_compile() {
    // torchtitan's --compile: what the blocks save is inductor's partitioner's (less than
    // eager's, and under op-level SAC only the cached outputs the backward reads)
    let base = Options { seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), compile: true, ac_wrapper: fsdp_planner::AcWrapper::Torchtitan, ..Options::default() };
    check_kept("tiny-llama-4l", 4, 8, base, true);
}

/// Blocks that are not alike — a dense block among MoE ones: Qwen3-MoE's `mlp_only_layers`
/// (the middle of 3), DeepSeek's `first_k_dense_replace` (the first of 3, latent attention,
/// a float32 router) — checkpoint differently, wherever they are: their choice is searched on
/// its own ([`tune::Space::minor_units`]), each with its own walk over the blocks alike. Brute
/// force over every assignment at every limit of its Pareto front (tensor peaks and the
/// allocator's need): before, tune counted from the front or the back only and answered up
/// to 4% slower (Qwen3-MoE: the middle block under SAC was faster than the first).
#[test]
fn tune_equals_brute_force_where_the_blocks_differ() {
    let base = Options { seq: 32, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    let before = MINOR_ANSWERS.load(std::sync::atomic::Ordering::Relaxed);
    for (name, minor) in [("tiny-qwen3-moe", 1u32), ("tiny-deepseek-v2", 0)] {
        let space = tune::space(&model(name), &Options { world_size: 2, ..base.clone() }, 2, 16, 8).unwrap();
        assert_eq!(space.minor_units(1), vec![minor], "{name}");
        for allocator in [false, true] {
            check_limits(name, 2, 16, base.clone(), allocator, None, false, true, true);
        }
    }
    let answers = MINOR_ANSWERS.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(answers >= 4, "{answers} answers checkpoint the minor units");
}

/// A configuration's blocks: the units alike counted (`full`, `sac`, from the front or the
/// back), the minor units by their base-3 digits — and the `--checkpoint` flags that say so.
#[test]
fn the_minor_units_checkpoint_by_their_digits() {
    let base = Options { world_size: 2, seq: 32, ..Options::default() };
    let space = tune::space(&model("tiny-qwen3-moe"), &base, 2, 4, 8).unwrap();
    assert_eq!((space.minor_units(1), space.minor_units(3)), (vec![1], vec![]), "the dense block 1 alone is unlike the rest; a unit of all three has nothing to compare");
    assert_eq!(space.minor_codes(1), vec![0, 1, 2]);
    let outer = tune::outers(&space)[0];
    let modes = |full, sac, back, minor| tune::block_modes(&space, &Config { outer, full, sac, back, minor });
    // blocks 0 and 2 are the units alike: the first full, the next (block 2) under SAC
    assert_eq!(modes(1, 1, false, 0), vec![1, 0, 2]);
    assert_eq!(modes(1, 1, true, 2), vec![2, 2, 1]);
    assert_eq!(modes(0, 0, false, 1), vec![0, 1, 0]);
    let flags = tune::flags(&space, &base, &Config { outer, full: 1, sac: 1, back: false, minor: 2 });
    let ck: Vec<&str> = flags.windows(2).filter(|w| w[0] == "--checkpoint").map(|w| w[1].as_str()).collect();
    assert_eq!(ck, ["model.layers.0=full", "model.layers.{1..2}=selective-op"]);
    // every block fully checkpointed: the least memory
    assert_eq!(tune::block_modes(&space, &Config::every_full(&space, outer)), vec![1, 1, 1]);
}

#[test]
fn tune_equals_brute_force_on_a_2_block_mixtral() {
    check_kept("tiny-mixtral", 2, 4, Options { seq: 32, ..Options::default() }, false);
}

/// MoE experts stacked on dim 0 over more ranks than experts: where the shard group outnumbers
/// them the space has them (and their router) sharded on dim 1 too (`--shard-dim`,
/// torchtitan's rule) — brute force over a tiny Mixtral's space at 8 ranks (4 experts: its
/// groups of 8 both ways, of 2 and 4 on dim 0 only); and on Mixtral-8x7B at 64 ranks, Shard(1)
/// is both the faster and the smaller for the same options.
#[test]
fn experts_outnumbered_by_the_shard_group_are_sharded_on_dim_1() {
    let (bf16, f32) = (fsdp_ir::DType::parse("bf16"), fsdp_ir::DType::parse("f32"));
    let base = Options { seq: 32, param_dtype: bf16, reduce_dtype: f32, ..Options::default() };
    check("tiny-mixtral", 8, 8, base, false);
    let m = model("tiny-mixtral");
    let space = tune::space(&m, &Options { world_size: 8, ..Options::default() }, 8, 8, 8).unwrap();
    let pats: Vec<&str> = space.short_dim0.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(pats, ["model.layers.*.mlp.gate.weight", "model.layers.*.mlp.experts.gate_up_proj", "model.layers.*.mlp.experts.down_proj"]);
    let outer = |shard| tune::outers(&space).into_iter().find(|o| o.shard == shard && !o.offload).map(|o| Outer { dim1: true, ..o }).unwrap();
    assert_eq!(tune::shard_dims(&space, &outer(8)).len(), 3);
    assert!(tune::shard_dims(&space, &outer(4)).is_empty());
    // (both ways where it applies, once elsewhere)
    assert!(tune::outers(&space).contains(&outer(8)) && tune::outers(&space).contains(&Outer { dim1: false, ..outer(8) }));
    assert!(!tune::outers(&space).contains(&outer(4)));
    let f = tune::flags(&space, &Options { world_size: 8, ..Options::default() }, &Config { outer: outer(8), full: 0, sac: 0, back: false, minor: 0 });
    assert!(f.windows(2).any(|w| w[0] == "--shard-dim" && w[1] == "model.layers.*.mlp.experts.gate_up_proj=1"), "{f:?}");
    // (real size: the experts Shard(0) over 64 ranks hold and gather 1/8 each)
    let m = model("mixtral-8x7b");
    let base = Options { world_size: 64, batch: 1, seq: 4096, param_dtype: bf16, reduce_dtype: f32, ..Options::default() };
    let dim1 = Options { shard_dims: vec![("model.layers.*.mlp.experts.*".into(), 1)], ..base.clone() };
    let (p0, p1) = (fsdp_planner::plan(&m, &base).unwrap(), fsdp_planner::plan(&m, &dim1).unwrap());
    let h = hw("h100-sxm");
    let (t0, t1) = (fsdp_planner::timeline::predict(&p0, &m, &h).step_time_s, fsdp_planner::timeline::predict(&p1, &m, &h).step_time_s);
    assert!(t1 < t0 / 3.0 && p1.memory.peak_bytes < p0.memory.peak_bytes, "{t1} vs {t0}, {} vs {}", p1.memory.peak_bytes, p0.memory.peak_bytes);
}

#[test]
fn an_evaluator_shares_schedule_preludes_only_between_configurations_that_agree() {
    // tune's evaluator makes a schedule prelude once per micro-batch, units and checkpointing
    // or not, and plans every configuration of every outer point that reads the same from it:
    // on Phi-3 (its fused QKV keeps HF's cache only with nothing checkpointed), checkpointed
    // configurations and ones with nothing checkpointed taken in turn across outer points
    // are each what planning it from scratch gives
    let m = model("tiny-phi3");
    let h = hw("h100-sxm");
    let base = Options { world_size: 4, seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    let space = tune::space(&m, &base, 4, 8, h.gpus_per_node).unwrap();
    let limit = Limit { bytes: u64::MAX / 4, reserve: Some(0) };
    let mut ev = tune::Evaluator::new(&m, &base, &h, &space, limit);
    let mut compared = 0;
    for o in tune::outers(&space) {
        for (full, sac) in [(1, 0), (0, 0), (0, 1)] {
            let c = Config { outer: o, full, sac, back: false, minor: 0 };
            let Some(e) = ev.eval(c) else { continue };
            let p = fsdp_planner::plan_unchecked(&m, &tune::options(&base, &space, &c)).unwrap();
            let t = fsdp_planner::timeline::predict(&p, &m, &h);
            assert_eq!((e.peak_bytes, e.step_time_s), (p.memory.peak_bytes, t.step_time_s), "{c:?}");
            compared += 1;
        }
    }
    assert!(compared > 20, "{compared}");
}

#[test]
fn edge_units_are_searched_only_where_the_head_is_its_own() {
    let space = |name: &str| tune::space(&model(name), &Options { world_size: 2, seq: 32, ..Options::default() }, 2, 2, 8).unwrap();
    // (and the final norm in the head's unit, as torchtitan wraps it)
    assert_eq!(space("tiny-llama-4l").edge_policy, Some(vec!["model.embed_tokens".to_string(), "model.layers.*".to_string(), "lm_head".to_string(), "model.norm+lm_head".to_string()]));
    assert_eq!(space("tiny-llama-4l").edges, [tune::Edges::Root, tune::Edges::Both]);
    assert_eq!(space("tiny-llama-tied").edge_policy, None);
    // the share of the params in them (what makes `tune` search every edge choice by
    // default): Llama-3-8B's embeddings and head are 2 × 128,256 × 4,096 of its
    // 8,030,261,248 params (the count on its HF model card); a tied head has none of its own
    let share = tune::edge_share(&model("llama-3-8b"));
    assert!((share - 2.0 * 128_256.0 * 4_096.0 / 8_030_261_248.0).abs() < 1e-12, "{share}");
    assert!(share < tune::EDGE_SEARCH_SHARE);
    assert_eq!(tune::edge_share(&model("tiny-llama-tied")), 0.0);
}

#[test]
fn plans_from_prepared_units_equal_plans_from_scratch() {
    // tune prepares the units once per `tune::units_key` (`prepare`: shared by the outer
    // points that differ only in the micro-batch, accumulation, prefetch, offload and sync)
    // and plans each configuration from them (`plan_prepared`): the plans must be those
    // `plan_unchecked` makes (with `--compile` too, on Phi-3, whose fused-QKV attention keeps
    // HF's cache only with nothing checkpointed; CPU offload in the space)
    let plain = Options { world_size: 4, seq: 64, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), master_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    let mut compared = 0;
    for (name, compile) in [("tiny-llama-4l", false), ("tiny-llama-4l", true), ("tiny-phi3", false)] {
        let m = model(name);
        let base = Options { compile, ..plain.clone() };
        let mut space = tune::space(&m, &base, 4, 8, 8).unwrap();
        space.groups = vec![1, 2];
        space.edges = space.edge_policy.as_deref().map_or(vec![tune::Edges::Root], tune::Edges::all);
        assert_eq!(space.offload, [false, true], "{name}");
        let mut preps: std::collections::HashMap<Outer, fsdp_planner::Prepared> = std::collections::HashMap::new();
        for o in tune::outers(&space) {
            // (the first outer point of its key prepares them)
            let prep = preps.entry(tune::units_key(o)).or_insert_with(|| fsdp_planner::prepare(&m, &tune::options(&base, &space, &Config { outer: o, full: 0, sac: 0, back: false, minor: 0 })).unwrap());
            let prep = &*prep;
            for (full, sac) in [(1, 2), (0, 0), (2, 2), (4, 0), (0, 3)] {
                let opts = tune::options(&base, &space, &Config { outer: o, full, sac, back: false, minor: 0 });
                let (a, b) = (fsdp_planner::plan_prepared(&m, &opts, prep), fsdp_planner::plan_unchecked(&m, &opts));
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap(), "{o:?} {full} {sac}");
                        compared += 1;
                    }
                    (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                    (a, b) => panic!("{o:?} {full} {sac}: {:?} vs {:?}", a.err(), b.err()),
                }
            }
        }
    }
    assert!(compared > 150, "{compared}");
}

/// `tune::resident_floor` (what stays on the device at the optimizer step: the search leaves
/// out the shard groups where it alone is over the limit) is at or below the tensor peak of
/// every plan, at every shard group, checkpointed or not, in fp32 and bf16 with f32 masters,
/// with AdamW, SGD or no optimizer, with frozen params.
#[test]
fn the_resident_floor_is_under_every_plans_peak() {
    let (mut checked, mut tightest) = (0, 0.0f64);
    for name in ["tiny-llama-4l", "tiny-llama-tied", "tiny-llama-partial", "tiny-gpt2", "tiny-deepseek-v2"] {
        let m = model(name);
        for mixed in [false, true] {
            for optimizer in [fsdp_planner::options::Optimizer::AdamW, fsdp_planner::options::Optimizer::Sgd, fsdp_planner::options::Optimizer::None] {
                let dt = |s: &str| fsdp_ir::DType::parse(s);
                let base = if mixed { Options { param_dtype: dt("bf16"), reduce_dtype: dt("f32"), master_dtype: dt("f32"), ..Options::default() } } else { Options::default() };
                let base = Options { world_size: 8, seq: 64, optimizer, device: fsdp_planner::options::Device::Cuda, ..base };
                let space = tune::space(&m, &base, 8, 8, 8).unwrap();
                for o in tune::outers(&space).into_iter().filter(|o| !o.offload && o.prefetch == 0 && o.group == 1) {
                    let l = space.blocks.len() as u32;
                    for (full, sac) in [(0, 0), (l, 0), (0, l)] {
                        let Ok(plan) = fsdp_planner::plan_unchecked(&m, &tune::options(&base, &space, &Config::new(o, full, sac, false, l, 0))) else { continue };
                        let floor = tune::resident_floor(&m, &base, o.shard);
                        assert!(floor > 0 && floor <= plan.memory.peak_bytes, "{name} {o:?} {full} {sac}: floor {floor} over the peak {}", plan.memory.peak_bytes);
                        tightest = tightest.max(floor as f64 / plan.memory.peak_bytes as f64);
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 100, "{checked}");
    // (and not far under every one: 72% of the 4-block Llama's peak, mixed precision on two
    // ranks, every block checkpointed)
    assert!(tightest > 0.7, "{tightest}");
}

/// CPU offload fits only where the node's host holds every rank's share of it: at a limit
/// where the fastest configuration is offloaded (the 4-block Llama on 4 ranks, 700 KiB),
/// a host one byte short of the node's 4 ranks' share answers as the search without offload
/// in its space; a host of exactly that share, as the search with it.
#[test]
fn offload_fits_only_where_the_nodes_host_holds_every_ranks_share() {
    let m = model("tiny-llama-4l");
    let bf16 = fsdp_ir::DType::parse("bf16");
    let base = Options { world_size: 4, seq: 64, param_dtype: bf16, reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    let h = hw("h100-sxm");
    let space = tune::space(&m, &base, 4, 8, h.gpus_per_node).unwrap();
    let limit = tune::Limit { bytes: 700 << 10, reserve: Some(0) };
    let answer = |h: &Hardware, space: &tune::Space| tune::search(&m, &base, h, space, limit, 2, &|_, _, _| {}).best.map(|e| (e.config, e.host_bytes));
    let (offloaded, host) = answer(&h, &space).expect("an answer at 700 KiB");
    assert!(offloaded.outer.offload, "{offloaded:?}");
    let share = 4 * host.unwrap();
    let without = answer(&h, &tune::Space { offload: vec![false], ..space.clone() }).map(|a| a.0);
    assert!(without.is_some_and(|c| c != offloaded), "{without:?}");
    let with_host = |bytes: u64| {
        let mut h = h.clone();
        h.host.as_mut().unwrap().memory_bytes = Some(bytes);
        answer(&h, &space).map(|a| a.0)
    };
    assert_eq!(with_host(share - 1), without);
    assert_eq!(with_host(share), Some(offloaded));
}

/// The fastest of `all` (options, tensor peak, step time) within each limit against tune's
/// answer: the limits are the enumeration's Pareto front (each point's peak: none cheaper
/// is faster) and a byte below the least peak. The limits where tune's answer is more than
/// 0.5% slower than the enumeration's (or where either finds nothing the other finds), and
/// the front.
fn beaten(m: &fsdp_ir::Model, base: &Options, h: &Hardware, space: &tune::Space, all: &mut [(Options, u64, f64)]) -> (Vec<String>, Vec<Options>) {
    all.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)));
    let mut front: Vec<&(Options, u64, f64)> = vec![];
    for x in all.iter() {
        if front.last().is_none_or(|f| x.2 < f.2) {
            front.push(x);
        }
    }
    let mut limits: Vec<u64> = front.iter().map(|f| f.1).collect();
    limits.push(all[0].1 - 1);
    let mut out = vec![];
    for bytes in limits {
        let best = all.iter().filter(|x| x.1 <= bytes).min_by(|a, b| a.2.total_cmp(&b.2));
        let tuned = tune::search(m, base, h, space, Limit { bytes, reserve: Some(0) }, 2, &|_, _, _| {});
        match (&tuned.best, best) {
            (None, None) => {}
            (None, Some(x)) => out.push(format!("limit {bytes}: {:?} fits at {} s, tune found nothing", x.0, x.2)),
            (Some(b), None) => out.push(format!("limit {bytes}: tune's {:?} fits, no enumerated configuration does", b.config)),
            (Some(b), Some(x)) if b.step_time_s > x.2 * 1.005 => out.push(format!("limit {bytes}: tune {} s ({:?}) vs {} s ({:?})", b.step_time_s, b.config, x.2, x.0)),
            _ => {}
        }
    }
    (out, front.into_iter().map(|x| x.0.clone()).collect())
}

/// Every combination of `plan` options written out by hand for 2 blocks on 4 ranks (see
/// [`tune_equals_an_independent_enumeration_of_plan_options`]) at `base`'s seq, with the
/// given policies (and the root's reshard_after_forward true or false where `root`): (the
/// options, the tensor peak, the step time) of those that plan.
fn enumerate(m: &fsdp_ir::Model, base: &Options, h: &Hardware, blocks: &[String], policies: &[fsdp_planner::Policy], root: bool) -> Vec<(Options, u64, f64)> {
    use fsdp_planner::{BackwardPrefetch, GradSync, Offload, Strategy};
    let mut all = vec![];
    let roots: &[Option<bool>] = if root { &[Some(false), Some(true)] } else { &[None] };
    for strategy in [Strategy::FullShard, Strategy::HybridShard { shard_size: 2 }] {
        for (batch, accum, sync) in [(2u64, 1u32, GradSync::Last), (1, 2, GradSync::Last), (1, 2, GradSync::Each)] {
            for (fwd, bwd) in [(0u32, BackwardPrefetch::Implicit), (1, BackwardPrefetch::Depth(2))] {
                for reshard in 0..5 {
                    for &root in roots {
                        for group in [1u32, 2] {
                            for policy in policies {
                                for offload in [Offload::None, Offload::Cpu] {
                                    for modes in 0..9usize {
                                        let checkpoint: Vec<String> = blocks
                                            .iter()
                                            .enumerate()
                                            .filter_map(|(i, b)| match (modes / 3usize.pow(i as u32)) % 3 {
                                                1 => Some(format!("{b}=full")),
                                                2 => Some(format!("{b}=selective-op")),
                                                _ => None,
                                            })
                                            .collect();
                                        let o = Options {
                                            strategy,
                                            batch,
                                            grad_accum: accum,
                                            grad_sync: sync,
                                            forward_prefetch: fwd,
                                            backward_prefetch: bwd,
                                            reshard_after_forward: Some(reshard != 2),
                                            reshard_to: (reshard >= 3).then_some(2),
                                            unit_reshard: if reshard == 1 || reshard == 4 { vec![("last".into(), false)] } else { vec![] },
                                            root_reshard_after_forward: root,
                                            unit_group: group,
                                            policy: policy.clone(),
                                            offload,
                                            checkpoint,
                                            ..base.clone()
                                        };
                                        let Ok(p) = fsdp_planner::plan(m, &o) else { continue };
                                        all.push((o, p.memory.peak_bytes, fsdp_planner::timeline::predict(&p, m, h).step_time_s));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    all
}

/// An oracle that shares nothing with tune's enumeration: `plan` options written out by hand
/// (not [`tune::outers`], [`tune::options`]) for a 2-block Llama-3.2-1B (untied head) on 4
/// H100s two to a node, global batch 8 at seq 512 and 2048 — FSDP or HSDP 2 × 2; micro-batch
/// 2 × 1 or 1 × 2, the latter syncing in the last or in each micro-batch; implicit or
/// explicit (1, 2) prefetch; the blocks resharding all / all but the last / none / to the
/// node (int 2) / to the node but the last; the root's reshard_after_forward false or true
/// (which tune leaves out as never better); one or two blocks per unit; the embeddings and
/// head the root's, or either or both units of their own; CPU offload or not; each block none / full / op-SAC
/// in any order — every combination `plan` accepts. At every limit where the enumeration's
/// fastest changes, tune's answer (with `--separate-edge-units`) is the fastest within 0.5%;
/// without the embeddings or the head alone a unit of its own it is not; and without counting
/// checkpointing from the back ([`tune::Config::back`]) it is not: at seq 2048, the first
/// block under SAC and the last fully checkpointed is 0.9% faster than the reverse (the
/// last block's recompute hidden behind the first's all-gather across nodes, prefetched).
#[test]
fn tune_equals_an_independent_enumeration_of_plan_options() {
    use fsdp_planner::{GradSync, Offload, Policy};
    let cfg = std::fs::read_to_string(root().join("models/llama-1b.config.json")).unwrap();
    let cfg = cfg.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 2").replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    assert!(cfg.contains("\"num_hidden_layers\": 2") && cfg.contains("\"tie_word_embeddings\": false"));
    let m = fsdp_ir::hf::import_hf(&cfg, "llama-1b-2l.config.json", "llama-1b-2l").unwrap();
    // (two to a node: HSDP's groups and resharding to the node gather within a node)
    let h = Hardware { gpus_per_node: 2, ..hw("h100-sxm") };
    let (bf16, f32) = (fsdp_ir::DType::parse("bf16"), fsdp_ir::DType::parse("f32"));
    let blocks = ["model.layers.0".to_string(), "model.layers.1".to_string()];
    // (the embeddings and the head: the root's, either a unit of its own, or both; the final
    // norm the root's or in the head's unit, `model.norm+lm_head`, which tune searches)
    let (embed, layers, head, norm_head) = ("model.embed_tokens".to_string(), "model.layers.*".to_string(), "lm_head".to_string(), "model.norm+lm_head".to_string());
    let policies = [
        Policy::Auto,
        Policy::Modules(vec![embed.clone(), layers.clone()]),
        Policy::Modules(vec![layers.clone(), head.clone()]),
        Policy::Modules(vec![layers.clone(), norm_head.clone()]),
        Policy::Modules(vec![embed.clone(), layers.clone(), head]),
        Policy::Modules(vec![embed, layers, norm_head]),
    ];
    let mut fronts: Vec<Options> = vec![];
    for seq in [512, 2048] {
        let base = Options { world_size: 4, seq, param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, optimizer: fsdp_planner::Optimizer::AdamW, ..Options::default() };
        let mut all = enumerate(&m, &base, &h, &blocks, &policies, true);
        // (every dimension plans somewhere)
        assert!(all.len() > 2000, "{} configurations plan", all.len());
        let mut space = tune::space(&m, &base, 4, 8, 2).unwrap();
        assert_eq!((space.node, space.shards.as_slice(), space.edges.as_slice(), space.offload.as_slice(), space.sync.as_slice()), (2, &[2, 4][..], &[tune::Edges::Root, tune::Edges::Both][..], &[false, true][..], &[false, true][..]));
        // (either alone too: `tune --separate-edge-units`)
        space.edges = tune::Edges::all(space.edge_policy.as_deref().unwrap());
        assert_eq!(space.edges.len(), 6);
        assert!(space.reshard.contains(&tune::Reshard::ToNode) && space.reshard.contains(&tune::Reshard::ToNodeButLast) && space.from_back);
        let (beat, front) = beaten(&m, &base, &h, &space, &mut all);
        assert!(beat.is_empty(), "seq {seq}:\n{}", beat.join("\n"));
        fronts.extend(front);
        space.from_back = false;
        let (beat, _) = beaten(&m, &base, &h, &space, &mut all);
        assert_eq!(beat.is_empty(), seq != 2048, "seq {seq}: {beat:?}");
        // (and without the embeddings or the head alone a unit of its own: up to 1.3% slower)
        (space.from_back, space.edges) = (true, vec![tune::Edges::Root, tune::Edges::Both, tune::Edges::EmbeddingsNormHead]);
        let (beat, _) = beaten(&m, &base, &h, &space, &mut all);
        assert!(!beat.is_empty(), "seq {seq}");
    }
    // (the fronts reach offload, syncing each micro-batch, resharding to the node and
    // checkpointing the last block only)
    assert!(fronts.iter().any(|o| o.offload == Offload::Cpu), "{fronts:?}");
    assert!(fronts.iter().any(|o| o.grad_sync == GradSync::Each), "{fronts:?}");
    assert!(fronts.iter().any(|o| o.reshard_to.is_some()), "{fronts:?}");
    assert!(fronts.iter().any(|o| o.checkpoint == ["model.layers.1=full"]), "{fronts:?}");
    assert!(fronts.iter().any(|o| matches!(&o.policy, Policy::Modules(p) if p.len() == 2)), "{fronts:?}");
}

/// Where communication across nodes is exposed, the blocks' position matters (the last
/// block's recompute can hide behind an all-gather in flight): a 4-block Llama-3.2-1B on 4
/// H100s two to a node at seq 1024, every assignment of {none, full, op-SAC} to the 4 blocks
/// at every outer point of a space cut to FSDP, micro-batch 2, a block per unit, the
/// embeddings and head their own units (both prefetch modes, the 5 reshard choices), tune's
/// answer within 0.5% of the fastest at every limit of their Pareto front.
#[test]
fn tune_equals_brute_force_where_the_blocks_position_matters() {
    let cfg = std::fs::read_to_string(root().join("models/llama-1b.config.json")).unwrap();
    let cfg = cfg.replace("\"num_hidden_layers\": 16", "\"num_hidden_layers\": 4").replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    let m = fsdp_ir::hf::import_hf(&cfg, "llama-1b-4l.config.json", "llama-1b-4l").unwrap();
    let h = Hardware { gpus_per_node: 2, ..hw("h100-sxm") };
    let base = Options { world_size: 4, seq: 1024, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
    let mut space = tune::space(&m, &base, 4, 8, 2).unwrap();
    (space.shards, space.batches, space.groups, space.edges, space.offload, space.keep) = (vec![4], vec![(2, 1)], vec![1], vec![tune::Edges::Both], vec![false], false);
    assert_eq!(space.blocks.len(), 4);
    assert!(space.reshard.contains(&tune::Reshard::ToNodeButLast));
    let all = brute(&m, &base, &h, &space);
    assert_eq!(all.len(), 10 * 81);
    let limits = pareto_limits(all.iter().map(|x| (x.2, x.4)));
    let (mut back, mut front_only_beaten) = (0, 0);
    for &bytes in &limits {
        let best = all.iter().filter(|x| x.2 <= bytes).map(|x| x.4).fold(f64::INFINITY, f64::min);
        let limit = Limit { bytes, reserve: Some(0) };
        let b = tune::search(&m, &base, &h, &space, limit, 2, &|_, _, _| {}).best.unwrap();
        assert!(b.step_time_s <= best * 1.005, "limit {bytes}: tune {} s ({:?}) vs brute force {best} s", b.step_time_s, b.config);
        back += b.config.back as usize;
        // (counted from the front only, the search misses some)
        let front = tune::search(&m, &base, &h, &tune::Space { from_back: false, ..space.clone() }, limit, 2, &|_, _, _| {}).best.unwrap();
        front_only_beaten += (front.step_time_s > best * 1.005) as usize;
    }
    // (measured: 13 limits, 11 answers from the back, 2 found by the front too)
    assert!(limits.len() >= 10 && back >= limits.len() / 2 && front_only_beaten > 0, "{} limits, {back} answers from the back, {front_only_beaten} missed from the front", limits.len());
}

/// [`tune_equals_an_independent_enumeration_of_plan_options`] on other families, 2 blocks
/// each on 4 H100s two to a node: GPT-2 XL at seq 512 (at the least memory CPU offload
/// syncing each micro-batch; syncing the last only, only CPU offload under HSDP 2 × 2 fits
/// there: by 2 KiB less than under FSDP) and Mixtral-8x7B (MoE) at seq 2048.
/// (Measured besides, not kept as tests: Qwen3-30B-A3B, DeepSeek-V2-Lite, Phi-3-mini,
/// OLMo-2-7B, Llama-3-8B, Qwen2-7B at seq 512 and 2048, Gemma-2-9B, and one node of 8: the
/// same.)
#[test]
fn tune_equals_an_independent_enumeration_on_other_families() {
    let h = Hardware { gpus_per_node: 2, ..hw("h100-sxm") };
    let (bf16, f32) = (fsdp_ir::DType::parse("bf16"), fsdp_ir::DType::parse("f32"));
    for (name, seq) in [("gpt2-xl", 512), ("mixtral-8x7b", 2048)] {
        let cfg = std::fs::read_to_string(root().join(format!("models/{name}.config.json"))).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&cfg).unwrap();
        let layers = ["num_hidden_layers", "n_layer"].into_iter().find(|k| v.get(k).is_some()).unwrap();
        v[layers] = 2.into();
        let m = fsdp_ir::hf::import_hf(&v.to_string(), &format!("{name}-2l.config.json"), name).unwrap();
        let base = Options { world_size: 4, seq, param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, optimizer: fsdp_planner::Optimizer::AdamW, ..Options::default() };
        let mut space = tune::space(&m, &base, 4, 8, 2).unwrap();
        assert_eq!(space.blocks.len(), 2, "{name}");
        let mut policies = vec![fsdp_planner::Policy::Auto];
        policies.extend(space.edge_policy.as_deref().and_then(|p| tune::Edges::Both.policy(p)).map(fsdp_planner::Policy::Modules));
        let mut all = enumerate(&m, &base, &h, &space.blocks.clone(), &policies, false);
        assert!(all.len() > 700, "{name}: {} configurations plan", all.len());
        let (beat, front) = beaten(&m, &base, &h, &space, &mut all);
        assert!(beat.is_empty(), "{name}:\n{}", beat.join("\n"));
        if name == "gpt2-xl" {
            // the least memory: CPU offload syncing each micro-batch (no unsharded grads kept
            // from one micro-batch to the next on the device)
            let offload_each = |o: &Options| o.offload == fsdp_planner::Offload::Cpu && o.grad_sync == fsdp_planner::GradSync::Each;
            assert!(offload_each(&front[0]), "{:?}", front[0]);
            // syncing the last micro-batch only, there only CPU offload under HSDP fits
            space.sync = vec![false];
            let mut last: Vec<(Options, u64, f64)> = all.iter().filter(|x| x.0.grad_sync == fsdp_planner::GradSync::Last).cloned().collect();
            let (beat, front) = beaten(&m, &base, &h, &space, &mut last);
            assert!(beat.is_empty(), "{name}:\n{}", beat.join("\n"));
            let hsdp_offload = |o: &Options| o.offload == fsdp_planner::Offload::Cpu && o.strategy != fsdp_planner::Strategy::FullShard;
            assert!(hsdp_offload(&front[0]), "{:?}", front[0]);
            // (searching FSDP only, tune finds nothing there)
            space.shards = vec![4];
            let (beat, _) = beaten(&m, &base, &h, &space, &mut last);
            assert!(!beat.is_empty());
        }
    }
}

/// The floor by which tune passes offloaded shard groups (`cost::host_step_floor_s`) is one:
/// Llama-3-8B on 8 H100s offloaded, under FSDP and HSDP 4 × 2, its plan's host optimizer
/// steps sum to no less (and within 1%: the padding of each rank's shard) and the step is
/// longer.
#[test]
fn the_host_step_floor_is_below_every_offloaded_step() {
    let m = model("llama-3-8b");
    let h = hw("h100-sxm");
    let trainable: u64 = m.params.iter().filter(|p| p.requires_grad && p.tied_to.is_none()).map(|p| p.numel()).sum();
    for strategy in [fsdp_planner::Strategy::FullShard, fsdp_planner::Strategy::HybridShard { shard_size: 4 }] {
        let o = Options { world_size: 8, batch: 1, seq: 1024, strategy, offload: fsdp_planner::Offload::Cpu, param_dtype: fsdp_ir::DType::parse("bf16"), reduce_dtype: fsdp_ir::DType::parse("f32"), ..Options::default() };
        let plan = fsdp_planner::plan(&m, &o).unwrap();
        let step = fsdp_planner::timeline::predict(&plan, &m, &h).step_time_s;
        let host: f64 = plan.units.iter().map(|u| fsdp_planner::cost::host_optimizer_s(&h, u, &plan.options).unwrap()).sum();
        let floor = fsdp_planner::cost::host_step_floor_s(&h, &o, trainable, o.shard_size());
        assert!(floor > 0.0 && floor <= host && host <= floor * 1.01 && host < step, "{strategy:?}: floor {floor} s, host steps {host} s, step {step} s");
    }
}

