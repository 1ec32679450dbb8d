#!/usr/bin/env bash
# Packed sequences against bucketing: real (non-padding) tokens a second of `glossa train` on the
# Austen LM (lm.austen.TransformerLmTiny) and the Bible MT model (mt.bible.TransformerEnEsTiny,
# when its corpus is found: $GLOSSA_DATA_DIR/bible_mt, built by scripts/prepare_bible_mt.sh),
# each run once with its registered bucketed input and once with
# `task.input.packed_input : True` (docs/input.md "Packed sequences"), alternating `reps` times.
# Each run has 4 loops (steps_per_loop = steps / 4); its figure is the median of its loops'
# `tokens/sec` summaries after the first; the table gives the median over the reps, examples
# (sentences or pairs) a second, and the ratio. The MT model runs half the steps (it is 8x slower).
#   bash bench/packed_input.sh [steps=200] [build_dir=build] [reps=3]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-200}"
build="${2:-build}"
reps="${3:-3}"
bin="$build/bin/glossa"
[ -x "$bin" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The median of a tag's values in metrics.jsonl, the first loop left out (it holds the warm-up).
median_of() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
vals = [json.loads(l)["value"] for l in open(sys.argv[1]) if f'"tag":"{sys.argv[2]}"' in l]
vals = vals[1:] if len(vals) > 1 else vals
print(statistics.median(vals) if vals else 0)
EOF
}

# The mean of a per-step summary over the steps from $3 on (every step writes it: one batch's
# fullness varies too much to stand for a run's).
mean_from() {
  /usr/bin/python3 - "$1" "$2" "$3" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if f'"tag":"{sys.argv[2]}"' in l]
vals = [r["value"] for r in rows if r["step"] >= int(sys.argv[3])] or [r["value"] for r in rows]
print(statistics.fmean(vals) if vals else 0)
EOF
}

run() {  # model packed(0/1) rep -> "tokens/s examples/s"
  local dir="$tmp/$1-$2-$3" n="$steps"
  case "$1" in mt.*) n=$((steps / 2)) ;; esac
  local override="task.input.packed_input : False"
  [ "$2" = 1 ] && override="task.input.packed_input : True"
  override="$override; task.train.steps_per_loop : $((n / 4)); task.train.summary_interval_steps : 1"
  if ! "$bin" train --model="$1" --logdir="$dir" --random_seed=1 --max_steps="$n" \
      --model_params_override="$override" > "$dir.log" 2>&1; then
    echo "FAIL: $1 (packed=$2): $(tail -3 "$dir.log")" >&2
    exit 1
  fi
  local m="$dir/train/metrics.jsonl"
  echo "$(median_of "$m" tokens/sec) $(median_of "$m" examples/sec) $(mean_from "$m" input_nonpad_fraction $((n / 4)))"
}

models=(lm.austen.TransformerLmTiny)
if [ -f "${GLOSSA_DATA_DIR:-/nonexistent}/bible_mt/train.tsv" ] &&
   [ "$(wc -l < "$GLOSSA_DATA_DIR/bible_mt/train.tsv")" -gt 1000 ]; then
  models+=(mt.bible.TransformerEnEsTiny)
else
  echo "(mt.bible.TransformerEnEsTiny left out: no corpus in \$GLOSSA_DATA_DIR/bible_mt;" \
       "bash scripts/prepare_bible_mt.sh DIR/bible_mt and set GLOSSA_DATA_DIR=DIR)"
fi
echo "CPU: $(bash bench/cpu.sh); $steps steps a run, $reps reps"
# full: input_nonpad_fraction, the share of the batches' cells holding a token (bucketed, packed),
# averaged over every step after the first loop; bound: their ratio, what packing could gain if
# the work were proportional to the cells.
printf "%-30s %14s %14s %12s %12s %6s %6s %6s %6s\n" model bucketed_tok/s packed_tok/s \
  bucketed_ex/s packed_ex/s full_b full_p bound ratio
for m in "${models[@]}"; do
  bt=(); pt=(); be=(); pe=(); bf=(); pf=()
  for r in $(seq "$reps"); do
    out=$(run "$m" 0 "$r"); read -r t e f <<<"$out"; bt+=("$t"); be+=("$e"); bf+=("$f")
    out=$(run "$m" 1 "$r"); read -r t e f <<<"$out"; pt+=("$t"); pe+=("$e"); pf+=("$f")
  done
  med() { printf "%s\n" "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
  awk -v m="$m" -v bt="$(med "${bt[@]}")" -v pt="$(med "${pt[@]}")" -v be="$(med "${be[@]}")" \
      -v pe="$(med "${pe[@]}")" -v bf="$(med "${bf[@]}")" -v pf="$(med "${pf[@]}")" 'BEGIN {
    printf "%-30s %14.0f %14.0f %12.1f %12.1f %6.3f %6.3f %6.2f %6.2f\n", m, bt, pt, be, pe, bf, pf,
           pf / bf, pt / bt }'
done
echo "reproduce: bash bench/packed_input.sh $steps $build $reps"
