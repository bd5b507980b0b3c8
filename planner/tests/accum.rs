//! Planning a long gradient accumulation from a short one (`tune`'s plans of many
//! micro-batches): the schedule builder's steady state (`Plan::steady`) and what the plan of
//! `n` micro-batches is then — the plan of `k` with micro-batch `k − 2` repeated — held
//! against the plans of `n` themselves: their schedules and buffers, tensor peak, step time
//! (`timeline::predict_longer`) and the caching allocator's replay.

use fsdp_planner::hardware::Hardware;
use fsdp_planner::plan::{BufferInfo, Event, Plan, ScheduleOp};
use fsdp_planner::Options;
use fsdp_planner::ids::{BufferId, OpId};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn model(name: &str) -> fsdp_ir::Model {
    let p = root().join(format!("models/{name}.ron"));
    fsdp_ir::parse_model(&std::fs::read_to_string(&p).unwrap(), name).unwrap()
}

fn hw(name: &str) -> Hardware {
    ron::from_str(&std::fs::read_to_string(root().join(format!("models/hardware/{name}.ron"))).unwrap()).unwrap()
}

/// The schedule and buffers of `n` micro-batches as `Plan::steady` says they are: `p`'s
/// (of k) with micro-batch k − 2 repeated n − k times, each copy's ops and buffers — and what
/// they name from micro-batch 1 on — as many later as the copy before's, and the last
/// micro-batch and the optimizer as many later as all the copies. (Written here from the
/// claim, independently of the planner's code.)
fn expand(p: &Plan, n: u32) -> (Vec<ScheduleOp>, Vec<BufferInfo>) {
    let k = p.options.grad_accum;
    let op_start = |m: u32| p.schedule.iter().position(|o| o.micro_batch == m).unwrap();
    let buf_start = |m: u32| p.buffers.iter().position(|b| p.schedule[b.alloc.index()].micro_batch >= m && !(b.alloc.index() == 0 && m > 0)).unwrap();
    let (fo, fb) = (op_start(1), buf_start(1));
    let (t, l) = (op_start(k - 2), op_start(k - 1));
    let (bt, bl) = (buf_start(k - 2), buf_start(k - 1));
    let (wo, wb) = (l - t, bl - bt);
    let mo = |x: OpId, c: usize| if x.index() >= fo { OpId::new(x.index() + c * wo) } else { x };
    let mb = |x: BufferId, c: usize| if x.index() >= fb { BufferId::new(x.index() + c * wb) } else { x };
    let op = |o: &ScheduleOp, c: usize| ScheduleOp {
        id: mo(o.id, c),
        micro_batch: o.micro_batch + c as u32,
        deps: o.deps.iter().map(|&d| mo(d, c)).collect(),
        events: o
            .events
            .iter()
            .map(|e| match *e {
                Event::Alloc(b) => Event::Alloc(mb(b, c)),
                Event::Free(b) => Event::Free(mb(b, c)),
            })
            .collect(),
        ..o.clone()
    };
    let buf = |b: &BufferInfo, c: usize| BufferInfo { id: mb(b.id, c), alloc: mo(b.alloc, c), continues: b.continues.iter().map(|&x| mb(x, c)).collect(), ..b.clone() };
    let extra = (n - k) as usize;
    let mut ops: Vec<ScheduleOp> = p.schedule[..l].to_vec();
    let mut bufs: Vec<BufferInfo> = p.buffers[..bl].to_vec();
    for c in 1..=extra {
        ops.extend(p.schedule[t..l].iter().map(|o| op(o, c)));
        bufs.extend(p.buffers[bt..bl].iter().map(|b| buf(b, c)));
    }
    ops.extend(p.schedule[l..].iter().map(|o| op(o, extra)));
    bufs.extend(p.buffers[bl..].iter().map(|b| buf(b, extra)));
    // (where each buffer is freed: its Free event's op)
    for b in &mut bufs {
        b.free = None;
    }
    for o in &ops {
        for e in &o.events {
            if let Event::Free(b) = *e {
                bufs[b.index()].free = Some(o.id);
            }
        }
    }
    (ops, bufs)
}

