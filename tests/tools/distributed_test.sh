#!/usr/bin/env bash
# Data-parallel training, evaluation and decoding on 127.0.0.1 (docs/distributed.md), through the
# glossa binary: --nproc_per_node, workers started from the environment as torchrun would,
# reproducibility with dropout on, a killed worker, resuming, sharded eval/decode against
# unsharded, expert, pipeline and tensor (model-axis) parallelism, and configuration errors.
#   bash tests/tools/distributed_test.sh build/bin/glossa
set -u
glossa="$1"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # check, wait_for, wait_until, slowdown
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
# start_pair <name> <rank 0's args array> <rank 1's args array>: a 2-rank job started from the
# environment, as torchrun would. Rank 0 binds a port the kernel picks (MASTER_PORT=0: no probe
# that another test could race) and says it; rank 1 starts on it. Logs $tmp/<name>R.log, pids in
# pids[]; fails, naming what it waited for, when rank 0 has not said its port within 120 s.
start_pair() {
  local name="$1" port
  local -n start_pair_args0="$2" start_pair_args1="$3"
  pids=()
  WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=0 \
    "$glossa" "${start_pair_args0[@]}" > "$tmp/${name}0.log" 2>&1 &
  pids+=($!)
  wait_ranks "$tmp/${name}0.log" '^glossa: rank 0 hosts the rendezvous at ' 120 "$tmp/${name}0.log" || return 1
  port=$(sed -n 's/^glossa: rank 0 hosts the rendezvous at 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$tmp/${name}0.log" | head -1)
  WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    "$glossa" "${start_pair_args1[@]}" > "$tmp/${name}1.log" 2>&1 &
  pids+=($!)
}
# The Austen LM at width 16, dropout on (residual 0.1, as the model has it).
small='task.emb.embedding_dim : 16; task.position_emb.embedding_dim : 16; task.softmax.input_dim : 16; task.stack.num_layers : 1; task.stack.mdl_dim : 16; task.stack.hidden_dim : 32; task.stack.num_atten_heads : 2;'
small+=' task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; task.train.summary_interval_steps : 5; task.decode_temperature : 0; task.decode_max_new_tokens : 6'
common=(--model=lm.austen.TransformerLmTiny --random_seed=3 --intra_op_threads=1)
base=("${common[@]}" "--model_params_override=$small")

# 1. --nproc_per_node=2 starts two workers; rank 0 alone writes the logdir.
run_job "train --nproc_per_node=2" "$tmp/a.log" "$glossa" train "${base[@]}" --logdir="$tmp/a" --max_steps=20 --nproc_per_node=2
check "output is prefixed by rank: $(tail -3 "$tmp/a.log")" grep -q '^\[rank 1\] rank 1 of 2: training on input shard 1$' "$tmp/a.log"
check "rank 0 reports the progress lines" grep -q '^\[rank 0\] step 20/20 (100%) · loss ' "$tmp/a.log"
check "the gradient allreduce summary" grep -q '^\[rank 0\] gradient allreduce over 2 ranks: .* MB per step' "$tmp/a.log"
check "rank 0 saved step 20" test -f "$tmp/a/train/ckpt-00000020.safetensors"
check "one events file (rank 0's)" test "$(ls "$tmp/a/train" | grep -c '^events.out.tfevents')" -eq 1
check "rank 1 wrote nothing" bash -c "! grep -q '^\[rank 1\] saved' '$tmp/a.log'"
check "tok/s counts every rank's tokens" grep -q '^\[rank 0\] step 20/20 .* steps/s · [0-9.]*k* tok/s' "$tmp/a.log"

# SIGTERM to the launcher reaches every worker; they stop at the same step and rank 0 saves.
"$glossa" train "${base[@]}" --logdir="$tmp/t" --max_steps=100000 --nproc_per_node=2 > "$tmp/t.log" 2>&1 &
launcher=$!
pids+=($launcher)
wait_checkpoint "$tmp/t/train" 1 300 "$tmp/t.log"
kill -TERM "$launcher"
wait "$launcher"; rc=$?
check "SIGTERM: the job exits 0 (rc $rc): $(tail -2 "$tmp/t.log")" test "$rc" -eq 0
# A stop that lands right after a save finds nothing new to save, and says so.
check "rank 0 saved on the way out: $(tail -1 "$tmp/t.log")" grep -q -e '^\[rank 0\] saved .* (stopped)$' -e '^\[rank 0\] checkpoint .* is already the latest (stopped)$' "$tmp/t.log"
pids=()

# 2. The same run with the environment set directly, as torchrun (or Slurm) would: the same
# weights bit for bit (dropout on: every rank draws its masks from the step seeds). torchrun sets
# LOCAL_WORLD_SIZE too: the workers share the cores alike, so their GEMMs round alike.
args=(train "${base[@]}" --logdir="$tmp/b" --max_steps=20)
start_pair b args args
wait "${pids[0]}"; rc0=$?
wait "${pids[1]:-0}" 2>/dev/null; rc1=$?
check "env-launched workers exit 0 ($rc0, $rc1): $(tail -2 "$tmp/b0.log") $(tail -2 "$tmp/b1.log")" test "$rc0" -eq 0 -a "$rc1" -eq 0
check "a second launch reproduces the weights (dropout on)" cmp -s "$tmp/a/train/ckpt-00000020.safetensors" "$tmp/b/train/ckpt-00000020.safetensors"
check "and the losses" test "$(grep -o 'loss [0-9.]*' "$tmp/b0.log")" = "$(sed -n 's/^\[rank 0\] //p' "$tmp/a.log" | grep -o 'loss [0-9.]*')"

# 3. Kill -9 one of two workers mid-training: the other fails within the collective timeout,
# naming the lost rank; a restart resumes from the last checkpoint and reaches max_steps.
args=(train "${base[@]}" --logdir="$tmp/k" --max_steps=100000 --dist_timeout=20)
start_pair k args args
wait_checkpoint "$tmp/k/train" 20 300 "$tmp/k0.log" "$tmp/k1.log"
kill -9 "${pids[1]}"
start=$(date +%s)
wait "${pids[0]}"; rc=$?
took=$(( $(date +%s) - start ))
wait "${pids[1]}" 2>/dev/null
# The lost peer's socket closes at once: the survivor's next collective fails, then it waits up to
# 5 s for the lost rank to report; the slack for that and for exiting stretches with the load.
bound=$((20 + 20 * $(slowdown)))
check "the survivor exits non-zero (rc $rc)" test "$rc" -ne 0
check "within the timeout (${took} s; bound $bound s)" test "$took" -le "$bound"
check "naming the lost rank: $(tail -1 "$tmp/k0.log")" grep -q 'lost rank(s): 1' "$tmp/k0.log"
last=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9]*\)"$/\1/p' "$tmp/k/train/checkpoint")
check "a checkpoint survived (step '$last')" test -n "$last"
target=$(( ${last:-0} + 10 ))
run_job "restart with --nproc_per_node=2" "$tmp/k2.log" "$glossa" train "${base[@]}" --logdir="$tmp/k" --max_steps=$target --nproc_per_node=2
check "it resumed from step $last: $(grep restored "$tmp/k2.log")" grep -q "restored .*ckpt-0*$last at step $last" "$tmp/k2.log"
check "and reached max_steps $target" test -f "$(printf '%s/k/train/ckpt-%08d.safetensors' "$tmp" "$target")"
for c in "$tmp"/k/train/ckpt-*.safetensors; do
  check "checkpoint $(basename "$c") loads" "$glossa" eval "${common[@]}" "--model_params_override=$small; task.eval.samples_per_summary : 8" --logdir="$tmp/k" --checkpoint="${c%.safetensors}" > "$tmp/load.log" 2>&1
