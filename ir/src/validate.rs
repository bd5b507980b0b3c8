//! Validation of a parsed model: every problem is collected and returned at once.
//!
//! Checks: duplicate names, the module tree, parameter and buffer owners, tied aliases
//! (known primary, same shape and dtype), op references (unknown inputs/params/modules,
//! use before definition, cycles), symbolic dims, size overflow, and shape agreement
//! between connected ops for every op kind.

use crate::error::Problem;
use crate::graph::op_graph;
use crate::model::*;
use std::collections::{HashMap, HashSet};

/// Large symbol values used to detect sizes that overflow u64.
const PROBE: Dims = Dims {
    batch: 1 << 16,
    seq: 1 << 20,
};

struct Ctx<'a> {
    problems: Vec<Problem>,
    model: &'a Model,
}

impl Ctx<'_> {
    fn err(&mut self, item: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            item: item.into(),
            message: message.into(),
        });
    }
}

fn shape_str(s: &[Dim]) -> String {
    let parts: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Returns every problem of the model (empty when it is valid).
pub fn validate(model: &Model) -> Vec<Problem> {
    let mut cx = Ctx {
        problems: Vec::new(),
        model,
    };
    check_modules(&mut cx);
    let params = check_params(&mut cx);
    check_buffers(&mut cx);
    check_ops(&mut cx, &params);
    cx.problems
}

fn dup_check<'a>(cx: &mut Ctx, what: &str, names: impl Iterator<Item = &'a str>) -> HashSet<&'a str> {
    let mut seen = HashSet::new();
    for n in names {
        if !seen.insert(n) {
            cx.err(format!("{what} {n}"), "duplicate name");
        }
    }
    seen
}

fn check_modules(cx: &mut Ctx) {
    let m = cx.model;
    match m.modules.first() {
        Some(r) if r.path.is_empty() => {}
        _ => cx.err("modules", "the first module must be the root, with path \"\""),
    }
    let paths = dup_check(cx, "module", m.modules.iter().map(|x| x.path.as_str()));
    for md in &m.modules {
        if let Some(p) = parent_path(&md.path) {
            if !paths.contains(p) {
                cx.err(format!("module {}", md.path), format!("parent module `{p}` is not declared"));
            }
        }
        if md.class.is_empty() {
            cx.err(format!("module {}", md.path), "empty class name");
        }
    }
}

fn check_params<'a>(cx: &mut Ctx<'a>) -> HashMap<&'a str, &'a Param> {
    let m = cx.model;
    dup_check(cx, "param", m.params.iter().map(|p| p.name.as_str()));
    let modules: HashSet<&str> = m.modules.iter().map(|x| x.path.as_str()).collect();
    let by_name: HashMap<&str, &Param> = m.params.iter().map(|p| (p.name.as_str(), p)).collect();
    for p in &m.params {
        let item = format!("param {}", p.name);
        if p.name.is_empty() {
            cx.err(&item, "empty parameter name");
        }
        if !modules.contains(p.module()) {
            cx.err(&item, format!("module `{}` is not declared", p.module()));
        }
        if p.shape.is_empty() {
            cx.err(&item, "0-dim parameters are not supported (FSDP2 rejects scalar parameters)");
        }
        if p.shape.contains(&0) {
            cx.err(&item, format!("zero-sized dimension in shape {:?}", p.shape));
        }
        if p.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).is_none() {
            cx.err(&item, format!("numel of shape {:?} overflows u64", p.shape));
        }
        if let Some(t) = &p.tied_to {
            match by_name.get(t.as_str()) {
                None => cx.err(&item, format!("tied to unknown parameter `{t}`")),
                Some(q) if q.tied_to.is_some() => {
                    cx.err(&item, format!("tied to `{t}`, which is itself an alias; tie to its primary"))
                }
                Some(q) if q.shape != p.shape => cx.err(
                    &item,
                    format!("tied to `{t}` but shapes differ: {:?} vs {:?}", p.shape, q.shape),
                ),
                Some(q) if q.dtype != p.dtype => cx.err(
                    &item,
                    format!("tied to `{t}` but dtypes differ: {} vs {}", p.dtype, q.dtype),
                ),
                _ => {}
            }
        }
    }
    let total = m
        .primary_params()
        .try_fold(0u64, |a, p| p.shape.iter().try_fold(1u64, |x, &d| x.checked_mul(d)).and_then(|n| a.checked_add(n)));
    if total.is_none() {
        cx.err("params", "total parameter count overflows u64");
    }
    by_name
}

