//! Golden tests of the timeline simulator and the cost model on hand-built schedules, with
//! every expected time computed by hand in the comments.
//!
//! The model: two 50×50 linear layers `a` and `b` (own units), batch 1 × seq 100 = 100
//! tokens, float32. The hardware: every peak 1e9 FLOP/s, all efficiencies 1, memory
//! bandwidth 1e300 B/s (bytes cost nothing), no per-op overhead, 2 ranks on one node linked
//! at 1e9 B/s with no latency. So:
//!
//! - forward of a linear = 2·100·50·50 = 500,000 FLOPs / 1e9 = 0.5 ms; backward = 2× = 1 ms;
//! - a collective on 2 ranks of N float32 = (2−1)/2 · 4N B / 1e9 B/s = 2N ns:
//!   N = 125,000 → 0.25 ms; N = 1,000,000 → 2 ms; an all-reduce is twice that.

use fsdp_ir::{DType, Dim, Input, Model, Module, Op, OpKind as IrOp, Param};
use fsdp_planner::cost::{self, Coll};
use fsdp_planner::hardware::{Efficiency, Hardware, Link, PeakFlops};
use fsdp_planner::ids::{OpId, UnitId};
use fsdp_planner::timeline::{self, TimeReport};
use fsdp_planner::{Group, OpKind, Options, Phase, Plan, Policy, ScheduleOp, Stream, Strategy};

const EPS: f64 = 1e-12;
const MS: f64 = 1e-3;

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() < EPS, "{what}: got {a:e}, want {b:e}");
}

fn hw() -> Hardware {
    Hardware {
        name: "unit".into(),
        peak_flops: PeakFlops { bf16: 1e9, fp16: 1e9, tf32: 1e9, fp32: 1e9, fp8: None },
        allow_tf32: false,
        memory_bytes: 1 << 40,
        hbm_bandwidth: 1e300,
        intra_node: Link { bandwidth: 1e9, latency: 0.0 },
        inter_node: Link { bandwidth: 1e8, latency: 0.0 },
        gpus_per_node: 8,
        efficiency: Efficiency { matmul: 1.0, attention: 1.0, memory: 1.0, comm: 1.0 },
        op_overhead_s: 0.0,
        backward_op_overhead_s: 0.0,
        forward_op_overhead_s: 0.0,
        serial_streams: false,
        host: None,
        gpu: None,
    }
}

fn model() -> Model {
    let lin = |name: &str, input: &str| Op {
        name: name.into(),
        kind: IrOp::Linear { bias: false, transposed: false, float32: false },
        module: name.into(),
        inputs: vec![input.into()],
        params: vec![format!("{name}.weight")],
        shape: vec![Dim::Sym("batch".into()), Dim::Sym("seq".into()), Dim::N(50)],
    };
    let module = |path: &str, class: &str| Module { path: path.into(), class: class.into() };
    let param = |name: &str| Param {
        name: name.into(),
        shape: vec![50, 50],
        dtype: DType::Float32,
        requires_grad: true,
        tied_to: None,
    };
    Model {
        name: "two-linears".into(),
        architecture: "TwoLinears".into(),
        attn_implementation: None,
        modules: vec![module("", "Net"), module("a", "Block"), module("b", "Block")],
        params: vec![param("a.weight"), param("b.weight")],
        buffers: vec![],
        inputs: vec![Input {
            name: "x".into(),
            shape: vec![Dim::Sym("batch".into()), Dim::Sym("seq".into()), Dim::N(50)],
            dtype: DType::Float32,
        }],
        ops: vec![lin("a", "x"), lin("b", "a")],
        alias_index: Default::default(),
    }
}

/// A real plan of the model (world size 2, units a and b), its schedule replaced by `ops`.
fn plan_with(m: &Model, ops: Vec<(OpKind, Stream, Phase, Vec<u32>)>) -> Plan {
    let opts = Options {
        world_size: 2,
        policy: Policy::Modules(vec!["a".into(), "b".into()]),
        batch: 1,
        seq: 100,
        ..Options::default()
    };
    let mut plan = fsdp_planner::plan(m, &opts).unwrap();
    plan.schedule = ops
        .into_iter()
        .enumerate()
        .map(|(i, (kind, stream, phase, deps))| ScheduleOp {
            id: OpId::new(i),
            kind,
            stream,
            phase,
            micro_batch: 0,
            deps: deps.into_iter().map(OpId).collect(),
            events: Default::default(),
        })
        .collect();
    plan
}

fn unit(plan: &Plan, label: &str) -> UnitId {
    plan.units.iter().find(|u| u.label() == label).unwrap().id
}