done
# Resuming with a different world size keeps the global batch: 1 worker goes on.
run_job "resume with 1 worker" "$tmp/k3.log" "$glossa" train "${base[@]}" --logdir="$tmp/k" --max_steps=$((target + 5))

# 3b. Under --nproc_per_node, a rank that hangs (SIGSTOP) makes the other fail after
# --dist_timeout, and the launcher then ends the job within its short grace, not the timeout again.
"$glossa" train "${base[@]}" --logdir="$tmp/stall" --max_steps=100000 --dist_timeout=10 --nproc_per_node=2 > "$tmp/stall.log" 2>&1 &
launcher=$!
pids+=("$launcher")
wait_ranks "$tmp/stall.log" '^\[rank 0\] step ' 300 "$tmp/stall.log"
rank1=$(ps --ppid "$launcher" -o pid= | sort -n | tail -1)
kill -STOP "$rank1"
start=$(date +%s)
wait "$launcher"; rc=$?
took=$(( $(date +%s) - start ))
kill -9 "$rank1" 2>/dev/null
# The 10 s timeout, rank 0's diagnosis (5 s) and the launcher's grace (5 s), and slack for exiting.
bound=$((25 + 20 * $(slowdown)))
check "the launcher exits non-zero when a rank hangs (rc $rc)" test "$rc" -ne 0
check "within the timeout and a short grace (${took} s; 10 s timeout; bound $bound s)" test "$took" -le "$bound"
check "naming what failed: $(grep 'glossa: rank' "$tmp/stall.log" | head -2)" grep -q 'glossa: rank 0 .*exited with status' "$tmp/stall.log"

# 4. Sharded eval and decode give the unsharded metrics: 48 Dev lines, all of them read. The
# eval metrics to fp64 rounding of the reduction (1e-6), the greedy decode's lines and metrics
# exactly.
head -48 "$(dirname "$(sed -n "s/^task.input.file_pattern : 'text:\(.*\)'$/\1/p" "$tmp/a/control/params.txt")")/dev.txt" > "$tmp/dev48.txt"
check "a 48-line Dev slice" test "$(wc -l < "$tmp/dev48.txt")" -eq 48
dev=("${common[@]}" --dataset=Dev "--model_params_override=$small; task.input.file_pattern : \"text:$tmp/dev48.txt\"; task.eval.samples_per_summary : 0; task.eval.decoder_samples_per_summary : 0")
cp -r "$tmp/a" "$tmp/s"
for job in eval decode; do
  run_job "$job unsharded" "$tmp/$job-1.log" "$glossa" $job "${dev[@]}" --logdir="$tmp/a" --once
  run_job "$job --nproc_per_node=2" "$tmp/$job-2.log" "$glossa" $job "${dev[@]}" --logdir="$tmp/s" --once --nproc_per_node=2
done
/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import sys
tmp = sys.argv[1]
def score(d):
    out = {}
    for line in open(f"{tmp}/{d}"):
        k, v = line.split(": ")
        out[k] = float(v)
    return out
ok = True
for job, rel in (("eval_dev", 1e-6), ("decoder_dev", 0.0)):
    a, b = score(f"a/{job}/score-00000020.txt"), score(f"s/{job}/score-00000020.txt")
    if a.keys() != b.keys():
        print(f"FAIL: {job}: metrics {sorted(a)} vs sharded {sorted(b)}"); ok = False; continue
    for k in a:
        # Per-batch counts depend on how each shard is bucketed into batches, not on the data.
        if job == "eval_dev" and k in ("num_predictions", "num_samples_in_batch"):
            continue
        if abs(a[k] - b[k]) > rel * max(abs(a[k]), 1e-12):
            print(f"FAIL: {job} {k}: unsharded {a[k]!r}, sharded {b[k]!r}"); ok = False
