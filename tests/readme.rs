//! Figures in the docs come from the binary: every fenced block that follows a
//! `<!-- fsdp-plan ARGS -->` line in README.md and bench/*.md (or, for output that is
//! Markdown itself, every line up to `<!-- /fsdp-plan -->`) must be exactly what
//! `fsdp-plan ARGS` prints now. `UPDATE_DOCS=1 cargo test --test readme` rewrites the blocks
//! (bless), so a change of the model shows up in the docs' diff.

use std::path::{Path, PathBuf};
use std::process::Command;

const MARK: &str = "<!-- fsdp-plan ";
const END: &str = "<!-- /fsdp-plan -->";

fn docs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v = vec![root.join("README.md")];
    if let Ok(rd) = std::fs::read_dir(root.join("bench")) {
        let mut b: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
        b.sort();
        v.extend(b);
    }
    v
}

/// `fsdp-plan ARGS`'s stdout (args split on spaces; none of ours holds one).
fn output(args: &str) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_fsdp-plan")).current_dir(env!("CARGO_MANIFEST_DIR")).args(args.split_whitespace()).output().unwrap();
    assert!(o.status.success(), "fsdp-plan {args}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// The doc with every generated block replaced by the command's output, and the commands
/// whose block differed.
fn regenerate(text: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let (mut out, mut stale) = (String::new(), vec![]);
    let mut i = 0;
    while i < lines.len() {
        out.push_str(lines[i]);
        let Some(args) = lines[i].trim().strip_prefix(MARK).and_then(|r| r.strip_suffix("-->")).map(str::trim) else {
            i += 1;
            continue;
        };
        // the fence right after the mark, its body, its closing fence (or Markdown up to END)
        let fence = lines.get(i + 1).copied().unwrap_or_default();
        let fenced = fence.trim_start().starts_with("```");
        let (start, end) = if fenced {
            (i + 2, (i + 2..lines.len()).find(|&k| lines[k].trim() == "```").unwrap_or_else(|| panic!("unclosed block after `{args}`")))
        } else {
            (i + 1, (i + 1..lines.len()).find(|&k| lines[k].trim() == END).unwrap_or_else(|| panic!("`{MARK}{args} -->` must be followed by a fenced block or end at `{END}`")))
        };
        let body: String = lines[start..end].concat();
        let now = output(args);
        if body != now {
            stale.push(args.to_string());
        }
        if fenced {
            out.push_str(fence);
        }
        out.push_str(&now);
        if !now.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(lines[end]);
        i = end + 1;
    }
    (out, stale)
}

#[test]
fn generated_blocks_match_the_binary() {
    let bless = std::env::var_os("UPDATE_DOCS").is_some();
    let mut problems = vec![];
    let mut blocks = 0;
    for doc in docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        blocks += text.lines().filter(|l| l.trim().starts_with(MARK)).count();
        let (new, stale) = regenerate(&text);
        if stale.is_empty() {
            continue;
        }
        if bless {
            let tmp = doc.with_extension("md.tmp");
            std::fs::write(&tmp, &new).unwrap();
            std::fs::rename(&tmp, &doc).unwrap();
        } else {
            problems.extend(stale.iter().map(|a| format!("{}: `fsdp-plan {a}` prints something else now", doc.display())));
        }
    }
    assert!(blocks > 0, "no generated blocks found");
    assert!(problems.is_empty(), "{}\n(UPDATE_DOCS=1 cargo test --test readme rewrites them)", problems.join("\n"));
}
