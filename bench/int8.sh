#!/usr/bin/env bash
# int8 against fp32 (`glossa export --quantize=int8`: weights per output channel, activations per
# row at run time; glossa/kernels/int8_gemm.h), quality and speed in one run; with QUANT=bf16,
# bf16 weights against fp32 (`--quantize=bf16`: the weights rounded to bf16 at load, activations
# and sums in float32; glossa/kernels/packed_affine.h).
#   bash bench/int8.sh [austen_logdir=runs/austen_tiny] [mt_logdir=runs/bible_tiny] [build=build] [reps=3] [verses=300]
#   SPEED=0 bash bench/int8.sh ...   # the quality rows only
#   QUANT=bf16 bash bench/int8.sh ...
# Quality, from the two logdirs' latest checkpoints, each exported twice (float32 and $QUANT):
#   - Austen Dev log_pplx: -sum(total_log_prob) / sum(lengths) over every Dev line, by the bundle's
#     Predictor (`glossa predict`, subgraph default). Target: int8 within 0.02 of fp32.
#   - Bible Test BLEU of the first `verses` verses translated by each bundle (`glossa predict`,
#     subgraph translate; `glossa bleu`). Target: int8 within 0.5 of fp32, bf16 within 0.2.
# Speed, medians of `reps` alternating invocations of each:
#   - LM scoring through the Predictor (bench_predictor, lm.austen.TransformerLmTiny) and the
#     network alone, at batch 1 and 8;
#   - beam-4 translation (bench_beam_search on mt_logdir), at batch 1 and 32.
# The austen logdir comes from `bash scripts/train_austen.sh`; the MT one from training
# mt.bible.TransformerEnEsTiny (docs/mt.md).
set -euo pipefail
cd "$(dirname "$0")/.."
austen="${1:-runs/austen_tiny}"
mt="${2:-runs/bible_tiny}"
build="${3:-build}"
reps="${4:-3}"
verses="${5:-300}"
quant="${QUANT:-int8}"
case "$quant" in int8|bf16) ;; *) echo "QUANT must be int8 or bf16, got '$quant'"; exit 1 ;; esac
glossa="$build/bin/glossa"
[ -x "$glossa" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
for d in "$austen" "$mt"; do
  ls "$d"/train/ckpt-*.safetensors >/dev/null 2>&1 || { echo "no checkpoint in $d/train"; exit 1; }
done
work="${TMPDIR:-/tmp}/glossa_bench_$quant"
rm -rf "$work" && mkdir -p "$work"
export OPENBLAS_NUM_THREADS=$(nproc)
quiet() { "$@" 2> >(grep -v '^I[0-9]\{8\} \|^WARNING: Logging' >&2); }
for q in none "$quant"; do
  quiet "$glossa" export --model=lm.austen.TransformerLmTiny --logdir="$austen" --dataset=Dev \
    --out="$work/lm_$q" --quantize=$q >/dev/null
  quiet "$glossa" export --model=mt.bible.TransformerEnEsTiny --logdir="$mt" --dataset=Test \
    --out="$work/mt_$q" --quantize=$q >/dev/null
done
grep -v '^$' data/austen/dev.txt > "$work/dev_lines.txt"
mtdata=data/bible_mt
head -n "$verses" "$mtdata/test.en" > "$work/test.en"
head -n "$verses" "$mtdata/test.es" > "$work/test.es"
printf "%-34s %10s %10s %8s\n" quality fp32 "$quant" diff
pplx() {
  quiet "$glossa" predict --bundle="$1" --input="$work/dev_lines.txt" --input_format=text |
    /usr/bin/python3 -c '
import json, sys
lp = n = 0.0
for line in sys.stdin:
    r = json.loads(line)
    lp += r["total_log_prob"]; n += r["lengths"]
print("%.4f" % (-lp / n))'
}
bleu() {
  quiet "$glossa" predict --bundle="$1" --subgraph=translate --input="$work/test.en" --input_format=text |
    /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    print(json.loads(line)["translation"])' > "$1.hyp"
  quiet "$glossa" bleu --hyp="$1.hyp" --ref="$work/test.es" | awk '$1 == "BLEU" {print $3; exit}'
}
p0=$(pplx "$work/lm_none"); p1=$(pplx "$work/lm_$quant")
awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%-34s %10.4f %10.4f %+8.4f\n", "austen Dev log_pplx (target 0.02)", a, b, b - a }'
b0=$(bleu "$work/mt_none"); b1=$(bleu "$work/mt_$quant")
target=0.5; [ "$quant" = bf16 ] && target=0.2
awk -v a="$b0" -v b="$b1" -v n="$verses" -v t="$target" 'BEGIN { printf "%-34s %10.2f %10.2f %+8.2f\n", "bible Test BLEU, " n " verses (" t ")", a, b, b - a }'

[ "${SPEED:-1}" = 0 ] && exit 0  # SPEED=0: the quality rows only
median() { printf "%s\n" "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
printf "\n%-26s %12s %12s %7s\n" speed fp32 "$quant" ratio
for batch in 1 8; do
  f=(); i=(); fn=(); in=()
  for _ in $(seq "$reps"); do
    o=$("$build/bin/bench_predictor" --batch=$batch --runs=3 --int8=0 2>/dev/null | grep glossa_tokens)
    f+=("$(awk '{print $2}' <<<"$o")"); fn+=("$(awk '{print $4}' <<<"$o")")
    o=$("$build/bin/bench_predictor" --batch=$batch --runs=3 --precision="$quant" 2>/dev/null | grep glossa_tokens)
    i+=("$(awk '{print $2}' <<<"$o")"); in+=("$(awk '{print $4}' <<<"$o")")
  done
  awk -v b=$batch -v x="$(median "${f[@]}")" -v y="$(median "${i[@]}")" \
    'BEGIN { printf "%-26s %12.1f %12.1f %7.2f\n", "LM Predictor tok/s, b" b, x, y, y / x }'
  awk -v b=$batch -v x="$(median "${fn[@]}")" -v y="$(median "${in[@]}")" \
    'BEGIN { printf "%-26s %12.1f %12.1f %7.2f\n", "LM network tok/s, b" b, x, y, y / x }'
done
for batch in 1 32; do
  f=(); i=()
  for _ in $(seq "$reps"); do
    f+=("$("$build/bin/bench_beam_search" --logdir="$mt" --batch=$batch --runs=3 --int8=0 2>/dev/null | awk '/glossa_sentences/ {print $4}')")
    i+=("$("$build/bin/bench_beam_search" --logdir="$mt" --batch=$batch --runs=3 --precision="$quant" 2>/dev/null | awk '/glossa_sentences/ {print $4}')")
  done
  awk -v b=$batch -v x="$(median "${f[@]}")" -v y="$(median "${i[@]}")" \
    'BEGIN { printf "%-26s %12.1f %12.1f %7.2f\n", "MT beam-4 tok/s, b" b, x, y, y / x }'
done
echo "reproduce: QUANT=$quant bash bench/int8.sh $austen $mt $build $reps $verses"