lines = [sorted(open(f"{tmp}/{d}/decoder_dev/decoder_out_000000020").read().splitlines()) for d in "as"]
if lines[0] != lines[1] or len(lines[0]) != 48:
    print(f"FAIL: decoder_out: {len(lines[0])} lines unsharded, {len(lines[1])} sharded, equal: {lines[0] == lines[1]}"); ok = False
sys.exit(0 if ok else 1)
PY

# 5. Configurations that cannot run are errors, naming what is wrong.
args=(train "${common[@]}" "--model_params_override=$small" --logdir="$tmp/m" --max_steps=5 --dist_timeout=20)
args1=(train "${common[@]}" "--model_params_override=$small; task.stack.hidden_dim : 48" --logdir="$tmp/m" --max_steps=5 --dist_timeout=20)
start_pair m args args1
wait "${pids[0]}"; rc0=$?
wait "${pids[1]:-0}" 2>/dev/null; rc1=$?
check "different model Params fail on every rank ($rc0, $rc1)" test "$rc0" -ne 0 -a "$rc1" -ne 0
check "naming rank 1: $(tail -1 "$tmp/m0.log")" grep -q 'disagree on the model Params.*rank(s) 1 differ from rank 0' "$tmp/m0.log"
check "no checkpoint from a refused run" test ! -e "$tmp/m/train/checkpoint"
# Rank 0 waiting at the rendezvous for a rank that never comes (it failed before joining) stops at
# once on SIGTERM, as the launcher sends after a failure: not after --dist_timeout (600 s here).
WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=0 \
  "$glossa" train "${base[@]}" --logdir="$tmp/w" --max_steps=5 --dist_timeout=600 > "$tmp/w0.log" 2>&1 &
pids=($!)
if wait_ranks "$tmp/w0.log" '^glossa: rank 0 hosts the rendezvous at ' 120 "$tmp/w0.log"; then
  kill -TERM "${pids[0]}"
  check "rank 0 says it stopped at the rendezvous: $(tail -1 "$tmp/w0.log")" wait_for "$tmp/w0.log" 'stopped while waiting at the rendezvous (rank 0 of 2 at 127.0.0.1:[0-9]*): 1 of 2 ranks had joined' 60
  wait "${pids[0]}"; rc=$?
  check "and exits 1 (rc $rc)" test "$rc" -eq 1
fi
"$glossa" train "${base[@]}" --logdir="$tmp/n" --max_steps=5 --nproc_per_node=3 > "$tmp/n.log" 2>&1; rc=$?
check "3 workers train (rc $rc), saying how the batch that does not divide is shared: $(grep -m1 'divide' "$tmp/n.log")" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] task.input.bucket_batch_limit = 64 does not divide among 3 workers: each reads 22, 66 in all' '$tmp/n.log'"
WORLD_SIZE=2 RANK=0 "$glossa" train "${base[@]}" --logdir="$tmp/n" --nproc_per_node=2 > "$tmp/n2.log" 2>&1; rc=$?
check "--nproc_per_node under a launcher is refused (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'WORLD_SIZE is already set' '$tmp/n2.log'"
"$glossa" train "${base[@]}" --logdir="$tmp/n" --nproc_per_node=0 > "$tmp/n3.log" 2>&1; rc=$?
check "--nproc_per_node=0 is refused (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'nproc_per_node' '$tmp/n3.log'"
WORLD_SIZE=2 RANK=5 "$glossa" train "${base[@]}" --logdir="$tmp/n" > "$tmp/n4.log" 2>&1; rc=$?
check "RANK out of range is refused (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'RANK must be in' '$tmp/n4.log'"

# 6. GShard's expert parallelism: lm.austen.TransformerLmMoeTinyExpertParallel keeps 2 of its 4
# experts on each of 2 ranks. Each rank writes its experts' shard before rank 0 writes the
# checkpoint; a restart resumes from it on both ranks; the checkpoint loads whole, and export
# builds the model in one process (no expert axis: every expert, from the same Params) and serves it.
moe=(--model=lm.austen.TransformerLmMoeTinyExpertParallel --random_seed=3 --intra_op_threads=1
     "--model_params_override=task.train.steps_per_loop : 5; task.train.save_interval_steps : 10")
"$glossa" train "${moe[@]}" --logdir="$tmp/e" --max_steps=10 --nproc_per_node=2 > "$tmp/e.log" 2>&1; rc=$?
check "expert-parallel training exits 0 (rc $rc): $(tail -2 "$tmp/e.log")" test "$rc" -eq 0
for r in 0 1; do
  check "rank $r's expert shard" test -f "$tmp/e/train/ckpt-00000010-rank-0000$r-of-00002.safetensors"
