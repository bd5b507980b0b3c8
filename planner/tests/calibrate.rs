//! Calibration recovers a profile it did not start from: a step "measured" by predicting it
//! on a known profile (the truth) is fitted starting from the shipped `cpu` profile, and the
//! fit must find the truth's per-launch overhead, per-backward-op overhead and efficiencies,
//! and reproduce every op's time. (How well a fit predicts a real runtime is measured in
//! `runtime/tests/calibrate.rs`; this checks the fitting itself.)

use fsdp_planner::calibrate::{calibrate, calibrate_many, Sample};
use fsdp_planner::hardware::Hardware;
use fsdp_planner::{Device, Options};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn model(name: &str) -> fsdp_ir::Model {
    let cfg = format!("models/{name}.config.json");
    fsdp_ir::hf::import_hf(&std::fs::read_to_string(root().join(&cfg)).unwrap(), &cfg, name).unwrap()
}

fn cpu() -> Hardware {
    ron::from_str(&std::fs::read_to_string(root().join("models/hardware/cpu.ron")).unwrap()).unwrap()
}

fn truth() -> Hardware {
    let mut t = cpu();
    t.op_overhead_s = 7e-6;
    t.backward_op_overhead_s = 20e-6;
    t.forward_op_overhead_s = 4e-6;
    t.efficiency.memory = 0.4;
    t.efficiency.matmul = 0.6;
    t.efficiency.attention = 0.3;
    t.efficiency.comm = 0.5;
    t
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

#[test]
fn recovers_a_known_profile() {
    let m = model("tiny-llama");
    let plan = fsdp_planner::plan(&m, &Options { world_size: 2, batch: 2, seq: 64, device: Device::Cpu, ..Options::default() }).unwrap();
    let t = truth();
    let measured: Vec<(f64, f64)> = fsdp_planner::timeline::predict(&plan, &m, &t).ops.iter().map(|s| (s.start, s.end)).collect();
    let c = calibrate(&plan, &m, &cpu(), &measured);
    assert!(c.error_before().abs() > 0.05, "the starting profile must be off ({:+.2}%)", 100.0 * c.error_before());
    assert!(c.error_after().abs() < 1e-6, "fitted step off by {:+e}", c.error_after());
    let h = &c.hardware;
    assert!(rel(h.op_overhead_s, t.op_overhead_s) < 1e-3, "launch overhead {:e}", h.op_overhead_s);
    assert!(rel(h.backward_op_overhead_s, t.backward_op_overhead_s) < 1e-3, "backward overhead {:e}", h.backward_op_overhead_s);
    assert!(rel(h.forward_op_overhead_s, t.forward_op_overhead_s) < 1e-3, "forward overhead {:e}", h.forward_op_overhead_s);
    assert!(rel(h.hbm_bandwidth * h.efficiency.memory, t.hbm_bandwidth * t.efficiency.memory) < 1e-3, "bandwidth");
    let fitted = fsdp_planner::timeline::predict(&plan, &m, h);
    for (i, (f, w)) in fitted.ops.iter().zip(&measured).enumerate() {
        let (a, b) = (f.end - f.start, w.1 - w.0);
        assert!((a - b).abs() <= 1e-3 * b + 1e-12, "op{i}: fitted {a:e} s, measured {b:e} s");
    }
}

#[test]
fn pools_several_steps() {
    let m = model("tiny-llama");
    let g = model("tiny-gpt2");
    let t = truth();
    let p1 = fsdp_planner::plan(&m, &Options { world_size: 2, batch: 2, seq: 64, device: Device::Cpu, ..Options::default() }).unwrap();
    let p2 = fsdp_planner::plan(&g, &Options { world_size: 2, batch: 4, seq: 32, device: Device::Cpu, ..Options::default() }).unwrap();
    let s1: Vec<(f64, f64)> = fsdp_planner::timeline::predict(&p1, &m, &t).ops.iter().map(|s| (s.start, s.end)).collect();
    let s2: Vec<(f64, f64)> = fsdp_planner::timeline::predict(&p2, &g, &t).ops.iter().map(|s| (s.start, s.end)).collect();
    let c = calibrate_many(&[Sample { plan: &p1, model: &m, measured: &s1 }, Sample { plan: &p2, model: &g, measured: &s2 }], &cpu());
    assert!(c.error_after().abs() < 1e-6, "pooled fit off by {:+e}", c.error_after());
    let want = s2.last().unwrap().1 - s2[0].0;
    let got = fsdp_planner::timeline::predict(&p2, &g, &c.hardware).step_time_s;
    assert!(rel(got, want) < 1e-3, "gpt2 step {got} vs {want}");
}