fn fwd(op: &str, u: UnitId) -> OpKind {
    OpKind::Forward { op: op.into(), unit: u }
}
fn bwd(op: &str, u: UnitId) -> OpKind {
    OpKind::Backward { op: op.into(), unit: u }
}
fn ag(u: UnitId, numel: u64) -> OpKind {
    OpKind::AllGather { unit: u, numel, dtype: DType::Float32, group: Group::World, prefetch: false }
}
fn rs(u: UnitId, numel: u64) -> OpKind {
    OpKind::ReduceScatter { unit: u, numel, dtype: DType::Float32, group: Group::World }
}

fn spans(r: &TimeReport) -> Vec<(f64, f64)> {
    r.ops.iter().map(|s| (s.start, s.end)).collect()
}

fn check_spans(r: &TimeReport, want: &[(f64, f64)]) {
    let got = spans(r);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        close(g.0, w.0, &format!("op{i} start"));
        close(g.1, w.1, &format!("op{i} end"));
    }
}

#[test]
fn compute_only() {
    // a fwd [0, 0.5] · b fwd [0.5, 1.0] · b bwd [1.0, 2.0] · a bwd [2.0, 3.0] ms
    let m = model();
    let p0 = plan_with(&m, vec![]);
    let (a, b) = (unit(&p0, "a"), unit(&p0, "b"));
    let plan = plan_with(
        &m,
        vec![
            (fwd("a", a), Stream::Compute, Phase::Forward, vec![]),
            (fwd("b", b), Stream::Compute, Phase::Forward, vec![]),
            (bwd("b", b), Stream::Compute, Phase::Backward, vec![]),
            (bwd("a", a), Stream::Compute, Phase::Backward, vec![]),
        ],
    );
    let r = timeline::predict(&plan, &m, &hw());
    check_spans(&r, &[(0.0, 0.5 * MS), (0.5 * MS, 1.0 * MS), (1.0 * MS, 2.0 * MS), (2.0 * MS, 3.0 * MS)]);
    close(r.step_time_s, 3.0 * MS, "step");
    close(r.compute_s, 3.0 * MS, "compute");
    close(r.comm_s, 0.0, "comm");
    close(r.exposed_comm_s, 0.0, "exposed");
    // model FLOPs = 3 · (500,000 + 500,000) = 3e6 in 3 ms = 1e9 FLOP/s = the peak: MFU 1
    close(r.model_flops, 3e6, "model flops");
    close(r.mfu, 1.0, "mfu");
    // 100 tokens / 3 ms
    close(r.tokens_per_s_per_gpu, 100.0 / 3e-3, "tokens/s");
}

#[test]
fn comm_only() {
    // three streams at once: all-gather 1e6 → [0, 2] ms, reduce-scatter 1e6 → [0, 2] ms,
    // all-reduce 1e6 → 2 × 2 = [0, 4] ms. Step 4 ms, comm 8 ms, all of the union exposed.
    let m = model();
    let p0 = plan_with(&m, vec![]);
    let (a, b) = (unit(&p0, "a"), unit(&p0, "b"));
    let plan = plan_with(
        &m,
        vec![
            (ag(a, 1_000_000), Stream::AllGather, Phase::Forward, vec![]),
            (rs(b, 1_000_000), Stream::ReduceScatter, Phase::Backward, vec![]),
            (
                OpKind::AllReduce { unit: b, numel: 1_000_000, dtype: DType::Float32, group: Group::World },
                Stream::AllReduce,
                Phase::Backward,
                vec![],
            ),
        ],
    );
    let r = timeline::predict(&plan, &m, &hw());
    check_spans(&r, &[(0.0, 2.0 * MS), (0.0, 2.0 * MS), (0.0, 4.0 * MS)]);
    close(r.step_time_s, 4.0 * MS, "step");
    close(r.comm_s, 8.0 * MS, "comm");
    close(r.exposed_comm_s, 4.0 * MS, "exposed");
    close(r.compute_s, 0.0, "compute");
}

