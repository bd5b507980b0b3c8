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