fn cases() -> Vec<(&'static str, &'static str, Options)> {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    let mp = Options { param_dtype: bf16, reduce_dtype: f32, master_dtype: f32, ..Options::default() };
    vec![
        ("llama-3-8b", "h100-sxm", Options { world_size: 8, batch: 1, seq: 4096, ..mp.clone() }),
        ("llama-2-7b", "h100-96gb-500w", Options { world_size: 8, batch: 2, seq: 2048, checkpoint: vec!["LlamaDecoderLayer".into()], layout: fsdp_planner::Layout::Flat, backward_prefetch: fsdp_planner::BackwardPrefetch::Pre, ..mp.clone() }),
        ("llama-3.1-8b", "h100-sxm", Options { world_size: 16, batch: 1, seq: 8192, checkpoint: vec!["model.layers.{0..15}=full".into(), "model.layers.{16..31}=selective-op".into()], unit_reshard: vec![("last".into(), false)], expandable_segments: true, ..mp.clone() }),
        ("llama-3-8b", "h100-sxm", Options { world_size: 16, batch: 2, seq: 4096, checkpoint: vec!["LlamaDecoderLayer".into()], strategy: fsdp_planner::Strategy::HybridShard { shard_size: 8 }, ..mp.clone() }),
        ("llama-3-8b", "h100-sxm", Options { world_size: 8, batch: 1, seq: 2048, device: fsdp_planner::Device::Cuda, offload: fsdp_planner::Offload::Cpu, checkpoint: vec!["LlamaDecoderLayer".into()], ..mp.clone() }),
        ("tiny-llama", "h100-sxm", Options { world_size: 2, batch: 2, seq: 32, ..Options::default() }),
        ("tiny-llama", "cpu", Options { world_size: 2, batch: 2, seq: 32, device: fsdp_planner::Device::Cpu, ..Options::default() }),
        ("tiny-mixtral", "a100-80gb", Options { world_size: 2, batch: 2, seq: 32, ..mp.clone() }),
        // (every micro-batch reduce-scattered, added into the sharded grads: f32 masters, and
        // bf16 ones under HSDP, each reduction cast, the all-reduce's input held)
        ("llama-3-8b", "h100-sxm", Options { world_size: 8, batch: 2, seq: 4096, checkpoint: vec!["LlamaDecoderLayer".into()], grad_sync: fsdp_planner::GradSync::Each, ..mp.clone() }),
        ("tiny-llama", "h100-sxm", Options { world_size: 4, batch: 2, seq: 32, strategy: fsdp_planner::Strategy::HybridShard { shard_size: 2 }, grad_sync: fsdp_planner::GradSync::Each, master_dtype: bf16, ..mp.clone() }),
        // (the allocator's state in its second step repeats every five micro-batches)
        ("llama-3-8b", "h100-sxm", Options { world_size: 8, batch: 2, seq: 4096, checkpoint: vec!["model.layers.{0..11}=full".into(), "model.layers.{12..31}=selective-op".into()], reshard_after_forward: Some(false), policy: fsdp_planner::Policy::parse("modules:model.embed_tokens,model.layers.*,lm_head").unwrap(), forward_prefetch: 1, backward_prefetch: fsdp_planner::BackwardPrefetch::Depth(2), ..mp.clone() }),
    ]
}

