//! What the commands share: reading models, plans and hardware profiles (a bad file is a
//! [`UserError`] naming it, exit code 2), writing outputs atomically, checking that a
//! compiled plan is what its model and options make, and size arguments.

use anyhow::{anyhow, bail, Context, Result};
use fsdp_ir::Model;
use fsdp_planner::hardware::Hardware;
use fsdp_planner::Plan;
use std::path::{Path, PathBuf};

/// Writes command output to stdout. A reader that went away (`fsdp-plan … | head`) ends the
/// program quietly, as a Unix filter ends, instead of the panic `print!` raises.
pub(crate) fn out(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(text).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`out`].
macro_rules! outln {
    ($($t:tt)*) => { $crate::io::out(format_args!("{}\n", format_args!($($t)*))) };
}
pub(crate) use outln;

/// A user error: reported with exit code 2.
#[derive(Debug)]
pub(crate) struct UserError(pub(crate) String);
impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UserError {}

/// Training stopped on a non-finite loss or gradient norm: exit code 3.
#[derive(Debug)]
pub(crate) struct NonFinite(pub(crate) String);
impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for NonFinite {}

pub(crate) fn user<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!(UserError(e.to_string()))
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| user(format!("{}: {e}", path.display())))
}

pub(crate) fn load_model(path: &Path) -> Result<Model> {
    let text = read(path)?;
    let file = path.display().to_string();
    let is_json = path.extension().is_some_and(|e| e == "json");
    let m = if is_json {
        let name = stem(path);
        fsdp_ir::hf::import_hf_report(&text, &file, &name, None).map(|(m, notes)| {
            // a typo in a config is worth a word on every command; the defaults, on `import hf`
            for n in notes.iter().filter(|n| n.starts_with("unknown key")) {
                eprintln!("warning: {file}: {n}");
            }
            m
        })
    } else {
        fsdp_ir::parse_model(&text, &file)
    };
    m.map_err(|e| match looks_like_plan(&text) {
        true => user(format!("{file}: this is a compiled plan, not a model: give it as the plan (`trace`, `plot`, `diff`, `run`), with --model MODEL if its model is not models/<name>.ron")),
        false => user(e),
    })
}

pub(crate) fn stem(path: &Path) -> String {
    let s = path.file_name().and_then(|s| s.to_str()).unwrap_or("model");
    s.trim_end_matches(".json").trim_end_matches(".config").trim_end_matches(".ron").to_string()
}

/// Whether two paths name the same existing file or directory.
#[cfg(feature = "runtime")]
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// Refuses an output path that is one of the command's inputs (or inside an input directory),
/// which the write would replace.
pub(crate) fn not_an_input(out: &Path, inputs: &[&Path]) -> Result<()> {
    let o = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).canonicalize().ok().map(|d| d.join(out.file_name().unwrap_or_default()));
    for i in inputs {
        if let (Some(o), Ok(i)) = (&o, i.canonicalize()) {
            if *o == i || (i.is_dir() && o.starts_with(&i)) {
                bail!(UserError(format!("-o {}: that is the input {}; write the output elsewhere", out.display(), i.display())));
            }
        }
    }
    Ok(())
}

/// Writes via a temp file in the same directory, then renames.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = fsdp_ir::tmp_sibling(path);
    std::fs::write(&tmp, text).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        user(format!("{}: {e}", path.display()))
    })?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        user(format!("{}: {e}", path.display()))
    })
}

pub(crate) fn load_plan(path: &Path) -> Result<Plan> {
    let text = read(path)?;
    let file = path.display();
    if !looks_like_plan(&text) {
        bail!(UserError(format!("{file}: not a compiled plan (`fsdp-plan compile MODEL -o PLAN.ron` makes one; `diff MODEL --policy A --policy B` compares two policies of a model)")));
    }
    let plan: Plan = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| json_error(path, &text, "not a valid plan: ", e))?
    } else {
        ron::from_str::<ron::Value>(&text).map_err(|e| user(format!("{file}:{}:{}: not a plan file: {}", e.position.line, e.position.col, e.code)))?;
        ron::from_str(&text).map_err(|e| user(format!("{file}:{}:{}: not a valid plan: {}", e.position.line, e.position.col, e.code)))?
    };
    if plan.format_version != fsdp_planner::FORMAT_VERSION {
        bail!(UserError(format!("{file}: plan format version {} is not supported (this build reads {})", plan.format_version, fsdp_planner::FORMAT_VERSION)));
    }
    Ok(plan)
}

