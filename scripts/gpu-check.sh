#!/usr/bin/env bash
# GPU checks of the CUDA/NCCL backend, for a machine with NVIDIA GPU(s) and a driver for
# CUDA 13 (>= 580; the venv's PyTorch is 2.11.0+cu130, NCCL 2.28). Without a GPU it prints
# SKIPPED and exits 0.
#
# STATUS: written without a GPU; NOT RUN YET. Nothing here has been seen to pass on a GPU.
#
#   bash scripts/gpu-check.sh            # all steps; logs in target/gpu-check/
#
# Steps:
#   1. build the binary with --features runtime,cuda and the NCCL test;
#   2. the NCCL collective test (one rank per GPU, up to 4, ranks as threads, id over the TCP
#      rendezvous): all-gather / reduce-scatter avg / all-reduce avg in f32 and bf16;
#   3. the same check across processes: fsdp-plan launch --nproc-per-node NGPU
#      rendezvous-selftest --collectives nccl;
#   4. a world-size-1 training run with --backend cuda (the executor does not run on CUDA
#      devices yet: this step reports that message until it does), and the CPU run of the
#      same configuration for its losses;
#   5. PyTorch FSDP2 side by side: torchrun scripts/fsdp2_side_by_side.py on NCCL with the
#      same weights/tokens, fsdp-plan's CPU runtime on the same weights/tokens (losses side by
#      side) and fsdp-plan's prediction for the same configuration.
set -uo pipefail
cd "$(dirname "$0")/.."
echo "gpu-check: NOTE: this script was written in a session without a GPU and has not been run on one yet"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIPPED: no CUDA device (nvidia-smi finds no GPU)"
  exit 0
fi
NGPU=$(nvidia-smi -L | grep -c '^GPU')
NP=$(( NGPU < 4 ? NGPU : 4 ))
LOG=target/gpu-check
mkdir -p "$LOG"
nvidia-smi -L
bash scripts/setup-venv.sh
source scripts/cuda-env.sh
.venv/bin/python -c 'import torch; assert torch.cuda.is_available(), "the venv torch sees no GPU"; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' || exit 1

fail=0
step() { # step NAME CMD...: run, log, record failure
  local name=$1; shift
  echo "== $name: $*"
  if "$@" > >(tee "$LOG/$name.log") 2>&1; then echo "== $name: ok"; else echo "== $name: FAILED (log: $LOG/$name.log)"; fail=1; fi
}

step build cargo build --locked --features runtime,cuda
step build-test cargo test --locked -p fsdp-runtime --features cuda --no-run --test nccl_gpu
step nccl-test cargo test --locked -p fsdp-runtime --features cuda --test nccl_gpu -- --nocapture --test-threads=1
if grep -q "SKIPPED: no CUDA device" "$LOG/nccl-test.log"; then echo "== nccl-test: the GPU test SKIPPED itself on a GPU machine"; fail=1; fi
B=target/debug/fsdp-plan
step nccl-launch "$B" launch --nproc-per-node "$NP" --master-port 0 rendezvous-selftest --collectives nccl --timeout-s 120

ARGS=(models/tiny-llama.ron --world-size 1 --batch 2 --seq 32 --steps 10 --format json)
step train-cuda-ws1 "$B" run "${ARGS[@]}" --backend cuda
step train-cpu-ws1 "$B" run "${ARGS[@]}" --backend cpu --device cpu

step fsdp2-side-by-side .venv/bin/torchrun --standalone --nproc-per-node "$NP" scripts/fsdp2_side_by_side.py \
  --model tiny-llama --batch 2 --seq 32 --steps 10 --device cuda --out "$LOG/side-by-side"
step fsdp-plan-same-run "$B" run models/tiny-llama.ron --world-size "$NP" --batch 2 --seq 32 --steps 10 --policy auto \
  --weights "$LOG/side-by-side/init.safetensors" --data "$LOG/side-by-side/tokens.u32" --backend cpu --device cpu
step fsdp-plan-predict "$B" plan models/tiny-llama.ron --world-size "$NP" --batch 2 --seq 32 --hardware h100

if [ "$fail" = 0 ]; then echo "gpu-check: all steps passed"; else echo "gpu-check: some steps FAILED (logs in $LOG/)"; fi
exit "$fail"