done
check "the chief's checkpoint" test -f "$tmp/e/train/ckpt-00000010.safetensors"
check "rank 0 says what the expert all-to-all exchanged: $(grep -m1 'all-to-all' "$tmp/e.log")" grep -q '^\[rank 0\] expert all-to-all over 2 ranks: 5.0 exchanges per step, ' "$tmp/e.log"
"$glossa" train "${moe[@]}" --logdir="$tmp/e" --max_steps=20 --nproc_per_node=2 > "$tmp/e2.log" 2>&1; rc=$?
check "expert-parallel resume exits 0 (rc $rc): $(tail -2 "$tmp/e2.log")" test "$rc" -eq 0
check "it resumed from step 10" grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' "$tmp/e2.log"
check "step 20's shards" test -f "$tmp/e/train/ckpt-00000020-rank-00001-of-00002.safetensors"
"$glossa" eval --model=lm.austen.TransformerLmMoeTinyExpertParallel --intra_op_threads=1 "--model_params_override=task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; task.eval.samples_per_summary : 8" --logdir="$tmp/e" --once > "$tmp/e_eval.log" 2>&1; rc=$?
check "one process evaluates the expert-parallel logdir with every expert (rc $rc): $(tail -1 "$tmp/e_eval.log")" bash -c "test $rc -eq 0 && test -f '$tmp/e/eval_dev/score-00000020.txt'"
"$glossa" export "${moe[@]}" --logdir="$tmp/e" --out="$tmp/e_bundle" > "$tmp/e3.log" 2>&1; rc=$?
check "the expert-parallel checkpoint exports in one process (rc $rc): $(tail -2 "$tmp/e3.log")" test "$rc" -eq 0
check "the bundle's Params are the training run's, unrewritten (num_devices 2; one process builds every expert)" grep -q 'num_devices : 2' "$tmp/e_bundle/model_params.txt"
echo 'It is a truth universally acknowledged' | "$glossa" predict --bundle="$tmp/e_bundle" > "$tmp/e_pred.jsonl" 2>"$tmp/e_pred.err"; rc=$?
check "the bundle scores text (rc $rc): $(tail -1 "$tmp/e_pred.err")" bash -c "test $rc -eq 0 && grep -q total_log_prob '$tmp/e_pred.jsonl'"
"$glossa" train "${moe[@]}" --logdir="$tmp/e1" --max_steps=5 > "$tmp/e5.log" 2>&1; rc=$?
check "one process cannot train the 2-rank experts (rc $rc): $(tail -1 "$tmp/e5.log")" bash -c "test $rc -ne 0 && grep -q \"needs a mesh with an 'expert' axis of 2 ranks.*--nproc_per_node=2\" '$tmp/e5.log'"
"$glossa" train "${moe[@]}" --logdir="$tmp/e3" --max_steps=5 --nproc_per_node=3 > "$tmp/e6.log" 2>&1; rc=$?
check "nor 3 ranks (rc $rc): $(grep -m1 'expert' "$tmp/e6.log")" bash -c "test $rc -ne 0 && grep -q 'but the axis has 3' '$tmp/e6.log'"
"$glossa" train "${moe[@]}" --logdir="$tmp/e7" --max_steps=5 --nproc_per_node=2 --mesh=data:2 > "$tmp/e7.log" 2>&1; rc=$?
check "nor a mesh without an expert axis, which it names (rc $rc): $(grep -m1 'expert' "$tmp/e7.log")" bash -c "test $rc -ne 0 && grep -q \"this run's mesh (data 2) has none: it needs a mesh with an 'expert' axis of 2 ranks: train it with --mesh=expert:2\" '$tmp/e7.log'"
rm "$tmp/e/train/ckpt-00000020-rank-00001-of-00002.safetensors"
"$glossa" export "${moe[@]}" --logdir="$tmp/e" --out="$tmp/e_bundle2" > "$tmp/e4.log" 2>&1; rc=$?
check "a missing shard is an error naming it (rc $rc): $(tail -1 "$tmp/e4.log")" bash -c "test $rc -ne 0 && grep -q 'ckpt-00000020-rank-00001-of-00002.safetensors is missing' '$tmp/e4.log'"

# 7. A data x expert mesh: 4 ranks, --mesh=data:2,expert:2. Ranks 0-1 and 2-3 each hold the 4
# experts once; ranks 0 and 2 (and 1 and 3) are replicas. The replicas of data index 0 write the 2
# expert shards; a restart resumes; a mesh that does not cover the ranks is refused.
"$glossa" train "${moe[@]}" --logdir="$tmp/m" --max_steps=10 --nproc_per_node=4 --mesh=data:2,expert:2 > "$tmp/m.log" 2>&1; rc=$?
check "data x expert training exits 0 (rc $rc): $(tail -2 "$tmp/m.log")" test "$rc" -eq 0
check "rank 0 names the mesh" grep -q '^\[rank 0\] mesh: data 2 x expert 2' "$tmp/m.log"
check "tokens go to the 2 ranks of an expert group" grep -q '^\[rank 0\] expert all-to-all over 2 ranks' "$tmp/m.log"
for r in 0 1; do
  check "expert shard $r of 2" test -f "$tmp/m/train/ckpt-00000010-rank-0000$r-of-00002.safetensors"
done
check "no shard files past the expert axis" test "$(ls "$tmp/m/train" | grep -c -- '-rank-')" -eq 2
"$glossa" train "${moe[@]}" --logdir="$tmp/m" --max_steps=15 --nproc_per_node=4 --mesh=data:2,expert:2 > "$tmp/m2.log" 2>&1; rc=$?
check "the mesh resumes (rc $rc): $(grep restored "$tmp/m2.log")" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' '$tmp/m2.log'"
"$glossa" train "${moe[@]}" --logdir="$tmp/m" --max_steps=20 --nproc_per_node=2 > "$tmp/m3.log" 2>&1; rc=$?
check "and the mesh's checkpoint resumes on 2 expert ranks alone (rc $rc)" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000015 at step 15' '$tmp/m3.log'"
"$glossa" train "${moe[@]}" --logdir="$tmp/m4" --max_steps=5 --nproc_per_node=2 --mesh=data:2,expert:2 > "$tmp/m4.log" 2>&1; rc=$?
check "a mesh of 4 on 2 ranks is refused (rc $rc): $(grep -m1 'mesh' "$tmp/m4.log")" bash -c "test $rc -ne 0 && grep -q \"\-\-mesh='data:2,expert:2': data 2 x expert 2 = 4 ranks, but the job has 2\" '$tmp/m4.log'"
"$glossa" train "${moe[@]}" --logdir="$tmp/m5" --max_steps=5 --mesh=data:2 > "$tmp/m5.log" 2>&1; rc=$?
check "and in one process (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'but the job has 1' '$tmp/m5.log'"

