//! fsdp-runtime: executes what the planner emits, with tch (libtorch 2.11) for compute and
//! autograd. This crate is a cargo feature of the binary (`--features runtime`), so the
//! planner builds without libtorch.
//!
//! Grouped by concern:
//! - [`exec`]: running a plan on one rank — the schedule executor, the op kernels
//!   ([`exec::ops`], checked against HF transformers), single-device autograd
//!   ([`exec::reference`]), the optimizers on shards ([`exec::optim`]), the plan's arena
//!   ([`exec::placement`], [`exec::shim`]: what tch lacks, in C++) and CUDA streams/events
//!   ([`exec::cuda`]);
//! - [`comm`]: collectives — the [`comm::Collective`] trait and CPU rank threads, TCP
//!   between CPU processes ([`comm::tcp`]), NCCL ([`comm::nccl`]), the rendezvous that
//!   starts them ([`comm::rendezvous`]) and their self-test ([`comm::selftest`]);
//! - [`launch`]: starting ranks like torchrun, reading the launcher's variables
//!   ([`launch::env`]), the watchdog that ends a stuck job ([`launch::watchdog`]);
//! - [`train`]: `fsdp-plan run` — the per-rank training loop, its data ([`train::data`]),
//!   learning-rate schedules ([`train::lr`]), checkpoints ([`train::checkpoint`],
//!   [`train::st_file`]).
//!
//! The old flat paths (`fsdp_runtime::ops`, `::nccl`, …) stay as re-exports.

pub mod comm;
pub mod error;
pub mod exec;
pub mod launch;
pub mod train;

pub use comm::{nccl, rendezvous, selftest, tcp as comm_tcp};
pub use error::RtError;
pub use exec::{cuda, float8, ops, optim, placement, reference, shim};
pub use launch::{env as launch_env, watchdog};
/// The tch the runtime is built with (for callers' tests).
pub use tch;
pub use train::{checkpoint, data, lr, st_file};
