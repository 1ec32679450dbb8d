#!/usr/bin/env bash
# GShard expert parallelism on this machine: the Austen MoE LM widened so its experts hold most
# of its weights (lm.austen.TransformerLmMoeTiny with 16 experts of hidden dim 2,048 in its MoE
# layer: 8.4 M expert parameters beside 1.5 M dense ones) trained for `steps` steps on 1, 2 and 4
# ranks (num_devices = ranks: each rank holds 16 / ranks experts and their Adam slots; 2 ranks per
# core at 4), and for each:
#   - global tokens/s (rank 0's last progress line, median of `reps` runs);
#   - parameter + optimizer-slot bytes per rank, read from the checkpoint the run wrote (rank 0's
#     file holds the replicated variables, each rank file one rank's experts), and their ratio to
#     the one-process model's;
#   - the expert all-to-all the run did (the trainer's summary line) and that exchange's bytes
#     timed alone through Glossa's Distributed::AllToAll (bench_model_parallel) and PyTorch's
#     all_to_all_single (bench/model_parallel.py), both over Gloo on loopback, same ranks.
# Then GPipe's pipeline parallelism: the Austen LM at width 256 with 4 layers of hidden dim 1,024
# (task.stack.splits = ranks, 4 micro-batches; 1 rank: unpipelined) on 1, 2 and 4 ranks
# (--mesh=pipe:N): tokens/s, parameter + slot bytes per rank as above (rank 0's file holds the
# global step, each rank file one stage's layers, stage 0's with the embedding and the last's
# with the softmax and final layer norm: Lingvo's placement), the activations stage 0
# sent per step (the trainer's summary line), and one micro-batch's hop timed alone through
# Glossa's Distributed::Send/Recv and PyTorch's dist.send/recv.
# Then tensor parallelism on the 512-wide LM over model axes of 1, 2 and 4 ranks (see below).
# docs/distributed.md's cost model uses these figures.
#   bash bench/model_parallel.sh [build=build] [steps=20] [reps=3]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
steps="${2:-20}"
reps="${3:-3}"
glossa="$build/bin/glossa"
a2a="$build/bin/bench_model_parallel"
[ -x "$glossa" ] && [ -x "$a2a" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
moe='task.stack.transformer_layer_params_tpl[1].tr_fflayer_tpl'
wide="$moe.num_experts : 16; $moe.hidden_dim : 2048; task.train.steps_per_loop : 5; task.train.save_interval_steps : 1000000"
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Parameter + slot bytes per rank: rank 0's checkpoint file plus one rank file.
per_rank_bytes() {
  /usr/bin/python3 - "$1" <<'PY'
import glob, json, struct, sys
def size(f):
    with open(f, "rb") as h:
        n = struct.unpack("<Q", h.read(8))[0]
        head = json.loads(h.read(n))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in head.items() if k != "__metadata__")
d = sys.argv[1]
chief = sorted(glob.glob(d + "/ckpt-*[0-9].safetensors"))[-1]
ranks = sorted(glob.glob(chief[:-len(".safetensors")] + "-rank-*"))
print(size(chief) + (max(size(r) for r in ranks) if ranks else 0))
PY
}
med() { printf "%s\n" "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
printf "%-6s %10s %14s %9s %26s %14s %14s %7s\n" ranks tokens/s "MB per rank" "of 1" "all-to-all per step" "glossa a2a ms" "torch a2a ms" ratio
one_bytes=0
for n in 1 2 4; do
  toks=(); line=""; bytes=0
  for r in $(seq "$reps"); do
    logdir="$tmp/n$n-$r"
    flags=(--model=lm.austen.TransformerLmMoeTiny --random_seed=3 --intra_op_threads=1
           "--model_params_override=$wide; $moe.num_devices : $n; $moe.num_groups : $n"
           --logdir="$logdir" --max_steps="$steps")
    [ "$n" -gt 1 ] && flags+=(--nproc_per_node="$n")
    "$glossa" train "${flags[@]}" > "$tmp/log" 2>&1 || { tail -5 "$tmp/log"; exit 1; }
    toks+=("$(grep -o '[0-9.]*k* tok/s' "$tmp/log" | tail -1 | awk '{v=$1; if (v ~ /k$/) {sub(/k$/, "", v); v *= 1000} print v}')")
    line=$(sed -n 's/^\[rank 0\] expert all-to-all over .* ranks: //p' "$tmp/log")
    bytes=$(per_rank_bytes "$logdir/train")
  done
  [ "$n" -eq 1 ] && one_bytes=$bytes
  ga="-"; ta="-"; ratio="-"
  if [ "$n" -gt 1 ]; then
    size=$(sed -n 's/.*the largest \([0-9]*\) bytes.*/\1/p' <<<"$line")
    gs=(); ts=()
    for _ in $(seq "$reps"); do
      p=$(port); pids=()
      for r in $(seq 1 $((n - 1))); do
        WORLD_SIZE=$n RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 "$a2a" --op=alltoall --bytes="$size" --reps=50 > /dev/null & pids+=($!)
      done
      gs+=("$(WORLD_SIZE=$n RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 "$a2a" --op=alltoall --bytes="$size" --reps=50 | awk '{print $2}')")
      wait "${pids[@]}"
      p=$(port); pids=()
      for r in $(seq 1 $((n - 1))); do
        WORLD_SIZE=$n RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 /usr/bin/python3 bench/model_parallel.py --bytes="$size" --reps=50 > /dev/null & pids+=($!)
      done
      ts+=("$(WORLD_SIZE=$n RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 /usr/bin/python3 bench/model_parallel.py --bytes="$size" --reps=50 | awk '{print $2}')")
      wait "${pids[@]}"
    done
    ga=$(med "${gs[@]}"); ta=$(med "${ts[@]}")
    ratio=$(awk -v g="$ga" -v t="$ta" 'BEGIN { printf "%.2f", t / g }')
  fi
  per=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }')
  of=$(awk -v b="$bytes" -v o="$one_bytes" 'BEGIN { printf "%.3f", b / o }')
  a2a_mb=$(sed -n 's/.*, \([0-9.]*\) MB per step.*/\1 MB/p' <<<"$line")
  printf "%-6s %10.0f %14s %9s %26s %14s %14s %7s\n" "$n" "$(med "${toks[@]}")" "$per" "$of" "${a2a_mb:--}" "$ga" "$ta" "$ratio"
  [ -n "$line" ] && echo "       ($line)"
