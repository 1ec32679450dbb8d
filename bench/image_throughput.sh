#!/usr/bin/env bash
# Image training throughput: image.fmnist.LeNet5 and image.fmnist.ResNetSmall in Glossa against
# the same models in PyTorch eager (Debian's python3-torch), on random 28x28 images, batch 128, in
# one run. Both get the fp32 thread layout Glossa uses (glossa/runtime/cpu_runtime.h: 1 ATen
# thread + OpenBLAS on every core) and the same allocator settings. Prints images/s medians and
# their ratio, against PyTorch as usually written (NCHW) and in channels_last (its fastest layout).
#   bash bench/image_throughput.sh [runs=3] [build_dir=build] [reps=3]
# Each framework is invoked `reps` times, alternating, each invocation timing `runs` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
build="${2:-build}"
reps="${3:-3}"
bin="$build/bin/bench_image_throughput"
[ -x "$bin" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
cores=$(nproc)
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864
# The same OpenBLAS kernels for both: the set Glossa's programs measured fastest here.
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$(bash bench/blas_core.sh "$build")}"
printf "%-7s %16s %16s %7s %19s %7s\n" model glossa_images/s torch_images/s ratio torch_cl_images/s ratio
for model in ${MODELS:-lenet5 resnet}; do
  steps=20
  [ "$model" = resnet ] && steps=5
  gs=(); ps=(); cs=()
  for _ in $(seq "$reps"); do
    gs+=("$("$bin" --model=$model --steps=$steps --runs="$runs" 2>/dev/null | awk '/glossa_images_per_sec/ {print $2}')")
    ps+=("$(OPENBLAS_NUM_THREADS=$cores /usr/bin/python3 bench/image_throughput.py --model=$model --steps=$steps --runs="$runs" --threads=1 | awk '{print $2}')")
    cs+=("$(OPENBLAS_NUM_THREADS=$cores /usr/bin/python3 bench/image_throughput.py --model=$model --steps=$steps --runs="$runs" --threads=1 --channels_last | awk '{print $2}')")
  done
  gt=$(printf "%s\n" "${gs[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
  pt=$(printf "%s\n" "${ps[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
  ct=$(printf "%s\n" "${cs[@]}" | sort -g | sed -n "$(( (reps + 1) / 2 ))p")
  awk -v m=$model -v g="$gt" -v p="$pt" -v c="$ct" \
    'BEGIN { printf "%-7s %16.1f %16.1f %7.2f %19.1f %7.2f\n", m, g, p, g / p, c, g / c }'
done
echo "reproduce: bash bench/image_throughput.sh $runs $build $reps"