# 8. GPipe stages on ranks: the tiny LM's 2 layers as 2 stages (task.stack.splits : 2) on 2 ranks,
# --mesh=pipe:2, 2 micro-batches a step. Each rank writes its stage's layers whole before rank 0
# writes the checkpoint; a restart resumes on both; one process evaluates the logdir and exports
# it (every layer, the bundle unpipelined), and resumes it unpipelined (splits 1); data x pipe on
# 4 ranks; a lost stage; a pipeline that does not match the ranks is refused.
pipe_small="${small/num_layers : 1/num_layers : 2}; task.stack.splits : 2; task.stack.num_micro_batches : 2"
pipe=("${common[@]}" "--model_params_override=$pipe_small")
"$glossa" train "${pipe[@]}" --logdir="$tmp/p" --max_steps=10 --nproc_per_node=2 --mesh=pipe:2 > "$tmp/p.log" 2>&1; rc=$?
check "pipeline training exits 0 (rc $rc): $(tail -2 "$tmp/p.log")" test "$rc" -eq 0
check "rank 1 is stage 1 and reads the same input as rank 0" grep -q '^\[rank 1\] rank 1 of 2: pipeline stage 1, training on input shard 0 of 1' "$tmp/p.log"
check "rank 0 says what its stage holds" grep -q '^\[rank 0\] pipeline stage 0 of 2: 18 variables' "$tmp/p.log"
check "and what it sent: $(grep -m1 'pipeline over' "$tmp/p.log")" grep -q '^\[rank 0\] pipeline over 2 ranks: stage 0 sent 2.0 micro-batches per step' "$tmp/p.log"
for r in 0 1; do
  check "stage $r's layers" test -f "$tmp/p/train/ckpt-00000010-rank-0000$r-of-00002.safetensors"
done
check "the chief's checkpoint" test -f "$tmp/p/train/ckpt-00000010.safetensors"
"$glossa" train "${pipe[@]}" --logdir="$tmp/p" --max_steps=20 --nproc_per_node=2 --mesh=pipe:2 > "$tmp/p2.log" 2>&1; rc=$?
check "the pipeline resumes (rc $rc): $(grep restored "$tmp/p2.log")" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' '$tmp/p2.log'"
"$glossa" eval "${pipe[@]}" --logdir="$tmp/p" --once > "$tmp/p_eval.log" 2>&1; rc=$?
check "one process evaluates the pipeline's logdir (rc $rc): $(tail -1 "$tmp/p_eval.log")" bash -c "test $rc -eq 0 && test -f '$tmp/p/eval_dev/score-00000020.txt'"
"$glossa" export "${pipe[@]}" --logdir="$tmp/p" --out="$tmp/p_bundle" > "$tmp/p3.log" 2>&1; rc=$?
check "the pipeline's checkpoint exports in one process (rc $rc): $(tail -1 "$tmp/p3.log")" test "$rc" -eq 0
check "the bundle's Params are the training run's (splits 2; without gradients the stack runs its layers in order)" grep -q 'splits : 2' "$tmp/p_bundle/model_params.txt"
echo 'It is a truth universally acknowledged' | "$glossa" predict --bundle="$tmp/p_bundle" > "$tmp/p_pred.jsonl" 2>"$tmp/p_pred.err"; rc=$?
check "the bundle scores text (rc $rc): $(tail -1 "$tmp/p_pred.err")" bash -c "test $rc -eq 0 && grep -q total_log_prob '$tmp/p_pred.jsonl'"
"$glossa" train "${common[@]}" "--model_params_override=${pipe_small/splits : 2/splits : 1}" --logdir="$tmp/p" --max_steps=25 > "$tmp/p4.log" 2>&1; rc=$?
check "one process resumes it unpipelined (rc $rc)" bash -c "test $rc -eq 0 && grep -q 'restored .*ckpt-00000020 at step 20' '$tmp/p4.log' && test -f '$tmp/p/train/ckpt-00000025.safetensors'"
"$glossa" train "${common[@]}" "--model_params_override=${pipe_small/splits : 2/splits : 1}" --logdir="$tmp/p5" --max_steps=5 --nproc_per_node=2 --mesh=pipe:2 > "$tmp/p5.log" 2>&1; rc=$?
check "a pipe mesh without a pipelined layer is refused (rc $rc): $(grep -m1 'pipelined' "$tmp/p5.log")" bash -c "test $rc -ne 0 && grep -q 'the model has no pipelined layer to place on the 2 ranks' '$tmp/p5.log'"
"$glossa" train "${common[@]}" "--model_params_override=${pipe_small/num_layers : 2/num_layers : 3}; task.stack.splits : 3" --logdir="$tmp/p6" --max_steps=5 --nproc_per_node=2 --mesh=pipe:2 > "$tmp/p6.log" 2>&1; rc=$?
check "3 stages on 2 ranks are refused (rc $rc): $(grep -m1 'stage' "$tmp/p6.log")" bash -c "test $rc -ne 0 && grep -q \"has 3 pipeline stage(s), but the mesh's 'pipe' axis has 2 ranks\" '$tmp/p6.log'"
# Data x pipe: 2 pipelines of 2 stages on 4 ranks, each on half the batch; the stages' replicas
# of data index 0 write the 2 stage files, and the checkpoint resumes on one pipeline of 2 ranks.
"$glossa" train "${pipe[@]}" --logdir="$tmp/dp" --max_steps=10 --nproc_per_node=4 --mesh=data:2,pipe:2 > "$tmp/dp.log" 2>&1; rc=$?
check "data x pipe training exits 0 (rc $rc): $(tail -2 "$tmp/dp.log")" test "$rc" -eq 0
check "rank 0 names the mesh" grep -q '^\[rank 0\] mesh: data 2 x pipe 2 (pipelines of 2 ranks, each replicated 2 times)' "$tmp/dp.log"
check "rank 3 is stage 1 of the second pipeline" grep -q '^\[rank 3\] rank 3 of 4: pipeline stage 1, training on input shard 1 of 2' "$tmp/dp.log"
check "2 stage files and no more" test "$(ls "$tmp/dp/train" | grep -c -- '-rank-')" -eq 2
"$glossa" train "${pipe[@]}" --logdir="$tmp/dp" --max_steps=15 --nproc_per_node=2 --mesh=pipe:2 > "$tmp/dp2.log" 2>&1; rc=$?
check "the data x pipe checkpoint resumes on one pipeline (rc $rc)" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' '$tmp/dp2.log'"
# Without --random_seed each process draws its own initialization: the stages' replicas start from
# data index 0's (they are compared before every checkpoint, which would fail otherwise).
"$glossa" train --model=lm.austen.TransformerLmTiny --intra_op_threads=1 "--model_params_override=$pipe_small" --logdir="$tmp/dp4" --max_steps=5 --nproc_per_node=4 --mesh=data:2,pipe:2 > "$tmp/dp4.log" 2>&1; rc=$?
check "data x pipe without --random_seed trains and saves (rc $rc): $(tail -1 "$tmp/dp4.log")" bash -c "test $rc -eq 0 && test -f '$tmp/dp4/train/ckpt-00000005.safetensors'"
"$glossa" train "${common[@]}" "--model_params_override=$pipe_small; task.train.learner.bprop_variable_filter : 'x_layers_1'" --logdir="$tmp/dp5" --max_steps=5 --nproc_per_node=2 --mesh=pipe:2 > "$tmp/dp5.log" 2>&1; rc=$?
check "a pipe mesh that would not train every stage is refused (rc $rc): $(grep -m1 'every stage' "$tmp/dp5.log")" bash -c "test $rc -ne 0 && grep -q 'on a pipe mesh every stage variable must train' '$tmp/dp5.log'"
"$glossa" train "${pipe[@]}" --logdir="$tmp/dp3" --max_steps=5 --nproc_per_node=2 --mesh=data:2,pipe:2 > "$tmp/dp3.log" 2>&1; rc=$?
check "a data x pipe mesh of 4 on 2 ranks is refused (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'data 2 x pipe 2 = 4 ranks, but the job has 2' '$tmp/dp3.log'"

