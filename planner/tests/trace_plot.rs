//! The Chrome trace is a valid Trace Event Format document (what chrome://tracing and
//! Perfetto's JSON importer require of each event kind), and the memory plot is well-formed
//! XML/SVG with its axes, legend and peak label.

use fsdp_planner::hardware::{Efficiency, Hardware, Link, PeakFlops};
use fsdp_planner::memory::describe;
use fsdp_planner::{plot, timeline, trace, Options, Plan};
use serde_json::Value;
use std::collections::HashMap;

fn h100ish() -> Hardware {
    Hardware {
        name: "test-gpu".into(),
        peak_flops: PeakFlops { bf16: 989e12, fp16: 989e12, tf32: 494e12, fp32: 67e12, fp8: None },
        allow_tf32: false,
        memory_bytes: 80 << 30,
        hbm_bandwidth: 3.35e12,
        intra_node: Link { bandwidth: 450e9, latency: 2e-6 },
        inter_node: Link { bandwidth: 50e9, latency: 5e-6 },
        gpus_per_node: 8,
        efficiency: Efficiency::default(),
        op_overhead_s: 5e-6,
        backward_op_overhead_s: 0.0,
        forward_op_overhead_s: 0.0,
        serial_streams: false,
        host: None,
        gpu: None,
    }
}

fn planned(name: &str, opts: Options) -> (fsdp_ir::Model, Plan) {
    let text = std::fs::read_to_string(format!("{}/../models/{name}.ron", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let m = fsdp_ir::parse_model(&text, name).unwrap();
    let p = fsdp_planner::plan(&m, &opts).unwrap();
    (m, p)
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("`{k}` is not a number in {v}"))
}

#[test]
fn trace_is_a_valid_chrome_trace() {
    let cases = [
        ("tiny-llama", Options { world_size: 2, seq: 64, ..Options::default() }),
        ("tiny-gpt2", Options { world_size: 4, seq: 32, grad_accum: 2, ..Options::default() }),
        (
            "tiny-llama",
            Options {
                world_size: 16,
                seq: 64,
                strategy: fsdp_planner::Strategy::HybridShard { shard_size: 8 },
                ..Options::default()
            },
        ),
    ];
    for (name, opts) in cases {
        let (m, plan) = planned(name, opts);
        let hw = h100ish();
        let r = timeline::predict(&plan, &m, &hw);
        let mem = timeline::memory_timeline(&plan, &r);
        let doc = trace::chrome_trace(&plan, &r, &mem);
        // it survives a round trip through text, as a file would
        let doc: Value = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
        let events = doc["traceEvents"].as_array().expect("traceEvents array");
        assert!(doc["displayTimeUnit"] == "ms" || doc["displayTimeUnit"] == "ns");
        let mut x_by_tid: HashMap<u64, Vec<(f64, f64)>> = HashMap::new();
        let mut names = vec![];
        let mut counters = 0;
        let mut thread_names = HashMap::new();
        for e in events {
            let ph = e["ph"].as_str().expect("ph");
            assert!(e["name"].is_string(), "{e}");
            assert!(e["pid"].is_u64(), "{e}");
            match ph {
                "X" => {
                    let (ts, dur) = (num(e, "ts"), num(e, "dur"));
                    assert!(ts >= 0.0 && dur >= 0.0 && ts.is_finite() && dur.is_finite(), "{e}");
                    let tid = e["tid"].as_u64().expect("X needs tid");
                    x_by_tid.entry(tid).or_default().push((ts, ts + dur));
                    assert!(e["cat"].is_string() && e["args"].is_object(), "{e}");
                    names.push(e["name"].as_str().unwrap().to_string());
                }
                "C" => {
                    assert!(num(e, "ts") >= 0.0);
                    let args = e["args"].as_object().expect("C needs args");
                    assert!(!args.is_empty() && args.values().all(|v| v.as_f64().is_some_and(|x| x >= 0.0)), "{e}");
                    counters += 1;
                }
                "M" => {
                    assert!(matches!(e["name"].as_str(), Some("process_name" | "thread_name" | "thread_sort_index")), "{e}");
                    assert!(e["args"].is_object(), "{e}");
                    if e["name"] == "thread_name" {
                        thread_names.insert(e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string());
                    }
                }
                other => panic!("unexpected ph {other}"),
            }
        }
        // one complete event per op, named as the printed schedule names it
        assert_eq!(names.len(), plan.schedule.len(), "{name}");
        for (n, op) in names.iter().zip(&plan.schedule) {
            let d = describe(op, Some(&plan.units));
            assert_eq!(n, d.split_once(' ').unwrap().1);
        }
        // one named track per stream; ops on a track never overlap
        for (tid, v) in &x_by_tid {
            assert!(thread_names.contains_key(tid), "tid {tid} has no thread_name");
            assert!(v.windows(2).all(|w| w[0].1 <= w[1].0 + 1e-6), "{name}: tid {tid} overlaps");
        }
        assert!(x_by_tid.len() >= 3, "{name}: compute, all-gather and reduce-scatter tracks");
        assert!(counters > 1, "{name}: memory counter");
        // the counter reaches the plan's peak (MiB, rounded to 1e-3)
        let max_c = events
            .iter()
            .filter(|e| e["ph"] == "C")
            .map(|e| e["args"].as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum::<f64>())
            .fold(0.0, f64::max);
        let peak_mib = plan.memory.peak_bytes as f64 / 1048576.0;
        assert!((max_c - peak_mib).abs() < 0.01, "{name}: counter max {max_c} MiB vs peak {peak_mib}");
    }
}

/// A minimal XML well-formedness check: balanced tags, quoted attributes, no stray `<` or
/// `&`, one root element.
fn check_xml(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut stack: Vec<String> = vec![];
    let mut root = None;
    let mut closed_root = false;
    while i < b.len() {
        match b[i] {
            b'<' => {
                let end = s[i..].find('>').ok_or("unterminated tag")? + i;
                let tag = &s[i + 1..end];
                if let Some(name) = tag.strip_prefix('/') {
                    let top = stack.pop().ok_or(format!("stray </{name}>"))?;
                    if top != name.trim() {
                        return Err(format!("</{name}> closes <{top}>"));
                    }
                    if stack.is_empty() {
                        closed_root = true;
                    }
                } else if tag.starts_with('?') || tag.starts_with('!') {
                } else {
                    if closed_root {
                        return Err("content after the root element".into());
                    }
                    let self_closing = tag.ends_with('/');
                    let body = tag.trim_end_matches('/');
                    let name: String = body.chars().take_while(|c| !c.is_whitespace()).collect();
                    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':' || c == '_') {
                        return Err(format!("bad tag name in <{tag}>"));
                    }
                    // attributes: name="value" pairs
                    let mut rest = body[name.len()..].trim();
                    while !rest.is_empty() {
                        let eq = rest.find('=').ok_or(format!("attribute without value in <{tag}>"))?;
                        let an = rest[..eq].trim();
                        if an.is_empty() || an.contains(char::is_whitespace) {
                            return Err(format!("bad attribute `{an}` in <{name}>"));
                        }
                        let after = rest[eq + 1..].trim_start();
                        let q = after.chars().next().ok_or("missing value")?;
                        if q != '"' && q != '\'' {
                            return Err(format!("unquoted attribute {an} in <{name}>"));
                        }
                        let close = after[1..].find(q).ok_or("unterminated attribute")? + 1;
                        let val = &after[1..close];
                        if val.contains('<') {
                            return Err(format!("`<` in attribute {an}"));
                        }
                        check_entities(val)?;
                        rest = after[close + 1..].trim_start();
                    }
                    if root.is_none() {
                        root = Some(name.clone());
                    }
                    if !self_closing {
                        stack.push(name);
                    } else if stack.is_empty() {
                        closed_root = true;
                    }
                }
                i = end + 1;
            }
            _ => {
                let end = s[i..].find('<').map(|x| x + i).unwrap_or(b.len());
                let text = &s[i..end];
                if stack.is_empty() && !text.trim().is_empty() {
                    return Err(format!("text outside the root: {text:?}"));
                }
                check_entities(text)?;
                i = end;
            }
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed <{}>", stack.join("> <")));
    }
    root.ok_or("no root element".into())
}

fn check_entities(t: &str) -> Result<(), String> {
    let mut rest = t;
    while let Some(p) = rest.find('&') {
        let r = &rest[p..];
        let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| r.starts_with(e)) || r.starts_with("&#");
        if !ok {
            return Err(format!("bare `&` in {t:?}"));
        }
        rest = &r[1..];
    }
    Ok(())
}

