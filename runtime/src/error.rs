//! Runtime errors, naming the op, file or parameter at fault.

#[derive(Debug, thiserror::Error)]
pub enum RtError {
    #[error("op {op}: {message}")]
    Op { op: String, message: String },
    #[error("{file}: {message}")]
    File { file: String, message: String },
    #[error("parameter `{name}`: {message}")]
    Param { name: String, message: String },
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("{0}")]
    Plan(String),
    /// A collective failed: a peer left or did not answer in time, an NCCL error.
    #[error("{0}")]
    Comm(String),
    /// A non-finite loss or gradient norm (the run stops: exit 3).
    #[error("non-finite: {0}")]
    NonFinite(String),
}