#[test]
fn post_forward_all_gathers_run_over_their_own_units_groups() {
    // reshard_after_forward=16 on a, =4 on b (ints differing per unit): each backward
    // all-gather of 1e6 float32 (4e6 B) over its own unit's post-forward group, one after the
    // other on the all-gather stream —
    // a, 16 ranks on 2 nodes of 8: the inter-node ring over 2 on B/8 = 5e5 B at 1e8 B/s,
    // 1/2 · 5 ms = 2.5 ms, then the intra-node ring on B, 7/8 · 4 ms = 3.5 ms: [0, 6] ms;
    // b, 4 ranks in a node: 3/4 · 4e6 / 1e9 = 3 ms: [6, 9] ms
    let m = model();
    let p0 = plan_with(&m, vec![]);
    let (a, b) = (unit(&p0, "a"), unit(&p0, "b"));
    let post = |u: UnitId| OpKind::AllGather { unit: u, numel: 1_000_000, dtype: DType::Float32, group: Group::PostForward, prefetch: false };
    let mut plan = plan_with(&m, vec![(post(a), Stream::AllGather, Phase::Backward, vec![]), (post(b), Stream::AllGather, Phase::Backward, vec![])]);
    std::sync::Arc::make_mut(&mut plan.units)[a.index()].reshard_to = Some(16);
    std::sync::Arc::make_mut(&mut plan.units)[b.index()].reshard_to = Some(4);
    let r = timeline::predict(&plan, &m, &hw());
    check_spans(&r, &[(0.0, 6.0 * MS), (6.0 * MS, 9.0 * MS)]);
}

/// FSDP2 forward of two units with the second all-gather prefetched: `ag_b` elements.
fn forward_two_units(ag_b: u64) -> (Model, Plan) {
    let m = model();
    let p0 = plan_with(&m, vec![]);
    let (a, b) = (unit(&p0, "a"), unit(&p0, "b"));
    let plan = plan_with(
        &m,
        vec![
            (ag(a, 125_000), Stream::AllGather, Phase::Forward, vec![]), // op0
            (OpKind::CopyOut { unit: a }, Stream::Compute, Phase::Forward, vec![0]), // op1
            (fwd("a", a), Stream::Compute, Phase::Forward, vec![0]), // op2
            (ag(b, ag_b), Stream::AllGather, Phase::Forward, vec![]), // op3
            (OpKind::CopyOut { unit: b }, Stream::Compute, Phase::Forward, vec![3]), // op4
            (fwd("b", b), Stream::Compute, Phase::Forward, vec![3]), // op5
        ],
    );
    (m, plan)
}

#[test]
fn perfect_overlap() {
    // op0 all-gather a [0, 0.25]; op1 copy-out a [0.25, 0.25] (its bytes cost nothing);
    // op2 forward a [0.25, 0.75]; op3 all-gather b 125,000 elements starts when the
    // all-gather stream is free (the first two all-gathers of a pass wait for nothing else):
    // [0.25, 0.5], hidden under forward a; op4 copy-out b at 0.75; op5 forward b [0.75, 1.25].
    // Step 1.25 ms = 0.25 + 0.5 + 0.5; exposed: only the first all-gather, 0.25 ms.
    let (m, plan) = forward_two_units(125_000);
    let r = timeline::predict(&plan, &m, &hw());
    check_spans(
        &r,
        &[
            (0.0, 0.25 * MS),
            (0.25 * MS, 0.25 * MS),
            (0.25 * MS, 0.75 * MS),
            (0.25 * MS, 0.5 * MS),
            (0.75 * MS, 0.75 * MS),
            (0.75 * MS, 1.25 * MS),
        ],
    );
    close(r.step_time_s, 1.25 * MS, "step");
    close(r.comm_s, 0.5 * MS, "comm");
    close(r.exposed_comm_s, 0.25 * MS, "exposed");
    close(r.compute_s, 1.0 * MS, "compute");
}

#[test]
fn serialized_on_a_slow_all_gather() {
    // As above but all-gather b is 1e6 elements = 2 ms: op3 [0.25, 2.25]; the copy-out of b
    // waits for it: op4 at 2.25, op5 [2.25, 2.75]. Step 2.75 = 0.25 + 2 + 0.5 ms; exposed =
    // 0.25 (first all-gather) + 2.25 − 0.75 (compute idle while all-gather b finishes) = 1.75.
    let (m, plan) = forward_two_units(1_000_000);
    let r = timeline::predict(&plan, &m, &hw());
    check_spans(
        &r,
        &[
            (0.0, 0.25 * MS),
            (0.25 * MS, 0.25 * MS),
            (0.25 * MS, 0.75 * MS),
            (0.25 * MS, 2.25 * MS),
            (2.25 * MS, 2.25 * MS),
            (2.25 * MS, 2.75 * MS),
        ],
    );
    close(r.step_time_s, 2.75 * MS, "step");
    close(r.exposed_comm_s, 1.75 * MS, "exposed");
}

