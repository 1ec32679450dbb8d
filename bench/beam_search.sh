#!/usr/bin/env bash
# Beam-search translation throughput (beam 4, fp32, ids in): Glossa's mt.TransformerModel
# Translate (bench_beam_search) against the same model and the same search in PyTorch eager
# (bench/beam_search.py, Debian's python3-torch, inference_mode, cached keys and values), both
# restored from the same checkpoint of a trained mt.bible.TransformerEnEsTiny logdir, on the first
# `sentences` verses of the Bible Test set, at batch 1 and 32. Same thread layout for both (1 ATen
# thread + OpenBLAS on every core); the peer runs with stock OpenBLAS kernels and again with
# Glossa's choice (torch_same_blas). Prints sentences/s and target tokens/s medians, the ratios,
# and how many best hypotheses agree.
#   bash bench/beam_search.sh [logdir=runs/bible_tiny] [runs=3] [build_dir=build] [reps=3] [sentences=64]
set -euo pipefail
cd "$(dirname "$0")/.."
logdir="${1:-runs/bible_tiny}"
runs="${2:-3}"
build="${3:-build}"
reps="${4:-3}"
sentences="${5:-64}"
bin="$build/bin/bench_beam_search"
[ -x "$bin" ] || { echo "build first: cmake --build $build"; exit 1; }
ckpt=$(ls "$logdir"/train/ckpt-*.safetensors 2>/dev/null | sort | tail -1)
[ -n "$ckpt" ] || { echo "no checkpoint in $logdir/train: train mt.bible.TransformerEnEsTiny first"; exit 1; }
work="${TMPDIR:-/tmp}/glossa_bench_beam"
export OPENBLAS_NUM_THREADS=$(nproc)
printf "%-6s %12s %12s %12s %7s %16s %7s %s\n" batch glossa_sent/s glossa_tok/s torch_sent/s ratio torch_same_blas ratio agree
for batch in 1 32; do
  gs=(); gt=(); ps=(); qs=(); agree=""
  for _ in $(seq "$reps"); do
    out=$("$bin" --logdir="$logdir" --workdir="$work" --sentences="$sentences" --batch=$batch --runs="$runs" 2>/dev/null | grep glossa_sentences_per_sec)
    gs+=("$(awk '{print $2}' <<<"$out")"); gt+=("$(awk '{print $4}' <<<"$out")"); core=$(awk '{print $14}' <<<"$out")
    p=$(/usr/bin/python3 bench/beam_search.py --ckpt="$ckpt" --workdir="$work" --batch=$batch --runs="$runs" --threads=1)
    ps+=("$(awk '{print $2}' <<<"$p")"); agree=$(awk '{print $6}' <<<"$p")
    q=$(OPENBLAS_CORETYPE="$core" /usr/bin/python3 bench/beam_search.py --ckpt="$ckpt" --workdir="$work" --batch=$batch --runs="$runs" --threads=1)
    qs+=("$(awk '{print $2}' <<<"$q")")
  done
  med() { printf "%s\n" "$@" | sort -g | sed -n "$(( (reps + 1) / 2 ))p"; }
  awk -v b=$batch -v g="$(med "${gs[@]}")" -v t="$(med "${gt[@]}")" -v p="$(med "${ps[@]}")" -v q="$(med "${qs[@]}")" -v a="$agree" 'BEGIN {
    printf "%-6s %12.2f %12.1f %12.2f %7.2f %16.2f %7.2f %s\n", b, g, t, p, g / p, q, g / q, a }'
done
echo "CPU: $(bash bench/cpu.sh)"
echo "checkpoint: $ckpt; OpenBLAS kernels: glossa $core"
echo "reproduce: bash bench/beam_search.sh $logdir $runs $build $reps $sentences"
