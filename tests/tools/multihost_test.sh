#!/usr/bin/env bash
# Two hosts on one machine (docs/distributed.md, "Several hosts"): two network namespaces joined
# by a veth pair, each with its own address, one rank in each started from the environment as
# torchrun starts a node's workers (WORLD_SIZE, RANK, MASTER_ADDR = host A's address,
# GLOO_SOCKET_IFNAME = the host's interface). The model is GShard's expert-parallel MoE LM
# (lm.austen.TransformerLmMoeTinyExpertParallel: 2 of its 4 experts on each host, tokens exchanged
# by all-to-all over the link). Checks:
#   1. equivalence: the two-host run writes the same checkpoint bytes (rank 0's file and both
#      expert shards) as --nproc_per_node=2 on 127.0.0.1;
#   2. a cut link (ip link set ... down) ends both ranks with an error naming the lost rank
#      within the collective timeout;
#   3. with the link back, a restart on both hosts resumes from the last complete checkpoint;
#   4. GPipe's stages across the hosts: the tiny LM's 2 layers as 2 stages (--mesh=pipe:2,
#      micro-batches by send/recv over the link) write the same checkpoint bytes (rank 0's file
#      and both stages' files) as on one host;
#   5. tensor parallelism across the hosts (--mesh=model:2: heads, hidden units and vocabulary
#      split, all-reduces over the link): the same checkpoint bytes as on one host; a rank killed
#      mid-training ends the other naming it; a restart on both hosts resumes;
#   6. MoE inside a pipeline across the hosts (--mesh=pipe:2,expert:2, 2 ranks per host: host A
#      stage 0, host B stage 1 with the MoE layer's experts split over its 2 ranks): the same
#      checkpoint bytes as 4 ranks on one host; a killed rank on host B ends every other rank
#      naming it; a restart on both hosts resumes.
# Needs root (ip netns); skipped with a message where namespaces cannot be created. The namespaces
# and the veth pair are deleted on every exit path.
#   bash tests/tools/multihost_test.sh build/bin/glossa
set -u
glossa="$(readlink -f "$1")"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # check, wait_for, wait_until, slowdown
tmp=$(mktemp -d)
id=$$
nsa="glossa_mh_a_$id" nsb="glossa_mh_b_$id"
va="gmh${id}a" vb="gmh${id}b"  # interface names: at most 15 characters
va=${va:0:15} vb=${vb:0:15}
addr_a=10.213.77.1 addr_b=10.213.77.2
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

if ! ip netns add "$nsa" 2> "$tmp/netns.err"; then
  echo "multihost_test: skipped: cannot create network namespaces here ($(head -1 "$tmp/netns.err")); it needs root and iproute2"
  exit 0
fi
set -e
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "$addr_a/24" dev "$va"
ip -n "$nsb" addr add "$addr_b/24" dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up
set +e

moe=(--model=lm.austen.TransformerLmMoeTinyExpertParallel --random_seed=3 --intra_op_threads=1
     "--model_params_override=task.train.steps_per_loop : 5; task.train.save_interval_steps : 10")
port=29517
model=("${moe[@]}")  # what host() trains

# host <a|b> <logfile> <glossa args...>: rank 0 on host A, rank 1 on host B, in the background.
# Both "hosts" share this machine's cores, so LOCAL_WORLD_SIZE=2 gives each worker the thread
# layout --nproc_per_node=2 gives it (and the same GEMM rounding).
host() {
  local h="$1" log="$2"; shift 2
  local ns="$nsa" dev="$va" rank=0
  if [ "$h" = b ]; then ns="$nsb" dev="$vb" rank=1; fi
  ip netns exec "$ns" env WORLD_SIZE=2 RANK=$rank LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR="$addr_a" MASTER_PORT=$port GLOO_SOCKET_IFNAME="$dev" \
    "$glossa" train "${model[@]}" "$@" > "$log" 2>&1 &
  pids+=($!)
}