done
echo "ratio: torch all_to_all_single ms / glossa AllToAll ms on the same bytes (> 1: Glossa faster)"

# GPipe stages on ranks.
pipe_model='task.emb.embedding_dim : 256; task.position_emb.embedding_dim : 256; task.softmax.input_dim : 256; task.stack.num_layers : 4; task.stack.mdl_dim : 256; task.stack.hidden_dim : 1024; task.stack.num_atten_heads : 4; task.stack.num_micro_batches : 4; task.train.steps_per_loop : 5; task.train.save_interval_steps : 1000000'
# One hop of `bytes` down `n` ranks: "glossa_ms torch_ms" (medians over reps runs).
hop_ms() {
  local n=$1 size=$2 gs=() ts=() p pids r
  for _ in $(seq "$reps"); do
    p=$(port); pids=()
    for r in $(seq 0 $((n - 1))); do
      WORLD_SIZE=$n RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 "$a2a" --op=sendrecv --bytes="$size" --reps=50 > "$tmp/hop$r" & pids+=($!)
    done
    wait "${pids[@]}"
    gs+=("$(cat "$tmp"/hop* | awk '/sendrecv_ms/ {print $2}')")
    p=$(port); pids=()
    for r in $(seq 0 $((n - 1))); do
      WORLD_SIZE=$n RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 /usr/bin/python3 bench/model_parallel.py --op=sendrecv --bytes="$size" --reps=50 > "$tmp/hop$r" & pids+=($!)
    done
    wait "${pids[@]}"
    ts+=("$(cat "$tmp"/hop* | awk '/sendrecv_ms/ {print $2}')")
  done
  echo "$(med "${gs[@]}") $(med "${ts[@]}")"
}
echo
printf "%-6s %10s %14s %9s %26s %14s %14s %7s\n" stages tokens/s "MB per rank" "of 1" "activations per step" "glossa hop ms" "torch hop ms" ratio
one_bytes=0
for n in 1 2 4; do
  toks=(); line=""; bytes=0
  for r in $(seq "$reps"); do
    logdir="$tmp/p$n-$r"
    flags=(--model=lm.austen.TransformerLmTiny --random_seed=3 --intra_op_threads=1
           "--model_params_override=$pipe_model; task.stack.splits : $n"
           --logdir="$logdir" --max_steps="$steps")
    [ "$n" -gt 1 ] && flags+=(--nproc_per_node="$n" --mesh=pipe:"$n")
    "$glossa" train "${flags[@]}" > "$tmp/log" 2>&1 || { tail -5 "$tmp/log"; exit 1; }
    toks+=("$(grep -o '[0-9.]*k* tok/s' "$tmp/log" | tail -1 | awk '{v=$1; if (v ~ /k$/) {sub(/k$/, "", v); v *= 1000} print v}')")
    line=$(sed -n 's/^\[rank 0\] pipeline over .* ranks: //p' "$tmp/log")
    bytes=$(per_rank_bytes "$logdir/train")
  done
  [ "$n" -eq 1 ] && one_bytes=$bytes
  gh="-"; th="-"; ratio="-"; act="-"
  if [ "$n" -gt 1 ]; then
    sends=$(sed -n 's/.*sent \([0-9.]*\) micro-batches.*/\1/p' <<<"$line")
    mb=$(sed -n 's/.*, \([0-9.]*\) MB per step.*/\1/p' <<<"$line")
    act="$mb MB"
    size=$(awk -v m="$mb" -v s="$sends" 'BEGIN { printf "%d", m * 1e6 / s }')
    read -r gh th <<<"$(hop_ms "$n" "$size")"
    ratio=$(awk -v g="$gh" -v t="$th" 'BEGIN { printf "%.2f", t / g }')
  fi
  per=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }')
  of=$(awk -v b="$bytes" -v o="$one_bytes" 'BEGIN { printf "%.3f", b / o }')
  printf "%-6s %10.0f %14s %9s %26s %14s %14s %7s\n" "$n" "$(med "${toks[@]}")" "$per" "$of" "$act" "$gh" "$th" "$ratio"
