#!/usr/bin/env bash
# End to end: train lm.austen.TransformerLmTiny (shrunk) a few steps, stop it with SIGTERM, resume
# from the checkpoint, run the evaler and decoder jobs against the train directory, and check the
# files each writes; then flags, flagfiles and errors.
set -u
glossa="$1"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # check, wait_for, wait_until, slowdown
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
small='task.emb.embedding_dim : 16; task.position_emb.embedding_dim : 16; task.softmax.input_dim : 16; task.stack.num_layers : 1; task.stack.mdl_dim : 16; task.stack.hidden_dim : 32; task.stack.num_atten_heads : 2;'
small+=' task.train.steps_per_loop : 5; task.train.save_interval_steps : 5; task.train.summary_interval_steps : 5;'
small+=' task.eval.samples_per_summary : 64; task.eval.decoder_samples_per_summary : 16;'
small+=' task.decode_max_new_tokens : 6'
logdir="$tmp/lm"
base_flags=(--model=lm.austen.TransformerLmTiny --logdir="$logdir" --random_seed=3 --intra_op_threads=1)
flags=("${base_flags[@]}" "--model_params_override=$small")

# 1. Train to (at most) step 400 in the background and stop it with SIGTERM once a checkpoint exists.
"$glossa" train "${flags[@]}" --max_steps=400 > "$tmp/train1.log" 2>&1 &
pid=$!
check "the first checkpoint within 120 s" wait_for "$logdir/train/checkpoint" 'ckpt-' 120
kill -TERM "$pid" 2>/dev/null
wait "$pid"; rc=$?
check "trainer exits 0 on SIGTERM (rc $rc): $(tail -3 "$tmp/train1.log")" test "$rc" -eq 0
check "trainer says it stopped: $(tail -2 "$tmp/train1.log")" grep -q "(stopped)" "$tmp/train1.log"
# A stop that lands right after a save finds nothing new to save, and names that checkpoint.
saved_file=$(sed -n -e 's/^saved \(.*\) (stopped)$/\1/p' \
  -e 's/^checkpoint \(.*\) is already the latest (stopped)$/\1.safetensors/p' "$tmp/train1.log")
check "the 'saved' line names the file written ($saved_file)" test -f "$saved_file"
check "control/params.txt" test -s "$logdir/control/params.txt"
check "model_analysis.txt has the total" grep -q "total #params:" "$logdir/control/model_analysis.txt"
check "train events" compgen -G "$logdir/train/events.out.tfevents.*" > /dev/null
stopped_at=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9]*\)"$/\1/p' "$logdir/train/checkpoint")
check "a checkpoint before max_steps (got '$stopped_at')" test -n "$stopped_at" -a "${stopped_at:-400}" -lt 400

# 1b. A SIGTERM during start-up, after main's first line (issue 47 item 7): a --load_library whose
# constructor holds the program until the test has sent the signal. The signal is caught, so the
# program goes on to its next step (which refuses this library, since it registers nothing: exit
# 1 naming it), never the default action's exit 143.
cat > "$tmp/hold.c" <<'HOLD'
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void hold(void) {
  const char* dir = getenv("GLOSSA_TEST_HOLD_DIR");
  char p[4096];
  if (dir == NULL) return;
  snprintf(p, sizeof p, "%s/loaded", dir);
  fclose(fopen(p, "w"));
  snprintf(p, sizeof p, "%s/release", dir);
  while (access(p, F_OK) != 0) usleep(1000);
}
HOLD
check "compile the holding library" cc -shared -fPIC -o "$tmp/hold.so" "$tmp/hold.c"
GLOSSA_TEST_HOLD_DIR="$tmp" "$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/early" \
  "--model_params_override=$small" --max_steps=400 --load_library="$tmp/hold.so" \
  > "$tmp/early.log" 2>&1 &
pid=$!
wait_until "the holding library to load" 120 bash -c "test -e '$tmp/loaded' || ! kill -0 $pid"
kill -TERM "$pid" 2>/dev/null
touch "$tmp/release"
wait "$pid"; rc=$?
check "a SIGTERM during start-up is caught (rc $rc, not 143): $(tail -2 "$tmp/early.log")" test "$rc" -eq 1
check "and the program went on past it" grep -q "hold.so' registered no Glossa model or class" "$tmp/early.log"

# 1c. Kernel choices (issue 48): a bf16 run measures its kernels on each shape and says so; the
# next run of this machine takes the cached decisions; --bf16_kernels pins a path.
bf16=(--model=lm.austen.TransformerLmTiny --random_seed=3 --intra_op_threads=1 --max_steps=1
      "--model_params_override=$small; task.fprop_dtype : bfloat16")
