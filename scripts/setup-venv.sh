#!/usr/bin/env bash
# Project-local Python venv with the pinned PyTorch / transformers (the runtime links this
# libtorch through tch; the harness uses it to record fixtures). Idempotent; ~2 min and
# ~4 GB the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! .venv/bin/python -c 'import torch, transformers, safetensors, sys; sys.exit(0 if torch.__version__.startswith("2.11.0") and transformers.__version__ == "5.17.0" else 1)' 2>/dev/null; then
  "$PY" -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check torch==2.11.0 transformers==5.17.0 safetensors
fi
# the CUDA runtime headers' crt/ part (134 kB), which pip's nvidia-cuda-runtime wheel leaves
# out: the `cuda` build compiles the GPU arena's allocator against c10/cuda's headers
if ! ls .venv/lib/python3*/site-packages/nvidia/cu13/include/crt/host_defines.h >/dev/null 2>&1; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps nvidia-cuda-crt==13.0.88
fi
# torchao's float8 training (torchtitan's --float8): the runtime's float8 test runs torchao as
# its truth (harness/float8_parity.py), and the harness records float8 conformance cases
if ! .venv/bin/python -c 'import torchao, sys; sys.exit(0 if torchao.__version__ == "0.18.0" else 1)' 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps torchao==0.18.0
fi
