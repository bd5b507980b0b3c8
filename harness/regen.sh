#!/usr/bin/env bash
# Regenerate every ground-truth fixture (needs .venv with torch==2.11.0, transformers==5.17.0):
#   bash harness/regen.sh            (from the repo root or anywhere; ~3 min on 2 CPU cores)
# Writes tests/fixtures/hf_params/*.json and tests/fixtures/fsdp2/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=.venv/bin/python
rm -f tests/fixtures/hf_params/*.json tests/fixtures/fsdp2/*.json
"$PY" harness/hf_params.py
"$PY" harness/fsdp2_oracle.py
