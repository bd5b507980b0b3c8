#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the pinned libtorch (PyTorch 2.11.0 in
# .venv) for the runtime, then runs every crate's tests. Planner fixtures are committed;
# `bash harness/regen.sh` re-records them with real PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
source scripts/env.sh
cargo test --workspace --all-targets --locked
cargo build -p fsdp-runtime --features cuda --locked   # the GPU backend compiles (cudarc loads CUDA/NCCL at run time)
