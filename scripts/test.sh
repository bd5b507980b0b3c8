#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the pinned libtorch (PyTorch 2.11.0 in
# .venv) for the runtime, then runs every crate's tests. Planner fixtures are committed;
# `bash harness/regen.sh` re-records them with real PyTorch.
#
# Every step runs even when an earlier one failed; the script fails at the end, naming the
# steps that failed. The runtime's tests run once more at each x86-64 CPU capability below the
# machine's own (ATEN_CPU_CAPABILITY=avx2, default): libtorch's kernels differ by capability,
# and the suite must hold on whatever machine runs it.
#
# One build serves every step: the workspace's tests with `--features cuda` (the runtime, its
# GPU backend and the CLI's `run`). A second feature set (`-p fsdp-runtime` alone, or `cargo
# build` without the dev-dependencies) unifies the dependencies' features differently and
# rebuilds tch, the runtime and ~60 crates: that was 9 of the suite's 30 minutes (2026-11-29);
# even `cargo check -p fsdp-runtime` (the runtime without `cuda`) took 342 s on a fresh clone.
# So the runtime without its GPU backend (`--features runtime`) is not built here:
# `cargo clippy --workspace --all-targets --features runtime` checks it, by hand (ARCHITECTURE.md).
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
  local t0=$SECONDS
  "$@" || { failed+=("$*"); echo "=== failed: $* (free disk: $(df -h . | awk 'NR==2 {print $4}'))"; }
  echo "=== $(( SECONDS - t0 )) s: $*"
}

# every case the harness defines has its recorded truth (the conformance suite reads what is there)
step python harness/check_fixtures.py
tests=(cargo test --workspace --all-targets --features cuda --locked)
step "${tests[@]}" --no-fail-fast
# the GPU side by side's plumbing, on the CPU: PyTorch FSDP2 (gloo) and fsdp-plan on the same
# weights and tokens, the loss comparison and the report (scripts/gpu-check.sh on a GPU)
step env GPU_CHECK_DRY=cpu FSDP_PLAN_BIN=target/debug/fsdp-plan bash scripts/gpu-check.sh
# the runtime's tests on other CPUs' kernels: the test binaries built above, run again (from
# the crate's directory, as cargo runs them)
runtime_tests() {
  "${tests[@]}" --no-run --message-format=json 2>/dev/null | python -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and m["manifest_path"].endswith("runtime/Cargo.toml"):
        print(m["executable"])'
}
run_at() {
  local cap=$1 bad=0 exe exes
  mapfile -t exes < <(runtime_tests; echo "cargo exit $?")
  # (the listing's last line: cargo's exit status — a build that failed lists a part)
  [ "${exes[-1]}" = "cargo exit 0" ] || { echo "listing the runtime's test binaries failed: ${exes[-1]}" >&2; return 1; }
  unset 'exes[-1]'
  [ ${#exes[@]} -gt 0 ] || { echo "no runtime test binaries found" >&2; return 1; }
  for exe in "${exes[@]}"; do
    echo "--- ATEN_CPU_CAPABILITY=$cap $(basename "$exe")"
    (cd runtime && ATEN_CPU_CAPABILITY=$cap "$exe") || bad=1
  done
  return $bad
}
native=$(python -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())')
rank() { case "$1" in default) echo 0 ;; avx2) echo 1 ;; *) echo 2 ;; esac; }
for cap in avx2 default; do
  [ "$(rank "$cap")" -lt "$(rank "$native")" ] || continue
  step run_at "$cap"
done

if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  echo "free disk at the end: $(df -h . | awk 'NR==2 {print $4 " of " $2}')" >&2
  exit 1
fi
echo "all test steps passed (native CPU capability: $native)"