fn check_buffers(cx: &mut Ctx) {
    let m = cx.model;
    dup_check(cx, "buffer", m.buffers.iter().map(|b| b.name.as_str()));
    let modules: HashSet<&str> = m.modules.iter().map(|x| x.path.as_str()).collect();
    for b in &m.buffers {
        let owner = b.name.rsplit_once('.').map(|(a, _)| a).unwrap_or("");
        if !modules.contains(owner) {
            cx.err(format!("buffer {}", b.name), format!("module `{owner}` is not declared"));
        }
        if b.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).is_none() {
            cx.err(format!("buffer {}", b.name), "numel overflows u64");
        }
    }
}

fn check_ops(cx: &mut Ctx, params: &HashMap<&str, &Param>) {
    let m = cx.model;
    dup_check(
        cx,
        "op/input",
        m.ops.iter().map(|o| o.name.as_str()).chain(m.inputs.iter().map(|i| i.name.as_str())),
    );
    let modules: HashSet<&str> = m.modules.iter().map(|x| x.path.as_str()).collect();
    let mut shapes: HashMap<&str, &Shape> = m.inputs.iter().map(|i| (i.name.as_str(), &i.shape)).collect();
    let op_index: HashMap<&str, usize> = m.ops.iter().enumerate().map(|(i, o)| (o.name.as_str(), i)).collect();
    for inp in &m.inputs {
        check_dims(cx, &format!("input {}", inp.name), &inp.shape);
    }
    let g = op_graph(m);
    if let Some(i) = g.find_cycle() {
        cx.err(format!("op {}", m.ops[i].name), "is part of a cycle in the op graph");
    }
    // a training step backpropagates one scalar loss: the last op's
    match m.ops.last() {
        None => cx.err("ops", "no ops: a model needs a forward graph ending in its loss (cross_entropy)"),
        Some(o) if !matches!(o.kind, OpKind::CrossEntropy { .. }) => {
            cx.err(format!("op {}", o.name), "the last op must be the loss (cross_entropy): a training step backpropagates from it")
        }
        Some(_) => {}
    }
    for (i, op) in m.ops.iter().enumerate() {
        let item = format!("op {}", op.name);
        if !modules.contains(op.module.as_str()) {
            cx.err(&item, format!("module `{}` is not declared", op.module));
        }
        check_dims(cx, &item, &op.shape);
        if let Err(msg) = check_attrs(&op.kind) {
            cx.err(&item, msg);
        }
        // what gathers rows reads token ids: integers
        if matches!(op.kind, OpKind::Embedding | OpKind::CrossEntropy { .. }) {
            for inp in &op.inputs {
                if let Some(x) = m.inputs.iter().find(|x| &x.name == inp) {
                    if x.dtype.is_float() {
                        cx.err(&item, format!("input `{inp}` holds token ids but has dtype {}; expected an integer dtype (int64)", x.dtype));
                    }
                }
            }
        }
        let mut in_shapes: Vec<Option<&Shape>> = Vec::new();
        for inp in &op.inputs {
            match (op_index.get(inp.as_str()), shapes.get(inp.as_str())) {
                (Some(&j), _) if j >= i => {
                    cx.err(&item, format!("input `{inp}` is produced later (ops must be in execution order)"));
                    in_shapes.push(None);
                }
                (_, Some(s)) => in_shapes.push(Some(*s)),
                (None, None) => {
                    cx.err(&item, format!("unknown input `{inp}`"));
                    in_shapes.push(None);
                }
                (Some(_), None) => in_shapes.push(None),
            }
        }
        let mut ps: Vec<Option<&Param>> = Vec::new();
        for p in &op.params {
            match params.get(p.as_str()) {
                Some(q) => ps.push(Some(q)),
                None => {
                    cx.err(&item, format!("unknown parameter `{p}`"));
                    ps.push(None)
                }
            }
        }
        if in_shapes.iter().all(Option::is_some) && ps.iter().all(Option::is_some) {
            let ins: Vec<&Shape> = in_shapes.into_iter().flatten().collect();
            let ps: Vec<&Param> = ps.into_iter().flatten().collect();
            if let Err(msg) = check_kind(op, &ins, &ps) {
                cx.err(&item, msg);
            }
        }
        shapes.insert(op.name.as_str(), &op.shape);
    }
}