/// The plans of 6 micro-batches of eleven configurations (FSDP2 and FSDP1, HSDP, CPU offload,
/// full and op-level checkpointing, kept units, edge units, expandable segments, a CPU,
/// Mixtral, bf16 and f32, a reduce-scatter in every micro-batch) are steady, and the plans of 7, 9 and 16 are theirs with micro-batch 4 repeated: the
/// same ops (kinds, streams, phases, dependencies, events), the same buffers (but their
/// names and arena offsets), the same tensor peak.
#[test]
fn a_steady_plan_is_the_longer_one_with_its_second_to_last_micro_batch_repeated() {
    let mut checked = 0;
    for (name, _, opts) in cases() {
        let m = model(name);
        let short = fsdp_planner::plan(&m, &Options { grad_accum: 6, ..opts.clone() }).unwrap();
        assert!(short.steady, "{name}");
        for n in [7u32, 9, 16] {
            let long = fsdp_planner::plan(&m, &Options { grad_accum: n, ..opts.clone() }).unwrap();
            let (ops, bufs) = expand(&short, n);
            assert!(ops == long.schedule, "{name}, {n} micro-batches: ops differ");
            let bare = |b: &BufferInfo| BufferInfo { name: String::new(), offset: 0, ..b.clone() };
            assert_eq!(bufs.len(), long.buffers.len(), "{name}, {n}");
            assert!(bufs.iter().zip(&long.buffers).all(|(a, b)| bare(a) == bare(b)), "{name}, {n} micro-batches: buffers differ");
            assert_eq!(short.memory.peak_bytes, long.memory.peak_bytes, "{name}, {n}");
            checked += 1;
        }
    }
    assert_eq!(checked, 33);
}

/// `timeline::predict_longer` from the plan of 6 micro-batches is the step time of the plan
/// of 7, 9 and 16 (to 10⁻⁹: float rounding) — GPU profiles (with the CPU's launches and the
/// collectives' slowdown of compute) and the CPU's serial streams — and it says nothing from
/// a plan whose second-to-last micro-batch does not run as the one before.
#[test]
fn the_step_time_of_a_longer_accumulation_is_the_steady_plans_with_its_period_repeated() {
    let mut checked = 0;
    for (name, hw_name, opts) in cases() {
        let (m, h) = (model(name), hw(hw_name));
        let short = fsdp_planner::plan(&m, &Options { grad_accum: 6, ..opts.clone() }).unwrap();
        let cm = fsdp_planner::cost::CostModel::new(&short, &m);
        for n in [7u32, 9, 16] {
            let long = fsdp_planner::plan(&m, &Options { grad_accum: n, ..opts.clone() }).unwrap();
            let t = fsdp_planner::timeline::predict(&long, &m, &h).step_time_s;
            let p = fsdp_planner::timeline::predict_longer(&short, &h, &cm, n).unwrap_or_else(|| panic!("{name}, {n}: not shown"));
            assert!((p / t - 1.0).abs() < 1e-9, "{name}, {n} micro-batches: {p} s predicted from 6, {t} s planned");
            checked += 1;
        }
        // (no more than it has; and one whose micro-batch 4 runs unlike micro-batch 3: an op
        // of it made another's, longer)
        assert_eq!(fsdp_planner::timeline::predict_longer(&short, &h, &cm, 6), None);
        let mut broken = short.clone();
        let t = broken.schedule.iter().position(|o| o.micro_batch == 4).unwrap();
        let (fwd, bwd) = (broken.schedule[t..].iter().position(|o| matches!(o.kind, fsdp_planner::plan::OpKind::Forward { .. })).unwrap() + t, broken.schedule.iter().rposition(|o| o.micro_batch == 4 && matches!(o.kind, fsdp_planner::plan::OpKind::Backward { .. })).unwrap());
        broken.schedule[fwd].kind = broken.schedule[bwd].kind.clone();
        assert_eq!(fsdp_planner::timeline::predict_longer(&broken, &h, &cm, 9), None, "{name}");
    }
    assert_eq!(checked, 33);
}