# A stage lost mid-training (kill -9 rank 1, whose stage rank 0 sends micro-batches to and waits
# on): rank 0 fails within the timeout naming it, and a restart resumes the last checkpoint.
args=(train "${pipe[@]}" --mesh=pipe:2 --logdir="$tmp/pk" --max_steps=100000 --dist_timeout=20)
start_pair pk args args
wait_checkpoint "$tmp/pk/train" 20 300 "$tmp/pk0.log" "$tmp/pk1.log"
kill -9 "${pids[1]}"
start=$(date +%s)
wait "${pids[0]}"; rc=$?
took=$(( $(date +%s) - start ))
wait "${pids[1]}" 2>/dev/null
pids=()
bound=$((20 + 20 * $(slowdown)))
check "the surviving stage exits non-zero (rc $rc)" test "$rc" -ne 0
check "within the timeout (${took} s; bound $bound s)" test "$took" -le "$bound"
check "naming the lost stage's rank: $(tail -1 "$tmp/pk0.log")" grep -q 'lost rank(s): 1' "$tmp/pk0.log"
last=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9]*\)"$/\1/p' "$tmp/pk/train/checkpoint")
check "a complete pipeline checkpoint survived (step '$last')" test -n "$last"
"$glossa" train "${pipe[@]}" --logdir="$tmp/pk" --max_steps=$(( ${last:-0} + 5 )) --nproc_per_node=2 --mesh=pipe:2 > "$tmp/pk2.log" 2>&1; rc=$?
check "the pipeline restarts from step $last (rc $rc)" bash -c "test $rc -eq 0 && grep -q 'restored .*ckpt-0*$last at step $last' '$tmp/pk2.log'"
# MoE inside a pipeline (--mesh=pipe:2,expert:2): the MoE LM's dense layer is stage 0 (ranks 0,
# 1), its MoE layer stage 1 (ranks 2, 3, 2 experts each); expert rank e reads input shard e. 4
# rank files; the pipeline's aux loss is every rank's; the checkpoint resumes on the same mesh,
# then one process evaluates it from the training Params.
pe=(--model=lm.austen.TransformerLmMoeTinyExpertParallel --random_seed=3 --intra_op_threads=1
    "--model_params_override=task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; task.stack.splits : 2; task.eval.samples_per_summary : 8")
