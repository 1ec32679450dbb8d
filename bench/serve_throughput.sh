#!/usr/bin/env bash
# `glossa serve` under load: 1, 4 and 16 concurrent clients (bench_serve_load, keep-alive HTTP
# connections) scoring short Austen sentences (the first 12 words of Dev lines) with the bundle
# bench_predictor exports, dynamic batching on (--max_batch_size=16, --batch_timeout_micros=0, or
# $BATCH_TIMEOUT_MICROS) with batch-invariant kernels (the default, "on"), with ATen's kernels
# ("plain": --no_batch_invariant), and off (--no_batching: each request runs alone on its HTTP
# thread).
# Prints requests/s and p50/p99 latency, medians over `reps` runs of `requests` requests.
#   bash bench/serve_throughput.sh [requests=400] [build_dir=build] [reps=3]
set -euo pipefail
cd "$(dirname "$0")/.."
requests="${1:-400}"
build="${2:-build}"
reps="${3:-3}"
for b in bench_predictor bench_serve_load glossa; do
  [ -x "$build/bin/$b" ] || { echo "build first: cmake --build $build"; exit 1; }
done
work="${TMPDIR:-/tmp}/glossa_bench_predictor"
[ -f "$work/bundle/MANIFEST.json" ] || "$build/bin/bench_predictor" --workdir="$work" --sentences=1 --runs=1 > /dev/null 2>&1
awk 'NF && c++ < 400 { n = NF < 12 ? NF : 12; s = $1; for (i = 2; i <= n; i++) s = s " " $i; print s }' data/austen/dev.txt > "$work/sentences.txt"
med() { printf "%s\n" "$@" | sort -g | sed -n "$(( (reps + 1) / 2 ))p"; }
printf "%-9s %8s %10s %9s %9s\n" batching clients req/s p50_ms p99_ms
for mode in on plain off; do
  flags=(--max_batch_size=16 --batch_timeout_micros=${BATCH_TIMEOUT_MICROS:-0})
  [ "$mode" = plain ] && flags+=(--no_batch_invariant)
  [ "$mode" = off ] && flags=(--no_batching)
  rm -f "$work/port"
  "$build/bin/glossa" serve --bundle="$work/bundle" --port=0 --port_file="$work/port" "${flags[@]}" > "$work/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [ -s "$work/port" ] && break; sleep 0.1; done
  port=$(cat "$work/port")
  "$build/bin/bench_serve_load" --port="$port" --clients=4 --requests=40 --sentences_file="$work/sentences.txt" > /dev/null  # warm-up
  for clients in 1 4 16; do
    rs=(); p50s=(); p99s=()
    for _ in $(seq "$reps"); do
      out=$("$build/bin/bench_serve_load" --port="$port" --clients=$clients --requests="$requests" --sentences_file="$work/sentences.txt")
      rs+=("$(awk '{print $2}' <<<"$out")"); p50s+=("$(awk '{print $4}' <<<"$out")"); p99s+=("$(awk '{print $6}' <<<"$out")")
    done
    printf "%-9s %8s %10s %9s %9s\n" "$mode" "$clients" "$(med "${rs[@]}")" "$(med "${p50s[@]}")" "$(med "${p99s[@]}")"
  done
  kill -TERM "$pid"; wait "$pid"
done
echo "reproduce: bash bench/serve_throughput.sh $requests $build $reps"