GLOSSA_KERNEL_CHOICE_CACHE="$tmp/kc.tsv" "$glossa" train "${bf16[@]}" --logdir="$tmp/bf16a" > "$tmp/bf16a.log" 2>&1
check "a bf16 run measures its kernels: $(grep -m1 'kernel choice' "$tmp/bf16a.log")" grep -q '^kernel choice: bf16_affine .* (measured: aten [0-9.e+-]* ms, native [0-9.e+-]* ms)$' "$tmp/bf16a.log"
GLOSSA_KERNEL_CHOICE_CACHE="$tmp/kc.tsv" "$glossa" train "${bf16[@]}" --logdir="$tmp/bf16b" > "$tmp/bf16b.log" 2>&1
check "the next run takes the cached choices: $(grep -m1 'kernel choice' "$tmp/bf16b.log")" bash -c "grep -q 'kernel choice: bf16_affine .*; as cached in $tmp/kc.tsv)' '$tmp/bf16b.log' && ! grep 'kernel choice' '$tmp/bf16b.log' | grep -qv 'as cached'"
GLOSSA_KERNEL_CHOICE_CACHE="$tmp/kc.tsv" "$glossa" train "${bf16[@]}" --logdir="$tmp/bf16c" --bf16_kernels=native > "$tmp/bf16c.log" 2>&1
check "--bf16_kernels=native pins the path" grep -q 'kernel choice: bf16_affine .*: native (float32 sgemm of widened bf16), as --bf16_kernels says' "$tmp/bf16c.log"
"$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/bf16d" --bf16_kernels=onednn > "$tmp/bf16d.log" 2>&1; rc=$?
check "--bf16_kernels=onednn is refused (rc $rc): $(head -1 "$tmp/bf16d.log")" bash -c "test $rc -ne 0 && grep -q 'bf16_kernels.*onednn' '$tmp/bf16d.log'"

# An fp32 run measures, per weight shape, whether its GEMMs run as row parts on the kernel threads
# or on OpenBLAS's (with several kernel threads: a machine of 2 cores or more); --gemm_split pins it.
fp32=(--model=lm.austen.TransformerLmTiny --random_seed=3 --max_steps=1 "--model_params_override=$small")
if [ "$(nproc)" -ge 2 ]; then
  GLOSSA_KERNEL_CHOICE_CACHE="$tmp/kc.tsv" "$glossa" train "${fp32[@]}" --logdir="$tmp/fp32a" > "$tmp/fp32a.log" 2>&1
  check "an fp32 run measures its GEMM split: $(grep -m1 'kernel choice: fp32' "$tmp/fp32a.log")" grep -q '^kernel choice: fp32_affine 1024x16x[0-9]* train, [0-9]* kernel threads: .* (measured: aten [0-9.e+-]* ms, native [0-9.e+-]* ms)$' "$tmp/fp32a.log"
  GLOSSA_KERNEL_CHOICE_CACHE="$tmp/kc.tsv" "$glossa" train "${fp32[@]}" --logdir="$tmp/fp32b" --gemm_split=aten > "$tmp/fp32b.log" 2>&1
  check "--gemm_split=aten pins it" grep -q "kernel choice: fp32_affine .*: aten (one GEMM at a time on OpenBLAS's threads), as --gemm_split says" "$tmp/fp32b.log"
fi
"$glossa" train "${fp32[@]}" --logdir="$tmp/fp32c" --row_kernels=blas > "$tmp/fp32c.log" 2>&1; rc=$?
check "--row_kernels=blas is refused (rc $rc): $(head -1 "$tmp/fp32c.log")" bash -c "test $rc -ne 0 && grep -q 'row_kernels.*blas' '$tmp/fp32c.log'"

# 2. Resume to step 30 (or past it when SIGTERM came late: then just to stopped_at + 10).
target=$(( stopped_at < 20 ? 30 : stopped_at + 10 ))
check "resume" "$glossa" train "${flags[@]}" --max_steps=$target > "$tmp/train2.log" 2>&1
check "resume restored step $stopped_at: $(head -3 "$tmp/train2.log")" grep -q "restored .*ckpt-0*$stopped_at at step $stopped_at" "$tmp/train2.log"
# The console through a pipe: one concise line per loop, no bar, no glog warning.
check "progress lines: $(grep -m1 '^step ' "$tmp/train2.log")" grep -qE "^step [0-9]+/$target \([0-9]+%\) · loss [0-9.e-]+ · log_pplx [0-9.e-]+ · lr [0-9.e-]+ · [0-9.e+]+ steps/s · [0-9.]+[kM]? tok/s · elapsed [0-9]+:[0-9]{2}( · ETA [0-9]+:[0-9]{2})?$" "$tmp/train2.log"
check "the last line is at max_steps with no ETA" grep -qE "^step $target/$target \(100%\) · .* · elapsed [0-9:]+$" "$tmp/train2.log"
check "no progress bar in a pipe" bash -c "! grep -q \$'\r' '$tmp/train2.log'"
check "no glog warning" bash -c "! grep -q 'Logging before InitGoogleLogging' '$tmp/train1.log' '$tmp/train2.log'"
# Under a pseudo-terminal (script(1)): the bar is redrawn in place between the lines.
if command -v script > /dev/null; then
  script -qec "$(printf '%q ' "$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/tty" --random_seed=3 --intra_op_threads=1 "--model_params_override=$small" --max_steps=10)" /dev/null > "$tmp/tty.log" 2>&1
  check "a bar on a terminal: $(tr '\r\033' '~^' < "$tmp/tty.log" | head -c 300)" bash -c "grep -q \$'\r\\[=*>* *\\] [0-9]*/10 ' '$tmp/tty.log' && grep -q \$'\033\\[K' '$tmp/tty.log'"
  check "and the lines still print on a terminal" grep -q "step 10/10 (100%)" "$tmp/tty.log"
