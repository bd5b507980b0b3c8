#!/usr/bin/env bash
# Every measured table in bench/, regenerated on this machine by one command:
#   bash bench/run.sh
# - planning speed (criterion, bench/planning.rs), tune's search (bench/tune.rs), tune
#   against brute force (bench/tune_oracle.rs) and against what its space leaves out
#   (bench/tune_space.rs): their tables in bench/RESULTS.md, between
#   the `<!-- bench:NAME -->` and `<!-- /bench -->` marks;
# - predicted against published runs (bench/published.md, `fsdp-plan rows`);
# - with --runtime, also the CPU runtime vs PyTorch FSDP2 table (bench/runtime_vs_fsdp2.py:
#   installs the venv if needed and builds the runtime; a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--runtime" ]; then
  bash scripts/setup-venv.sh
  source scripts/env.sh
  cargo build --release --features runtime
  .venv/bin/python bench/runtime_vs_fsdp2.py
fi
cargo bench --bench planning -- --warm-up-time 1 --measurement-time 5 >/dev/null
tune=$(cargo bench --bench tune 2>/dev/null | grep '^|')
oracle=$(cargo bench --bench tune_oracle 2>/dev/null | grep '^|')
space=$(cargo bench --bench tune_space 2>/dev/null | grep '^|')
python3 - "$tune" "$oracle" "$space" <<'PY'
import json, pathlib, re, sys
def median(path):
    e = json.loads(pathlib.Path(path).read_text())
    m = e["median"]
    return m["point_estimate"] / 1e6, m["confidence_interval"]["lower_bound"] / 1e6, m["confidence_interval"]["upper_bound"] / 1e6
def fmt(ms):
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
a = median("target/criterion/plan llama-3.1-405b ws16384/new/estimates.json")
b = median("target/criterion/synthetic/plan 10000 layers ws64/new/estimates.json")
planning = "\n".join([
    "| benchmark | what | time (criterion median) | target |",
    "|---|---|---:|---:|",
    f"| `plan llama-3.1-405b ws16384` | 126 layers, bf16 params / f32 reduce, seq 8192, checker included | **{fmt(a[0])}** | < 50 ms {'✔' if a[0] < 50 else '✘'} |",
    f"| `synthetic/plan 10000 layers ws64` | Llama-style, 10,000 decoder layers (400k schedule ops, 710k buffers), seq 512, checker included | **{fmt(b[0])}** ({fmt(b[1])}–{fmt(b[2])}) | < 1 s {'✔' if b[0] < 1000 else '✘'} |",
])
p = pathlib.Path("bench/RESULTS.md")
text = p.read_text()
for name, table in [("planning", planning), ("tune", sys.argv[1].strip()), ("tune_oracle", sys.argv[2].strip()), ("tune_space", sys.argv[3].strip())]:
    text, n = re.subn(rf"(<!-- bench:{name} -->\n).*?(\n<!-- /bench -->)", lambda m: m.group(1) + table + m.group(2), text, flags=re.S)
    assert n == 1, f"bench/RESULTS.md: no <!-- bench:{name} --> block"
tmp = p.with_suffix(".md.tmp")
tmp.write_text(text)
tmp.replace(p)
print("bench/RESULTS.md: planning and tune tables regenerated")
PY
UPDATE_DOCS=1 cargo test --release --test readme >/dev/null
echo "bench/published.md (and README's generated blocks) regenerated"
