//! fsdp-runtime: executes what the planner emits, with tch (libtorch 2.11) for compute and
//! autograd. This crate is a cargo feature of the binary (`--features runtime`), so the
//! planner builds without libtorch.
//!
//! [`ops`]: the op kernels (checked against HF transformers); [`reference`]: single-device
//! autograd; [`exec`]: the sharded executor following a plan's schedule; [`comm`]: the
//! collective trait and CPU rank threads; [`optim`]: AdamW on shards; [`placement`]: which plan buffer each allocation is (the
//! arena); [`train`]: `run`.

pub mod checkpoint;
pub mod comm;
pub mod comm_tcp;
pub mod cuda;
pub mod data;
pub mod error;
pub mod exec;
pub mod launch;
pub mod launch_env;
pub mod lr;
pub mod nccl;
pub mod ops;
pub mod optim;
pub mod placement;
pub mod reference;
pub mod rendezvous;
pub mod selftest;
pub mod shim;
pub mod st_file;
pub mod train;
pub mod watchdog;

pub use error::RtError;
/// The tch the runtime is built with (for callers' tests).
pub use tch;
