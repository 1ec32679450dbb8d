#!/usr/bin/env bash
# Training throughput of this build against another build of Glossa (e.g. the commit before a
# refactor), paired: the two bench_train_throughput binaries alternate, 5 pairs per row, --runs=3
# inside each; prints the median tokens/s of each and their ratio. Build the other commit first:
#   git worktree add /tmp/old REV && cmake -S /tmp/old -B /tmp/old/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/old/build --target bench_train_throughput
#   bash bench/train_throughput_paired.sh /tmp/old/build
set -u
cd "$(dirname "$0")/.."
other="${1:?usage: bench/train_throughput_paired.sh OTHER_BUILD_DIR}"
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$(bash bench/blas_core.sh build)}"
new=build/bin/bench_train_throughput; old="$other/bin/bench_train_throughput"
[ -x "$new" ] && [ -x "$old" ] || { echo "build both first (see the top of this file)" >&2; exit 1; }
tiny="--model_dim=128 --num_layers=2 --num_heads=4 --hidden_dim=512 --vocab=2000 --seq=128 --batch=16 --steps=20"
big="--model_dim=512 --num_layers=6 --num_heads=8 --hidden_dim=2048 --vocab=8000 --seq=256 --batch=8 --steps=3"
mt="--task=mt --model_dim=256 --num_layers=3 --num_heads=4 --hidden_dim=1024 --vocab=8000 --seq=48 --batch=64 --steps=3"
row() {  # name shape dtype
  local name=$1 shape=$2 dtype=$3 n=() o=()
  for i in 1 2 3 4 5; do
    n+=($("$new" $shape --runs=3 --dtype=$dtype 2>/dev/null | awk '/glossa_tokens_per_sec/ {print $2}'))
    o+=($("$old" $shape --runs=3 --dtype=$dtype 2>/dev/null | awk '/glossa_tokens_per_sec/ {print $2}'))
  done
  local mn mo
  mn=$(printf "%s\n" "${n[@]}" | sort -g | sed -n 3p); mo=$(printf "%s\n" "${o[@]}" | sort -g | sed -n 3p)
  echo "$name $dtype new_median=$mn old_median=$mo new/old=$(awk -v a="$mn" -v b="$mo" 'BEGIN{printf "%.3f", a/b}') new=[${n[*]}] old=[${o[*]}]"
}
row tiny "$tiny" fp32
row tiny "$tiny" bf16
row mt "$mt" fp32
row 512 "$big" fp32
row 512 "$big" bf16