#[test]
fn xml_checker_rejects_broken_documents() {
    assert!(check_xml("<svg><g></svg>").is_err());
    assert!(check_xml("<svg a=1/>").is_err());
    assert!(check_xml("<svg><text>a & b</text></svg>").is_err());
    assert!(check_xml("<svg/><svg/>").is_err());
    assert_eq!(check_xml(r#"<svg a="1"><text>a &amp; b</text></svg>"#).unwrap(), "svg");
}

#[test]
fn memory_plot_is_well_formed_svg() {
    for (name, opts) in [
        ("tiny-llama", Options { world_size: 2, seq: 64, ..Options::default() }),
        ("tiny-mixtral", Options { world_size: 2, seq: 64, checkpoint: vec!["MixtralDecoderLayer".into()], ..Options::default() }),
    ] {
        let (mut m, plan) = planned(name, opts);
        m.name = "a <tricky> & \"name\"".into();
        let mut plan = plan;
        plan.model_name = m.name.clone();
        let hw = h100ish();
        let r = timeline::predict(&plan, &m, &hw);
        let mem = timeline::memory_timeline(&plan, &r);
        let svg = plot::memory_svg(&plan, &r, &mem, Some(("test-gpu", hw.memory_bytes)));
        assert_eq!(check_xml(&svg), Ok("svg".to_string()), "{name}");
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("&lt;tricky&gt; &amp; &quot;name&quot;"), "escaped title");
        assert!(svg.contains(&format!("peak {}", fsdp_planner::print::bytes(plan.memory.peak_bytes))), "peak label");
        assert!(svg.contains("time since the start of the step (") && svg.contains("memory in use"), "axis labels");
        for (c, b) in &plan.memory.breakdown {
            if *b > 0 {
                assert!(svg.contains(&format!(">{}</text>", c.name())), "legend lacks {}", c.name());
            }
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{name}: non-finite coordinates");
    }
}