# 1. Equivalence with one host.
"$glossa" train "${moe[@]}" --logdir="$tmp/one" --max_steps=10 --nproc_per_node=2 > "$tmp/one.log" 2>&1
check "the one-host run exits 0: $(tail -2 "$tmp/one.log")" test $? -eq 0
host a "$tmp/two0.log" --logdir="$tmp/two" --max_steps=10
host b "$tmp/two1.log" --logdir="$tmp/two" --max_steps=10
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
pids=()
check "both hosts exit 0 ($rc0, $rc1): $(tail -2 "$tmp/two0.log") $(tail -2 "$tmp/two1.log")" test "$rc0" -eq 0 -a "$rc1" -eq 0
check "rank 1 trained on host B's address" grep -q 'rank 1 of 2' "$tmp/two1.log"
for f in ckpt-00000010.safetensors ckpt-00000010-rank-00000-of-00002.safetensors \
         ckpt-00000010-rank-00001-of-00002.safetensors; do
  check "two hosts write the bytes one host writes: $f" cmp -s "$tmp/one/train/$f" "$tmp/two/train/$f"
done

# 2. Cut the link mid-training: both ranks end, naming the lost rank, within the timeout.
timeout_s=15
host a "$tmp/cut0.log" --logdir="$tmp/cut" --max_steps=100000 --dist_timeout=$timeout_s
host b "$tmp/cut1.log" --logdir="$tmp/cut" --max_steps=100000 --dist_timeout=$timeout_s
wait_checkpoint "$tmp/cut/train" 20 120 "$tmp/cut0.log" "$tmp/cut1.log"
ip -n "$nsb" link set "$vb" down
start=$(date +%s)
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
took=$(( $(date +%s) - start ))
pids=()
# Two timeouts (host B's collective, then its store) and the diagnosis; the slack for exiting
# stretches with how busy the machine is.
bound=$((2 * timeout_s + 10 * $(slowdown)))
check "both ranks exit non-zero ($rc0, $rc1)" test "$rc0" -ne 0 -a "$rc1" -ne 0
check "within the timeout and the diagnosis (${took} s for a ${timeout_s} s timeout; bound $bound s)" test "$took" -le "$bound"
check "host A names rank 1: $(tail -1 "$tmp/cut0.log")" grep -q 'lost rank(s): 1' "$tmp/cut0.log"
check "host B names rank 0 and its store: $(tail -1 "$tmp/cut1.log")" grep -q "lost rank(s): 0 (it hosts the rendezvous store at $addr_a:$port" "$tmp/cut1.log"

# 3. The link back, a restart on both hosts resumes from the last complete checkpoint.
ip -n "$nsb" link set "$vb" up
last=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9]*\)"$/\1/p' "$tmp/cut/train/checkpoint")
check "a complete checkpoint survived (step '$last')" test -n "$last"
target=$(( ${last:-0} + 10 ))
host a "$tmp/re0.log" --logdir="$tmp/cut" --max_steps=$target
host b "$tmp/re1.log" --logdir="$tmp/cut" --max_steps=$target
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
pids=()
check "the restart exits 0 on both hosts ($rc0, $rc1): $(tail -2 "$tmp/re0.log") $(tail -2 "$tmp/re1.log")" test "$rc0" -eq 0 -a "$rc1" -eq 0
check "it resumed from step $last: $(grep restored "$tmp/re0.log")" grep -q "restored .*ckpt-0*$last at step $last" "$tmp/re0.log"
check "and wrote step $target with both expert shards" test -f "$(printf '%s/cut/train/ckpt-%08d-rank-00001-of-00002.safetensors' "$tmp" "$target")"

# 4. Pipeline stages on the two hosts: the same bytes as on one host.
model=(--model=lm.austen.TransformerLmTiny --random_seed=3 --intra_op_threads=1
       "--model_params_override=task.stack.num_layers : 2; task.stack.splits : 2; task.stack.num_micro_batches : 2; task.train.steps_per_loop : 5; task.train.save_interval_steps : 10"
       --mesh=pipe:2)
"$glossa" train "${model[@]}" --logdir="$tmp/pone" --max_steps=10 --nproc_per_node=2 > "$tmp/pone.log" 2>&1
check "the one-host pipeline exits 0: $(tail -2 "$tmp/pone.log")" test $? -eq 0
host a "$tmp/ptwo0.log" --logdir="$tmp/ptwo" --max_steps=10
host b "$tmp/ptwo1.log" --logdir="$tmp/ptwo" --max_steps=10
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
pids=()
check "both pipeline hosts exit 0 ($rc0, $rc1): $(tail -2 "$tmp/ptwo0.log") $(tail -2 "$tmp/ptwo1.log")" test "$rc0" -eq 0 -a "$rc1" -eq 0
check "host B ran stage 1" grep -q 'pipeline stage 1' "$tmp/ptwo1.log"
for f in ckpt-00000010.safetensors ckpt-00000010-rank-00000-of-00002.safetensors \
         ckpt-00000010-rank-00001-of-00002.safetensors; do
  check "two pipeline hosts write the bytes one host writes: $f" cmp -s "$tmp/pone/train/$f" "$tmp/ptwo/train/$f"