/// The caching allocator's replay of the plan of `n` from the plans of 8 and 12
/// (`reserved::predict_longer`, `needed_within_longer`): where it is shown (the replay's state
/// repeats within the shorter plan's micro-batches, in each step, at a micro-batch that
/// leaves as many before the last, modulo its period, as the plan of `n` leaves), the replay
/// of the plan of `n` itself, every figure; a search's stop over a limit where the plan of
/// `n`'s is. Shown for 107 of the 110 here (1 to 4 micro-batches more, and 24; the last case's
/// second step with a period of five micro-batches), the states of the expandable segments'
/// case and of Llama-3-8B's first at 13 and 15 by their large pools (their small pools'
/// blocks drift through the second step: replayed, `reserved::small_jump`); not for the last
/// case from the plan of 8 at 10, 12 and 24 (its state repeats too late in the plan of 8 to
/// leave the longer one's count before the last). (71 of 90 before the small pools were
/// replayed; the two `--grad-sync each` cases, 20 of 20.)
#[test]
fn the_allocator_replay_of_a_longer_accumulation_is_the_steady_plans_where_its_state_repeats() {
    let (mut shown, mut checked) = (0, 0);
    for (name, hw_name, opts) in cases() {
        let (m, h) = (model(name), hw(hw_name));
        for k in [8u32, 12] {
            let short = fsdp_planner::plan(&m, &Options { grad_accum: k, ..opts.clone() }).unwrap();
            for n in [k + 1, k + 2, k + 3, k + 4, 24] {
                let long = fsdp_planner::plan(&m, &Options { grad_accum: n, ..opts.clone() }).unwrap();
                let full = fsdp_planner::reserved::predict(&long, &h);
                checked += 1;
                let Some(r) = fsdp_planner::reserved::predict_longer(&short, &h, n) else {
                    assert!(fsdp_planner::reserved::needed_within_longer(&short, &h, full.device_bytes, n).is_none(), "{name}, {k} → {n}");
                    continue;
                };
                assert_eq!(r, full, "{name}, {k} → {n} micro-batches");
                let need = full.needed_bytes(&long);
                assert_eq!(fsdp_planner::reserved::needed_within_longer(&short, &h, full.device_bytes, n), Some(Some(need)), "{name}, {k} → {n}");
                if h.gpu.is_some() {
                    assert_eq!(fsdp_planner::reserved::needed_within_longer(&short, &h, full.device_bytes - 1, n), Some(None), "{name}, {k} → {n}");
                }
                shown += 1;
            }
            assert_eq!(fsdp_planner::reserved::predict_longer(&short, &h, k), None);
        }
    }
    assert_eq!((shown, checked), (107, 110));
}

/// A replay whose small pools never repeat within the plan of 12 (Llama-3-8B on 8 GPUs at
/// 1 × 4096, 26 blocks fully and 6 SAC checkpointed: small blocks drift through the cache from
/// one micro-batch to the next; with the large pools' period alone, the plan of 12 shows
/// nothing — checked by turning it off) while its large pools do: shown by
/// the large pools' state, the small pools' requests replayed (`reserved::small_jump`), for 32
/// and 128 micro-batches, every figure the replay of the plan of 32 itself (planning 128 here
/// would cost more than the rest of the file), and the search's stop a byte under its need.
#[test]
fn a_replay_whose_small_blocks_drift_is_shown_by_its_large_pools() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    let opts = Options { world_size: 8, batch: 1, seq: 4096, param_dtype: bf16, reduce_dtype: f32, checkpoint: vec!["model.layers.{0..25}=full".into(), "model.layers.{26..31}=selective-op".into()], ..Options::default() };
    let (m, h) = (model("llama-3-8b"), hw("h100-sxm"));
    let short = fsdp_planner::plan(&m, &Options { grad_accum: 12, ..opts.clone() }).unwrap();
    let long = fsdp_planner::plan(&m, &Options { grad_accum: 32, ..opts }).unwrap();
    let full = fsdp_planner::reserved::predict(&long, &h);
    assert_eq!(fsdp_planner::reserved::predict_longer(&short, &h, 32), Some(full.clone()));
    let need = full.needed_bytes(&long);
    assert_eq!(fsdp_planner::reserved::needed_within_longer(&short, &h, full.device_bytes, 32), Some(Some(need)));
    assert_eq!(fsdp_planner::reserved::needed_within_longer(&short, &h, full.device_bytes - 1, 32), Some(None));
    // (the plan of 32's own replay skips too: most of its micro-batches)
    let (every, skipping, skipped) = fsdp_planner::reserved::predict_skipping(&long, &h);
    assert_eq!(every, skipping);
    assert!(skipped >= 50, "{skipped} skipped");
    assert!(fsdp_planner::reserved::predict_longer(&short, &h, 128).is_some());
}