else
  echo "SKIP: script(1) (bsdutils) is not installed: no pseudo-terminal test"
fi
final=$(printf "ckpt-%08d" "$target")
check "final checkpoint $final" test -f "$logdir/train/$final.safetensors"

# 3. The evaler and decoder jobs process the checkpoints up to max_steps and exit.
check "evaler" "$glossa" eval "${flags[@]}" --max_steps=$target --dataset=Dev > "$tmp/eval.log" 2>&1
score=$(printf "%s/eval_dev/score-%08d.txt" "$logdir" "$target")
check "eval score file $score" grep -q "^log_pplx: " "$score"
check "processed_ckpts.txt" grep -qx "$final" "$logdir/eval_dev/processed_ckpts.txt"
check "eval events" compgen -G "$logdir/eval_dev/events.out.tfevents.*" > /dev/null
# A restarted evaler skips what it processed.
"$glossa" eval "${flags[@]}" --max_steps=$target --dataset=Dev > "$tmp/eval2.log" 2>&1
check "restarted evaler reprocesses nothing: $(cat "$tmp/eval2.log")" bash -c "! grep -q '^eval ' '$tmp/eval2.log'"
# eval.load_checkpoint_from: one given checkpoint, then exit.
first="$logdir/train/$final"
check "evaler with load_checkpoint_from" "$glossa" eval "${base_flags[@]}" --dataset=Test \
  "--model_params_override=$small; task.eval.load_checkpoint_from : '$first'" > "$tmp/eval3.log" 2>&1
check "eval_test score for step $target" test -f "$(printf "%s/eval_test/score-%08d.txt" "$logdir" "$target")"
check "decoder" "$glossa" decode "${flags[@]}" --max_steps=$target --dataset=Dev > "$tmp/decode.log" 2>&1
out=$(printf "%s/decoder_dev/decoder_out_%09d" "$logdir" "$target")
check "decoder output $out" test "$(grep -c ' ||| ' "$out" 2>/dev/null)" -ge 16
check "decoder score" grep -q "^num_samples_in_batch: " "$(printf "%s/decoder_dev/score-%08d.txt" "$logdir" "$target")"

