//! Errors of the IR crate: parse errors with file:line:col, and validation problems
//! reported all at once.

use std::fmt;

/// One validation problem, naming the offending item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What the problem is about: `op model.layers.0.mlp.up_proj`, `param lm_head.weight`, …
    pub item: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.item, self.message)
    }
}

fn list(ps: &[Problem]) -> String {
    ps.iter().map(|p| format!("\n  - {p}")).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum IrError {
    #[error("{file}:{line}:{col}: {message}")]
    Syntax {
        file: String,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{file}: invalid model ({} problem(s)):{}", problems.len(), list(problems))]
    Invalid { file: String, problems: Vec<Problem> },
    #[error("{file}: {message}")]
    Import { file: String, message: String },
}

/// A serde_json error's line, column counted from 1 (serde_json counts from 0 at a line's
/// start, so an empty file is at `1:0`) and message without its own " at line L column C".
pub fn json_position(e: &serde_json::Error) -> (usize, usize, String) {
    let m = e.to_string();
    let message = m.strip_suffix(&format!(" at line {} column {}", e.line(), e.column())).unwrap_or(&m).to_string();
    (e.line(), e.column().max(1), message)
}

impl IrError {
    pub fn problems(&self) -> &[Problem] {
        match self {
            IrError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}
