//! Chrome / Perfetto trace of a predicted step (the JSON "Trace Event Format"): one process
//! per rank (rank 0), one thread per stream with a complete event (`ph: "X"`) per op, named
//! as the printed schedule names it, and a memory counter (`ph: "C"`) by FSDPMemTracker
//! category from [`crate::timeline::memory_timeline`]. Times in microseconds.

use crate::memory::describe;
use crate::plan::*;
use crate::timeline::{MemSample, TimeReport};
use serde_json::{json, Value};

/// Thread id and name of each stream's track.
pub const STREAMS: [(Stream, u32, &str); 4] = [
    (Stream::Compute, 0, "compute"),
    (Stream::AllGather, 1, "all-gather"),
    (Stream::ReduceScatter, 2, "reduce-scatter"),
    (Stream::AllReduce, 3, "all-reduce"),
];

fn tid(s: Stream) -> u32 {
    STREAMS.iter().find(|x| x.0 == s).map(|x| x.1).unwrap_or(0)
}

fn phase(p: Phase) -> &'static str {
    match p {
        Phase::Setup => "setup",
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer",
    }
}

/// The trace document: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`.
pub fn chrome_trace(plan: &Plan, report: &TimeReport, mem: &[MemSample]) -> Value {
    let pid = plan.memory.rank;
    let mut ev: Vec<Value> = vec![json!({
        "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": {"name": format!("rank {pid} · {} · {}", plan.model_name, report.hardware)},
    })];
    let used: Vec<Stream> = STREAMS.iter().map(|x| x.0).filter(|s| plan.schedule.iter().any(|o| o.stream == *s)).collect();
    for (s, t, name) in STREAMS {
        if used.contains(&s) {
            ev.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": name}}));
            ev.push(json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": t, "args": {"sort_index": t}}));
        }
    }
    for (op, span) in plan.schedule.iter().zip(&report.ops) {
        let d = describe(op, Some(&plan.units));
        let name = d.split_once(' ').map(|x| x.1).unwrap_or(&d).to_string();
        let mut args = json!({"op": op.id.to_string(), "phase": phase(op.phase), "micro_batch": op.micro_batch});
        if let OpKind::AllGather { numel, dtype, .. } | OpKind::ReduceScatter { numel, dtype, .. } | OpKind::AllReduce { numel, dtype, .. } = &op.kind {
            args["bytes"] = json!(numel * dtype.size());
            args["dtype"] = json!(dtype.torch_name());
        }
        if !op.deps.is_empty() {
            args["after"] = json!(op.deps.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","));
        }
        ev.push(json!({
            "name": name,
            "cat": phase(op.phase),
            "ph": "X",
            "ts": span.start * 1e6,
            "dur": (span.end - span.start) * 1e6,
            "pid": pid,
            "tid": tid(op.stream),
            "args": args,
        }));
    }
    // memory counter: one series per category that is ever non-zero, in MiB
    let cats: Vec<usize> = (0..Category::ALL.len()).filter(|&c| mem.iter().any(|m| m.bytes[c] > 0)).collect();
    for m in crate::timeline::coalesce(mem) {
        let args: serde_json::Map<String, Value> = cats
            .iter()
            .map(|&c| (Category::ALL[c].name().to_string(), json!((m.bytes[c] as f64 / 1048576.0 * 1000.0).round() / 1000.0)))
            .collect();
        ev.push(json!({"name": "memory (MiB)", "ph": "C", "ts": m.t * 1e6, "pid": pid, "args": args}));
    }
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": plan.model_name,
            "plan_hash": plan.plan_hash,
            "hardware": report.hardware,
            "world_size": plan.options.world_size,
            "device": plan.options.device.name(),
            "step_time_s": report.step_time_s,
            "exposed_comm_s": report.exposed_comm_s,
            "mfu": report.mfu,
            "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu,
            "peak_bytes": plan.memory.peak_bytes,
        },
    })
}

/// (start, end) in seconds of every schedule op of `plan`, read back from a trace in this
/// format (e.g. the runtime's measured `run --trace`). Errors name the first missing op.
pub fn spans_from_trace(doc: &Value, plan: &Plan) -> Result<Vec<(f64, f64)>, String> {
    let mut spans = vec![None; plan.schedule.len()];
    for ev in doc["traceEvents"].as_array().into_iter().flatten() {
        if ev["ph"] != "X" {
            continue;
        }
        let Some(i) = ev["args"]["op"].as_str().and_then(|o| o.strip_prefix("op")).and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        let (ts, dur) = (ev["ts"].as_f64().unwrap_or(0.0) * 1e-6, ev["dur"].as_f64().unwrap_or(0.0) * 1e-6);
        if let Some(s) = spans.get_mut(i) {
            *s = Some((ts, ts + dur));
        }
    }
    spans
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| format!("no event for op{i}: the trace is of another plan")))
        .collect()
}
