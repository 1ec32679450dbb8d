#!/usr/bin/env bash
# Data-parallel training on this machine: the 512-wide Transformer LM (model dim 512, 6 layers,
# seq 256, global batch 8, vocab 8000, fp32) as
#   glossa 1x2: one process on every core (the fp32 layout of glossa/runtime/cpu_runtime.h),
#   glossa 2x1: two c10d/Gloo workers with half the batch each, one core each (LOCAL_WORLD_SIZE=2),
#               gradients averaged in 25 MB buckets started during the backward pass;
#   torch DDP 2x1: the same model in PyTorch (Debian's python3-torch) under
#               DistributedDataParallel over Gloo, two processes, one thread each; once as
#               Debian ships it, once with OPENBLAS_CORETYPE set to the GEMM kernels Glossa picks
#               (UseBestBlasKernels: stock OpenBLAS falls back to SSE3 kernels on these VMs);
# in one run, alternating `reps` times (medians of medians). Prints global tokens/s, the ratio of
# glossa 2x1 to torch DDP 2x1, and the allreduce bytes and exposed (not hidden by the backward
# pass) time per step; and the allreduce cost alone (Gloo ring over loopback) for the prediction
# in docs/distributed.md.
#   bash bench/distributed.sh [runs=3] [build_dir=build] [reps=3]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
build="${2:-build}"
reps="${3:-3}"
bin="$build/bin/bench_train_throughput"
[ -x "$bin" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864
shape="--model_dim=512 --num_layers=6 --num_heads=8 --hidden_dim=2048 --vocab=8000 --seq=256 --batch=8 --steps=3"
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# two <out> <command...>: two workers of `command` with the standard environment; rank 0's output.
two() {
  local out="$1"; shift
  local p; p=$(port)
  WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$@" > /dev/null &
  local other=$!
  WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$@" > "$out"
  wait "$other"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g1s=(); g2s=(); t2s=(); s2s=(); mb=0; ex=(); early=0; core=""
for _ in $(seq "$reps"); do
  g1s+=("$("$bin" $shape --runs="$runs" 2>/dev/null | awk '/glossa_tokens_per_sec/ {print $2}')")
  two "$tmp/g2" "$bin" $shape --runs="$runs" --threads=1
  g2s+=("$(awk '/glossa_tokens_per_sec/ {print $2}' "$tmp/g2")")
  core=$(awk '/glossa_tokens_per_sec/ {print $10}' "$tmp/g2")
  ex+=("$(awk '/allreduce_mb_per_step/ {print $4}' "$tmp/g2")")
  mb=$(awk '/allreduce_mb_per_step/ {print $2}' "$tmp/g2")
  early=$(awk '/allreduce_mb_per_step/ {print $8}' "$tmp/g2")
  two "$tmp/t2" /usr/bin/python3 bench/train_throughput.py $shape --runs="$runs" --threads=1
  t2s+=("$(awk '/torch_tokens_per_sec/ {print $2}' "$tmp/t2")")
  OPENBLAS_CORETYPE="$core" two "$tmp/s2" /usr/bin/python3 bench/train_throughput.py $shape --runs="$runs" --threads=1
  s2s+=("$(awk '/torch_tokens_per_sec/ {print $2}' "$tmp/s2")")
done
med() { printf "%s\n" "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
g1=$(med "${g1s[@]}"); g2=$(med "${g2s[@]}"); t2=$(med "${t2s[@]}"); s2=$(med "${s2s[@]}"); e=$(med "${ex[@]}")
printf "%-44s %12s\n" configuration tokens/s
printf "%-44s %12.1f\n" "glossa 1 process x 2 threads" "$g1" "glossa 2 processes x 1" "$g2" \
  "torch DDP 2 processes x 1" "$t2" "torch DDP 2 processes x 1, $core kernels" "$s2"
awk -v g="$g2" -v t="$t2" -v s="$s2" -v g1="$g1" 'BEGIN {
  printf "glossa 2x1 / torch DDP 2x1: %.2fx (%.2fx with the same kernels)   glossa 2x1 / glossa 1x2: %.2fx\n", g / t, g / s, g / g1 }'
echo "gradient allreduce per step: $mb MB per rank in 25 MB buckets, $e ms not hidden by the backward pass (median), $early of the buckets started during the backward pass"
# The allreduce alone: the same bytes through the same Gloo ring, no model (time per step).
cat > "$tmp/ar.py" <<'PY'
import os, statistics, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
n = int(float(sys.argv[1]) * 1e6 / 4)
bucket = 25 * 2**20 // 4
bufs = [torch.ones(min(bucket, n - i)) for i in range(0, n, bucket)]
for b in bufs: dist.all_reduce(b)
ts = []
for _ in range(10):
    t0 = time.perf_counter()
    for b in bufs: dist.all_reduce(b)
    ts.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print(f"allreduce_ms {1e3 * statistics.median(ts):.1f}")
PY
two "$tmp/ar" /usr/bin/python3 "$tmp/ar.py" "$mb"
echo "the same bytes allreduced alone (Gloo, 2 ranks, loopback): $(awk '{print $2}' "$tmp/ar") ms per step"
echo "reproduce: bash bench/distributed.sh $runs $build $reps"
