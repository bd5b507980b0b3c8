#!/usr/bin/env bash
# Regenerate every ground-truth fixture (needs .venv with torch==2.11.0, transformers==5.17.0):
#   bash harness/regen.sh            (from the repo root or anywhere; about half an hour on 2 CPU cores)
# Writes tests/fixtures/hf_params/*.json, tests/fixtures/fsdp2{,_fake,_fakegpu,_compile}/*.json, tests/fixtures/train/,
# tests/fixtures/fsdp1{,_fake,_fakegpu}/*.json and tests/fixtures/runtime/<name>/ (each file atomically), then
# deletes fixtures whose model config / case no longer exists.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=.venv/bin/python
"$PY" harness/hf_params.py
"$PY" harness/fsdp2_oracle.py
"$PY" harness/fsdp2_fake.py
"$PY" harness/fsdp1_oracle.py
"$PY" harness/fsdp1_fake.py
"$PY" harness/hf_parity.py
"$PY" harness/train_parity.py
"$PY" harness/tokenizer_fixture.py
# (torch.optim's results, harness/optim_parity.py, are computed by runtime/tests/hf_parity.rs
# when it runs, on the machine it runs on: not recorded)
for f in tests/fixtures/hf_params/*.json; do
  n=$(basename "$f" .json); [ -f "models/$n.config.json" ] || { echo "removing stale $f"; rm -f "$f"; }
done
cases=$("$PY" harness/fsdp2_oracle.py --list)
for f in tests/fixtures/fsdp2/*.json; do
  n=$(basename "$f" .json); grep -qx "$n" <<<"$cases" || { echo "removing stale $f"; rm -f "$f"; }
done
cases=$("$PY" harness/fsdp2_fake.py --list)
for f in tests/fixtures/fsdp2_fake/*.json tests/fixtures/fsdp2_fakegpu/*.json tests/fixtures/fsdp2_compile/*.json; do
  n=$(basename "$f" .json); grep -qx "$n" <<<"$cases" || { echo "removing stale $f"; rm -f "$f"; }
done
cases=$("$PY" harness/fsdp1_fake.py --list)
for f in tests/fixtures/fsdp1_fake/*.json tests/fixtures/fsdp1_fakegpu/*.json; do
  n=$(basename "$f" .json); grep -qx "$n" <<<"$cases" || { echo "removing stale $f"; rm -f "$f"; }
done
cases=$("$PY" harness/fsdp1_oracle.py --list)
for f in tests/fixtures/fsdp1/*.json; do
  n=$(basename "$f" .json); grep -qx "$n" <<<"$cases" || { echo "removing stale $f"; rm -f "$f"; }
done
models=$("$PY" harness/hf_parity.py --list)
for d in tests/fixtures/runtime/*/; do
  [ -d "$d" ] || continue
  n=$(basename "$d"); grep -qx "$n" <<<"$models" || { echo "removing stale $d"; rm -rf "$d"; }
done
"$PY" harness/check_fixtures.py
