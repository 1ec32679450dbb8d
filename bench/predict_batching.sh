#!/usr/bin/env bash
# `glossa predict` on lines of mixed lengths: batches in input order against length-sorted,
# token-budget batches (--sort_window, --max_batch_tokens; Marian's maxi-batch and CTranslate2's
# token batches), the same binary and bundle, alternating. The tiny Austen LM (trained 5 steps,
# exported) scores `lines` lines of 2 to 60 words drawn from one sentence's words; each command's
# wall time includes loading the bundle. Checks that every configuration answers the same lines in
# the same order (total_log_prob within 1e-3), then prints medians, the real (non-pad) tokens/s and
# the ratio to input order.
#   bash bench/predict_batching.sh [build_dir=build] [reps=3] [lines=2000] [batch_size=32]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
reps="${2:-3}"
lines="${3:-2000}"
batch="${4:-32}"
glossa="$build/bin/glossa"
[ -x "$glossa" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$work/run" --max_steps=5 > "$work/train.log" 2>&1
"$glossa" export --model=lm.austen.TransformerLmTiny --logdir="$work/run" --out="$work/bundle" > "$work/export.log" 2>&1
/usr/bin/python3 - "$work/lines.txt" "$lines" <<'PY'
import random, sys
random.seed(1)
words = ("it is a truth universally acknowledged that a single man in possession of a good "
         "fortune must be in want of a wife").split()
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        f.write(" ".join(random.choice(words) for _ in range(random.choice([2, 3, 5, 8, 20, 40, 60]))) + "\n")
PY
configs=("" "--sort_window=$lines" "--sort_window=$lines --max_batch_tokens=$((batch * 32))")
names=("input order" "sorted" "sorted + token budget")
declare -A times
for _ in $(seq "$reps"); do
  for i in "${!configs[@]}"; do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    "$glossa" predict --bundle="$work/bundle" --input="$work/lines.txt" --batch_size="$batch" ${configs[$i]} > "$work/out$i.jsonl" 2>"$work/err$i.log"
    end=$(date +%s.%N)
    times[$i]+="$(echo "$end - $start" | bc) "
  done
done
/usr/bin/python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
outs = [[json.loads(l) for l in open(f"{w}/out{i}.jsonl")] for i in range(3)]
for o in outs[1:]:
    assert len(o) == len(outs[0])
    for a, b in zip(outs[0], o):
        assert a["pieces"] == b["pieces"] and abs(a["total_log_prob"] - b["total_log_prob"]) < 1e-3
print(sum(len(r["pieces"]) for r in outs[0]), file=open(f"{w}/tokens", "w"))
PY
tokens=$(cat "$work/tokens")
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(median "${times[0]}")
printf "%-22s %10s %14s %7s\n" batches seconds real_tok/s ratio
for i in "${!configs[@]}"; do
  m=$(median "${times[$i]}")
  printf "%-22s %10.3f %14.0f %7.2f\n" "${names[$i]}" "$m" "$(echo "$tokens / $m" | bc -l)" "$(echo "$base / $m" | bc -l)"
done
echo "($lines lines, $tokens tokens, batch_size $batch, medians of $reps; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores)"
echo "reproduce: bash bench/predict_batching.sh $build $reps $lines $batch"
