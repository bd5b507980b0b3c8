//! Width-aware layout of the printouts with `pretty` (Wadler-style documents): the plan's
//! unit tree, with runs of like units folded into one line (`model.layers.{0..31}`), the
//! schedule's op lines, whose dependency lists wrap under the op at the page width, and the
//! model IR itself (`fsdp-plan models MODEL`): its module tree with parameters, like blocks
//! folded, and its forward ops.

use crate::plan::Plan;
use crate::units::Unit;
use fsdp_ir::Model;
use pretty::RcDoc;
use rustc_hash::FxHashMap as HashMap;

/// The page width printouts are laid out for.
pub const WIDTH: usize = 120;

fn render(doc: RcDoc<'_>) -> String {
    let mut out = Vec::new();
    // (writing to a Vec cannot fail)
    let _ = doc.render(WIDTH, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `prefix.N` → (`prefix.`, N).
fn numbered(path: &str) -> Option<(&str, u64)> {
    let dot = path.rfind('.')?;
    Some((&path[..dot + 1], path[dot + 1..].parse().ok()?))
}

/// What a unit line says besides its path.
fn unit_words(u: &Unit, n: usize) -> String {
    let raf = match (u.reshard_after_forward, u.reshard_to) {
        (true, Some(n)) => format!("reshard to {n} after forward"),
        (true, None) => "reshard after forward".to_string(),
        (false, _) => "kept after forward".to_string(),
    };
    let each = if n > 1 { " each" } else { "" };
    format!("{}{} ({} params{each}, shard {}) · {raf}", if n > 1 { format!("{n} × ") } else { String::new() }, u.class, crate::print::count(u.numel), crate::print::count(u.shard_numel))
}

/// The units as a tree under the root: each unit nested under the nearest unit whose module
/// contains it, consecutive siblings of one class, size and reshard (its N too) folded into one line
/// (`model.layers.{0..30}: 31 × LlamaDecoderLayer …`).
pub fn unit_tree(plan: &Plan) -> String {
    let units = &plan.units;
    let inside = |a: &str, b: &str| b.is_empty() || a.starts_with(&format!("{b}."));
    // parent: the deepest unit whose module contains this one's (the root contains all)
    let parent: Vec<Option<usize>> = units
        .iter()
        .enumerate()
        .map(|(i, u)| {
            if u.is_root() {
                return None;
            }
            units.iter().enumerate().filter(|(j, v)| *j != i && (v.is_root() || inside(&u.module, &v.module))).max_by_key(|(_, v)| if v.is_root() { 0 } else { v.module.len() + 1 }).map(|(j, _)| j)
        })
        .collect();
    fn node<'a>(plan: &'a Plan, parent: &[Option<usize>], i: usize) -> RcDoc<'a> {
        let units = &plan.units;
        let u = &units[i];
        let name = match (u.is_root(), u.group.last()) {
            (true, _) => "root".to_string(),
            (false, None) => u.module.clone(),
            // (unlike modules, `model.norm+lm_head`, as the policy names them)
            (false, Some(_)) if u.class.contains('+') => u.name(),
            (false, Some(last)) => format!("{} … {last}", u.module),
        };
        let head = RcDoc::text(format!("{name}: {}", unit_words(u, 1)));
        let kids: Vec<usize> = (0..units.len()).filter(|&j| parent[j] == Some(i)).collect();
        // fold runs of numbered siblings alike in class, size and reshard, with no children
        let mut lines: Vec<RcDoc<'a>> = vec![];
        let mut k = 0;
        while k < kids.len() {
            let a = &units[kids[k]];
            let leaf = |j: usize| !parent.contains(&Some(j));
            let mut run = 1;
            // (a unit group of k blocks steps k at a time)
            let stride = 1 + a.group.len() as u64;
            if let (Some((pre, n0)), true) = (numbered(&a.module), leaf(kids[k])) {
                while k + run < kids.len() {
                    let b = &units[kids[k + run]];
                    let alike = b.class == a.class && b.numel == a.numel && b.group.len() == a.group.len() && b.reshard_after_forward == a.reshard_after_forward && b.reshard_to == a.reshard_to && leaf(kids[k + run]);
                    if !(alike && numbered(&b.module) == Some((pre, n0 + stride * run as u64))) {
                        break;
                    }
                    run += 1;
                }
                if run > 1 {
                    let groups = if stride > 1 { format!(" in groups of {stride}") } else { String::new() };
                    lines.push(RcDoc::text(format!("{pre}{{{n0}..{}}}{groups}: {}", n0 + stride * run as u64 - 1, unit_words(a, run))));
                    k += run;
                    continue;
                }
            }
            lines.push(node(plan, parent, kids[k]));
            k += 1;
        }
        if lines.is_empty() {
            return head;
        }
        head.append(RcDoc::hardline().append(RcDoc::intersperse(lines, RcDoc::hardline())).nest(2))
    }
    let roots: Vec<usize> = (0..units.len()).filter(|&i| parent[i].is_none()).collect();
    let docs: Vec<RcDoc> = roots.iter().map(|&r| node(plan, &parent, r)).collect();
    let mut s = render(RcDoc::intersperse(docs, RcDoc::hardline()));
    s.push('\n');
    s
}