/// Every tiny model on 1, 2 and 4 ranks under eleven option sets (mixed precision, checkpointing,
/// no reshard, FSDP1, HSDP, torchtitan's 2024 loop, CPU offload (on a GPU), the last unit
/// kept, bf16 masters, CPU offload syncing each micro-batch; HSDP over 2 ranks refused on 1):
/// the plan of 6 micro-batches is steady and the plan of 9 is its expansion, with its tensor
/// peak, and `timeline::predict_longer` shows the plan of 9's step on an H100 (the CPU's
/// launches and the collectives' slowdown of compute included) — but under offload syncing
/// each, whose CPU waits for the GPU (it declines: `None`).
#[test]
fn every_tiny_configuration_is_steady_and_planned_longer_exactly() {
    let bf16 = fsdp_ir::DType::parse("bf16");
    let f32 = fsdp_ir::DType::parse("f32");
    let h = hw("h100-sxm");
    let (mut planned, mut timed) = (0, 0);
    for name in ["tiny-llama", "tiny-llama-4l", "tiny-qwen3", "tiny-mixtral", "tiny-gpt2", "tiny-gemma3", "tiny-llama-gqa", "tiny-deepseek-v3"] {
        let m = model(name);
        for ws in [1u64, 2, 4] {
            for variant in 0..11 {
                let mut o = Options { world_size: ws, batch: 2, seq: 32, grad_accum: 6, ..Options::default() };
                match variant {
                    1 => (o.param_dtype, o.reduce_dtype) = (bf16, f32),
                    // (the decoder blocks' class: the first block's)
                    2 => o.checkpoint = m.modules.iter().find(|x| x.path.ends_with(".0")).map(|x| x.class.clone()).into_iter().collect(),
                    3 => o.reshard_after_forward = Some(false),
                    4 => o.layout = fsdp_planner::Layout::Flat,
                    5 => (o.strategy, o.param_dtype, o.reduce_dtype) = (fsdp_planner::Strategy::HybridShard { shard_size: 2 }, bf16, f32),
                    6 => o.train_loop = fsdp_planner::options::TrainLoop::Torchtitan2024,
                    7 => o.offload = fsdp_planner::Offload::Cpu,
                    8 => o.unit_reshard = vec![("last".into(), false)],
                    9 => (o.param_dtype, o.reduce_dtype, o.master_dtype) = (bf16, f32, bf16),
                    10 => (o.offload, o.grad_sync) = (fsdp_planner::Offload::Cpu, fsdp_planner::GradSync::Each),
                    _ => {}
                }
                // (what the planner refuses: HSDP over 2 ranks on 1)
                let Ok(short) = fsdp_planner::plan(&m, &o) else {
                    assert!(variant == 5 && ws == 1, "{name} ws {ws} variant {variant}");
                    continue;
                };
                assert!(short.steady, "{name} ws {ws} variant {variant}");
                let long = fsdp_planner::plan(&m, &Options { grad_accum: 9, ..o.clone() }).unwrap();
                let (ops, bufs) = expand(&short, 9);
                let bare = |b: &BufferInfo| BufferInfo { name: String::new(), offset: 0, ..b.clone() };
                assert!(ops == long.schedule && bufs.len() == long.buffers.len() && bufs.iter().zip(&long.buffers).all(|(a, b)| bare(a) == bare(b)), "{name} ws {ws} variant {variant}");
                assert_eq!(short.memory.peak_bytes, long.memory.peak_bytes, "{name} ws {ws} variant {variant}");
                let cm = fsdp_planner::cost::CostModel::new(&short, &m);
                let longer = fsdp_planner::timeline::predict_longer(&short, &h, &cm, 9);
                assert_eq!(longer.is_none(), variant == 10, "{name} ws {ws} variant {variant}");
                if let Some(t) = longer {
                    let want = fsdp_planner::timeline::predict(&long, &m, &h).step_time_s;
                    assert!((t / want - 1.0).abs() < 1e-9, "{name} ws {ws} variant {variant}: {t} vs {want}");
                    timed += 1;
                }
                planned += 1;
            }
        }
    }
    assert_eq!((planned, timed), (256, 232));
}

