//! Planner errors: bad options and models FSDP would reject, with the offending name.

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("invalid option {option}: {message}")]
    Option { option: String, message: String },
    #[error("wrap policy `{policy}`: {message}")]
    Policy { policy: String, message: String },
    #[error("wrap policy `{policy}` puts the modules sharing tied parameter `{param}` in different FSDP units ({units}); FSDP2 raises ValueError at the first forward. Wrap them in one unit (fully_shard([a, b])) or leave both in a common ancestor")]
    TiedAcrossUnits { policy: String, param: String, units: String },
    #[error("verifier: {0}")]
    Verify(String),
    #[error("checker: {0}")]
    Check(String),
    #[error("plan file: {0}")]
    PlanFile(String),
}

pub fn opt_err(option: &str, message: impl Into<String>) -> PlanError {
    PlanError::Option {
        option: option.to_string(),
        message: message.into(),
    }
}