done

# 5. Tensor parallelism across the hosts: the tiny LM's heads, hidden units and vocabulary split
# over a model axis of 2 (--mesh=model:2, two all-reduces per layer forward and two backward over
# the link) write the same checkpoint bytes as on one host; a rank killed mid-training ends the
# other naming it, and a restart on both hosts resumes.
l=task.stack.transformer_layer_params_tpl
model=(--model=lm.austen.TransformerLmTiny --random_seed=3 --intra_op_threads=1
       "--model_params_override=task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; $l.tr_atten_tpl.atten_tpl.weight_split_dims_mapping : [None, 'model', None]; $l.tr_fflayer_tpl.weight_split_dims_mapping_list : [[None, 'model'], ['model', None]]; task.emb.weight_split_dims_mapping : ['model', None]; task.softmax.weight_split_dims_mapping : [None, 'model']"
       --mesh=model:2)
"$glossa" train "${model[@]}" --logdir="$tmp/tone" --max_steps=10 --nproc_per_node=2 > "$tmp/tone.log" 2>&1
check "the one-host model axis exits 0: $(tail -2 "$tmp/tone.log")" test $? -eq 0
host a "$tmp/ttwo0.log" --logdir="$tmp/ttwo" --max_steps=10
host b "$tmp/ttwo1.log" --logdir="$tmp/ttwo" --max_steps=10
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
pids=()
check "both model-axis hosts exit 0 ($rc0, $rc1): $(tail -2 "$tmp/ttwo0.log") $(tail -2 "$tmp/ttwo1.log")" test "$rc0" -eq 0 -a "$rc1" -eq 0
check "host B held model shard 1" grep -q 'model shard 1 of 2' "$tmp/ttwo1.log"
for f in ckpt-00000010.safetensors ckpt-00000010-rank-00000-of-00002.safetensors \
         ckpt-00000010-rank-00001-of-00002.safetensors; do
  check "two model-axis hosts write the bytes one host writes: $f" cmp -s "$tmp/tone/train/$f" "$tmp/ttwo/train/$f"
done
host a "$tmp/tk0.log" --logdir="$tmp/tk" --max_steps=100000 --dist_timeout=$timeout_s
host b "$tmp/tk1.log" --logdir="$tmp/tk" --max_steps=100000 --dist_timeout=$timeout_s
wait_checkpoint "$tmp/tk/train" 20 120 "$tmp/tk0.log" "$tmp/tk1.log"
kill -9 "${pids[1]}"
start=$(date +%s)
wait "${pids[0]}"; rc0=$?
took=$(( $(date +%s) - start ))
wait "${pids[1]}" 2>/dev/null
pids=()
bound=$((2 * timeout_s + 10 * $(slowdown)))
check "host A's rank exits non-zero when host B's is killed (rc $rc0)" test "$rc0" -ne 0
check "within the timeout and the diagnosis (${took} s; bound $bound s)" test "$took" -le "$bound"
check "naming rank 1: $(tail -1 "$tmp/tk0.log")" grep -q 'lost rank(s): 1' "$tmp/tk0.log"
last=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9]*\)"$/\1/p' "$tmp/tk/train/checkpoint")
check "a complete model-axis checkpoint survived (step '$last')" test -n "$last"
target=$(( ${last:-0} + 5 ))
host a "$tmp/tr0.log" --logdir="$tmp/tk" --max_steps=$target
host b "$tmp/tr1.log" --logdir="$tmp/tk" --max_steps=$target
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
pids=()
check "the restart exits 0 on both hosts ($rc0, $rc1)" test "$rc0" -eq 0 -a "$rc1" -eq 0
check "it resumed from step $last: $(grep restored "$tmp/tr0.log")" grep -q "restored .*ckpt-0*$last at step $last" "$tmp/tr0.log"

# 6. MoE inside a pipeline across the hosts: 4 ranks, ranks 0-1 on host A (stage 0), 2-3 on host
# B (stage 1: the MoE layer, 2 experts each, all-to-all inside host B); micro-batches and their
# gradients cross the link, and the stages' aux losses meet in an all-reduce over it.
model=(--model=lm.austen.TransformerLmMoeTinyExpertParallel --random_seed=3 --intra_op_threads=1
       "--model_params_override=task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; task.stack.splits : 2"
       --mesh=pipe:2,expert:2)
