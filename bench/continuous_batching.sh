#!/usr/bin/env bash
# Continuous batching (issue 50, item 6): a short generation's first token while a 512-token one
# runs, on `glossa serve` with one replica (--num_batch_threads=1: both requests share one batch
# thread), with continuous batching and without it (--no_continuous_batching: the short one waits
# for the long one's batch to end). The bundle is bench_predictor's (the tiny Austen LM).
# Then 16 concurrent generation clients (bench/generation_load.py) with the default layout.
# Prints medians over `reps` runs (the two .py files say what each column is).
#   bash bench/continuous_batching.sh [build_dir=build] [reps=5]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
reps="${2:-5}"
for b in bench_predictor glossa; do
  [ -x "$build/bin/$b" ] || { echo "build first: cmake --build $build"; exit 1; }
done
work="${TMPDIR:-/tmp}/glossa_bench_predictor"
[ -f "$work/bundle/MANIFEST.json" ] || "$build/bin/bench_predictor" --workdir="$work" --sentences=1 --runs=1 > /dev/null 2>&1
med() { printf "%s\n" "$@" | sort -g | sed -n "$(( (${#@} + 1) / 2 ))p"; }
printf "%-12s %16s %18s %13s %11s %8s %13s\n" batching first_token_ms first_token_steps queued_steps long_steps step_ms join_step_ms
for mode in continuous off; do
  flags=(--num_batch_threads=1)
  [ "$mode" = off ] && flags+=(--no_continuous_batching)
  rm -f "$work/port_cb"
  "$build/bin/glossa" serve --bundle="$work/bundle" --port=0 --port_file="$work/port_cb" "${flags[@]}" > "$work/serve_cb.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [ -s "$work/port_cb" ] && break; sleep 0.1; done
  port=$(cat "$work/port_cb")
  ms=(); st=(); q=(); ls=(); sm=(); js=()
  for _ in $(seq "$reps"); do
    out=$(/usr/bin/python3 bench/continuous_batching.py --port="$port" --continuous=$([ "$mode" = off ] && echo 0 || echo 1))
    read -r _ a _ b _ c _ d _ e _ f <<<"$out"
    ms+=("$a"); st+=("$b"); q+=("$c"); ls+=("$d"); sm+=("$e"); js+=("$f")
  done
  printf "%-12s %16s %18s %13s %11s %8s %13s\n" "$mode" "$(med "${ms[@]}")" "$(med "${st[@]}")" "$(med "${q[@]}")" "$(med "${ls[@]}")" "$(med "${sm[@]}")" "$(med "${js[@]}")"
  kill -TERM "$pid"; wait "$pid"
done
# Throughput: 16 concurrent clients generating (bench/generation_load.py), with the default
# layout (one replica per core), continuous batching on and off.
printf "\n%-12s %8s %10s %12s %9s %9s\n" batching clients req/s tokens/s p50_ms p99_ms
for mode in continuous off; do
  flags=()
  [ "$mode" = off ] && flags+=(--no_continuous_batching)
  rm -f "$work/port_cb"
  "$build/bin/glossa" serve --bundle="$work/bundle" --port=0 --port_file="$work/port_cb" ${flags[@]+"${flags[@]}"} > "$work/serve_cb.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [ -s "$work/port_cb" ] && break; sleep 0.1; done
  port=$(cat "$work/port_cb")
  rs=(); ts=(); p50=(); p99=()
  for _ in $(seq "$reps"); do
    read -r _ a _ b _ c _ d <<<"$(/usr/bin/python3 bench/generation_load.py --port="$port" --clients=16 --requests=8)"
    rs+=("$a"); ts+=("$b"); p50+=("$c"); p99+=("$d")
  done
  printf "%-12s %8s %10s %12s %9s %9s\n" "$mode" 16 "$(med "${rs[@]}")" "$(med "${ts[@]}")" "$(med "${p50[@]}")" "$(med "${p99[@]}")"
  kill -TERM "$pid"; wait "$pid"
done
echo "CPU: $(bash bench/cpu.sh)"
echo "reproduce: bash bench/continuous_batching.sh $build $reps"
