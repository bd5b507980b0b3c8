#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the pinned libtorch (PyTorch 2.11.0 in
# .venv) for the runtime, then runs every crate's tests. Planner fixtures are committed;
# `bash harness/regen.sh` re-records them with real PyTorch.
#
# Every step runs even when an earlier one failed; the script fails at the end, naming the
# steps that failed. The runtime's tests run once more at each x86-64 CPU capability below the
# machine's own (ATEN_CPU_CAPABILITY=avx2, default): libtorch's kernels differ by capability,
# and the suite must hold on whatever machine runs it.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh || { echo "error: could not install the pinned PyTorch into .venv" >&2; exit 1; }
source scripts/env.sh
# a fresh clone builds once: incremental state would only take disk (~1.3 GB)
export CARGO_INCREMENTAL=0

# disk is what a fresh machine can run out of: its free space is printed at the start and
# after a step that failed, so that a failure for want of it says so
echo "=== free disk: $(df -h . | awk 'NR==2 {print $4 " of " $2}')"
failed=()
step() {
  echo "=== $*"
  "$@" || { failed+=("$*"); echo "=== failed: $* (free disk: $(df -h . | awk 'NR==2 {print $4}'))"; }
}

# every case the harness defines has its recorded truth (the conformance suite reads what is there)
step python harness/check_fixtures.py
step cargo test --workspace --all-targets --locked --no-fail-fast
# the binary with the runtime and the GPU backend compiles (cudarc loads CUDA/NCCL at run time)
step cargo build --features cuda --locked
# the runtime's unit tests in the cuda build: the GPU arena's allocator over a fake caching
# allocator, and its installation in front of libtorch's (GPU tests print SKIPPED without one)
step cargo test -p fsdp-runtime --features cuda --lib --locked
# `run`, `launch` and `consolidate` end to end: bad input refused by name, user files kept;
# the trainer's data, schedules and reports; an export transformers loads
step cargo test --features cuda --test cli_run --test hf_export --locked
# the GPU side by side's plumbing, on the CPU: PyTorch FSDP2 (gloo) and fsdp-plan on the same
# weights and tokens, the loss comparison and the report (scripts/gpu-check.sh on a GPU)
step env GPU_CHECK_DRY=cpu FSDP_PLAN_BIN=target/debug/fsdp-plan bash scripts/gpu-check.sh
# the runtime's tests on other CPUs' kernels
native=$(python -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())')
rank() { case "$1" in default) echo 0 ;; avx2) echo 1 ;; *) echo 2 ;; esac; }
for cap in avx2 default; do
  [ "$(rank "$cap")" -lt "$(rank "$native")" ] || continue
  step env ATEN_CPU_CAPABILITY=$cap cargo test -p fsdp-runtime --locked --no-fail-fast
done

if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  echo "free disk at the end: $(df -h . | awk 'NR==2 {print $4 " of " $2}')" >&2
  exit 1
fi
echo "all test steps passed (native CPU capability: $native)"