# host4 <a|b> <tag> <glossa args...>: the host's 2 of 4 ranks in the background, logs $tmp/<tag><rank>.log.
host4() {
  local h="$1" tag="$2"; shift 2
  local ns="$nsa" dev="$va" first=0
  if [ "$h" = b ]; then ns="$nsb" dev="$vb" first=2; fi
  for rank in $first $((first + 1)); do
    ip netns exec "$ns" env WORLD_SIZE=4 RANK=$rank LOCAL_RANK=$((rank - first)) LOCAL_WORLD_SIZE=4 \
      MASTER_ADDR="$addr_a" MASTER_PORT=$port GLOO_SOCKET_IFNAME="$dev" \
      "$glossa" train "${model[@]}" "$@" > "$tmp/$tag$rank.log" 2>&1 &
    pids+=($!)
  done
}
wait_all() {  # the exit codes of $pids, space-separated, into $rcs
  rcs=""
  for p in "${pids[@]}"; do wait "$p"; rcs="$rcs $?"; done
  pids=()
}
"$glossa" train "${model[@]}" --logdir="$tmp/xone" --max_steps=10 --nproc_per_node=4 > "$tmp/xone.log" 2>&1
check "the one-host pipe x expert run exits 0: $(tail -2 "$tmp/xone.log")" test $? -eq 0
host4 a x --logdir="$tmp/xtwo" --max_steps=10
host4 b x --logdir="$tmp/xtwo" --max_steps=10
wait_all
check "all 4 pipe x expert ranks exit 0 ($rcs): $(tail -1 "$tmp/x0.log") $(tail -1 "$tmp/x2.log")" test "$rcs" = " 0 0 0 0"
check "host B's rank 3 ran stage 1's experts: $(grep -m1 'rank 3 of 4' "$tmp/x3.log")" grep -q 'pipeline stage 1' "$tmp/x3.log"
for f in ckpt-00000010.safetensors ckpt-00000010-rank-0000{0,1,2,3}-of-00004.safetensors; do
  check "two pipe x expert hosts write the bytes one host writes: $f" cmp -s "$tmp/xone/train/$f" "$tmp/xtwo/train/$f"
done
host4 a xk --logdir="$tmp/xk" --max_steps=100000 --dist_timeout=$timeout_s
host4 b xk --logdir="$tmp/xk" --max_steps=100000 --dist_timeout=$timeout_s
wait_checkpoint "$tmp/xk/train" 20 180 "$tmp/xk0.log" "$tmp/xk2.log"
kill -9 "${pids[2]}"  # rank 2: host B's first
start=$(date +%s)
wait_all
took=$(( $(date +%s) - start ))
bound=$((2 * timeout_s + 10 * $(slowdown)))
check "every other rank exits non-zero when rank 2 is killed ($rcs)" bash -c "set -- $rcs; test \$1 -ne 0 -a \$2 -ne 0 -a \$4 -ne 0"
check "within the timeout and the diagnosis (${took} s; bound $bound s)" test "$took" -le "$bound"
for r in 0 1 3; do
  check "rank $r names a lost rank: $(tail -1 "$tmp/xk$r.log")" grep -q 'lost rank(s):' "$tmp/xk$r.log"
done
check "rank 3, its stage's other expert rank, names rank 2: $(tail -1 "$tmp/xk3.log")" grep -q 'lost rank(s):.*\b2\b' "$tmp/xk3.log"
last=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9]*\)"$/\1/p' "$tmp/xk/train/checkpoint")
check "a complete pipe x expert checkpoint survived (step '$last')" test -n "$last"
target=$(( ${last:-0} + 5 ))
host4 a xr --logdir="$tmp/xk" --max_steps=$target
host4 b xr --logdir="$tmp/xk" --max_steps=$target
wait_all
check "the pipe x expert restart exits 0 on both hosts ($rcs)" test "$rcs" = " 0 0 0 0"
check "it resumed from step $last: $(grep restored "$tmp/xr0.log")" grep -q "restored .*ckpt-0*$last at step $last" "$tmp/xr0.log"

[ "$fail" -eq 0 ] && echo "multihost_test: all checks passed"
exit "$fail"