/// `--offload cpu --grad-sync each`: past the step's first micro-batch, each reduction's copy
/// to the host blocks the CPU (FSDP2 2.11 `foreach_reduce`: the host already holds the grads,
/// `to_accumulate_grad`), which then adds them there (`cost::host_accumulate_s`): nothing
/// after it in the schedule starts before it ends plus that work. The first micro-batch's
/// copies do not block: compute runs beside them. (Tiny Llama on 2 H100s, 3 micro-batches.)
#[test]
fn offloaded_reductions_past_the_first_micro_batch_hold_the_cpu_back() {
    let m = model("tiny-llama");
    let h = hw("h100-sxm");
    let o = Options { world_size: 2, batch: 2, seq: 32, grad_accum: 3, device: fsdp_planner::Device::Cuda, offload: fsdp_planner::Offload::Cpu, grad_sync: fsdp_planner::GradSync::Each, ..Options::default() };
    let plan = fsdp_planner::plan(&m, &o).unwrap();
    let r = fsdp_planner::timeline::predict(&plan, &m, &h);
    let (mut held, mut free) = (0, 0);
    for (i, op) in plan.schedule.iter().enumerate() {
        let fsdp_planner::OpKind::ReduceScatter { unit, .. } = op.kind else { continue };
        let end = r.ops[i].end;
        if op.micro_batch == 0 {
            free += usize::from(r.ops[i + 1..].iter().any(|s| s.stream == fsdp_planner::Stream::Compute && s.start < end));
            continue;
        }
        let work = fsdp_planner::cost::host_accumulate_s(&h, plan.unit(unit), &plan.options).unwrap();
        assert!(work > 0.0);
        assert!(r.ops[i + 1..].iter().all(|s| s.start >= end + work - 1e-15), "op{i}");
        held += 1;
    }
    assert_eq!(held, 2 * plan.units.len());
    assert!(free > 0);
    // the first micro-batch's end of backward holds the CPU until its copies are done
    // (`finalize_backward`): nothing of the next micro-batch starts before
    let end0 = plan.schedule.iter().position(|op| op.kind == fsdp_planner::OpKind::PhaseEnd && op.phase == fsdp_planner::Phase::Backward && op.micro_batch == 0).unwrap();
    assert!(r.ops[end0 + 1..].iter().all(|s| s.start >= r.ops[end0].end));
    // a host half as fast makes the step longer, beyond its optimizer step's own slowdown, by
    // exactly the adds' time once more (the CPU's adds are on the step's path)
    let slow = fsdp_planner::hardware::Hardware { host: h.host.clone().map(|x| fsdp_planner::hardware::Host { adam_params_per_s: x.adam_params_per_s / 2.0, ..x }), ..h.clone() };
    let added: f64 = plan.schedule.iter().filter_map(|op| match op.kind {
        fsdp_planner::OpKind::ReduceScatter { unit, .. } if op.micro_batch > 0 => fsdp_planner::cost::host_accumulate_s(&h, plan.unit(unit), &plan.options),
        _ => None,
    }).sum();
    let grads = plan.units.iter().flat_map(|u| &u.params).filter(|p| p.requires_grad).count() as f64 * 2.0;
    let add_only = added - grads * h.op_overhead_s;
    // (the optimizer's host step slows as much syncing the last micro-batch only: what is
    // longer beyond it is the adds)
    let longer = |p: &Plan| fsdp_planner::timeline::predict(p, &m, &slow).step_time_s - fsdp_planner::timeline::predict(p, &m, &h).step_time_s;
    let last = fsdp_planner::plan(&m, &Options { grad_sync: fsdp_planner::GradSync::Last, ..o.clone() }).unwrap();
    let beyond = longer(&plan) - longer(&last);
    assert!(add_only > 0.0 && (beyond / add_only - 1.0).abs() < 1e-6, "{beyond} s longer, the adds {add_only} s");
}