/// One schedule line: the op (`id`, stream, what it does), then `after …` its cross-stream
/// dependencies — on the same line when it fits the page, else wrapped under the op, as many
/// per line as fit — then `mark`.
pub fn op_line(id: &str, stream: &str, desc: &str, deps: &[String], mark: &str) -> String {
    let head = RcDoc::text(format!("  {id:<14} {stream:<14} {desc}"));
    let doc = if deps.is_empty() {
        head
    } else {
        let list = RcDoc::intersperse(deps.iter().map(|d| RcDoc::text(d.clone())), RcDoc::text(",").append(RcDoc::softline_()));
        // two spaces before `after` on one line; a new line under the op when it does not fit
        let gap = RcDoc::hardline().flat_alt(RcDoc::text("  "));
        head.append(gap.append(RcDoc::text("after ")).append(list.nest(6)).nest(4).group())
    };
    let mut s = render(doc.append(RcDoc::text(mark.to_string())));
    s.push('\n');
    s
}

/// The model IR as a tree: each module under its parent with its class, its own parameters
/// (shape, dtype, `→` the weight a tied alias shares) and, above the leaves, the parameters
/// of its subtree; runs of numbered siblings with the same structure folded into one line
/// (`layers.{0..31}: 32 × LlamaDecoderLayer`) over the first one's children. With `ops`, then
/// the forward ops in order (`name: kind ← inputs → shape`, inputs wrapped at the page width),
/// a folded run's later blocks as one line.
pub fn model_tree(model: &Model, ops: bool) -> String {
    let n = model.modules.len();
    let index: HashMap<&str, usize> = model.modules.iter().enumerate().map(|(i, m)| (m.path.as_str(), i)).collect();
    fn parent_path(p: &str) -> &str {
        p.rsplit_once('.').map(|(a, _)| a).unwrap_or("")
    }
    let mut kids: Vec<Vec<usize>> = vec![vec![]; n];
    for (i, m) in model.modules.iter().enumerate().skip(1) {
        if let Some(&pi) = index.get(parent_path(&m.path)) {
            kids[pi].push(i);
        }
    }
    let mut own: Vec<Vec<&fsdp_ir::Param>> = vec![vec![]; n];
    for p in &model.params {
        if let Some(&mi) = index.get(p.module()) {
            own[mi].push(p);
        }
    }
    // params of each subtree (a tied alias counted once, with its primary), bottom-up
    let mut total = vec![0u64; n];
    for i in (0..n).rev() {
        total[i] = own[i].iter().filter(|p| p.tied_to.is_none()).map(|p| p.numel()).sum::<u64>() + kids[i].iter().map(|&k| total[k]).sum::<u64>();
    }
    // structure of a subtree relative to its root: what makes two blocks alike
    fn shape_of(model: &Model, kids: &[Vec<usize>], own: &[Vec<&fsdp_ir::Param>], i: usize, base: &str, out: &mut String) {
        let m = &model.modules[i];
        out.push_str(&format!("{}:{};", m.path.strip_prefix(base).unwrap_or(&m.path), m.class));
        for p in &own[i] {
            out.push_str(&format!("{}{:?}{}{};", p.name.strip_prefix(base).unwrap_or(&p.name), p.shape, p.dtype, p.tied_to.is_some()));
        }
        for &k in &kids[i] {
            shape_of(model, kids, own, k, base, out);
        }
    }
    let sig = |i: usize| {
        let mut s = String::new();
        shape_of(model, &kids, &own, i, &model.modules[i].path, &mut s);
        s
    };
    let param_words = |p: &fsdp_ir::Param| {
        let name = p.name.rsplit_once('.').map_or(p.name.as_str(), |x| x.1);
        match &p.tied_to {
            Some(t) => format!("{name} → {t} (tied)"),
            None => format!("{name} {:?} {}", p.shape, p.dtype),
        }
    };
    struct Cx<'a> {
        kids: &'a [Vec<usize>],
        folded: Vec<(String, u64, u64)>,
    }
    let mut cx = Cx { kids: &kids, folded: vec![] };
    #[allow(clippy::too_many_arguments)]
    fn node<'a>(model: &'a Model, cx: &mut Cx, own: &[Vec<&fsdp_ir::Param>], total: &[u64], sig: &dyn Fn(usize) -> String, words: &dyn Fn(&fsdp_ir::Param) -> String, i: usize, label: String, times: usize) -> RcDoc<'a> {
        let m = &model.modules[i];
        let mut head = if times > 1 { format!("{label}: {times} × {}", m.class) } else { format!("{label}: {}", m.class) };
        if !own[i].is_empty() {
            head += &format!(" · {}", own[i].iter().map(|p| words(p)).collect::<Vec<_>>().join(" · "));
        }
        let kids = cx.kids[i].clone();
        if !kids.is_empty() && total[i] > 0 {
            head += &format!(" ({} params{})", crate::print::count(total[i]), if times > 1 { " each" } else { "" });
        }
        let mut lines: Vec<RcDoc<'a>> = vec![];
        let mut k = 0;
        while k < kids.len() {
            let a = kids[k];
            let name = |j: usize| model.modules[j].path.rsplit_once('.').map_or(model.modules[j].path.clone(), |x| x.1.to_string());
            let mut run = 1;
            if let Some((pre, n0)) = numbered(&model.modules[a].path) {
                let s0 = sig(a);
                while k + run < kids.len() && numbered(&model.modules[kids[k + run]].path) == Some((pre, n0 + run as u64)) && sig(kids[k + run]) == s0 {
                    run += 1;
                }
                if run > 1 {
                    let last = n0 + run as u64 - 1;
                    cx.folded.push((pre.to_string(), n0, last));
                    let leaf = pre.trim_end_matches('.').rsplit_once('.').map_or(pre.trim_end_matches('.'), |x| x.1);
                    lines.push(node(model, cx, own, total, sig, words, a, format!("{leaf}.{{{n0}..{last}}}"), run));
                    k += run;
                    continue;
                }
            }
            lines.push(node(model, cx, own, total, sig, words, a, name(a), 1));
            k += 1;
        }
        let head = RcDoc::text(head);
        if lines.is_empty() {
            return head;
        }
        head.append(RcDoc::hardline().append(RcDoc::intersperse(lines, RcDoc::hardline())).nest(2))
    }
    let root = format!("{} ({})", model.name, model.architecture);
    let doc = node(model, &mut cx, &own, &total, &sig, &param_words, 0, root, 1);
    let mut s = render(doc);
    s.push('\n');
    if ops {
        s.push_str(&format!("\nforward ops ({}):\n", model.ops.len()));
        let folded = &cx.folded;
        // the run (and block) an op's module lies in, past a run's first block
        let later = |module: &str| {
            folded.iter().enumerate().find_map(|(r, (pre, n0, n1))| {
                let rest = module.strip_prefix(pre.as_str())?;
                let k: u64 = rest.split('.').next()?.parse().ok()?;
                (k > *n0 && k <= *n1).then_some(r)
            })
        };
        let mut said = vec![false; folded.len()];
        for op in &model.ops {
            if let Some(r) = later(&op.module) {
                if !said[r] {
                    said[r] = true;
                    let (pre, n0, n1) = &folded[r];
                    let per = model.ops.iter().filter(|o| o.module == format!("{pre}{n0}") || o.module.starts_with(&format!("{pre}{n0}."))).count();
                    let rest = if n0 + 1 == *n1 { format!("{pre}{n1}") } else { format!("{pre}{{{}..{n1}}}", n0 + 1) };
                    s.push_str(&format!("  {rest}: the same {per} ops as {pre}{n0}, each\n"));
                }
                continue;
            }
            let shape: Vec<String> = op.shape.iter().map(|d| d.to_string()).collect();
            // the kind as the model file spells it, fields left at their defaults omitted
            let kind = ron::ser::to_string(&op.kind).unwrap_or_else(|_| op.kind.name().to_string()).replace(',', ", ").replace(':', ": ");
            let head = RcDoc::text(format!("  {}: {kind}", op.name));
            let ins = RcDoc::intersperse(op.inputs.iter().map(|i| RcDoc::text(i.clone())), RcDoc::text(",").append(RcDoc::line()));
            let doc = head
                .append(RcDoc::line().append(RcDoc::text("← ")).append(ins.nest(2)).append(RcDoc::line()).append(RcDoc::text(format!("→ [{}]", shape.join(", ")))).nest(6).group());
            s.push_str(&render(doc));
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(config: &str) -> Model {
        fsdp_ir::hf::import_hf(config, "config.json", "m").expect("imports")
    }

    #[test]
    fn like_blocks_fold_and_unlike_ones_do_not() {
        let llama = import(r#"{"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "vocab_size": 50, "tie_word_embeddings": true}"#);
        let t = model_tree(&llama, true);
        assert!(t.contains("layers.{0..3}: 4 × LlamaDecoderLayer"), "{t}");
        assert!(t.contains("lm_head: Linear · weight → model.embed_tokens.weight (tied)"), "{t}");
        // one block's ops, then the other three as one line
        assert!(t.contains("model.layers.0.mlp.down_proj: Linear") && !t.contains("model.layers.2.mlp.down_proj"), "{t}");
        assert!(t.contains("model.layers.{1..3}: the same 16 ops as model.layers.0, each"), "{t}");
        // a dense layer between MoE layers breaks the run: three runs of one
        let moe = import(r#"{"model_type": "qwen3_moe", "hidden_size": 16, "intermediate_size": 32, "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 50, "mlp_only_layers": [1]}"#);
        let t = model_tree(&moe, false);
        assert!(!t.contains("× Qwen3MoeDecoderLayer"), "{t}");
        assert_eq!(t.matches(": Qwen3MoeDecoderLayer").count(), 3, "{t}");
        assert!(t.contains("mlp: Qwen3MoeMLP") && t.contains("mlp: Qwen3MoeSparseMoeBlock"), "{t}");
    }

    #[test]
    fn dependencies_stay_on_the_line_when_they_fit_and_wrap_under_the_op_when_not() {
        let short = op_line("op7", "compute", "copy-out model.layers.0", &["op5".into()], "");
        assert_eq!(short, "  op7            compute        copy-out model.layers.0  after op5\n");
        let many: Vec<String> = (0..40).map(|i| format!("op{}", 1000 + i)).collect();
        let long = op_line("op2000", "compute", "end of backward", &many, "  <- peak");
        let lines: Vec<&str> = long.lines().collect();
        assert!(lines.len() > 2 && lines[0].ends_with("end of backward"), "{long}");
        assert!(lines[1].starts_with("    after op1000,") && lines[2].starts_with("          op10"), "{long}");
        assert!(lines.iter().all(|l| l.len() <= WIDTH), "{long}");
        assert!(long.trim_end().ends_with("op1039  <- peak"), "{long}");
    }
}
