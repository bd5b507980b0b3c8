#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the pinned libtorch (PyTorch 2.11.0 in
# .venv) for the runtime, then runs every crate's tests. Planner fixtures are committed;
# `bash harness/regen.sh` re-records them with real PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
source scripts/env.sh
cargo test --workspace --all-targets --locked
cargo build --features cuda --locked   # the binary with the runtime and the GPU backend compiles (cudarc loads CUDA/NCCL at run time)
# the runtime's unit tests in the cuda build: the GPU arena's allocator over a fake caching
# allocator, and its installation in front of libtorch's (GPU tests print SKIPPED without one)
cargo test -p fsdp-runtime --features cuda --lib --locked
# `run`, `launch` and `consolidate` end to end: bad input refused by name, user files kept
cargo test --features cuda --test cli_run --locked
# the GPU side by side's plumbing, on the CPU: PyTorch FSDP2 (gloo) and fsdp-plan on the same
# weights and tokens, the loss comparison and the report (scripts/gpu-check.sh on a GPU)
GPU_CHECK_DRY=cpu FSDP_PLAN_BIN=target/debug/fsdp-plan bash scripts/gpu-check.sh
