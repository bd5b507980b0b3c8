#!/usr/bin/env bash
# The whole test suite, on a fresh machine: Rust toolchain only (fixtures are committed).
# `bash harness/regen.sh` (needs .venv: see harness/README.md) regenerates the fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets --locked