done
echo "ratio: torch send/recv ms / glossa Send/Recv ms per hop of one micro-batch (> 1: Glossa faster)"

# Tensor parallelism (--mesh=model:N) on the 512-wide LM (lm.austen.TransformerLm512: 6 layers,
# 8 heads, 2,048 hidden units, 2,000 classes): its heads, hidden units and vocabulary split over
# N ranks by the split mappings in its Params. Tokens/s, parameter + slot bytes per rank as above
# (rank 0's file holds the replicated layer norms and output biases, each rank file one rank's
# blocks), the all-reduces the run did (the trainer's summary line), and one block's all-reduce
# (its activations, [2048, 512] floats) timed alone through Glossa's Distributed::AllReduceSum and
# PyTorch's dist.all_reduce over Gloo on loopback.
l='task.stack.transformer_layer_params_tpl'
tp_model="$l.tr_atten_tpl.atten_tpl.weight_split_dims_mapping : [None, 'model', None]; $l.tr_fflayer_tpl.weight_split_dims_mapping_list : [[None, 'model'], ['model', None]]; task.emb.weight_split_dims_mapping : ['model', None]; task.softmax.weight_split_dims_mapping : [None, 'model']; task.train.steps_per_loop : 5; task.train.save_interval_steps : 1000000"
allreduce_ms() {
  local n=$1 size=$2 gs=() ts=() p pids r
  for _ in $(seq "$reps"); do
    for peer in glossa torch; do
      p=$(port); pids=()
      for r in $(seq 0 $((n - 1))); do
        if [ "$peer" = glossa ]; then
          WORLD_SIZE=$n RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 "$a2a" --op=allreduce --bytes="$size" --reps=50 > "$tmp/ar$r" & pids+=($!)
        else
          WORLD_SIZE=$n RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p OMP_NUM_THREADS=1 /usr/bin/python3 bench/model_parallel.py --op=allreduce --bytes="$size" --reps=50 > "$tmp/ar$r" & pids+=($!)
        fi
      done
      wait "${pids[@]}"
      if [ "$peer" = glossa ]; then gs+=("$(awk '{print $2}' "$tmp/ar0")"); else ts+=("$(awk '{print $2}' "$tmp/ar0")"); fi
    done
  done
  echo "$(med "${gs[@]}") $(med "${ts[@]}")"
}
echo
printf "%-6s %10s %14s %9s %30s %14s %14s %7s\n" model tokens/s "MB per rank" "of 1" "all-reduces per step" "glossa ar ms" "torch ar ms" ratio
one_bytes=0
for n in 1 2 4; do
  toks=(); line=""; bytes=0
  for r in $(seq "$reps"); do
    logdir="$tmp/m$n-$r"
    flags=(--model=lm.austen.TransformerLm512 --random_seed=3 --intra_op_threads=1
           "--model_params_override=$tp_model" --logdir="$logdir" --max_steps="$steps")
    [ "$n" -gt 1 ] && flags+=(--nproc_per_node="$n" --mesh=model:"$n")
    "$glossa" train "${flags[@]}" > "$tmp/log" 2>&1 || { tail -5 "$tmp/log"; exit 1; }
    toks+=("$(grep -o '[0-9.]*k* tok/s' "$tmp/log" | tail -1 | awk '{v=$1; if (v ~ /k$/) {sub(/k$/, "", v); v *= 1000} print v}')")
    line=$(sed -n 's/^\[rank 0\] model all-reduce over .* ranks: //p' "$tmp/log")
    bytes=$(per_rank_bytes "$logdir/train")
  done
  [ "$n" -eq 1 ] && one_bytes=$bytes
  ga="-"; ta="-"; ratio="-"
  if [ "$n" -gt 1 ]; then
    read -r ga ta <<<"$(allreduce_ms "$n" $((2048 * 512 * 4)))"
    ratio=$(awk -v g="$ga" -v t="$ta" 'BEGIN { printf "%.2f", t / g }')
  fi
  per=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }')
  of=$(awk -v b="$bytes" -v o="$one_bytes" 'BEGIN { printf "%.3f", b / o }')
  printf "%-6s %10.0f %14s %9s %30s %14s %14s %7s\n" "$n" "$(med "${toks[@]}")" "$per" "$of" "${line:--}" "$ga" "$ta" "$ratio"
done
echo "ratio: torch all_reduce ms / glossa AllReduceSum ms on one block's [2048, 512] floats (> 1: Glossa faster)"
echo "reproduce: bash bench/model_parallel.sh $build $steps $reps"