fn check_dims(cx: &mut Ctx, item: &str, s: &Shape) {
    for d in s {
        if let Dim::Sym(x) = d {
            if x != "batch" && x != "seq" {
                cx.err(item, format!("unknown symbolic dimension `{x}` (only `batch` and `seq`)"));
                return;
            }
        }
    }
    if numel(s, PROBE).is_none() {
        cx.err(item, format!("size of shape {} overflows u64 at batch=2^16, seq=2^20", shape_str(s)));
    }
}

fn n(x: u64) -> Dim {
    Dim::N(x)
}

fn expect_eq(what: &str, got: &[Dim], want: &[Dim]) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: shape {} but expected {}", shape_str(got), shape_str(want)))
    }
}

fn with_last(s: &[Dim], last: u64) -> Shape {
    let mut v = s.to_vec();
    if let Some(x) = v.last_mut() {
        *x = n(last);
    }
    v
}

fn last(s: &[Dim]) -> Option<&Dim> {
    s.last()
}

fn arity(op: &Op, ins: usize, params: std::ops::RangeInclusive<usize>, i: &[&Shape], p: &[&Param]) -> Result<(), String> {
    if i.len() != ins {
        return Err(format!("{} takes {ins} input(s), got {}", op.kind.name(), i.len()));
    }
    if !params.contains(&p.len()) {
        return Err(format!("{} takes {:?} parameter(s), got {}", op.kind.name(), params, p.len()));
    }
    Ok(())
}

fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Shape> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for k in 0..r {
        let x = if k + a.len() >= r { &a[k + a.len() - r] } else { &Dim::N(1) };
        let y = if k + b.len() >= r { &b[k + b.len() - r] } else { &Dim::N(1) };
        out.push(if x == y || *y == Dim::N(1) {
            x.clone()
        } else if *x == Dim::N(1) {
            y.clone()
        } else {
            return None;
        });
    }
    Some(out)
}

