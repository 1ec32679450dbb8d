#!/usr/bin/env bash
# Training throughput: Glossa's Transformer LM against the same model in PyTorch (Debian's
# python3-torch), in one run. Two sizes (tiny: the lm.austen.TransformerLmTiny shapes; 512: model
# dim 512, 6 layers, seq 256, batch 8, vocab 8000), fp32 and bf16 compute. Both frameworks get the
# same thread layout (glossa/runtime/cpu_runtime.h: fp32 = 1 ATen thread + OpenBLAS on every core;
# bf16 = ATen on every core + 1 OpenBLAS thread) and the same glibc allocator settings. Prints
# tokens/s medians, their ratio, FLOPs per token and the fractions of the measured fp32 GEMM peak
# and of the peak of the row's own dtype (bf16 rows: the bf16 GEMM peak), the latter measured right
# after each of Glossa's timed runs (--peak_beside), in the machine state the run saw. The LM rows
# also print a bound: the tokens/s of a step that did only its GEMMs, each at the rate it reaches
# alone (--gemm_model), and that over PyTorch's tokens/s (the most the ratio could be); the fp32
# rows a second, tighter one: the same GEMMs as they ran inside a step (--gemm_in_step), where
# their operands come from memory.
#   bash bench/train_throughput.sh [runs=3] [build_dir=build] [reps=3]
# Each framework is invoked `reps` times, alternating, each invocation timing `runs` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
build="${2:-build}"
reps="${3:-3}"
bin="$build/bin/bench_train_throughput"
[ -x "$bin" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
cores=$(nproc)
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864
# The same OpenBLAS kernels for both: the set Glossa's programs measured fastest here (without
# this PyTorch ran the fp32 rows with Prescott kernels, 2.6× slower, on 2026-12-01).
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$(bash bench/blas_core.sh "$build")}"
peak=$("$bin" --gemm --runs=5 2>/dev/null | awk '/gemm_fp32_gflops/ {print $2}')
bf16_out=$("$bin" --gemm --dtype=bf16 --runs=5 2>/dev/null)
peak_onednn=$(awk '/gemm_bf16_gflops/ {print $2}' <<<"$bf16_out")
peak_glossa=$(awk '/gemm_bf16_glossa_gflops/ {print $2}' <<<"$bf16_out")
glossa_via=$(awk '/gemm_bf16_glossa_gflops/ {print $4}' <<<"$bf16_out")
# The bf16 rows' own peak: the faster of the two bf16 GEMMs this machine offers.
peak_bf16=$(awk -v a="$peak_onednn" -v b="$peak_glossa" 'BEGIN { print (b > a ? b : a) }')
echo "CPU: $(bash bench/cpu.sh)"
echo "GEMM peaks (2048^2 matmul, $cores cores): fp32 $peak GFLOP/s (OpenBLAS); bf16 $peak_onednn GFLOP/s (ATen/oneDNN, what PyTorch runs), $peak_glossa GFLOP/s (Glossa's bf16 projections, $glossa_via); %ownpeak: each run over the peak of its dtype (bf16: the larger) measured right after it"
tiny="--model_dim=128 --num_layers=2 --num_heads=4 --hidden_dim=512 --vocab=2000 --seq=128 --batch=16 --steps=20"
big="--model_dim=512 --num_layers=6 --num_heads=8 --hidden_dim=2048 --vocab=8000 --seq=256 --batch=8 --steps=3"
# mt: the encoder-decoder of mt.bible.TransformerEnEsTiny (3 + 3 layers, model dim 256, vocab 8000,
# 48-token sources and targets, 64 pairs a batch); tokens/s counts target tokens.
mt="--task=mt --model_dim=256 --num_layers=3 --num_heads=4 --hidden_dim=1024 --vocab=8000 --seq=48 --batch=64 --steps=3"
printf "%-6s %-5s %14s %14s %7s %12s %10s %10s\n" size dtype glossa_tok/s torch_tok/s ratio MFLOP/token %fp32peak %ownpeak
for size in ${SIZES:-tiny 512 mt}; do
  for dtype in fp32 bf16; do
    case "$size" in tiny) shape="$tiny" ;; 512) shape="$big" ;; mt) shape="$mt" ;; esac
    if [ "$dtype" = fp32 ]; then t=1; blas=$cores; else t=$cores; blas=1; fi
    # Alternate the two frameworks (`reps` times each) so that drifts in this shared machine's
    # speed hit both alike; report the median of the per-invocation medians.
    gs=(); ps=(); fr=(); fl=0; gw=(); pw=(); gb=(); gi=()
    for _ in $(seq "$reps"); do
      out=$("$bin" $shape --runs="$runs" --dtype=$dtype --peak_beside=1 2>/dev/null)
      g=$(grep glossa_tokens_per_sec <<<"$out")
      fr+=("$(awk '/own_peak_fraction/ {print $4}' <<<"$out")")
      choices=$(sed -n 's/^kernel_choices //p' <<<"$out")
      gs+=("$(awk '{print $2}' <<<"$g")"); fl=$(awk '{print $4}' <<<"$g")
      gw+=("$(awk '{print $12}' <<<"$g")")
      # The LM rows' bound: a step that did nothing but its GEMMs, each at its isolated rate.
      if [ "$size" != mt ]; then
        gb+=("$("$bin" $shape --dtype=$dtype --gemm_model=1 2>/dev/null | awk '/model_gemm_tokens_per_sec/ {print $10}')")
      fi
      # fp32: the same GEMMs as they run inside a step (operands from memory): --gemm_in_step.
      if [ "$dtype" = fp32 ]; then
        gi+=("$("$bin" $shape --dtype=fp32 --gemm_split=aten --gemm_in_step=1 2>/dev/null | awk '/gemm_in_step_tokens_per_sec/ {print $8}')")
      fi
      p=$(OPENBLAS_NUM_THREADS=$blas /usr/bin/python3 bench/train_throughput.py $shape --runs="$runs" --dtype=$dtype --threads=$t)
      ps+=("$(awk '{print $2}' <<<"$p")")
      pw+=("$(awk '{print $6}' <<<"$p")")
    done
    gt=$(printf "%s\n" "${gs[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
    pt=$(printf "%s\n" "${ps[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
    # %ownpeak: the median over Glossa's invocations of each one's own fraction (its runs' FLOP
    # rates over the row's GEMM peak measured right after each run, in the same machine state).
    ft=$(printf "%s\n" "${fr[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
    awk -v s=$size -v d=$dtype -v g="$gt" -v p="$pt" -v f="$fl" -v peak="$peak" -v own="$ft" 'BEGIN {
      printf "%-6s %-5s %14.1f %14.1f %7.2f %12.1f %9.0f%% %9.0f%%\n", s, d, g, p, g / p, f / 1e6,
             100 * g * f / 1e9 / peak, 100 * own }'
    if [ "${#gb[@]}" -gt 0 ]; then
      bt=$(printf "%s\n" "${gb[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
      awk -v b="$bt" -v p="$pt" 'BEGIN { printf "       bound (the step'"'"'s GEMMs alone, each at its isolated rate: --gemm_model): %.1f tok/s, %.2f x PyTorch\n", b, b / p }'
    fi
    if [ "${#gi[@]}" -gt 0 ]; then
      it=$(printf "%s\n" "${gi[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
      awk -v b="$it" -v p="$pt" 'BEGIN { printf "       bound (the projections'"'"' GEMMs alone, as they ran inside a step: --gemm_in_step): %.1f tok/s, %.2f x PyTorch\n", b, b / p }'
    fi
    echo "       warm-up steps (until a step takes under 256 new pages): glossa ${gw[*]}, torch ${pw[*]}"
    [ -n "$choices" ] && echo "       kernel choices (measured per shape, glossa/kernels/kernel_choice.h): $choices"
  done
done
echo "reproduce: bash bench/train_throughput.sh $runs $build $reps"
