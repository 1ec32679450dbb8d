#!/usr/bin/env bash
# Predictor LM scoring throughput: Glossa's Predictor (strings in, fetches out: tokenization, the
# network, log-probs, ids and pieces) against the same model in PyTorch eager under
# torch.inference_mode (Debian's python3-torch and python3-sentencepiece, reading the bundle's
# weights and SentencePiece model), in one run, at batch 1 and 8; and the two networks alone on
# prebuilt tensors. Both get the same thread layout (1 ATen thread + OpenBLAS on every core,
# glossa/runtime/cpu_runtime.h). Glossa's programs pick OpenBLAS's best kernels for the CPU
# (UseBestBlasKernels); stock PyTorch keeps what OpenBLAS detected, so the peer also runs a second
# time with OPENBLAS_CORETYPE set to Glossa's choice (torch_same_blas). The peer first checks that
# its ids and sentence scores equal Glossa's. ONNX Runtime 1.30 (bench/onnx, installed by
# scripts/setup.sh) runs the bundle's onnx/lm_score.onnx on the same batches with 1 and with 2
# intra-op threads; the better of the two is the peer of the network alone (ort_network). Prints
# tokens/s medians and the ratios.
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
printf "%-6s %13s %13s %7s %16s %7s %15s %15s %7s %12s %7s\n" batch glossa_tok/s torch_tok/s ratio torch_same_blas ratio glossa_network torch_network ratio ort_network ratio
for batch in 1 8; do
  gs=(); ns=(); ps=(); pn=(); qs=(); os=()
  for _ in $(seq "$reps"); do
    g=$("$bin" --workdir="$work" --sentences="$sentences" --batch=$batch --runs="$runs" 2>/dev/null | grep glossa_tokens_per_sec)
    gs+=("$(awk '{print $2}' <<<"$g")"); ns+=("$(awk '{print $4}' <<<"$g")"); core=$(awk '{print $10}' <<<"$g")
    p=$(/usr/bin/python3 bench/predictor_throughput.py --workdir="$work" --batch=$batch --runs="$runs" --threads=1)
    ps+=("$(awk '{print $2}' <<<"$p")"); pn+=("$(awk '{print $4}' <<<"$p")")
    q=$(OPENBLAS_CORETYPE="$core" /usr/bin/python3 bench/predictor_throughput.py --workdir="$work" --batch=$batch --runs="$runs" --threads=1)
    qs+=("$(awk '{print $2}' <<<"$q")")
    tokens=$(awk '{print $12}' <<<"$g")
    best=0
    for t in 1 2; do
      ms=$(node bench/onnx/ort_run.js --model "$work/bundle/onnx/lm_score.onnx" --feeds "$work/onnx_feeds_b$batch.jsonl" \
             --threads $t --repeat "$runs" --warmup 1 --no_outputs | sed -n 's/.*"median_ms":\([0-9.e+-]*\).*/\1/p')
      best=$(awk -v b="$best" -v n="$tokens" -v ms="$ms" 'BEGIN { r = n / (ms / 1000); print (r > b ? r : b) }')
    done
    os+=("$best")
  done
  med() { printf "%s\n" "$@" | sort -g | sed -n "$(( (reps + 1) / 2 ))p"; }
  awk -v b=$batch -v g="$(med "${gs[@]}")" -v n="$(med "${ns[@]}")" -v p="$(med "${ps[@]}")" -v q="$(med "${pn[@]}")" -v s="$(med "${qs[@]}")" -v o="$(med "${os[@]}")" 'BEGIN {
    printf "%-6s %13.1f %13.1f %7.2f %16.1f %7.2f %15.1f %15.1f %7.2f %12.1f %7.2f\n", b, g, p, g / p, s, g / s, n, q, n / q, o, n / o }'
done
echo "CPU: $(bash bench/cpu.sh)"
echo "OpenBLAS kernels: glossa $core, stock PyTorch $(/usr/bin/python3 -c 'import ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())')"
echo "reproduce: bash bench/predictor_throughput.sh $runs $build $reps $sentences"