#[test]
fn backward_reduce_scatters_and_the_final_wait() {
    // op0 backward b [0, 1]; op1 reduce-scatter b (1e6: 2 ms) after op0: [1, 3]; op2
    // backward a: the first compute op after the first reduce-scatter waits for no earlier
    // one: [1, 2]; op3 reduce-scatter a after op2, stream busy until 3: [3, 5]; op4 phase end
    // waits for every collective: [5, 5]. Step 5 ms; compute 2 ms; comm 4 ms; exposed 3 ms.
    let m = model();
    let p0 = plan_with(&m, vec![]);
    let (a, b) = (unit(&p0, "a"), unit(&p0, "b"));
    let plan = plan_with(
        &m,
        vec![
            (bwd("b", b), Stream::Compute, Phase::Backward, vec![]),
            (rs(b, 1_000_000), Stream::ReduceScatter, Phase::Backward, vec![0]),
            (bwd("a", a), Stream::Compute, Phase::Backward, vec![]),
            (rs(a, 1_000_000), Stream::ReduceScatter, Phase::Backward, vec![2]),
            (OpKind::PhaseEnd, Stream::Compute, Phase::Backward, vec![]),
        ],
    );
    let r = timeline::predict(&plan, &m, &hw());
    check_spans(&r, &[(0.0, 1.0 * MS), (1.0 * MS, 3.0 * MS), (1.0 * MS, 2.0 * MS), (3.0 * MS, 5.0 * MS), (5.0 * MS, 5.0 * MS)]);
    close(r.step_time_s, 5.0 * MS, "step");
    close(r.compute_s, 2.0 * MS, "compute");
    close(r.comm_s, 4.0 * MS, "comm");
    close(r.exposed_comm_s, 3.0 * MS, "exposed");
}

#[test]
fn forward_all_gathers_run_at_most_two_ahead() {
    // FSDP2 implicit prefetch: an all-gather of a forward pass waits for the copy-out two
    // copy-outs back. op0 all-gather a [0, 0.25]; op1 copy-out a at 0.25; op2 forward a
    // [0.25, 0.75]; op3 all-gather b [0.25, 0.5]; op4 copy-out b at 0.75; op5 forward b
    // [0.75, 1.25]; op6, a third all-gather (1e6 elements, 2 ms), waits for copy-out a
    // (0.25) and its stream (0.5): [0.5, 2.5].
    let m = model();
    let p0 = plan_with(&m, vec![]);
    let (a, b) = (unit(&p0, "a"), unit(&p0, "b"));
    let plan = plan_with(
        &m,
        vec![
            (ag(a, 125_000), Stream::AllGather, Phase::Forward, vec![]),
            (OpKind::CopyOut { unit: a }, Stream::Compute, Phase::Forward, vec![0]),
            (fwd("a", a), Stream::Compute, Phase::Forward, vec![0]),
            (ag(b, 125_000), Stream::AllGather, Phase::Forward, vec![]),
            (OpKind::CopyOut { unit: b }, Stream::Compute, Phase::Forward, vec![3]),
            (fwd("b", b), Stream::Compute, Phase::Forward, vec![3]),
            (ag(a, 1_000_000), Stream::AllGather, Phase::Forward, vec![]),
        ],
    );
    let deps = timeline::implicit_deps(&plan.schedule);
    assert_eq!(deps[6], vec![1], "third all-gather waits for the first copy-out");
    assert!(deps[3].is_empty(), "the second all-gather waits for nothing");
    let r = timeline::predict(&plan, &m, &hw());
    close(r.ops[6].start, 0.5 * MS, "third all-gather start");
    close(r.ops[6].end, 2.5 * MS, "third all-gather end");
}

