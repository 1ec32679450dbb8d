#!/usr/bin/env bash
# What a new user following the docs tripped on (issue 32), each checked through the glossa program:
# export and the jobs use the Params the run was trained with; a mistyped logdir is refused and left
# uncreated; the first step and the waits say something; the seed notice comes once, where it
# matters; a copied checkout finds its own data; inference edges; flags and help.
#   bash tests/tools/new_user_test.sh build/bin/glossa
set -u
glossa="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # wait_for
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
bad() { echo "FAIL: $*"; fail=1; }
model=lm.austen.TransformerLmTiny
small='task.stack.num_layers : 1; task.train.steps_per_loop : 10; task.train.save_interval_steps : 10'
gelu='task.stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation : "GELU"'

# Training from scratch: the first step's line, and the seed notice once (no random_seed given).
"$glossa" train --model=$model --logdir=run --max_steps=20 --intra_op_threads=1 \
  --model_params_override="$small; $gelu" > train.log 2>&1 || bad "train: $(cat train.log)"
grep -q '^step 1/20 (5%) .* first step$' train.log || bad "no first-step line: $(cat train.log)"
[ "$(grep -c 'No random_seed is set' train.log)" = 1 ] || bad "seed notice not said once: $(cat train.log)"
# Resumed (weights from a checkpoint): no seed notice.
"$glossa" train --model=$model --logdir=run --max_steps=30 --intra_op_threads=1 \
  --model_params_override="$small; $gelu" > resume.log 2>&1 || bad "resume: $(cat resume.log)"
grep -q 'No random_seed' resume.log && bad "seed notice on a resumed run: $(cat resume.log)"

# Export without the training override builds the trained model (GELU), and says so.
"$glossa" export --model=$model --logdir=run --out=b1 > export.log 2>&1 || bad "export: $(cat export.log)"
grep -q "tr_fflayer_tpl.activation : 'GELU'" b1/model_params.txt || bad "export bundled another model: $(grep 'tr_fflayer_tpl.activation' b1/model_params.txt)"
grep -q "trained 'GELU', given 'RELU'" export.log || bad "export did not say it used the trained Params: $(cat export.log)"
grep -q '^export: writing [0-9]* weights (.* MB, float32) of step 30$' export.log || bad "export did not say what it writes: $(cat export.log)"
grep -q 'No random_seed' export.log && bad "seed notice on export: $(cat export.log)"
# An override that changes the trained model is refused with the difference, and writes nothing.
if "$glossa" export --model=$model --logdir=run --out=b2 \
     --model_params_override='task.stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation : "RELU"' > refuse.log 2>&1; then
  bad "export with a changed model succeeded"
fi
grep -q "tr_fflayer_tpl.activation: trained 'GELU', given 'RELU'" refuse.log || bad "no diff in: $(cat refuse.log)"
[ -e b2 ] && bad "a refused export left b2"
# ... unless --allow_params_change.
"$glossa" export --model=$model --logdir=run --out=b3 --allow_params_change \
  --model_params_override='task.stack.transformer_layer_params_tpl.tr_fflayer_tpl.activation : "RELU"' > allow.log 2>&1 \
  || bad "--allow_params_change: $(cat allow.log)"
grep -q "tr_fflayer_tpl.activation : 'RELU'" b3/model_params.txt 2>/dev/null || bad "--allow_params_change did not apply the override"
# The same Params in eval: no seed notice, the trained model evaluated.
"$glossa" eval --model=$model --logdir=run --dataset=Dev --once \
  --model_params_override='task.eval.samples_per_summary : 16' > eval.log 2>&1 \
  || bad "eval --once: $(cat eval.log)"
grep -q 'No random_seed' eval.log && bad "seed notice on eval: $(cat eval.log)"
# A checkpoint of another model (two layers for the run's one): an error naming a variable it has
# and the model lacks, and no bundle.
"$glossa" train --model=$model --logdir=other --max_steps=1 --intra_op_threads=1 --random_seed=1 \
  --model_params_override='task.stack.num_layers : 2' > other.log 2>&1 || bad "train other: $(cat other.log)"