# 3b. export: an inference bundle of the final checkpoint; never over an existing one.
check "export" "$glossa" export "${flags[@]}" --max_steps=$target --out="$tmp/bundle" --torchscript --onnx > "$tmp/export.log" 2>&1
check "export names the checkpoint: $(cat "$tmp/export.log")" grep -q "exported .*$final (step $target) to $tmp/bundle" "$tmp/export.log"
check "bundle manifest and weights" test -s "$tmp/bundle/MANIFEST.json" -a -s "$tmp/bundle/weights.safetensors" -a -s "$tmp/bundle/assets/spm_2k.model"
check "the manifest lists the ONNX network" grep -q '"onnx/lm_score.onnx"' "$tmp/bundle/MANIFEST.json"
one_line_error() {  # one_line_error <pattern> <args...>
  local pattern="$1"; shift
  local out
  if out=$("$glossa" "$@" 2>&1); then echo "FAIL: glossa $* succeeded"; fail=1; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then echo "FAIL: glossa $*: no '$pattern' in: $out"; fail=1; fi
  # The error is one line; besides it only log lines and the kernel choices a command prints
  # first (e.g. OpenBLAS's kernel set where OPENBLAS_CORETYPE is not in the environment).
  if [ "$(grep -vc '^[IW][0-9]\{8\} \|WARNING: Logging\|^kernel choice: ' <<<"$out")" -ne 1 ]; then echo "FAIL: glossa $*: not one line: $out"; fail=1; fi
}
one_line_error "exists and is not empty" export "${flags[@]}" --out="$tmp/bundle"
# predict: text lines (one string feed) and JSON lines, in batches; errors name the line.
printf 'It is a truth universally acknowledged\nthat a single man\nmust be in want of a wife\n' > "$tmp/texts.txt"
check "predict scores text lines" bash -c "'$glossa' predict --bundle='$tmp/bundle' --input='$tmp/texts.txt' --batch_size=2 > '$tmp/scores.jsonl' && test \$(wc -l < '$tmp/scores.jsonl') -eq 3 && grep -q '\"total_log_prob\":-' '$tmp/scores.jsonl'"
# Length-sorted, token-budget batches (Marian's maxi-batch, CTranslate2's token batches): the
# lines are sorted by length before batching and capped at 12 padded tokens a batch, yet each
# answer is its line's, in input order; a failing batch of non-consecutive lines names them.
check "predict --sort_window --max_batch_tokens answers each line in input order" bash -c "'$glossa' predict --bundle='$tmp/bundle' --input='$tmp/texts.txt' --batch_size=2 --sort_window=3 --max_batch_tokens=12 > '$tmp/scores_sorted.jsonl' && /usr/bin/python3 -c '
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    assert x[\"pieces\"] == y[\"pieces\"] and abs(x[\"total_log_prob\"] - y[\"total_log_prob\"]) < 1e-4, (x, y)
' '$tmp/scores.jsonl' '$tmp/scores_sorted.jsonl'"
/usr/bin/python3 -c 'print("short line"); print(" ".join(["truth"] * 5000)); print("another short line")' > "$tmp/one_long.txt"
one_line_error "one_long.txt:2: feed 'text' is 5000 tokens, more than max_input_tokens 4096" predict --bundle="$tmp/bundle" --input="$tmp/one_long.txt" --batch_size=3 --sort_window=3
printf '{"prompt": "Elizabeth", "max_new_tokens": -5}\n{"prompt": "Mr Darcy", "max_new_tokens": 3}\n{"prompt": "Jane", "max_new_tokens": -5}\n' > "$tmp/mixed_options.jsonl"
one_line_error "mixed_options.jsonl \(the batch of lines 1, 3\): .*max_new_tokens" predict --bundle="$tmp/bundle" --subgraph=generate --input="$tmp/mixed_options.jsonl" --sort_window=3
# The plan made at load: --precision=int8 quantizes a float bundle's projections when it loads
# (said in the first lines); its scores are int8's, close to float32's and not the same.
check "predict --precision=int8 runs an int8 plan made at load" bash -c "'$glossa' predict --bundle='$tmp/bundle' --input='$tmp/texts.txt' --precision=int8 > '$tmp/scores_int8.jsonl' 2> '$tmp/int8.log' && grep -q 'compute: int8, fused decoder step (.* weights prepared at load)' '$tmp/int8.log' && /usr/bin/python3 -c '
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 3, (len(a), len(b))
assert any(x[\"total_log_prob\"] != y[\"total_log_prob\"] for x, y in zip(a, b)), \"int8 gave float32 scores\"
for x, y in zip(a, b):
    assert x[\"pieces\"] == y[\"pieces\"] and abs(x[\"total_log_prob\"] - y[\"total_log_prob\"]) < 0.5, (x, y)
' '$tmp/scores.jsonl' '$tmp/scores_int8.jsonl'"
one_line_error "--precision: int4 not in" predict --bundle="$tmp/bundle" --input="$tmp/texts.txt" --precision=int4
# The TorchScript network, run by stock PyTorch, gives predict's log-probs (bit for bit with
# OpenBLAS's SkylakeX kernels, within float32 rounding with others: check_torchscript.py).
# (GLOSSA_KEEP_BLAS_KERNELS: the OpenBLAS kernels stock PyTorch uses, for a bit-for-bit comparison.)
GLOSSA_KEEP_BLAS_KERNELS=1 "$glossa" predict --bundle="$tmp/bundle" --input="$tmp/texts.txt" > "$tmp/scores_one_batch.jsonl" 2>/dev/null
check "torchscript = predict" /usr/bin/python3 "$(dirname "$0")/../reference/check_torchscript.py" "$tmp/bundle" "$tmp/scores_one_batch.jsonl"
printf '{"prompt": "Elizabeth", "max_new_tokens": 4, "seed": 1}\n{"prompt": "Mr. Darcy", "max_new_tokens": 4, "seed": 1}\n' > "$tmp/prompts.jsonl"
check "predict generates from JSON lines" bash -c "'$glossa' predict --bundle='$tmp/bundle' --subgraph=generate < '$tmp/prompts.jsonl' > '$tmp/gen.jsonl' && test \$(wc -l < '$tmp/gen.jsonl') -eq 2 && grep -q '\"text\":' '$tmp/gen.jsonl'"
printf 'fine\n{"txt": "x"}\n' > "$tmp/bad_feed.jsonl"
one_line_error "bad_feed.jsonl:2: unknown feed 'txt' \(feeds: text\)" predict --bundle="$tmp/bundle" --input="$tmp/bad_feed.jsonl"
printf '{"prompt": 3}\n' > "$tmp/bad_type.jsonl"
one_line_error "bad_type.jsonl:1: feed 'prompt' must be a string" predict --bundle="$tmp/bundle" --subgraph=generate --input="$tmp/bad_type.jsonl"
one_line_error "has no subgraph 'translate'" predict --bundle="$tmp/bundle" --subgraph=translate --input="$tmp/texts.txt"
one_line_error "has no MANIFEST.json" predict --bundle="$tmp" --input="$tmp/texts.txt"
# A write that fails (a full device) ends predict non-zero naming the output, never a short file
# and exit 0.
check "predict > /dev/full fails naming stdout" bash -c "! '$glossa' predict --bundle='$tmp/bundle' --input='$tmp/texts.txt' > /dev/full 2> '$tmp/full.log' && grep -q 'cannot write stdout' '$tmp/full.log'"
check "predict --output=/dev/full fails naming it" bash -c "! '$glossa' predict --bundle='$tmp/bundle' --input='$tmp/texts.txt' --output=/dev/full 2> '$tmp/full2.log' && grep -q \"cannot write '/dev/full'\" '$tmp/full2.log'"
# The input format is a flag: a text line that starts with '{' is text with --input_format=text.
printf '{curly} text\n' > "$tmp/curly.txt"
one_line_error "curly.txt:1: not valid JSON.*use --input_format=text" predict --bundle="$tmp/bundle" --input="$tmp/curly.txt"
check "--input_format=text reads a '{' line as text" bash -c "'$glossa' predict --bundle='$tmp/bundle' --input_format=text --input='$tmp/curly.txt' | grep -q '\"total_log_prob\":-'"
head -c 3000 /dev/zero | tr '\0' a > "$tmp/long.txt"
one_line_error "long.txt:1: line of 3000 bytes is longer than --max_line_bytes=1000" predict --bundle="$tmp/bundle" --input="$tmp/long.txt" --max_line_bytes=1000
printf '{"prompt": "Elizabeth", "max_new_tokens": -5}\n' > "$tmp/negative.jsonl"
one_line_error "feed 'max_new_tokens' is -5; it must be in \[0, 512\]" predict --bundle="$tmp/bundle" --subgraph=generate --input="$tmp/negative.jsonl"
# An empty flag value is an error (it would take the next flag as its value), and an absurd
# thread count is refused before anything starts.
one_line_error "--logdir has an empty value" train --model=lm.austen.TransformerLmTiny --logdir= --max_steps=5
check "no directory named after the next flag" test ! -e "./--max_steps=5"
one_line_error "--intra_op_threads=1024 is more than 4 per core" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/threads" --intra_op_threads=1024 --max_steps=1
one_line_error "dtype must be float32 or bfloat16" export "${flags[@]}" --out="$tmp/bundle16" --dtype=float16

# serve: HTTP on a free 127.0.0.1 port, driven by curl: answers, errors, concurrent clients, a 10 MB
# body, and SIGTERM with requests in flight (they finish, the server exits 0).
"$glossa" serve --bundle="$tmp/bundle" --port=0 --port_file="$tmp/port" --max_body_bytes=1000000 \
  > "$tmp/serve.log" 2>&1 &
serve_pid=$!
if wait_until "the port file" 60 test -s "$tmp/port"; then
  url="http://127.0.0.1:$(cat "$tmp/port")"
  check "serve: subgraphs" bash -c "curl -sf '$url/v1/subgraphs' | grep -q '\"generate\"'"
  check "serve: healthz" bash -c "curl -sf '$url/healthz' | grep -q '\"status\":\"ok\"'"
  check "serve: says its plan" grep -q "compute: float32, batch-invariant, fused decoder step" "$tmp/serve.log"
  check "serve: says which subgraphs batch continuously" grep -q "^continuous batching: generate (requests join a running decoding batch at every step" "$tmp/serve.log"
  check "serve: says its replicas, one per core by default" grep -qE "^layout: ([0-9]+) replicas? x 1 thread on \1 cores? \(weights shared\)$" "$tmp/serve.log"
  score=$(curl -s -X POST "$url/v1/subgraphs/default:run" -d '{"feeds": {"text": ["It is a truth universally acknowledged"]}}')
  predicted=$(head -1 "$tmp/scores.jsonl" | sed 's/.*"total_log_prob":\([-0-9.e]*\).*/\1/')
  # Within float32 rounding, not bit for bit: serve runs the batch-invariant kernels, predict
  # ATen's (as stock PyTorch does, below), and the trained step depends on when the stop landed;
  # on some weights the two round a sum differently (-77.64601135 vs -77.64601898 in a stress pass).
  served=$(sed -n 's/.*"total_log_prob":\[\([-0-9.e]*\)\].*/\1/p' <<<"$score")
  check "serve scores as predict does, within 1e-4 ($score vs $predicted)" awk -v a="$served" -v b="$predicted" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d <= 1e-4 && d >= -1e-4) }'
  code() { curl -s -o "$tmp/body" -w '%{http_code}' -X POST "$url$1" "${@:2}"; }
  # Continuous batching: a generation streamed as server-sent events, ending with the :run answer.
  curl -sN -X POST "$url/v1/subgraphs/generate:stream" \
    -d '{"feeds": {"prompt": ["Elizabeth"], "max_new_tokens": 5, "seed": 3}}' > "$tmp/stream.txt"
  run_answer=$(curl -s -X POST "$url/v1/subgraphs/generate:run" -d '{"feeds": {"prompt": ["Elizabeth"], "max_new_tokens": 5, "seed": 3}}')
  check "serve: :stream opens with the step it joined at" bash -c "head -2 '$tmp/stream.txt' | tr '\n' ' ' | grep -qE '^event: joined data: \{\"step\":[0-9]+,\"queued_steps\":[0-9]+\}'"
  check "serve: :stream sends a token event per token ($(grep -c '^event: token' "$tmp/stream.txt"))" test "$(grep -c '^event: token' "$tmp/stream.txt")" -ge 1 -a "$(grep -c '^event: token' "$tmp/stream.txt")" -le 5
  check "serve: :stream ends with the :run answer" test "$(grep -A1 '^event: done' "$tmp/stream.txt" | sed -n 's/^data: //p')" = "$run_answer"
  check "serve: scoring cannot stream" test "$(code /v1/subgraphs/default:stream -d '{"feeds": {"text": ["a"]}}')" = 400
  check "serve: malformed body is 400" test "$(code /v1/subgraphs/default:run -d '{"feeds": ')" = 400
  check "serve: 400 names the JSON error" grep -q 'not valid JSON' "$tmp/body"
  check "serve: unknown subgraph is 404" test "$(code /v1/subgraphs/translate:run -d '{}')" = 404
  check "serve: bad feed is 400" test "$(code /v1/subgraphs/default:run -d '{"feeds": {"txt": ["a"]}}')" = 400
  check "serve: bad feed message" grep -q "unknown feed 'txt' (feeds: text)" "$tmp/body"
  head -c 10000000 /dev/zero | tr '\0' 'x' > "$tmp/big.json"
  dur() { curl -s "$url/metrics" | sed -n 's/^glossa_serve_request_duration_seconds_count{subgraph="default"} \([0-9]*\)$/\1/p'; }
  samples=$(dur)
  check "serve: a 10 MB body is 413" test "$(code /v1/subgraphs/default:run --data-binary @"$tmp/big.json")" = 413
  check "serve: a 413 counts in requests_total" bash -c "curl -s '$url/metrics' | grep -qx 'glossa_serve_requests_total{subgraph=\"default\",code=\"413\"} 1'"
  check "serve: a 413 adds no latency sample ($samples, then $(dur))" test -n "$samples" -a "$(dur)" = "$samples"
  # --max_batch_size (32) caps the examples of one request, as documented.
  texts() { /usr/bin/python3 -c "import json, sys; print(json.dumps({'feeds': {'text': ['a truth'] * int(sys.argv[1])}}))" "$1"; }
  check "serve: 32 examples are answered" test "$(code /v1/subgraphs/default:run -d "$(texts 32)")" = 200
  check "serve: 33 examples are 400" test "$(code /v1/subgraphs/default:run -d "$(texts 33)")" = 400
  check "serve: naming the cap" grep -q "has 33 examples, more than max_batch_size 32" "$tmp/body"
  # A string is bounded in bytes before it is tokenized (32 a token of --max_input_tokens); one
  # within the bound tokenizes in linear time, a long run of unknown characters included.
  cjk() { /usr/bin/python3 -c "import json, sys; print(json.dumps({'feeds': {'text': ['\u65e5' * int(sys.argv[1])]}}, ensure_ascii=False))" "$1"; }
  cjk 300000 > "$tmp/cjk_big.json"
  check "serve: a 900 KB string is 400" test "$(code /v1/subgraphs/default:run --data-binary @"$tmp/cjk_big.json")" = 400
  check "serve: naming its bytes" grep -q "is 900000 bytes, more than 32 per token of max_input_tokens 4096 (131072 bytes)" "$tmp/body"
  cjk 40000 > "$tmp/cjk_ok.json"
  check "serve: a 120 KB run of unknown characters is scored" test "$(code /v1/subgraphs/default:run --data-binary @"$tmp/cjk_ok.json")" = 200
  # Chunked, curl streaming a 200 MB body: refused when it passes the limit, not read to its end
  # (curl then reports the server's 413, or that the server stopped reading).
  chunked=$(head -c 200000000 /dev/zero | tr '\0' 'x' | curl -s -o "$tmp/body" -w '%{http_code} %{size_upload}' -X POST "$url/v1/subgraphs/default:run" -H 'Transfer-Encoding: chunked' --data-binary @- || true)
  check "serve: a chunked 200 MB body stops at the limit ($chunked)" bash -c "[ \"\${1%% *}\" = 413 ] || [ \"\${1#* }\" -lt 200000000 ]" _ "$chunked"
  check "serve: max_new_tokens over the cap is 400" test "$(code /v1/subgraphs/generate:run -d '{"feeds": {"prompt": ["a"], "max_new_tokens": 8000}}')" = 400
  check "serve: naming the field and its range" grep -q "feed 'max_new_tokens' is 8000; it must be in \[0, 512\]" "$tmp/body"
  check "serve: a negative temperature is 400" test "$(code /v1/subgraphs/generate:run -d '{"feeds": {"prompt": ["a"], "temperature": -1}}')" = 400
  check "serve: invalid UTF-8 is 400, not 500" test "$(code /v1/subgraphs/default:run --data-binary $'{"feeds": {"text": ["\xff\xfe"]}}')" = 400
  # 16 concurrent clients, then SIGTERM.
  for i in $(seq 1 16); do
    curl -s -o "$tmp/c$i.json" -w '%{http_code}\n' -X POST "$url/v1/subgraphs/default:run" \
      -d "{\"feeds\": {\"text\": [\"client $i\"]}}" > "$tmp/c$i.code" &
  done
  wait_until "16 clients" 60 bash -c "test \$(cat '$tmp'/c*.code 2>/dev/null | grep -c '^200$') -eq 16"
  check "serve: 16 clients scored" bash -c "grep -l total_log_prob '$tmp'/c*.json | wc -l | grep -qx 16"
  kill -TERM "$serve_pid"
  wait "$serve_pid"; serve_rc=$?
  check "serve exits 0 on SIGTERM (rc $serve_rc)" test "$serve_rc" -eq 0
  check "serve: stopped" bash -c "! curl -s '$url/healthz'"
else
  kill "$serve_pid" 2>/dev/null
fi
# SIGTERM with 3 requests in flight: batches of 4 with a minute's timeout hold all three (no
# fourth comes), so they stay in flight until the server stops (an event, not a race: with a
# fourth the batch would run at once and the in-flight window could close between two polls).
# Without continuous batching: with it, generations join a running batch at once and never wait.
rm -f "$tmp/port"
"$glossa" serve --bundle="$tmp/bundle" --port=0 --port_file="$tmp/port" --max_batch_size=4 \
  --batch_timeout_micros=60000000 --no_continuous_batching > "$tmp/serve2.log" 2>&1 &
serve_pid=$!
if wait_until "the port file" 60 test -s "$tmp/port"; then
  url="http://127.0.0.1:$(cat "$tmp/port")"
  for i in 1 2 3; do
    curl -s -o "$tmp/g$i.json" -w '%{http_code}' -X POST "$url/v1/subgraphs/generate:run" \
      -d '{"feeds": {"prompt": ["Elizabeth"], "max_new_tokens": 8, "seed": 1}}' > "$tmp/g$i.code" &
  done
  wait_until "3 requests in flight" 60 bash -c "curl -s '$url/metrics' | grep -q '^glossa_serve_in_flight_requests 3$'"
  kill -TERM "$serve_pid"
  wait "$serve_pid"; serve_rc=$?
  check "serve exits 0 on SIGTERM with requests in flight (rc $serve_rc)" test "$serve_rc" -eq 0
  for i in 1 2 3; do wait_until "generation $i" 60 test -s "$tmp/g$i.code"; done
  check "serve: requests in flight at SIGTERM finish ($(cat "$tmp"/g*.code))" test "$(cat "$tmp"/g*.code)" = 200200200
  check "serve: in-flight answers are generations" bash -c "grep -l '\"text\"' '$tmp'/g*.json | wc -l | grep -qx 3"
  check "serve: drained" grep -q "finishing the requests in flight" "$tmp/serve2.log"
else
  kill "$serve_pid" 2>/dev/null
fi
one_line_error "cannot listen on 203.0.113.7:1" serve --bundle="$tmp/bundle" --host=203.0.113.7 --port=1
one_line_error "--port: must be an integer in \\[0, 65535\\], got '70000'" serve --bundle="$tmp/bundle" --port=70000

# 4. report: model vs unigram, and samples.
check "report" "$glossa" report "${flags[@]}" --dataset=Dev > "$tmp/report.log" 2>/dev/null
check "report lines: $(cat "$tmp/report.log")" grep -q "unigram log_pplx: " "$tmp/report.log"

# 5. Determinism: two fresh runs with the same --random_seed give bit-identical checkpoints (the
# shuffling file reader included); another seed does not.
for run in a b c; do
  seed=$([ "$run" = c ] && echo 6 || echo 5)
  "$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/det_$run" --random_seed=$seed \
    --max_steps=10 "--model_params_override=$small" > /dev/null 2>&1
done
check "same seed, bit-identical checkpoints" cmp -s "$tmp/det_a/train/ckpt-00000010.safetensors" "$tmp/det_b/train/ckpt-00000010.safetensors"
check "another seed differs" bash -c "! cmp -s '$tmp/det_a/train/ckpt-00000010.safetensors' '$tmp/det_c/train/ckpt-00000010.safetensors'"
# A run interrupted at step 7 and resumed to 10 equals the uninterrupted one bit for bit: the
# checkpoint holds the input position, and the resumed reader skips what was trained on.
"$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/det_r" --random_seed=5 \
  --max_steps=7 "--model_params_override=$small" > /dev/null 2>&1
"$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/det_r" --random_seed=5 \
  --max_steps=10 "--model_params_override=$small" > "$tmp/det_r.log" 2>&1
check "resume skips to the input position: $(head -3 "$tmp/det_r.log")" grep -q "input: skipped 7 batches to the checkpoint's input position" "$tmp/det_r.log"
check "interrupted and resumed equals uninterrupted, bit for bit" cmp -s "$tmp/det_a/train/ckpt-00000010.safetensors" "$tmp/det_r/train/ckpt-00000010.safetensors"

# 6. Flags: --flagfile, --help lists flags with docs, and clear one-line errors.
printf -- "--model=lm.austen.TransformerLmTiny\n# a comment\n--dataset=Dev\n" > "$tmp/flags.txt"
check "flagfile" bash -c "'$glossa' inspect_model --flagfile='$tmp/flags.txt' | grep -q 'total #params:'"
check "train --help documents --max_steps" bash -c "'$glossa' train --help | grep -q -- '--max_steps.*max_steps'"
one_line_error "no.such.Model" train --model=no.such.Model --logdir="$tmp/x"
one_line_error "TransformerLmTiny" inspect_model --model=lm.austen.TransformerLmTin
one_line_error "Dvv" inspect_model --model=lm.austen.TransformerLmTiny --dataset=Dvv
one_line_error "task.nope" inspect_model --model=lm.austen.TransformerLmTiny "--model_params_override=task.nope : 1"
printf "bad line\n" > "$tmp/bad.flags"
one_line_error "bad.flags:1" inspect_model --flagfile="$tmp/bad.flags"
one_line_error "no checkpoint" eval --model=lm.austen.TransformerLmTiny --logdir="$tmp/empty" --once
# Limits: files that are not small text files, out-of-range integers (never clamped), ';' inside
# a quoted override value.
mkdir -p "$tmp/flagdir"
one_line_error "--flagfile: file '$tmp/flagdir' is a directory" inspect_model --flagfile="$tmp/flagdir"
one_line_error "--flagfile: file '/dev/zero' is a character device" inspect_model --flagfile=/dev/zero
one_line_error "--random_seed: must be an integer in \[0, 9223372036854775807\], got '99999999999999999999'" \
  train --model=lm.austen.TransformerLmTiny --logdir="$tmp/x" --random_seed=99999999999999999999
one_line_error "--random_seed: must be an integer in .* got '-2'" \
  train --model=lm.austen.TransformerLmTiny --logdir="$tmp/x" --random_seed=-2
one_line_error "--intra_op_threads: must be an integer in \[0, 1024\]" \
  train --model=lm.austen.TransformerLmTiny --logdir="$tmp/x" --intra_op_threads=100000
one_line_error "--max_steps: must be an integer in \[0, 9007199254740992\]" \
  train --model=lm.austen.TransformerLmTiny --logdir="$tmp/x" --max_steps=9223372036854775807
one_line_error "steps_per_loop must be in \[1, 2\^53\], got -5" \
  train --model=lm.austen.TransformerLmTiny --logdir="$tmp/x" "--model_params_override=task.train.steps_per_loop : -5"
one_line_error "learning_rate.* must be (a )?finite.*, got inf" \
  train --model=lm.austen.TransformerLmTiny --logdir="$tmp/x" "--model_params_override=task.train.learner.learning_rate : inf"
check "refused runs leave no logdir" test ! -e "$tmp/x"
check "';' inside quotes stays in the value" bash -c "'$glossa' inspect_model --model=lm.austen.TransformerLmTiny \"--model_params_override=task.input.file_pattern : 'text:/a;b.txt'; task.train.max_steps : 7\" | grep -qx \"task.input.file_pattern : 'text:/a;b.txt'\""
# Lingvo's trainer flags.
check "inspect_model part counts and topn" bash -c "'$glossa' inspect_model --model=lm.austen.TransformerLmTiny --inspect_model_part_regex='stack:.*/stack/.*' --inspect_model_part_regex='softmax:.*softmax.*' --inspect_model_topn=2 > '$tmp/inspect.log' && grep -qE '^#params of stack: [0-9]+$' '$tmp/inspect.log' && grep -qE '^#params of softmax: [0-9]+$' '$tmp/inspect.log' && grep -A2 '^top 2 variables by size:' '$tmp/inspect.log' | grep -q 'emb'"
one_line_error "--inspect_model_part_regex: expected name:regex" inspect_model --model=lm.austen.TransformerLmTiny --inspect_model_part_regex=nocolon
one_line_error "--model_task_name is for multi-task models; this model \('lm'\) has a single task" inspect_model --model=lm.austen.TransformerLmTiny --model_task_name=lm
first_ckpt=$(printf "%s/train/ckpt-%08d" "$logdir" "$stopped_at")
if [ -f "$first_ckpt.safetensors" ]; then
  check "eval --checkpoint evaluates that checkpoint" bash -c "'$glossa' eval ${flags[*]@Q} --dataset=Test --checkpoint='$first_ckpt' > '$tmp/eval_ckpt.log' 2>&1 && test -f \"\$(printf '%s/eval_test/score-%08d.txt' '$logdir' '$stopped_at')\""
fi
one_line_error "--checkpoint: no checkpoint files at" eval "${flags[@]}" --checkpoint="$tmp/none/ckpt-1"
if "$glossa" train "${base_flags[@]/--logdir=$logdir/--logdir=$tmp/numerics}" --max_steps=50 --enable_check_numerics \
    "--model_params_override=$small; task.train.learner.learning_rate : 1e30" > "$tmp/numerics.log" 2>&1; then
  echo "FAIL: --enable_check_numerics let a non-finite gradient pass"; fail=1
fi
check "check numerics names the gradient: $(tail -1 "$tmp/numerics.log")" grep -qE "Gradient for .* is not finite\." "$tmp/numerics.log"
# Divergence: a huge learning rate stops the run with an error and a non-zero exit.
if "$glossa" train "${base_flags[@]/--logdir=$logdir/--logdir=$tmp/diverge}" --max_steps=200 \
    "--model_params_override=$small; task.train.learner.learning_rate : 1e30; task.train.max_consecutive_skipped_steps : 10" \
    > "$tmp/diverge.log" 2>&1; then
  echo "FAIL: a diverging run exited 0: $(tail -3 "$tmp/diverge.log")"; fail=1
fi
check "divergence is named: $(tail -2 "$tmp/diverge.log")" grep -q "training diverged: 10 consecutive steps were skipped" "$tmp/diverge.log"

[ "$fail" -eq 0 ] && echo "trainer e2e: all checks passed"
exit "$fail"
