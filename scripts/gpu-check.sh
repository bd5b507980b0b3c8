#!/usr/bin/env bash
# GPU checks of the CUDA/NCCL runtime, side by side with PyTorch FSDP2, in one command. For a
# machine with NVIDIA GPU(s), a driver for CUDA 13 and PyTorch 2.11 (+ transformers 5.17):
# the project venv (scripts/setup-venv.sh), or, on a machine without Rust or network (the
# device machine), the system python3's torch with binaries built elsewhere by
# `bash scripts/gpu-bundle.sh` (target/gpu-bin/). Without a GPU it prints SKIPPED and exits 0.
#
# STATUS: written without a GPU; NOT RUN ON ONE YET (no session so far was lent a device).
#
#   bash scripts/gpu-check.sh            # logs and JSON in target/gpu-check/ (copied to $OUT)
#
# On the device tool (10 minutes a command), one model per call, on the same warm machine:
#   GPU_CHECK_MODELS=gpt2 bash scripts/gpu-check.sh
#   GPU_CHECK_MODELS=llama-1b bash scripts/gpu-check.sh   # + the cross-calibration (needs gpt2's)
#
# Steps:
#   1. the NCCL collective test (one rank per GPU, up to 4), if its binary is at hand;
#   2. the same across processes: fsdp-plan launch --nproc-per-node NGPU rendezvous-selftest
#      --collectives nccl;
#   3. per model (gpt2 124M; llama-1b: Llama-3.2-1B's shapes, 1.24B parameters), world size 1:
#      a. PyTorch FSDP2 (`fully_shard` per decoder block + root, AdamW, fp32) trains B×S for
#         10 steps and writes the initial weights and tokens;
#      b. fsdp-plan run --backend cuda on the same weights, tokens, optimizer, batch, seq: in
#         the plan's arena (the default), then with --no-arena (libtorch's caching allocator);
#      c. the CUDA run's losses against the CPU runtime's (a short run, same weights/tokens),
#         and against the same run under --offload cpu (its device peak against the plan's);
#         llama-1b: FSDP2 with torchao's float8 linears (weights gathered in float8) against
#         `run --float8 tensorwise --float8-all-gather`, 3 steps;
#      d. fsdp-plan's prediction (plan --hardware h100-sxm);
#      e. scripts/gpu_report.py: tokens/s and peak memory of both, the predicted peak, the
#         loss checks -> RESULTS-gpu.md (rows for bench/RESULTS.md);
#      f. fsdp-plan calibrate on the CUDA run's measured timeline (`run --trace`: device
#         timestamps, collectives on NCCL's stream) -> a fitted profile;
#   4. the profile fitted on gpt2 predicts llama-1b's measured step (the time model's error).
#
# GPU_CHECK_DRY=cpu runs step 3 on the CPU instead (tiny models, gloo, --backend cpu): a check
# of this script's plumbing (and of FSDP2-vs-fsdp-plan losses) on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=target/gpu-check
mkdir -p "$LOG"
# what the last call wrote comes back from $OUT (the device tool), whatever happens below
trap '[ -n "${OUT:-}" ] && cp -r "$LOG"/. "$OUT"/ 2>/dev/null' EXIT
if [ "${GPU_CHECK_DRY:-}" = cpu ]; then
  echo "gpu-check: dry run on the CPU (GPU_CHECK_DRY=cpu)"
  DEV=cpu; SPECS=("tiny-gpt2 2 32" "tiny-llama 2 32"); SHORT=(1 32); RTOL=1e-12; F2RTOL=1e-6; NP=0; HW=cpu
else
  echo "gpu-check: NOTE: written in a session without a GPU; not yet seen to pass on one"
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIPPED: no CUDA device (nvidia-smi finds no GPU)"
    exit 0
  fi
  NGPU=$(nvidia-smi -L | grep -c '^GPU')
  NP=$(( NGPU < 4 ? NGPU : 4 ))
  nvidia-smi -L
  # model, batch, seq of the side by side (fp32, AdamW as FSDP2's script); fp32 matmuls are
  # full fp32 on both sides (PyTorch's default: no TF32), hence the tight loss tolerance
  DEV=cuda; SPECS=("gpt2 8 1024" "llama-1b 4 1024"); SHORT=(1 128); RTOL=1e-4; F2RTOL=1e-4; HW=h100
  ldd --version 2>&1 | head -1   # the binaries need glibc >= 2.34 (built on Debian 12)
