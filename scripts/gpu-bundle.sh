#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine without Rust: the release fsdp-plan
# with the runtime and the CUDA/NCCL backend, and the NCCL collective test, stripped, into
# target/gpu-bin/ (carry that folder; they load libtorch from the torch of the python there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
source scripts/env.sh
cargo build --locked --release --features cuda
mkdir -p target/gpu-bin
cp target/release/fsdp-plan target/gpu-bin/fsdp-plan
test_exe=$(cargo test --locked --release -p fsdp-runtime --features cuda --test nccl_gpu --no-run --message-format json 2>/dev/null \
  | python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "nccl_gpu":
        print(m["executable"])')
cp "$test_exe" target/gpu-bin/nccl_gpu
strip target/gpu-bin/fsdp-plan target/gpu-bin/nccl_gpu
# the torch these were built against (gpu-check.sh refuses another: the shim subclasses its allocator)
.venv/bin/python -c 'import torch, transformers; print(torch.__version__, torch.version.git_version, transformers.__version__)' > target/gpu-bin/versions.txt
ls -la target/gpu-bin
