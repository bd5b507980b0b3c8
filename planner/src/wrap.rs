//! Pass 1, wrap policy: which modules get their own FSDP unit (besides the root).

use crate::error::PlanError;
use crate::options::Policy;
use fsdp_ir::{parent_path, Model};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

/// Module tree helpers shared by the passes.
pub struct Tree<'a> {
    pub model: &'a Model,
    /// Children of each module (by index into `model.modules`), in registration order.
    pub children: Vec<Vec<usize>>,
    pub index: HashMap<&'a str, usize>,
}

impl<'a> Tree<'a> {
    pub fn new(model: &'a Model) -> Tree<'a> {
        let index: HashMap<&str, usize> = model
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| (m.path.as_str(), i))
            .collect();
        let mut children = vec![Vec::new(); model.modules.len()];
        for (i, m) in model.modules.iter().enumerate() {
            if let Some(p) = parent_path(&m.path).and_then(|p| index.get(p)) {
                children[*p].push(i);
            }
        }
        Tree {
            model,
            children,
            index,
        }
    }
}

/// The resolved policy: auto → transformer:<the decoder-layer class>, what HF's
/// `_no_split_modules` names for every decoder-only family (`…DecoderLayer`, GPT-2's
/// `GPT2Block`); none for a model without one.
pub fn resolve(model: &Model, policy: &Policy) -> Policy {
    match policy {
        Policy::Auto => {
            let layer = model.modules.iter().map(|m| m.class.as_str()).find(|c| c.ends_with("DecoderLayer") || *c == "GPT2Block");
            match layer {
                Some(c) => Policy::Transformer(vec![c.to_string()]),
                None => Policy::None,
            }
        }
        p => p.clone(),
    }
}

/// Paths of the wrapped non-root modules, in module pre-order.
pub fn wrap(model: &Model, policy: &Policy) -> Result<Vec<String>, PlanError> {
    let tree = Tree::new(model);
    let policy = resolve(model, policy);
    let perr = |m: String| PlanError::Policy {
        policy: policy.to_string(),
        message: m,
    };
    let mut wrapped: HashSet<usize> = HashSet::default();
    match &policy {
        Policy::None | Policy::Auto => {}
        Policy::Transformer(classes) => {
            for c in classes {
                let hits: Vec<usize> = (1..model.modules.len())
                    .filter(|&i| &model.modules[i].class == c)
                    .collect();
                if hits.is_empty() {
                    let mut known: Vec<&str> = model.modules.iter().map(|m| m.class.as_str()).collect();
                    known.sort_unstable();
                    known.dedup();
                    return Err(perr(format!(
                        "class `{c}` matches no module (classes in this model: {})",
                        known.join(", ")
                    )));
                }
                wrapped.extend(hits);
            }
        }
        Policy::Modules(paths) => {
            for p in paths.iter().flat_map(|p| p.split('+')) {
                if p.contains('*') || p.contains('{') {
                    let hits: Vec<usize> = (1..model.modules.len()).filter(|&i| glob_match(p, &model.modules[i].path)).collect();
                    if hits.is_empty() {
                        return Err(perr(format!("the pattern `{p}` matches no module (`*` stands for one path component or part of it, `{{a..b}}` for the numbers a to b)")));
                    }
                    wrapped.extend(hits);
                    continue;
                }
                match tree.index.get(p) {
                    Some(0) => {}
                    Some(&i) => {
                        wrapped.insert(i);
                    }
                    None => return Err(perr(format!("no module at path `{p}`"))),
                }
            }
        }
        Policy::Size(min) => {
            size_wrap(&tree, *min, &mut wrapped);
        }
    }
    let mut v: Vec<usize> = wrapped.into_iter().collect();
    v.sort_unstable();
    Ok(v.into_iter().map(|i| model.modules[i].path.clone()).collect())
}