"$glossa" train "${pe[@]}" --logdir="$tmp/p7" --max_steps=10 --nproc_per_node=4 --mesh=pipe:2,expert:2 > "$tmp/p7.log" 2>&1; rc=$?
check "pipe x expert training exits 0 (rc $rc): $(tail -2 "$tmp/p7.log")" test "$rc" -eq 0
check "rank 0 names the mesh: $(grep -m1 'mesh:' "$tmp/p7.log")" grep -q '^\[rank 0\] mesh: pipe 2 x expert 2' "$tmp/p7.log"
check "rank 3 is stage 1 on input shard 1: $(grep -m1 '^\[rank 3\] rank 3 of 4' "$tmp/p7.log")" grep -q '^\[rank 3\] rank 3 of 4: .*pipeline stage 1.*input shard 1 of 2' "$tmp/p7.log"
check "4 rank files (stage x expert)" test "$(ls "$tmp/p7/train" | grep -c -- 'ckpt-00000010-rank-.*-of-00004')" -eq 4
check "rank 0 (stage 0, no MoE layer) records the pipeline's aux loss: $(grep -m1 '"aux_loss"' "$tmp/p7/train/metrics.jsonl")" grep -Eq '"tag":"aux_loss","value":([1-9]|0\.0*[1-9])' "$tmp/p7/train/metrics.jsonl"
"$glossa" train "${pe[@]}" --logdir="$tmp/p7" --max_steps=15 --nproc_per_node=4 --mesh=pipe:2,expert:2 > "$tmp/p8.log" 2>&1; rc=$?
check "pipe x expert resumes (rc $rc)" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' '$tmp/p8.log'"
"$glossa" eval "${pe[@]}" --logdir="$tmp/p7" --once > "$tmp/p9.log" 2>&1; rc=$?
check "one process evaluates the pipe x expert checkpoint with every expert (rc $rc): $(tail -1 "$tmp/p9.log")" bash -c "test $rc -eq 0 && test -f '$tmp/p7/eval_dev/score-00000015.txt'"

# 9. Tensor parallelism: the tiny LM's heads, hidden units and vocabulary (embedding rows, softmax
# classes: a sharded cross-entropy) split over a model axis of 2 ranks by
# the split mappings in its Params (--mesh=model:2). Both ranks read the same batches; each writes
# its blocks; the losses are one process's; the checkpoint resumes on data x model (4 ranks), then
# in one process, which evaluates and exports it from the training run's Params.
tp="$small; task.stack.transformer_layer_params_tpl.tr_atten_tpl.atten_tpl.weight_split_dims_mapping : [None, 'model', None]"
tp+="; task.stack.transformer_layer_params_tpl.tr_fflayer_tpl.weight_split_dims_mapping_list : [[None, 'model'], ['model', None]]"
tp+="; task.emb.weight_split_dims_mapping : ['model', None]; task.softmax.weight_split_dims_mapping : [None, 'model']"
tpm=("${common[@]}" "--model_params_override=$tp")
"$glossa" train "${tpm[@]}" --logdir="$tmp/tm" --max_steps=10 --nproc_per_node=2 --mesh=model:2 > "$tmp/tm.log" 2>&1; rc=$?
check "model-axis training exits 0 (rc $rc): $(tail -2 "$tmp/tm.log")" test "$rc" -eq 0
check "rank 1 holds model shard 1 and reads rank 0's input" grep -q '^\[rank 1\] rank 1 of 2: model shard 1 of 2, training on input shard 0 of 1' "$tmp/tm.log"
check "what the model axis summed: $(grep -m1 'model all-reduce' "$tmp/tm.log")" grep -q '^\[rank 0\] model all-reduce over 2 ranks: 8.0 per step' "$tmp/tm.log"
for r in 0 1; do
  check "model shard $r's blocks" test -f "$tmp/tm/train/ckpt-00000010-rank-0000$r-of-00002.safetensors"
done
"$glossa" train "${tpm[@]}" --logdir="$tmp/tm1" --max_steps=10 > "$tmp/tm1.log" 2>&1; rc=$?
loss_at() { sed -n 's/^{"step":9,"tag":"loss","value":\([^,]*\),.*/\1/p' "$1/train/metrics.jsonl"; }
check "one process trains the same Params (rc $rc)" test "$rc" -eq 0
check "to the same loss at step 9 ($(loss_at "$tmp/tm") on 2 ranks, $(loss_at "$tmp/tm1") in one process)" \
  awk -v a="$(loss_at "$tmp/tm")" -v b="$(loss_at "$tmp/tm1")" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * b) }'
