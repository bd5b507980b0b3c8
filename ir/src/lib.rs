//! fsdp-ir: the model IR of fsdp-plan.
//!
//! A model file (RON) holds the module tree, the parameters (with tied aliases), the
//! buffers and the forward op graph with symbolic shapes. This crate parses, validates,
//! prints and imports (from HF `config.json`) such models. It does no IO: callers pass
//! file contents and names in, and get text back.

pub mod error;
pub mod graph;
pub mod hf;
pub mod model;
pub mod validate;

pub use error::{IrError, Problem};
pub use model::*;

/// The temp file a write to `path` goes through before its rename (every file fsdp-plan
/// writes, so that an interrupted write never leaves a half file under the user's name):
/// hidden, beside it, named for this process. Only the name: no IO here.
pub fn tmp_sibling(path: &std::path::Path) -> std::path::PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    path.with_file_name(format!(".{name}.tmp{}", std::process::id()))
}

/// Parses and validates a model file's text. `file` names it in errors.
pub fn parse_model(text: &str, file: &str) -> Result<Model, IrError> {
    let model: Model = ron::Options::default()
        .from_str(text)
        .map_err(|e| IrError::Syntax {
            file: file.to_string(),
            line: e.position.line,
            col: e.position.col,
            message: e.code.to_string(),
        })?;
    let problems = validate::validate(&model);
    if problems.is_empty() {
        Ok(model)
    } else {
        Err(IrError::Invalid {
            file: file.to_string(),
            problems,
        })
    }
}

/// Pretty RON text of a model (what `import hf` writes).
pub fn to_ron(model: &Model) -> String {
    let cfg = ron::ser::PrettyConfig::new()
        .depth_limit(3)
        .indentor("  ".to_string())
        .struct_names(false);
    // Serializing plain data with string keys cannot fail.
    ron::ser::to_string_pretty(model, cfg).unwrap_or_default()
}