if "$glossa" export --model=$model --logdir=run --checkpoint=other/train/ckpt-00000001 --out=b4 > mismatch.log 2>&1; then
  bad "export of a checkpoint of another model succeeded"
fi
grep -q 'not variables of the model (lm/lm/stack/x_layers_1/' mismatch.log || bad "mismatch error names no variable: $(cat mismatch.log)"
[ -e b4 ] && bad "a failed export left b4"

# A mistyped logdir: refused, nothing created.
if "$glossa" eval --model=$model --logdir=runs/austen_tiy --dataset=Dev > typo.log 2>&1; then
  bad "eval on a mistyped logdir succeeded"
fi
grep -q "holds no training run .*--wait_for_train" typo.log || bad "typo: $(cat typo.log)"
[ -e runs ] && bad "eval on a mistyped logdir created $(find runs)"
# --wait_for_train waits, saying where; stopped by SIGTERM it exits 0.
"$glossa" decode --model=$model --logdir=later --dataset=Dev --wait_for_train > wait.log 2>&1 &
pid=$!
wait_for wait.log 'waiting for a new checkpoint in later/train' 60 || bad "no waiting line: $(cat wait.log)"
kill -TERM $pid; wait $pid || bad "decode --wait_for_train did not stop cleanly: $(cat wait.log)"

# A copied checkout's program finds the copy's data first: with the copy's own (empty)
# data/bible_mt it reads that, whatever the original checkout holds (a checkout that ran
# scripts/prepare_bible_mt.sh would otherwise be found next, and the corpus trained on).
mkdir -p copy/build/bin copy/data/bible_mt
cp "$glossa" copy/build/bin/glossa
touch copy/build/CMakeCache.txt
out=$(env -u GLOSSA_DATA_DIR copy/build/bin/glossa train --model=mt.bible.TransformerEnEsTiny --logdir=mt 2>&1)
case "$out" in
  *"none of $tmp/copy/data/bible_mt"*) ;;
  *"$tmp/copy/data/bible_mt"*) ;;  # found: the copy's directory is what it reads
  *) bad "the copy's data dir is not tried first: $out" ;;
esac

# A bundle path that does not exist says so.
out=$(echo hi | "$glossa" predict --bundle=no/such/bundle 2>&1) && bad "predict on a missing bundle succeeded"
grep -q "NOT_FOUND: bundle 'no/such/bundle' does not exist" <<<"$out" || bad "missing bundle: $out"
# A misspelled flag gets a did-you-mean.
out=$("$glossa" train --model=$model --logdir=x --max_step=10 2>&1) && bad "--max_step succeeded"
grep -q -- "--max_step=10.*did you mean: .*--max_steps" <<<"$out" || bad "no did-you-mean: $out"
[ -e x ] && bad "a refused train created x"
# Help: the program's name and examples; serve's defaults; --flagfile listed.
out=$("$glossa" --help 2>&1)
grep -q '^Usage: glossa' <<<"$out" || bad "--help does not name the program: $out"
[ "$(grep -c '^  glossa ' <<<"$out")" -ge 3 ] || bad "--help shows fewer than 3 examples: $out"
out=$("$glossa" serve --help 2>&1)
for f in max_batch_size=32 batch_timeout_micros=0 max_enqueued_requests=256 max_connections=512 max_new_tokens=512 host=127.0.0.1; do
  grep -q -- "--${f%%=*} [A-Z]*=${f#*=}\b" <<<"$out" || bad "serve --help lacks the default of --${f%%=*}: $out"
done
"$glossa" train --help | grep -q -- '--flagfile' || bad "train --help does not list --flagfile"
"$glossa" inspect_params glossa.layers.FeedForward > /dev/null 2>&1 && true
"$glossa" inspect_params --help | grep -q 'glossa.layers.FeedForward' && bad "inspect_params --help suggests an unregistered key"

[ $fail = 0 ] && echo "new_user: all checks passed"
exit $fail