#[test]
fn ring_and_hierarchical_collectives() {
    let mut h = hw();
    h.intra_node = Link { bandwidth: 400e9, latency: 2e-6 };
    h.inter_node = Link { bandwidth: 50e9, latency: 5e-6 };
    h.efficiency.comm = 0.5;
    let b = 8e9;
    // one node of 8: 7·2 µs + 7/8 · 8e9 / (400e9 · 0.5) = 14 µs + 35 ms
    close(cost::collective_time(&h, Coll::AllGather, b, 8, 8), 14e-6 + 0.035, "intra all-gather");
    close(cost::collective_time(&h, Coll::ReduceScatter, b, 8, 8), 14e-6 + 0.035, "intra reduce-scatter");
    close(cost::collective_time(&h, Coll::AllReduce, b, 8, 8), 2.0 * (14e-6 + 0.035), "intra all-reduce");
    // 16 ranks on 2 nodes of 8: inter ring over 2 nodes on B/8 = 1e9: 5 µs + 1/2 · 1e9 / 25e9
    // = 5 µs + 20 ms; then the intra ring on B: 14 µs + 35 ms
    close(cost::collective_time(&h, Coll::AllGather, b, 16, 8), 5e-6 + 0.02 + 14e-6 + 0.035, "hierarchical");
    // one rank per node (HSDP replicate group of 4): 3·5 µs + 3/4 · 8e9 / 25e9 = 15 µs + 240 ms
    close(cost::collective_time(&h, Coll::AllGather, b, 4, 1), 15e-6 + 0.24, "inter ring");
    close(cost::collective_time(&h, Coll::AllGather, b, 1, 1), 0.0, "one rank");
    // group shapes: HSDP 32 ranks, shard groups of 8 (one node each), replicate groups of 4
    let o = Options { world_size: 32, strategy: Strategy::HybridShard { shard_size: 8 }, ..Options::default() };
    assert_eq!(cost::group_shape(&o, Group::Shard, None, 8), (8, 8));
    assert_eq!(cost::group_shape(&o, Group::Replicate, None, 8), (4, 1));
    // shard groups of 2: a node holds 4 of them, so a replicate group of 16 has 4 per node
    let o = Options { world_size: 32, strategy: Strategy::HybridShard { shard_size: 2 }, ..Options::default() };
    assert_eq!(cost::group_shape(&o, Group::Replicate, None, 8), (16, 4));
    // full shard over 64 ranks: 8 per node, hierarchical
    let o = Options { world_size: 64, ..Options::default() };
    assert_eq!(cost::group_shape(&o, Group::World, None, 8), (64, 8));
    // a post-forward group is its unit's N consecutive ranks: 4 inside a node, 16 over two
    assert_eq!(cost::group_shape(&o, Group::PostForward, Some(4), 8), (4, 4));
    assert_eq!(cost::group_shape(&o, Group::PostForward, Some(16), 8), (16, 8));
}

#[test]
fn llama_model_flops_are_6nt_plus_attention() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/llama-3.1-8b.ron")).unwrap();
    let m = fsdp_ir::parse_model(&text, "llama-3.1-8b.ron").unwrap();
    let opts = Options { batch: 2, seq: 8192, ..Options::default() };
    let got = cost::model_flops(&m, &opts, fsdp_planner::AttnImpl::Sdpa);
    // GEMM parameters: per layer q, o 4096² each, k, v 4096·1024 each, gate, up, down
    // 4096·14336 each; 32 layers; plus the LM head 128256·4096 (the embedding is a gather).
    let layer = 2.0 * 4096.0 * 4096.0 + 2.0 * 4096.0 * 1024.0 + 3.0 * 4096.0 * 14336.0;
    let n = 32.0 * layer + 128256.0 * 4096.0;
    let t = 2.0 * 8192.0;
    // 6·N·T + 12·L·h·hd·s·T
    let want = 6.0 * n * t + 12.0 * 32.0 * 32.0 * 128.0 * 8192.0 * t;
    assert!((got - want).abs() / want < 1e-12, "{got:e} vs {want:e}");
}

#[test]
fn memory_replay_peaks_where_the_plan_does() {
    for name in ["tiny-llama", "tiny-gpt2", "tiny-mixtral"] {
        let text = std::fs::read_to_string(format!("{}/../models/{name}.ron", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let m = fsdp_ir::parse_model(&text, name).unwrap();
        let plan = fsdp_planner::plan(&m, &Options { world_size: 2, seq: 64, ..Options::default() }).unwrap();
        let h = Hardware { name: "h".into(), ..hw() };
        let r = timeline::predict(&plan, &m, &h);
        let mem = timeline::memory_timeline(&plan, &r);
        let peak = mem.iter().max_by_key(|s| s.total()).unwrap();
        assert_eq!(peak.total(), plan.memory.peak_bytes, "{name}");
        for (i, c) in fsdp_planner::Category::ALL.iter().enumerate() {
            assert_eq!(peak.bytes[i], plan.memory.breakdown.get(c).copied().unwrap_or(0), "{name} {}", c.name());
        }
        assert!(mem.windows(2).all(|w| w[0].t <= w[1].t), "{name}: samples in time order");
        // every stream runs one op at a time, in schedule order
        for s in [Stream::Compute, Stream::AllGather, Stream::ReduceScatter, Stream::AllReduce] {
            let v: Vec<_> = r.ops.iter().filter(|o| o.stream == s).collect();
            assert!(v.windows(2).all(|w| w[0].end <= w[1].start + 1e-15), "{name}: {s:?} overlaps");
        }
        assert!(r.step_time_s > 0.0 && r.exposed_comm_s <= r.comm_s + 1e-15);
    }
}