/// Whether module `path` matches `pattern`, component by component (split at `.`): `*`
/// matches any text within a component (`*` alone, a whole component: `model.layers.*.mlp`),
/// `{a..b}` a number from a to b (`model.layers.{0..7}`), anything else itself.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let mut pc = vec![];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in pattern.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            '.' if depth == 0 => {
                pc.push(&pattern[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pc.push(&pattern[start..]);
    let mc: Vec<&str> = path.split('.').collect();
    pc.len() == mc.len() && pc.iter().zip(&mc).all(|(p, m)| component_match(p, m))
}

fn component_match(p: &str, m: &str) -> bool {
    if p.contains('{') {
        let Some((head, a, b, tail)) = crate::options::brace_range(p) else { return false };
        let Some(mid) = m.strip_prefix(head).and_then(|x| x.strip_suffix(tail)) else { return false };
        return !mid.is_empty() && mid.bytes().all(|c| c.is_ascii_digit()) && mid.parse::<u64>().is_ok_and(|n| (a..=b).contains(&n)) && (mid == "0" || !mid.starts_with('0'));
    }
    wildcard(p.as_bytes(), m.as_bytes())
}

/// `*` as any run of bytes, the rest literally.
fn wildcard(p: &[u8], m: &[u8]) -> bool {
    match p.split_first() {
        None => m.is_empty(),
        Some((b'*', rest)) => (0..=m.len()).any(|k| wildcard(rest, &m[k..])),
        Some((&c, rest)) => m.first() == Some(&c) && wildcard(rest, &m[1..]),
    }
}

/// FSDP1 `size_based_auto_wrap_policy` through `_recursive_wrap`: recurse into a module if
/// its (subtree, deduplicated) numel ≥ min; wrap it if what its children did not wrap is
/// still ≥ min. ModuleList/ModuleDict are never wrapped; the top call only wraps children.
fn size_wrap(tree: &Tree, min: u64, wrapped: &mut HashSet<usize>) {
    let model = tree.model;
    // Params (primary names) registered directly on each module.
    let mut direct: Vec<Vec<(&str, u64)>> = vec![Vec::new(); model.modules.len()];
    for p in &model.params {
        if let Some(&i) = tree.index.get(p.module()) {
            direct[i].push((model.primary_of(&p.name), p.numel()));
        }
    }
    // Subtree numel, deduplicated within the subtree (post-order accumulate of name sets
    // would be quadratic; tied params are rare, so dedupe only names seen twice).
    fn subtree<'a>(tree: &Tree, direct: &[Vec<(&'a str, u64)>], i: usize, out: &mut Vec<(&'a str, u64)>) {
        out.extend_from_slice(&direct[i]);
        for &c in &tree.children[i] {
            subtree(tree, direct, c, out);
        }
    }
    fn numel_of(tree: &Tree, direct: &[Vec<(&str, u64)>], i: usize) -> u64 {
        let mut all = Vec::new();
        subtree(tree, direct, i, &mut all);
        all.sort_unstable();
        all.dedup();
        all.iter().map(|x| x.1).sum()
    }
    fn rec(tree: &Tree, direct: &[Vec<(&str, u64)>], i: usize, min: u64, top: bool, wrapped: &mut HashSet<usize>) -> u64 {
        let n = numel_of(tree, direct, i);
        if n < min {
            return 0;
        }
        let mut total = 0;
        for &c in &tree.children[i] {
            total += rec(tree, direct, c, min, false, wrapped);
        }
        let class = tree.model.modules[i].class.as_str();
        let excluded = class == "ModuleList" || class == "ModuleDict";
        if !top && n.saturating_sub(total) >= min && !excluded {
            wrapped.insert(i);
            n
        } else {
            total
        }
    }
    rec(tree, &direct, 0, min, true, wrapped);
}

