"""Summarizes a GPU side-by-side (scripts/gpu-check.sh) as Markdown rows for bench/RESULTS.md,
and checks what the GPU issue asks: the CUDA run's losses equal the CPU runtime's on the same
weights and tokens (within a stated tolerance), and fsdp-plan's tokens/s and peak memory beside
PyTorch FSDP2's on the same model, batch and sequence, with the planner's predicted peak.

    python scripts/gpu_report.py --name gpt2 --ours-cuda A.json --ours-cpu B.json \
        --fsdp2 C.json --plan D.json [--rtol 1e-4] [--out RESULTS-gpu.md]

A.json / B.json: `fsdp-plan run … --format json` (CUDA run, and the CPU run of the same
configuration); C.json: `scripts/fsdp2_side_by_side.py --json`; D.json: `fsdp-plan plan
--format json` of the same configuration. tokens/s: the median over steps after the first two
(warm-up). Exit code 1 when the losses differ by more than --rtol (CUDA vs CPU) or
--fsdp2-rtol (fsdp-plan vs FSDP2).
"""
import argparse
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        text = f.read()
    # `fsdp-plan launch` prefixes lines with "[rank k] "
    lines = [l.split("] ", 1)[1] if l.startswith("[rank ") else l for l in text.splitlines()]
    # `run --format json`: one JSON line per step, then {"summary": …} (rank 0's); other
    # files are one JSON document
    objs = []
    for l in lines:
        l = l.strip()
        if l.startswith("{") and l.endswith("}"):
            try:
                objs.append(json.loads(l))
            except ValueError:
                objs = None
                break
    if objs and any("summary" in o for o in objs):
        doc = dict(next(o["summary"] for o in objs if "summary" in o))
        doc["steps"] = [o for o in objs if "step" in o]
        return doc
    text = "\n".join(lines)
    start = text.find("{")
    return json.loads(text[start:])


def tokens_per_s(steps):
    xs = [s["tokens_per_s"] for s in steps[2:]] or [s["tokens_per_s"] for s in steps]
    return statistics.median(xs)


def gib(b):
    if b is None:
        return "n/a"
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--ours-cuda", required=True)
    ap.add_argument("--ours-cpu", default=None, help="the CPU run of the --loss-cuda configuration")
    ap.add_argument("--loss-cuda", default=None, help="the CUDA run compared with --ours-cpu (default: --ours-cuda)")
    ap.add_argument("--ours-heap", default=None, help="the --ours-cuda run with --no-arena (libtorch's caching allocator)")
    ap.add_argument("--fsdp2", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--fsdp2-rtol", type=float, default=1e-4, help="fsdp-plan vs FSDP2 losses")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    ours, f2, plan = load(a.ours_cuda), load(a.fsdp2), load(a.plan)
    rows, ok = [], True
    if a.ours_cpu:
        gpu, cpu = load(a.loss_cuda or a.ours_cuda), load(a.ours_cpu)
        worst = 0.0
        for g, c in zip(gpu["steps"], cpu["steps"]):
            worst = max(worst, abs(g["loss"] - c["loss"]) / max(abs(c["loss"]), 1e-12))
        ok = worst <= a.rtol
        rows.append(f"- {a.name}: {gpu.get('backend', 'cuda').upper()} vs CPU runtime losses over {min(len(gpu['steps']), len(cpu['steps']))} steps, "
                    f"same weights and tokens: max relative difference {worst:.2e} "
                    f"(tolerance {a.rtol:g}: {'ok' if ok else 'FAILED'})")
    # FSDP2 vs fsdp-plan on the same weights/tokens: losses side by side
    lw = max(abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-12) for x, y in zip(ours["steps"], f2["steps"]))
    ok2 = lw <= a.fsdp2_rtol
    rows.append(f"- {a.name}: fsdp-plan vs FSDP2 losses over {min(len(ours['steps']), len(f2['steps']))} steps on the same weights "
                f"and tokens: max relative difference {lw:.2e} (tolerance {a.fsdp2_rtol:g}: {'ok' if ok2 else 'FAILED'})")
    ok = ok and ok2
    ot, ft = tokens_per_s(ours["steps"]), tokens_per_s(f2["steps"])
    op, fp = ours["steps"][-1].get("peak_bytes"), f2.get("peak_allocated_bytes_rank0")
    pp = plan["memory"]["peak_bytes"]
    table = [
        "| model | GPU | batch × seq | dtype | fsdp-plan tokens/s | FSDP2 tokens/s | ratio | fsdp-plan peak | FSDP2 peak | predicted peak | predicted tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {a.name} | {f2.get('gpu')} | {f2.get('batch')} × {f2.get('seq')} | {f2.get('param_dtype')} | {ot:,.0f} | {ft:,.0f} | "
        f"{ot / ft:.2f}× | {gib(op)} | {gib(fp)} | {gib(pp)} | {plan['time']['tokens_per_s_per_gpu']:,.0f} |",
    ]
    if ours.get("arena"):
        ar = ours["arena"]
        rows.append(f"- {a.name}: fsdp-plan in the plan's arena (last step): {gib(ar['placed_bytes'])} in {ar['placed']} allocations placed at the plan's offsets, "
                    f"{gib(ar['heap_bytes'])} in {ar['heap']} from the caching allocator ({ar['overlaps']} refused a region still in use)")
    if a.ours_heap:
        h = load(a.ours_heap)
        ht, hp = tokens_per_s(h["steps"]), h["steps"][-1].get("peak_bytes")
        rows.append(f"- {a.name}: fsdp-plan with `--no-arena` (libtorch's caching allocator): {ht:,.0f} tokens/s ({ht / ft:.2f}× FSDP2), peak {gib(hp)}")
    text = "\n".join(table + [""] + rows) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
