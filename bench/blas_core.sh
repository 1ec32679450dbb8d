#!/usr/bin/env bash
# The OpenBLAS kernel set Glossa's programs run on this machine (glossa/runtime/blas_kernels.h:
# measured once per machine and cached, or OPENBLAS_CORETYPE when set), for a peer in the same
# benchmark to run the same kernels.
#   bash bench/blas_core.sh [build_dir=build]   ->   Cooperlake
set -euo pipefail
cd "$(dirname "$0")/.."
"${1:-build}/bin/bench_train_throughput" --steps=1 --runs=1 --model_dim=32 --num_layers=1 \
  --num_heads=2 --hidden_dim=64 --vocab=50 --seq=8 --batch=2 2>/dev/null |
  awk '{ for (i = 1; i < NF; ++i) if ($i == "blas_core") print $(i + 1) }'