/// `--unit-group k`: the wrapped modules as units, runs of consecutive sibling blocks of one
/// class (`model.layers.0`, `model.layers.1`, …) cut into groups of `k` in forward order (a
/// shorter last group), each one FSDP unit as FSDP2's `fully_shard([m0, …, mk-1])` makes it;
/// every other wrapped module its own unit. `k = 1`: one unit per module.
///
/// A `modules:` entry `a+b` (`model.norm+lm_head`) is one unit of those modules, FSDP2's
/// `fully_shard([a, b])` (torchtitan's `fully_shard([model.norm, model.output])`), placed in
/// module pre-order at its first module; `--unit-group` groups the other modules only. Its
/// modules must run forward one after the other, nothing else between them, inside the same
/// unit: FSDP2's group hooks gather at the first one's pre-forward and reshard after the
/// last one's forward, which the schedule models as one run of the unit's ops.
pub fn group(model: &Model, wrapped: &[String], policy: &Policy, k: u32) -> Result<Vec<Vec<String>>, PlanError> {
    let explicit = explicit_groups(model, policy)?;
    if explicit.is_empty() {
        return group_runs(model, wrapped, policy, k);
    }
    let perr = |m: String| PlanError::Policy { policy: policy.to_string(), message: m };
    let inside = |path: &str, m: &str| path == m || path.strip_prefix(m).is_some_and(|x| x.starts_with('.'));
    for g in &explicit {
        let name = g.join("+");
        // the innermost other unit around each member: the same for all
        let around = |m: &str| {
            let mut p = m;
            while let Some(q) = fsdp_ir::parent_path(p) {
                if wrapped.iter().any(|w| w == q) {
                    return q.to_string();
                }
                p = q;
            }
            "the root".to_string()
        };
        let outer: Vec<String> = g.iter().map(|m| around(m)).collect();
        if let Some(i) = outer.iter().position(|o| *o != outer[0]) {
            return Err(perr(format!("`{name}`: `{}` is inside {} but `{}` inside {} (one unit's modules sit in the same unit)", g[0], outer[0], g[i], outer[i])));
        }
        // their forward ops one run, nothing between them
        let ops: Vec<usize> = model.ops.iter().enumerate().filter(|(_, o)| g.iter().any(|m| inside(&o.module, m))).map(|(i, _)| i).collect();
        if let (Some(&a), Some(&b)) = (ops.first(), ops.last()) {
            if b - a + 1 != ops.len() {
                let between = (a..=b).find(|i| !ops.contains(i)).map(|i| model.ops[i].name.as_str()).unwrap_or("");
                return Err(perr(format!("`{name}`: its modules do not run forward one after the other (`{between}` runs between them): FSDP2 would keep them gathered across it, which the plan does not model")));
            }
        }
    }
    let grouped: HashSet<&str> = explicit.iter().flatten().map(String::as_str).collect();
    let rest: Vec<String> = wrapped.iter().filter(|p| !grouped.contains(p.as_str())).cloned().collect();
    if rest.is_empty() && k > 1 {
        return Err(perr(format!("--unit-group {k}: every wrapped module is in a unit of several modules (`a+b`): nothing left to group")));
    }
    let mut out = if rest.is_empty() { vec![] } else { group_runs(model, &rest, policy, k)? };
    out.extend(explicit);
    // (units in module pre-order of their first module, as `wrap` lists modules)
    let tree = Tree::new(model);
    out.sort_by_key(|g| g.first().and_then(|p| tree.index.get(p.as_str()).copied()));
    Ok(out)
}

