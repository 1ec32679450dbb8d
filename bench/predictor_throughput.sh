#!/usr/bin/env bash
# Predictor LM scoring throughput: Glossa's Predictor (strings in, fetches out: tokenization, the
# network, log-probs, ids and pieces) against the same network in PyTorch eager under
# torch.inference_mode (Debian's python3-torch, reading the bundle's weights and Glossa's token
# ids, so it skips tokenization), in one run, at batch 1 and 8. Both get the same thread layout
# (1 ATen thread + OpenBLAS on every core, glossa/runtime/cpu_runtime.h). The peer first checks
# that its sentence scores equal Glossa's. Prints tokens/s medians and their ratio.
#   bash bench/predictor_throughput.sh [runs=3] [build_dir=build] [reps=3] [sentences=200]
# Each framework is invoked `reps` times, alternating, each invocation timing `runs` passes.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
build="${2:-build}"
reps="${3:-3}"
sentences="${4:-200}"
bin="$build/bin/bench_predictor"
[ -x "$bin" ] || { echo "build first: cmake --build $build"; exit 1; }
work="${TMPDIR:-/tmp}/glossa_bench_predictor"
cores=$(nproc)
export OPENBLAS_NUM_THREADS=$cores
printf "%-6s %14s %16s %14s %7s\n" batch glossa_tok/s "(network_only)" torch_tok/s ratio
for batch in 1 8; do
  gs=(); ns=(); ps=()
  for _ in $(seq "$reps"); do
    g=$("$bin" --workdir="$work" --sentences="$sentences" --batch=$batch --runs="$runs" 2>/dev/null | grep glossa_tokens_per_sec)
    gs+=("$(awk '{print $2}' <<<"$g")"); ns+=("$(awk '{print $4}' <<<"$g")")
    p=$(/usr/bin/python3 bench/predictor_throughput.py --workdir="$work" --batch=$batch --runs="$runs" --threads=1)
    ps+=("$(awk '{print $2}' <<<"$p")")
  done
  med() { printf "%s\n" "$@" | sort -g | sed -n "$(( (reps + 1) / 2 ))p"; }
  awk -v b=$batch -v g="$(med "${gs[@]}")" -v n="$(med "${ns[@]}")" -v p="$(med "${ps[@]}")" 'BEGIN {
    printf "%-6s %14.1f %16.1f %14.1f %7.2f\n", b, g, n, p, g / p }'
done
echo "reproduce: bash bench/predictor_throughput.sh $runs $build $reps $sentences"
