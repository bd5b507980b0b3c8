#!/usr/bin/env bash
# Compares two fsdp-plan binaries' `tune` answers over the model zoo (every non-tiny model in
# models/, at its default limit and under 60 GiB, on H100s): a change to the search must give
# the same answer (tokens/s/GPU and flags) everywhere; what it changes is the plans built.
#   scripts/tune-compare.sh OLD-BINARY NEW-BINARY
# (build the old one from a worktree: git worktree add /tmp/old REV && cd /tmp/old &&
#  CARGO_TARGET_DIR=/tmp/old-target cargo build --release)
# Prints one line per scenario (SAME/DIFF, plans old → new), the flags where they differ, and
# the totals; exits 1 if any answer differs.
set -uo pipefail
old=${1:?old binary}; new=${2:?new binary}
cd "$(dirname "$0")/.."
answer() {
  "$1" tune "${@:2}" --hardware h100-sxm --param-dtype bf16 --reduce-dtype f32 --format json 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); b=d['best']; print(d['searched'], '%.2f' % b['predicted']['tokens_per_s_per_gpu'] if b else 'none', ' '.join(b['flags']) if b else '')" 2>/dev/null ||
    echo "0 error"
}
diffs=0; total_old=0; total_new=0
for m in models/*.ron; do
  name=$(basename "$m" .ron)
  case $name in
    tiny-*) continue ;;
    gpt2*) args=(--world-size 8 --global-batch 64 --seq 1024) ;;
    *405b* | deepseek-v3 | qwen3-235b*) args=(--world-size 1024 --global-batch 1024 --seq 4096) ;;
    *70b* | *34b* | gemma-3-27b | mixtral* | qwen3-30b*) args=(--world-size 64 --global-batch 64 --seq 8192) ;;
    *) args=(--world-size 8 --global-batch 16 --seq 8192) ;;
  esac
  for limit in "" "60GiB"; do
    extra=(); [ -n "$limit" ] && extra=(--memory-limit "$limit")
    o=$(answer "$old" "$m" "${args[@]}" "${extra[@]}"); n=$(answer "$new" "$m" "${args[@]}" "${extra[@]}")
    po=${o%% *}; pn=${n%% *}; total_old=$((total_old + po)); total_new=$((total_new + pn))
    if [ "${o#* }" = "${n#* }" ]; then verdict=SAME; else verdict=DIFF; diffs=$((diffs + 1)); fi
    printf '%s %-18s %-6s plans %5d -> %5d\n' "$verdict" "$name" "${limit:-device}" "$po" "$pn"
    [ $verdict = DIFF ] && printf '   old: %s\n   new: %s\n' "${o#* }" "${n#* }"
  done
done
echo "plans $total_old -> $total_new; $diffs answers differ"
[ $diffs -eq 0 ]