/// The `a+b` entries of a `modules:` policy, each member an exact module path, in module
/// pre-order; none shared between entries, none inside another, none the root.
fn explicit_groups(model: &Model, policy: &Policy) -> Result<Vec<Vec<String>>, PlanError> {
    let Policy::Modules(entries) = policy else { return Ok(vec![]) };
    let tree = Tree::new(model);
    let perr = |m: String| PlanError::Policy { policy: policy.to_string(), message: m };
    let mut out: Vec<Vec<String>> = vec![];
    let mut seen: HashSet<&str> = HashSet::default();
    for e in entries.iter().filter(|e| e.contains('+')) {
        let mut members: Vec<(usize, String)> = vec![];
        for m in e.split('+') {
            if m.is_empty() {
                return Err(perr(format!("`{e}`: an empty module path (a unit of several modules is `a+b`: `model.norm+lm_head`)")));
            }
            if m.contains(['*', '{']) {
                return Err(perr(format!("`{e}`: a unit of several modules names each by its path (`model.norm+lm_head`), not by a pattern")));
            }
            match tree.index.get(m) {
                Some(0) | None => return Err(perr(format!("`{e}`: no module at path `{m}`"))),
                Some(&i) => members.push((i, m.to_string())),
            }
            if !seen.insert(m) {
                return Err(perr(format!("`{e}`: `{m}` is in more than one unit")));
            }
        }
        members.sort_unstable();
        for (_, a) in &members {
            if let Some((_, b)) = members.iter().find(|(_, b)| b.strip_prefix(a.as_str()).is_some_and(|x| x.starts_with('.'))) {
                return Err(perr(format!("`{e}`: `{b}` is inside `{a}` (one fully_shard call takes modules side by side)")));
            }
        }
        out.push(members.into_iter().map(|(_, m)| m).collect());
    }
    // a member also listed alone (or by a pattern) would be two units' module
    for p in entries.iter().filter(|e| !e.contains('+')) {
        if let Some(m) = out.iter().flatten().find(|m| if p.contains(['*', '{']) { glob_match(p, m) } else { *m == p }) {
            return Err(perr(format!("`{m}` is both in a unit of several modules and a unit of its own (`{p}`)")));
        }
    }
    Ok(out)
}

/// `--unit-group k` over the wrapped modules (none of them in an explicit group).
fn group_runs(model: &Model, wrapped: &[String], policy: &Policy, k: u32) -> Result<Vec<Vec<String>>, PlanError> {
    if k <= 1 {
        return Ok(wrapped.iter().map(|p| vec![p.clone()]).collect());
    }
    let class_of: HashMap<&str, &str> = model.modules.iter().map(|m| (m.path.as_str(), m.class.as_str())).collect();
    let numbered = |p: &str| p.rsplit_once('.').and_then(|(pre, n)| n.parse::<u64>().ok().map(|n| (pre.to_string(), n)));
    let mut out: Vec<Vec<String>> = vec![];
    let mut i = 0;
    while i < wrapped.len() {
        // the run of consecutive siblings of one class starting here
        let mut j = i + 1;
        if let Some((pre, n)) = numbered(&wrapped[i]) {
            while j < wrapped.len() && numbered(&wrapped[j]) == Some((pre.clone(), n + (j - i) as u64)) && class_of.get(wrapped[j].as_str()) == class_of.get(wrapped[i].as_str()) {
                j += 1;
            }
        }
        for chunk in wrapped[i..j].chunks(k as usize) {
            out.push(chunk.to_vec());
        }
        i = j;
    }
    if out.len() == wrapped.len() && !wrapped.is_empty() {
        return Err(PlanError::Policy { policy: policy.to_string(), message: format!("--unit-group {k}: no two wrapped modules are consecutive siblings (model.layers.0, model.layers.1, …) to group") });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn module_patterns_match_whole_components() {
        for (p, m, want) in [
            ("model.layers.*.mlp.experts", "model.layers.12.mlp.experts", true),
            ("model.layers.*.mlp.experts", "model.layers.12.mlp", false),
            ("model.layers.*", "model.layers.3", true),
            ("model.layers.*", "model.layers.3.mlp", false),
            ("model.layers.{0..7}", "model.layers.7", true),
            ("model.layers.{0..7}", "model.layers.8", false),
            ("model.layers.{0..7}", "model.layers.07", false),
            ("model.layers.{2..3}.self_attn", "model.layers.2.self_attn", true),
            ("model.layers.1*", "model.layers.12", true),
            ("model.layers.1*", "model.layers.21", false),
            ("model.*.mlp.*_proj", "model.layers.mlp.gate_proj", true),
            ("lm_head", "lm_head", true),
        ] {
            assert_eq!(glob_match(p, m), want, "{p} vs {m}");
        }
    }
}