fi
ALL_SPECS=("${SPECS[@]}")
if [ -n "${GPU_CHECK_MODELS:-}" ]; then # a subset, by name (one call per model on the device tool)
  SPECS=(); for spec in "${ALL_SPECS[@]}"; do set -- $spec; [[ " $GPU_CHECK_MODELS " == *" $1 "* ]] && SPECS+=("$spec"); done
  [ ${#SPECS[@]} -gt 0 ] || { echo "gpu-check: GPU_CHECK_MODELS=$GPU_CHECK_MODELS names none of: ${ALL_SPECS[*]}"; exit 2; }
fi

# python with torch: the project venv, else the system's
if [ -x .venv/bin/python ]; then PY=.venv/bin/python
elif command -v cargo >/dev/null; then bash scripts/setup-venv.sh && PY=.venv/bin/python
else PY=python3; fi
$PY -c 'import sys, torch, transformers; assert sys.argv[1] == "cpu" or torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "devices", torch.cuda.device_count())' "$DEV" || exit 1
TORCHLIB=$($PY -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
# the binaries were built against one torch: the same one must run them (the C++ shim
# subclasses libtorch's CUDA allocator, whose layout changes between builds)
if [ -f target/gpu-bin/versions.txt ]; then
  HERE=$($PY -c 'import torch, transformers; print(torch.__version__, torch.version.git_version, transformers.__version__)')
  if [ "$HERE" != "$(cat target/gpu-bin/versions.txt)" ]; then
    echo "gpu-check: the binaries were built for torch/transformers $(cat target/gpu-bin/versions.txt); this python has $HERE"
    [ -n "${GPU_CHECK_IGNORE_VERSIONS:-}" ] || { echo "gpu-check: rebuild with scripts/gpu-bundle.sh against this torch (or set GPU_CHECK_IGNORE_VERSIONS=1 to try anyway)"; exit 1; }
  fi
fi
# libtorch finds the CUDA libraries through its RPATH (../../nvidia/*/lib), which holds where
# pip put torch and nvidia-* in one site-packages; otherwise the loader path must name them
NVLIBS=$($PY -c 'import os, nvidia; print(":".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, d, "lib"))))' 2>/dev/null || true)
# cudarc dlopens libnccl.so; the wheels ship libnccl.so.2
NCCL=$($PY -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
mkdir -p target/nccl-lib
[ -n "$NCCL" ] && [ -e "$NCCL" ] && ln -sf "$NCCL" target/nccl-lib/libnccl.so
export LD_LIBRARY_PATH="$PWD/target/nccl-lib:$TORCHLIB${NVLIBS:+:$NVLIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TORCHRUN=("$PY" -m torch.distributed.run)

# the binaries: prebuilt (gpu-bundle.sh), else built here
B=${FSDP_PLAN_BIN:-target/gpu-bin/fsdp-plan}
if [ ! -x "$B" ]; then
  if command -v cargo >/dev/null; then bash scripts/gpu-bundle.sh || exit 1
  else echo "gpu-check: no $B and no cargo: run scripts/gpu-bundle.sh on a machine with Rust and carry target/gpu-bin"; exit 1; fi
fi

fail=0
step() { # step NAME CMD...: run, log, record failure
  local name=$1; shift
  echo "== $name: $*"
  # (a pipe, not a process substitution: the log is complete when the step returns)
  "$@" 2>&1 | tee "$LOG/$name.log"
  if [ "${PIPESTATUS[0]}" = 0 ]; then echo "== $name: ok"; else echo "== $name: FAILED (log: $LOG/$name.log)"; fail=1; fi
}
json() { # json FILE CMD...: stdout to FILE, stderr to the log
  local f=$1; shift
  echo "== $(basename "$f"): $*"
  "$@" 2>&1 > "$f" | tee "$f.err" >&2 # (stderr through the pipe: complete when the step returns)
  if [ "${PIPESTATUS[0]}" = 0 ]; then echo "== ok"; else echo "== FAILED ($f.err)"; fail=1; fi
}

if [ "$DEV" = cuda ]; then
  if [ -x target/gpu-bin/nccl_gpu ]; then
    step nccl-test target/gpu-bin/nccl_gpu --nocapture --test-threads=1
    grep -q "SKIPPED: no CUDA device" "$LOG/nccl-test.log" && { echo "== nccl-test SKIPPED itself on a GPU machine"; fail=1; }
  fi
  step nccl-launch "$B" launch --nproc-per-node "$NP" --master-port 0 rendezvous-selftest --collectives nccl --timeout-s 120
fi

for spec in "${SPECS[@]}"; do
  set -- $spec; M=$1; BS=$2; SEQ=$3
  W=target/side-by-side/$M
  step "$M-fsdp2" "${TORCHRUN[@]}" --standalone --nproc-per-node 1 scripts/fsdp2_side_by_side.py \
    --model "$M" --batch "$BS" --seq "$SEQ" --steps 10 --device "$DEV" --out "$W" --json "$LOG/$M-fsdp2.json"
  # the model as the FSDP2 script builds it: its config with dropout 0 (GPT-2's is 0.1)
  mkdir -p "$W"
  "$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "summary_first_dropout", "hidden_dropout", "mlp_dropout"):
    if k in d: d[k] = 0.0
json.dump(d, open(sys.argv[2], "w"), indent=1)' "models/$M.config.json" "$W/model.config.json"
  step "$M-import" "$B" import hf "$W/model.config.json" -o "$W/model.ron" --name "$M"
  COMMON=("$W/model.ron" --world-size 1 --policy auto --optimizer adamw --lr 1e-3 --weights "$W/init.safetensors" --data "$W/tokens.u32" --format json)
  json "$LOG/$M-cuda.json" "$B" run "${COMMON[@]}" --batch "$BS" --seq "$SEQ" --steps 10 --backend "$DEV" --trace "$LOG/$M-trace.json"
  # the same in libtorch's caching allocator instead of the plan's arena
  json "$LOG/$M-cuda-heap.json" "$B" run "${COMMON[@]}" --batch "$BS" --seq "$SEQ" --steps 10 --backend "$DEV" --no-arena
  # losses: CUDA vs the CPU runtime on a short run of the same weights and tokens
  json "$LOG/$M-cuda-short.json" "$B" run "${COMMON[@]}" --batch "${SHORT[0]}" --seq "${SHORT[1]}" --steps 3 --backend "$DEV"
  json "$LOG/$M-cpu-short.json" "$B" run "${COMMON[@]}" --batch "${SHORT[0]}" --seq "${SHORT[1]}" --steps 3 --backend cpu
  # --offload cpu (FSDP2's CPUOffloadPolicy): shards, grads and AdamW on the host; the losses
  # of the run without (within RTOL: the optimizer's kernels are the CPU's), the device's
  # measured peak within 2% of the plan's
  json "$LOG/$M-offload-short.json" "$B" run "${COMMON[@]}" --batch "${SHORT[0]}" --seq "${SHORT[1]}" --steps 3 --backend "$DEV" --offload cpu
  step "$M-offload" "$PY" - "$LOG/$M-cuda-short.json" "$LOG/$M-offload-short.json" "$RTOL" <<'PYEOF'
import json, sys
rows = lambda p: [json.loads(l) for l in open(p) if l.strip()]
a, b, rtol = rows(sys.argv[1]), rows(sys.argv[2]), float(sys.argv[3])
la, lb = [r["loss"] for r in a if "step" in r], [r["loss"] for r in b if "step" in r]
assert len(la) == len(lb) == 3 and all(abs(x - y) <= rtol * abs(x) for x, y in zip(la, lb)), (la, lb)
s = b[-1]["summary"]
m, p = s["measured_peak_bytes"], s["predicted_peak_bytes"]
assert abs(m / p - 1) < 0.02, f"device peak {m} B measured, {p} B planned"
print(f"offload: losses {lb} (without: {la}); device peak {m} B measured vs {p} B planned")
PYEOF
  # torchao's float8 linears, weights gathered in float8 (torchtitan's --float8 with
  # enable_fsdp_float8_all_gather): FSDP2 + torchao 0.18 against `run --float8 tensorwise
  # --float8-all-gather`, 3 steps of the short run's shape (Llama: GPT-2's Conv1D is no
  # nn.Linear; needs torchao beside torch, which scripts/setup-venv.sh installs)
  if [[ $M == *llama* ]] && "$PY" -c 'import torchao, sys; sys.exit(torchao.__version__ != "0.18.0")' 2>/dev/null; then
    step "$M-fsdp2-float8" "${TORCHRUN[@]}" --standalone --nproc-per-node 1 scripts/fsdp2_side_by_side.py --model "$M" --batch "${SHORT[0]}" \
      --seq "${SHORT[1]}" --steps 3 --device "$DEV" --out "$W" --json "$LOG/$M-fsdp2-float8.json" --float8 --float8-all-gather
    json "$LOG/$M-float8-short.json" "$B" run "${COMMON[@]}" --batch "${SHORT[0]}" --seq "${SHORT[1]}" --steps 3 --backend "$DEV" --float8 tensorwise --float8-all-gather
    step "$M-float8" "$PY" - "$LOG/$M-fsdp2-float8.json" "$LOG/$M-float8-short.json" "$F2RTOL" <<'PYEOF'
import json, sys
a = json.load(open(sys.argv[1]))
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
la, lb, rtol = [r["loss"] for r in a["steps"]], [r["loss"] for r in b if "step" in r], float(sys.argv[3])
assert a["float8"] and a["float8_all_gather"], a
assert len(la) == len(lb) == 3 and all(abs(x - y) <= rtol * abs(x) for x, y in zip(la, lb)), (la, lb)
print(f"float8: FSDP2 + torchao {la}, fsdp-plan {lb}")
PYEOF
  elif [[ $M == *llama* ]]; then
    echo "== $M-float8: SKIPPED (no torchao 0.18.0 beside this torch)"
  fi
  json "$LOG/$M-plan.json" "$B" plan "$W/model.ron" --world-size 1 --policy auto --optimizer adamw --batch "$BS" --seq "$SEQ" --hardware h100-sxm --device "$DEV" --format json
  step "$M-report" "$PY" scripts/gpu_report.py --name "$M" --ours-cuda "$LOG/$M-cuda.json" --ours-heap "$LOG/$M-cuda-heap.json" --loss-cuda "$LOG/$M-cuda-short.json" \
    --ours-cpu "$LOG/$M-cpu-short.json" --fsdp2 "$LOG/$M-fsdp2.json" --plan "$LOG/$M-plan.json" --rtol "$RTOL" --fsdp2-rtol "$F2RTOL" --out "$LOG/RESULTS-gpu.md"
  # the time model: the hardware profile fitted to this run's measured timeline (device
  # timestamps on a GPU), and its step-time error before and after
  PLANOPTS=("$W/model.ron" --world-size 1 --policy auto --optimizer adamw --batch "$BS" --seq "$SEQ")
  step "$M-calibrate" "$B" calibrate "${PLANOPTS[@]}" --trace "$LOG/$M-trace.json" --hardware "$HW" -o "$LOG/$M-calibrated.ron"
  echo "- $M: \`fsdp-plan calibrate\` on its own measured step: $(grep -h 'measured step' "$LOG/$M-calibrate.log")" >> "$LOG/RESULTS-gpu.md"
done

# the calibrated time model predicts the other architecture: the profile fitted on the first
# model's run, the second model's measured step (goal: within 10%); with both models' runs in
# $LOG (this call's or an earlier one's on the same machine)
set -- ${ALL_SPECS[0]}; M1=$1
set -- ${ALL_SPECS[1]}; M2=$1; BS=$2; SEQ=$3
if [ -f "$LOG/$M1-calibrated.ron" ] && [ -f "$LOG/$M2-trace.json" ]; then
step cross-calibration "$B" calibrate "target/side-by-side/$M2/model.ron" --world-size 1 --policy auto --optimizer adamw --batch "$BS" --seq "$SEQ" \
  --trace "$LOG/$M2-trace.json" --hardware "$LOG/$M1-calibrated.ron" -o "$LOG/$M2-from-$M1.ron"
echo "- $M2 predicted with the profile calibrated on $M1: $(grep -h 'measured step' "$LOG/cross-calibration.log")" >> "$LOG/RESULTS-gpu.md"
else
  echo "== cross-calibration: not yet ($M1's calibrated profile and $M2's trace are both needed)"
fi

if [ "$fail" = 0 ]; then echo "gpu-check: all steps passed"; else echo "gpu-check: some steps FAILED (logs in $LOG/)"; fi
exit "$fail"