/// A JSON file's error at its line:column ([`fsdp_ir::error::json_position`]).
pub(crate) fn json_error(path: &Path, text: &str, what: &str, e: serde_json::Error) -> anyhow::Error {
    if text.trim().is_empty() {
        return user(format!("{}: empty file (expected JSON)", path.display()));
    }
    let (line, col, msg) = fsdp_ir::error::json_position(&e);
    user(format!("{}:{line}:{col}: {what}{msg}", path.display()))
}

/// Directories searched for `--hardware NAME` and for the model of a compiled plan: the
/// current directory's, then this repository's.
pub(crate) fn search_dirs(sub: &str) -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from(sub)];
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(sub);
    if std::fs::canonicalize(&repo).ok() != std::fs::canonicalize(&v[0]).ok() {
        v.push(repo);
    }
    v
}

/// `--float8` needs float8 tensor cores (`torch._scaled_mm`: sm89+): refused on a profile
/// without a float8 rate (A100, the CPU), by name.
pub(crate) fn check_float8(hw: &Hardware, float8: bool) -> Result<()> {
    if float8 && hw.peak_flops.fp8.is_none() {
        bail!(UserError(format!("--float8: {} has no float8 tensor cores (torch._scaled_mm needs an H100, H200 or newer; the profile has no `peak_flops.fp8`)", hw.name)));
    }
    Ok(())
}

/// `--hardware NAME|FILE`: a path (has a `/` or ends in `.ron`), else models/hardware/NAME.ron,
/// else the one profile whose name starts with NAME.
pub(crate) fn load_hardware(spec: &str) -> Result<Hardware> {
    let path = if spec.contains('/') || spec.ends_with(".ron") {
        PathBuf::from(spec)
    } else {
        let dirs = search_dirs("models/hardware");
        match dirs.iter().map(|d| d.join(format!("{spec}.ron"))).find(|p| p.is_file()) {
            Some(p) => p,
            None => {
                let mut known: Vec<(String, PathBuf)> = vec![];
                for d in &dirs {
                    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                        let p = e.path();
                        if let Some(n) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".ron")) {
                            if !known.iter().any(|k| k.0 == n) {
                                known.push((n.to_string(), p.clone()));
                            }
                        }
                    }
                }
                known.sort();
                let hits: Vec<&(String, PathBuf)> = known.iter().filter(|k| k.0.starts_with(spec)).collect();
                match hits.as_slice() {
                    [one] => one.1.clone(),
                    _ => bail!(UserError(format!(
                        "--hardware `{spec}`: {} (known: {}; or give a .ron file)",
                        if hits.is_empty() { "no such profile in models/hardware/" } else { "ambiguous" },
                        known.iter().map(|k| k.0.as_str()).collect::<Vec<_>>().join(", ")
                    ))),
                }
            }
        }
    };
    let text = read(&path)?;
    ron::from_str::<Hardware>(&text)
        .map_err(|e| user(format!("{}:{}:{}: not a valid hardware profile: {}", path.display(), e.position.line, e.position.col, e.code)))
}

/// The model a compiled plan was made from: `--model FILE`, else models/<model name>.ron;
/// its hash must equal the plan's.
pub(crate) fn model_of_plan(plan: &Plan, explicit: Option<&Path>) -> Result<Model> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if plan.model_name.is_empty() || plan.model_name.contains(['/', '\\']) || plan.model_name.starts_with('.') => {
            bail!(UserError(format!("the plan's model name `{}` is not a file name in models/; pass --model FILE", plan.model_name)))
        }
        None => search_dirs("models")
            .into_iter()
            .map(|d| d.join(format!("{}.ron", plan.model_name)))
            .find(|p| p.is_file())
            .ok_or_else(|| user(format!("the plan's model `{}` is not in models/; pass --model FILE", plan.model_name)))?,
    };
    let model = load_model(&path)?;
    if fsdp_planner::model_hash(&model) != plan.model_hash {
        let hint = match explicit {
            Some(_) => String::new(),
            None => format!(
                "; it was found by the plan's model name `{}`: if the plan was compiled from another file (a config.json, another dtype), pass that one with --model FILE",
                plan.model_name
            ),
        };
        bail!(UserError(format!("{}: not the model the plan was compiled from (model hash differs){hint}", path.display())));
    }
    Ok(model)
}

