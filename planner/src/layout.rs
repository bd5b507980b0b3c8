//! Width-aware layout of the plan's printouts with `pretty` (Wadler-style documents): the
//! unit tree, with runs of like units folded into one line (`model.layers.{0..31}`), and the
//! schedule's op lines, whose dependency lists wrap under the op at the page width.

use crate::plan::Plan;
use crate::units::Unit;
use pretty::RcDoc;

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
    let raf = if u.reshard_after_forward { "reshard after forward" } else { "kept after forward" };
    let each = if n > 1 { " each" } else { "" };
    format!("{}{} ({} params{each}, shard {}) · {raf}", if n > 1 { format!("{n} × ") } else { String::new() }, u.class, crate::print::count(u.numel), crate::print::count(u.shard_numel))
}

/// The units as a tree under the root: each unit nested under the nearest unit whose module
/// contains it, consecutive siblings of one class, size and reshard folded into one line
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
        let name = if u.is_root() { "root".to_string() } else { u.module.clone() };
        let head = RcDoc::text(format!("{name}: {}", unit_words(u, 1)));
        let kids: Vec<usize> = (0..units.len()).filter(|&j| parent[j] == Some(i)).collect();
        // fold runs of numbered siblings alike in class, size and reshard, with no children
        let mut lines: Vec<RcDoc<'a>> = vec![];
        let mut k = 0;
        while k < kids.len() {
            let a = &units[kids[k]];
            let leaf = |j: usize| !parent.contains(&Some(j));
            let mut run = 1;
            if let (Some((pre, n0)), true) = (numbered(&a.module), leaf(kids[k])) {
                while k + run < kids.len() {
                    let b = &units[kids[k + run]];
                    let alike = b.class == a.class && b.numel == a.numel && b.reshard_after_forward == a.reshard_after_forward && leaf(kids[k + run]);
                    if !(alike && numbered(&b.module) == Some((pre, n0 + run as u64))) {
                        break;
                    }
                    run += 1;
                }
                if run > 1 {
                    lines.push(RcDoc::text(format!("{pre}{{{n0}..{}}}: {}", n0 + run as u64 - 1, unit_words(a, run))));
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

#[cfg(test)]
mod tests {
    use super::*;

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
