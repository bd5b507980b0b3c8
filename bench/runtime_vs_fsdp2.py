"""The CPU runtime against real PyTorch FSDP2 (gloo), the table in bench/RESULTS.md between
`<!-- bench:runtime -->` and `<!-- /bench -->`, regenerated on this machine:

    bash scripts/setup-venv.sh && source scripts/env.sh && cargo build --release --features runtime
    .venv/bin/python bench/runtime_vs_fsdp2.py          # (bash bench/run.sh --runtime runs it too)

For each model: `fsdp-plan run` at world size 2 (one thread per rank) in the plan's arena and
with --no-arena (libtorch's heap), and bench/fsdp2_cpu_tokens.py (fully_shard per block and
root, gloo, one process per rank at one thread) on the same config, batch and sequence.
tokens/s = global batch tokens / median step time over the measured steps after 3 warm-up
steps (fsdp-plan: rank 0's time between the ends of consecutive steps, from its JSON lines).
Figures on a shared VM move with its load: the table says when and where it was measured.
"""
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(REPO, "target", "release", "fsdp-plan")
PY = os.path.join(REPO, ".venv", "bin", "python")
# (name, model file, HF config, batch, seq, measured steps)
MODELS = [
    ("tiny-llama", "models/tiny-llama.ron", "models/tiny-llama.config.json", 4, 64, 20),
    ("llama-small (hidden 256, 4 layers)", "bench/llama-small.ron", "bench/llama-small.config.json", 4, 128, 20),
    ("llama-med (hidden 512, 4 layers)", "bench/llama-med.ron", "bench/llama-med.config.json", 4, 256, 10),
]
WARMUP = 3
WS = 2


def fsdp_plan(model, batch, seq, steps, arena):
    args = [BIN, "run", model, "--world-size", str(WS), "--batch", str(batch), "--seq", str(seq),
            "--steps", str(steps + WARMUP), "--format", "json"] + ([] if arena else ["--no-arena"])
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    tps = [r["tokens_per_s"] for r in rows if "step" in r and "tokens_per_s" in r and r["step"] > WARMUP]
    if len(tps) < steps:
        sys.exit(f"fsdp-plan run {model}: {len(tps)} measured steps in its output, expected {steps}")
    return statistics.median(tps)


def fsdp2(config, batch, seq, steps):
    out = subprocess.run([PY, "bench/fsdp2_cpu_tokens.py", config, "--world-size", str(WS), "--batch", str(batch),
                          "--seq", str(seq), "--steps", str(steps), "--warmup", str(WARMUP)],
                         cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).stdout
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


def main():
    if not os.path.exists(BIN) or not os.path.exists(PY):
        sys.exit("needs target/release/fsdp-plan built with --features runtime and the venv (see the docstring)")
    rows = []
    for name, model, config, batch, seq, steps in MODELS:
        arena = fsdp_plan(model, batch, seq, steps, True)
        heap = fsdp_plan(model, batch, seq, steps, False)
        ref = fsdp2(config, batch, seq, steps)
        g = WS * batch * seq
        rows.append(f"| {name} | {WS} | {batch}×{seq} | {arena:,.0f} ({g / arena * 1e3:.1f} ms/step) | {heap:,.0f} | "
                    f"{ref:,.0f} ({g / ref * 1e3:.1f} ms/step) | **{arena / ref:.2f}×** / {heap / ref:.2f}× |")
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    table = "\n".join([
        "| model | world size | batch×seq per rank | fsdp-plan tokens/s, plan's arena | `--no-arena` (heap) | FSDP2 tokens/s | ratio (arena / heap) |",
        "|---|---:|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {cpu} ({os.cpu_count()} cores), torch "
        + subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
        + f", {WARMUP} warm-up steps then the median of the measured steps; one run of each.",
    ])
    path = os.path.join(REPO, "bench", "RESULTS.md")
    text = open(path).read()
    new, n = re.subn(r"(<!-- bench:runtime -->\n).*?(\n<!-- /bench -->)", lambda m: m.group(1) + table + m.group(2), text, flags=re.S)
    if n != 1:
        sys.exit("bench/RESULTS.md: no <!-- bench:runtime --> block")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)
    print(table)


if __name__ == "__main__":
    main()