/// A compiled plan must be what `compile` makes of its model and options: its hash, and then
/// the whole plan, replanned and compared. An edited plan (offsets, sizes, ids, options) is
/// refused at the first line that differs, rather than run or drawn.
pub(crate) fn verify_plan(path: &Path, plan: &Plan, model: &Model) -> Result<()> {
    let file = path.display();
    let mut fresh = fsdp_planner::plan(model, &plan.options).map_err(|e| user(format!("{file}: the plan's options: {e}")))?;
    // (what a plan file does not hold: whether the builder reached a steady state)
    fresh.steady = plan.steady;
    if fresh.plan_hash != plan.plan_hash {
        bail!(UserError(format!("{file}: plan_hash {} is not the hash of its model and options ({}): edited, or compiled by another version", plan.plan_hash, fresh.plan_hash)));
    }
    if fresh == *plan {
        return Ok(());
    }
    // the text of both only to name where they differ
    let (want, got) = (plan_ron(&fresh)?, plan_ron(plan)?);
    if want != got {
        let (i, (g, w)) = got.lines().zip(want.lines()).enumerate().find(|(_, (g, w))| g != w).unwrap_or((got.lines().count().min(want.lines().count()), ("(end of plan)", "(more)")));
        // the lines around their first difference (a unit's line lists all its params)
        let at = g.char_indices().zip(w.chars()).find(|((_, a), b)| a != b).map_or(g.len().min(w.len()), |((k, _), _)| k);
        let around = |l: &str| {
            let from = l.char_indices().map(|(k, _)| k).rfind(|&k| k <= at.saturating_sub(40)).unwrap_or(0);
            let t: String = l[from..].chars().take(100).collect();
            format!("{}{}{}", if from > 0 { "…" } else { "" }, t.trim(), if l[from..].chars().count() > 100 { "…" } else { "" })
        };
        bail!(UserError(format!(
            "{file}:{}: `{}` where `compile` makes `{}` of the same model and options: the plan was edited (recompile it)",
            i + 1,
            around(g),
            around(w)
        )));
    }
    Ok(())
}

/// A compiled plan and its model (`--model`, else found by name), verified ([`verify_plan`]).
pub(crate) fn load_plan_and_model(path: &Path, model: Option<&Path>) -> Result<(Plan, Model)> {
    let plan = load_plan(path)?;
    let model = model_of_plan(&plan, model)?;
    verify_plan(path, &plan, &model)?;
    Ok((plan, model))
}

/// A compiled plan (RON or JSON, as `compile` writes it) rather than a model or HF config.
pub(crate) fn is_plan_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "ron" || e == "json") && std::fs::read_to_string(path).is_ok_and(|t| looks_like_plan(&t))
}

/// Whether a file's text has a plan's fields (which no model or HF config has).
pub(crate) fn looks_like_plan(text: &str) -> bool {
    text.contains("plan_hash") && text.contains("format_version")
}

/// `80GiB`, `80 GiB`, `80G` (= GiB, as docker reads it), `75GB`, `81559MiB`, `8e10` (bytes);
/// `flag` names the option in the error.
pub(crate) fn parse_size(flag: &str, s: &str) -> Result<u64> {
    parse_size_from(flag, s, false)
}

/// [`parse_size`], zero allowed (a reserve of nothing).
pub(crate) fn parse_size_or_zero(flag: &str, s: &str) -> Result<u64> {
    parse_size_from(flag, s, true)
}

fn parse_size_from(flag: &str, s: &str, zero: bool) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "ki" | "kib" => 1024.0,
        "m" | "mi" | "mib" => 1048576.0,
        "g" | "gi" | "gib" => 1073741824.0,
        "t" | "ti" | "tib" => 1099511627776.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => bail!(UserError(format!("{flag} `{s}`: unknown unit `{u}` (B; KiB, MiB, GiB, TiB or K, M, G, T: powers of 1024; KB, MB, GB, TB: of 1000)"))),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (v > 0.0 || (zero && v == 0.0)) && v * mult < 1.8e19 => Ok((v * mult) as u64),
        _ => bail!(UserError(format!("{flag} `{s}`: expected a size such as 80GiB"))),
    }
}

pub(crate) fn plan_ron(plan: &Plan) -> Result<String> {
    let cfg = ron::ser::PrettyConfig::new().depth_limit(2).struct_names(false);
    ron::ser::to_string_pretty(plan, cfg).context("serializing the plan")
}