/// Shape rules per op kind: inputs and params against the declared output.
/// Attribute values the kernels can compute with (as HF's configs constrain them).
fn check_attrs(k: &OpKind) -> Result<(), String> {
    let prob = |what: &str, p: f64| match (0.0..1.0).contains(&p) {
        true => Ok(()),
        false => Err(format!("{what} {p}: a probability in [0, 1)")),
    };
    match *k {
        OpKind::LayerNorm { eps } | OpKind::RmsNorm { eps, .. } if !(eps.is_finite() && eps > 0.0) => Err(format!("eps {eps}: expected a small positive number")),
        OpKind::Dropout { p } => prob("dropout p", p),
        OpKind::Attention { scaling: Some(s), .. } if !(s.is_finite() && s > 0.0) => Err(format!("attention scaling {s}: expected a positive number")),
        OpKind::Attention { softcap: Some(c), .. } if !(c.is_finite() && c > 0.0) => Err(format!("attention softcap {c}: expected a positive number")),
        OpKind::Attention { dropout, .. } => prob("attention dropout", dropout),
        OpKind::Scale { factor, divide, .. } if !(factor.is_finite() && (!divide || factor != 0.0)) => Err(format!("scale factor {factor}: expected a finite number (non-zero to divide by)")),
        OpKind::RotaryEmbedding { scaling: Some(RopeScaling::Linear { factor }), .. } if !(factor.is_finite() && factor > 0.0) => Err(format!("linear rope scaling factor {factor}: expected a positive number")),
        OpKind::RotaryEmbedding { scaling: Some(RopeScaling::Yarn { factor, original_max_position_embeddings: n, beta_fast, beta_slow, attention_factor, .. }), .. }
            if !(factor.is_finite() && factor > 0.0 && n > 0 && beta_fast.is_finite() && beta_slow.is_finite() && attention_factor.is_finite() && attention_factor > 0.0) =>
        {
            Err(format!("yarn rope scaling (factor {factor}, original_max_position_embeddings {n}, beta_fast {beta_fast}, beta_slow {beta_slow}, attention_factor {attention_factor}): expected positive finite numbers"))
        }
        OpKind::RotaryEmbedding { theta, .. } if !(theta.is_finite() && theta > 0.0) => Err(format!("rope theta {theta}: expected a positive number")),
        OpKind::RotaryEmbedding { scaling: Some(RopeScaling::Llama3 { factor, low_freq_factor: lo, high_freq_factor: hi, original_max_position_embeddings: n }), .. } => {
            if !(factor.is_finite() && factor > 0.0 && lo.is_finite() && lo > 0.0 && hi.is_finite() && hi > lo && n > 0) {
                Err(format!("llama3 rope scaling (factor {factor}, low_freq_factor {lo}, high_freq_factor {hi}, original_max_position_embeddings {n}): expected factor > 0, 0 < low < high, a positive length"))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

fn check_kind(op: &Op, i: &[&Shape], p: &[&Param]) -> Result<(), String> {
    let out = &op.shape;
    match &op.kind {
        OpKind::Embedding | OpKind::PositionEmbedding => {
            arity(op, 1, 1..=1, i, p)?;
            let w = &p[0].shape;
            if w.len() != 2 {
                return Err(format!("embedding weight `{}` must be 2-D", p[0].name));
            }
            let mut want: Shape = if matches!(op.kind, OpKind::PositionEmbedding) {
                vec![n(1), i[0].last().cloned().unwrap_or(n(1))]
            } else {
                i[0].clone()
            };
            want.push(n(w[1]));
            expect_eq("output", out, &want)
        }
        OpKind::Linear { bias, transposed, .. } => {
            arity(op, 1, if *bias { 2..=2 } else { 1..=1 }, i, p)?;
            let w = &p[0].shape;
            if w.len() != 2 {
                return Err(format!("linear weight `{}` must be 2-D", p[0].name));
            }
            let (fan_in, fan_out) = if *transposed { (w[0], w[1]) } else { (w[1], w[0]) };
            if last(i[0]) != Some(&n(fan_in)) {
                return Err(format!(
                    "input `{}` has shape {} but weight `{}` {:?} takes {fan_in} features",
                    op.inputs[0],
                    shape_str(i[0]),
                    p[0].name,
                    w
                ));
            }
            if *bias && p[1].shape != [fan_out] {
                return Err(format!("bias `{}` has shape {:?}, expected [{fan_out}]", p[1].name, p[1].shape));
            }
            expect_eq("output", out, &with_last(i[0], fan_out))
        }
        OpKind::RmsNorm { input_width: Some(w), .. } => {
            arity(op, 1, 1..=1, i, p)?;
            let (Some(Dim::N(o)), Some(x)) = (last(out), last(i[0])) else { return Err(format!("output {} needs a fixed last dim", shape_str(out))) };
            if x != &n(*w) || o >= w {
                return Err(format!("input {} should be {w} wide, more than the output's {o} columns it normalizes", shape_str(i[0])));
            }
            if p[0].numel() != *o {
                return Err(format!("norm weight `{}` {:?} does not match output {}", p[0].name, p[0].shape, shape_str(out)));
            }
            expect_eq("output", out, &with_last(i[0], *o))
        }
        OpKind::RmsNorm { head_dim: Some(hd), .. } => {
            arity(op, 1, 1..=1, i, p)?;
            let per_head = matches!(last(i[0]), Some(Dim::N(l)) if *hd > 0 && l % hd == 0);
            if !per_head {
                return Err(format!("head_dim {hd} does not divide the last dim of input {}", shape_str(i[0])));
            }
            if p[0].numel() != *hd {
                return Err(format!("norm weight `{}` {:?} does not match head_dim {hd}", p[0].name, p[0].shape));
            }
            expect_eq("output", out, i[0])
        }
        OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } => {
            let np = if matches!(op.kind, OpKind::LayerNorm { .. }) { 2 } else { 1 };
            arity(op, 1, np..=np, i, p)?;
            for q in p {
                if last(i[0]) != Some(&n(q.numel())) {
                    return Err(format!("norm weight `{}` {:?} does not match input {}", q.name, q.shape, shape_str(i[0])));
                }
            }
            expect_eq("output", out, i[0])
        }
        OpKind::GatedActivation { .. } => {
            arity(op, 1, 0..=0, i, p)?;
            match (last(i[0]), last(out)) {
                (Some(Dim::N(w)), Some(Dim::N(o))) if *w == 2 * o => Ok(()),
                _ => Err(format!("output {} is not half of input {} (gate and up halves)", shape_str(out), shape_str(i[0]))),
            }
        }
        OpKind::Activation { .. } | OpKind::Dropout { .. } | OpKind::Scale { .. } => {
            arity(op, 1, 0..=0, i, p)?;
            expect_eq("output", out, i[0])
        }
        OpKind::Add | OpKind::Mul => {
            arity(op, 2, 0..=0, i, p)?;
            match broadcast(i[0], i[1]) {
                Some(b) => expect_eq("output", out, &b),
                None => Err(format!(
                    "inputs {} and {} do not broadcast",
                    shape_str(i[0]),
                    shape_str(i[1])
                )),
            }
        }
        OpKind::RotaryEmbedding { head_dim, .. } => {
            arity(op, 1, 0..=0, i, p)?;
            expect_eq("output", out, &[n(1), i[0].last().cloned().unwrap_or(n(1)), n(*head_dim)])
        }
        OpKind::Rope { head_dim, offset: Some(off), head_stride: Some(hs), .. } => {
            arity(op, 2, 0..=0, i, p)?;
            if i[1].last() != Some(&n(*head_dim)) {
                return Err(format!("rotary input has shape {}, expected last dim {head_dim}", shape_str(i[1])));
            }
            match (last(i[0]), last(out)) {
                (Some(Dim::N(w)), Some(Dim::N(o))) if *head_dim > 0 && o % head_dim == 0 && off + head_dim <= *hs && *w == o / head_dim * hs => Ok(()),
                _ => Err(format!("output {} ({head_dim} columns from {off} of each {hs}-wide head) does not fit input {}", shape_str(out), shape_str(i[0]))),
            }
        }
        OpKind::Rope { head_dim, offset: Some(off), .. } => {
            arity(op, 2, 0..=0, i, p)?;
            if i[1].last() != Some(&n(*head_dim)) {
                return Err(format!("rotary input has shape {}, expected last dim {head_dim}", shape_str(i[1])));
            }
            match (last(i[0]), last(out)) {
                (Some(Dim::N(w)), Some(Dim::N(o))) if off + o <= *w && o % head_dim == 0 => Ok(()),
                _ => Err(format!("output {} from column {off} does not fit in input {} (or is not a multiple of head_dim {head_dim})", shape_str(out), shape_str(i[0]))),
            }
        }
        OpKind::Rope { head_dim, .. } => {
            arity(op, 2, 0..=0, i, p)?;
            if i[1].last() != Some(&n(*head_dim)) {
                return Err(format!("rotary input has shape {}, expected last dim {head_dim}", shape_str(i[1])));
            }
            match i[0].last() {
                Some(Dim::N(x)) if x % head_dim == 0 => expect_eq("output", out, i[0]),
                _ => Err(format!("input {} is not a multiple of head_dim {head_dim}", shape_str(i[0]))),
            }
        }
        OpKind::Attention { heads, kv_heads, head_dim, mla: Some(m), .. } => {
            if !p.is_empty() {
                return Err("attention takes no parameters".into());
            }
            if kv_heads != heads || m.nope >= *head_dim {
                return Err(format!("latent attention: kv_heads {kv_heads} must equal heads {heads}, nope {} be less than head_dim {head_dim}", m.nope));
            }
            if i.len() != 4 {
                return Err(format!("latent attention takes 4 inputs (q, q's rotary part, kv_b_proj's output, k's rotary part), got {}", i.len()));
            }
            let r = head_dim - m.nope;
            for (k, want) in [(0, heads * head_dim), (1, heads * r), (2, heads * (m.nope + m.v_head_dim)), (3, r)] {
                if last(i[k]) != Some(&n(want)) {
                    return Err(format!("input `{}` has shape {}, expected last dim {want}", op.inputs[k], shape_str(i[k])));
                }
            }
            expect_eq("output", out, &with_last(i[0], heads * m.v_head_dim))
        }
        OpKind::Attention {
            heads,
            kv_heads,
            head_dim,
            v_offset,
            ..
        } => {
            if !p.is_empty() {
                return Err("attention takes no parameters".into());
            }
            if *kv_heads == 0 || heads % kv_heads != 0 {
                return Err(format!("heads {heads} is not a multiple of kv_heads {kv_heads}"));
            }
            let (q, kv) = (heads * head_dim, kv_heads * head_dim);
            match i.len() {
                1 => {
                    if last(i[0]) != Some(&n(q + 2 * kv)) {
                        return Err(format!("fused qkv input {} should end in {}", shape_str(i[0]), q + 2 * kv));
                    }
                }
                3 => {
                    if let Some(off) = v_offset {
                        if !matches!(last(i[2]), Some(Dim::N(w)) if off + kv <= *w) {
                            return Err(format!("v ({kv} columns from {off}) does not fit in input `{}` {}", op.inputs[2], shape_str(i[2])));
                        }
                    }
                    for (k, want) in [(0, q), (1, kv), (2, kv)] {
                        if k == 2 && v_offset.is_some() {
                            continue;
                        }
                        if last(i[k]) != Some(&n(want)) {
                            return Err(format!(
                                "input `{}` has shape {}, expected last dim {want}",
                                op.inputs[k],
                                shape_str(i[k])
                            ));
                        }
                    }
                }
                k => return Err(format!("attention takes 1 (fused qkv) or 3 inputs, got {k}")),
            }
            expect_eq("output", out, &with_last(i[0], q))
        }
        OpKind::Router { experts, top_k, .. } => {
            arity(op, 1, 0..=0, i, p)?;
            if let OpKind::Router { scaled: Some(sc), .. } = &op.kind {
                let ok = sc.scale.is_finite() && sc.scale > 0.0 && sc.groups.is_none_or(|(g, k)| g > 0 && experts % g == 0 && k > 0 && k <= g && *top_k <= k * (experts / g));
                if !ok {
                    return Err(format!("scaled top-k: a positive scale ({}), the {top_k} experts within the best groups {:?} (n_group, topk_group) of {experts}", sc.scale, sc.groups));
                }
            }
            if let OpKind::Router { sigmoid: Some(g), .. } = &op.kind {
                let per = if g.groups > 0 && experts % g.groups == 0 { experts / g.groups } else { 0 };
                if per < 2 || g.topk_groups == 0 || g.topk_groups > g.groups || *top_k > g.topk_groups * per || !(g.scale.is_finite() && g.scale > 0.0) {
                    return Err(format!("grouped top-k: {experts} experts in {} groups of at least 2, the best {} groups holding the top {top_k}, a positive scale ({})", g.groups, g.topk_groups, g.scale));
                }
            }
            if last(i[0]) != Some(&n(*experts)) {
                return Err(format!("router input (the gate's logits) should end in {experts} experts, got {}", shape_str(i[0])));
            }
            if top_k > experts {
                return Err(format!("top_k {top_k} > experts {experts}"));
            }
            expect_eq("output", out, &with_last(i[0], *top_k))
        }
        OpKind::Experts {
            experts,
            intermediate,
            ..
        } => {
            arity(op, 2, 2..=2, i, p)?;
            let h = match last(i[0]) {
                Some(Dim::N(h)) => *h,
                _ => return Err("hidden input must end in a constant dim".into()),
            };
            if p[0].shape != [*experts, 2 * intermediate, h] {
                return Err(format!("`{}` {:?} should be [{experts}, {}, {h}]", p[0].name, p[0].shape, 2 * intermediate));
            }
            if p[1].shape != [*experts, h, *intermediate] {
                return Err(format!("`{}` {:?} should be [{experts}, {h}, {intermediate}]", p[1].name, p[1].shape));
            }
            expect_eq("output", out, i[0])
        }
        OpKind::CrossEntropy { vocab } => {
            arity(op, 2, 0..=0, i, p)?;
            if last(i[0]) != Some(&n(*vocab)) {
                return Err(format!("logits {} should end in vocab {vocab}", shape_str(i[0])));
            }
            if i[0][..i[0].len() - 1] != i[1][..] {
                return Err(format!("labels {} do not match logits {}", shape_str(i[1]), shape_str(i[0])));
            }
            expect_eq("output", out, &[])
        }
    }
}