"$glossa" train "${tpm[@]}" --logdir="$tmp/tm" --max_steps=15 --nproc_per_node=4 --mesh=data:2,model:2 > "$tmp/tm2.log" 2>&1; rc=$?
check "the model-axis checkpoint resumes on data x model (rc $rc): $(grep -m1 restored "$tmp/tm2.log")" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' '$tmp/tm2.log'"
check "which names its mesh" grep -q '^\[rank 0\] mesh: data 2 x model 2 (model groups of 2 ranks, each replicated 2 times)' "$tmp/tm2.log"
"$glossa" train "${tpm[@]}" --logdir="$tmp/tm" --max_steps=20 > "$tmp/tm3.log" 2>&1; rc=$?
check "and in one process (rc $rc)" bash -c "test $rc -eq 0 && grep -q 'restored .*ckpt-00000015 at step 15' '$tmp/tm3.log'"
check "control/params.txt is the split model's" grep -q "atten_tpl.weight_split_dims_mapping : \['NoneType', 'model', 'NoneType'\]" "$tmp/tm/control/params.txt"
"$glossa" eval "${tpm[@]}" --logdir="$tmp/tm" --once > "$tmp/tm5.log" 2>&1; rc=$?
check "one process evaluates it from control/params.txt, no rewriting (rc $rc): $(tail -1 "$tmp/tm5.log")" bash -c "test $rc -eq 0 && test -f '$tmp/tm/eval_dev/score-00000020.txt'"
"$glossa" export "${tpm[@]}" --logdir="$tmp/tm" --out="$tmp/tm_bundle" > "$tmp/tm4.log" 2>&1; rc=$?
check "one process exports it (rc $rc): $(tail -1 "$tmp/tm4.log")" test "$rc" -eq 0
echo 'It is a truth universally acknowledged' | "$glossa" predict --bundle="$tmp/tm_bundle" > "$tmp/tm_pred.jsonl" 2>"$tmp/tm_pred.err"; rc=$?
check "the bundle scores text (rc $rc)" bash -c "test $rc -eq 0 && grep -q total_log_prob '$tmp/tm_pred.jsonl'"
"$glossa" train "${common[@]}" "--model_params_override=$small; task.stack.num_atten_heads : 3; task.stack.mdl_dim : 18; task.emb.embedding_dim : 18; task.position_emb.embedding_dim : 18; task.softmax.input_dim : 18; task.stack.transformer_layer_params_tpl.tr_atten_tpl.atten_tpl.weight_split_dims_mapping : [None, 'model', None]" --logdir="$tmp/tm6" --max_steps=5 --nproc_per_node=2 --mesh=model:2 > "$tmp/tm6.log" 2>&1; rc=$?
check "heads that do not split are refused naming the layer (rc $rc): $(grep -m1 'heads do not split' "$tmp/tm6.log")" bash -c "test $rc -ne 0 && grep -q '3 heads do not split over the 2 ranks of the .model. axis' '$tmp/tm6.log'"
"$glossa" train "${common[@]}" "--model_params_override=$small" --logdir="$tmp/tm7" --max_steps=5 --nproc_per_node=2 --mesh=model:2 > "$tmp/tm7.log" 2>&1; rc=$?
check "a model axis over a model that splits nothing is refused (rc $rc): $(grep -m1 'splits no variable' "$tmp/tm7.log")" bash -c "test $rc -ne 0 && grep -q 'the model splits no variable over the .model. axis, so its 2 ranks would compute the same thing' '$tmp/tm7.log'"

# 10. Experts beside tensor parallelism (--mesh=expert:2,model:2): the MoE LM's attention (both
# layers), its dense layer's hidden units and its vocabulary split over a model axis of 2 by the
# split mappings in its Params, its 4 experts 2 per expert rank; each model shard has its own
# expert group, and expert rank e reads input shard e (its model ranks the same rows). 4 rank
# files; the checkpoint resumes on 2 ranks of an expert axis alone (every attention and dense
# block whole), and one process evaluates it with every expert from the training run's Params.
em="task.train.steps_per_loop : 5; task.train.save_interval_steps : 10; task.eval.samples_per_summary : 8"
for l in 0 1; do
  em+="; task.stack.transformer_layer_params_tpl[$l].tr_atten_tpl.atten_tpl.weight_split_dims_mapping : [None, 'model', None]"
done
em+="; task.stack.transformer_layer_params_tpl[0].tr_fflayer_tpl.weight_split_dims_mapping_list : [[None, 'model'], ['model', None]]"
em+="; task.emb.weight_split_dims_mapping : ['model', None]; task.softmax.weight_split_dims_mapping : [None, 'model']"
emm=(--model=lm.austen.TransformerLmMoeTinyExpertParallel --random_seed=3 --intra_op_threads=1 "--model_params_override=$em")
"$glossa" train "${emm[@]}" --logdir="$tmp/em" --max_steps=10 --nproc_per_node=4 --mesh=expert:2,model:2 > "$tmp/em.log" 2>&1; rc=$?
check "expert x model training exits 0 (rc $rc): $(tail -2 "$tmp/em.log")" test "$rc" -eq 0
check "rank 0 names the mesh: $(grep -m1 'mesh:' "$tmp/em.log")" grep -q '^\[rank 0\] mesh: expert 2 x model 2$' "$tmp/em.log"
check "rank 3 holds expert shard 1 and model shard 1 on input shard 1" grep -q '^\[rank 3\] rank 3 of 4: expert shard 1 of 2, model shard 1 of 2, training on input shard 1 of 2' "$tmp/em.log"
check "rank 1 reads rank 0's rows" grep -q '^\[rank 1\] rank 1 of 4: expert shard 0 of 2, model shard 1 of 2, training on input shard 0 of 2' "$tmp/em.log"
check "both axes exchanged: $(grep -m1 'expert all-to-all' "$tmp/em.log")" bash -c "grep -q '^\[rank 0\] expert all-to-all over 2 ranks' '$tmp/em.log' && grep -q '^\[rank 0\] model all-reduce over 2 ranks' '$tmp/em.log'"
check "4 rank files (expert x model)" test "$(ls "$tmp/em/train" | grep -c -- 'ckpt-00000010-rank-.*-of-00004')" -eq 4
"$glossa" train "${emm[@]}" --logdir="$tmp/em" --max_steps=15 --nproc_per_node=2 --mesh=expert:2 > "$tmp/em2.log" 2>&1; rc=$?
check "the expert x model checkpoint resumes on an expert axis alone, every block whole (rc $rc): $(grep -m1 restored "$tmp/em2.log")" bash -c "test $rc -eq 0 && grep -q '^\[rank 0\] restored .*ckpt-00000010 at step 10' '$tmp/em2.log'"
"$glossa" eval "${emm[@]}" --logdir="$tmp/em" --once > "$tmp/em3.log" 2>&1; rc=$?
check "one process evaluates it (rc $rc): $(tail -1 "$tmp/em3.log")" bash -c "test $rc -eq 0 && test -f '$tmp/em/eval_dev/score-00000015.txt'"

[ "$fail" -eq 0 ] && echo "distributed_test: all checks passed"
exit "$fail"
