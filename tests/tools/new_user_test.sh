#!/usr/bin/env bash
# What a new user following the docs tripped on (issue 32), each checked through the glossa program:
# export and the jobs use the Params the run was trained with; a mistyped logdir is refused and left
# uncreated; the first step and the waits say something; the seed notice comes once, where it
# matters; a copied checkout finds its own data; inference edges; flags and help.
#   bash tests/tools/new_user_test.sh build/bin/glossa
set -u
glossa="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # wait_for
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
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

# Issue 46: your own text, end to end. A small English text that ships with Debian, split.
mkdir -p own
grep -v '^[[:space:]]*$' /usr/share/common-licenses/GPL-3 | sed 's/^[[:space:]]*//' > own/all.txt
head -400 own/all.txt > own/train.txt
sed -n '401,460p' own/all.txt > own/dev.txt
ndev=$(wc -l < own/dev.txt)
[ "$ndev" = 60 ] || bad "own/dev.txt has $ndev lines, not 60"
short="$small; task.train.summary_interval_steps : 50"
# The natural route (task.input.file_pattern) would train on it and evaluate on Austen: refused,
# with the override that says what every dataset reads.
if "$glossa" train --model=$model --logdir=mixed --max_steps=5 --intra_op_threads=1 --random_seed=1 \
     --model_params_override="$short; task.input.file_pattern : 'text:$tmp/own/train.txt'" > mixed.log 2>&1; then
  bad "training on own text with Dev on Austen's was not refused"
fi
grep -q "Train reads 'text:$tmp/own/train.txt', not $model's registered .* would still read the registered data" mixed.log \
  || bad "mixed data: $(cat mixed.log)"
grep -q "datasets.dev : '[^']*austen/dev.txt'; datasets.test : '[^']*'; datasets.train : 'text:$tmp/own/train.txt'" mixed.log \
  || bad "the refusal does not show the override: $(cat mixed.log)"
[ -e mixed/train ] && bad "a refused train created mixed/train"
# Saying what each dataset reads trains; params.txt records it. 5 steps, summaries every 50: the
# loss is still written (the loop's mean, as the console shows it).
own="datasets.train : 'text:$tmp/own/train.txt'; datasets.dev : 'text:$tmp/own/dev.txt'; datasets.test : ''"
"$glossa" train --model=$model --logdir=ownrun --max_steps=5 --intra_op_threads=1 --random_seed=1 \
  --model_params_override="$short; $own" > own_train.log 2>&1 || bad "train on own text: $(cat own_train.log)"
grep -q "^datasets.dev : 'text:$tmp/own/dev.txt'$" ownrun/control/params.txt || bad "params.txt lacks datasets.dev: $(grep datasets ownrun/control/params.txt)"
grep -q '"tag":"loss"' ownrun/train/metrics.jsonl || bad "a 5-step run recorded no loss in metrics.jsonl"
# eval --dataset=Dev with no override reads the run's Dev: 60 examples, not Austen's 774.
"$glossa" eval --model=$model --logdir=ownrun --dataset=Dev --once > own_eval.log 2>&1 || bad "eval own: $(cat own_eval.log)"
grep -q "eval Dev · ckpt-00000005 (step 5) · $ndev examples" own_eval.log || bad "eval did not read own Dev: $(cat own_eval.log)"
grep -q "reading the data the run was trained with" own_eval.log || bad "eval did not say whose data: $(cat own_eval.log)"
grep -q "file_pattern : 'text:$tmp/own/dev.txt'" ownrun/eval_dev/data.txt || bad "eval_dev/data.txt: $(cat ownrun/eval_dev/data.txt)"
# Again: it says the checkpoint was evaluated and where its scores are; --force redoes it.
"$glossa" eval --model=$model --logdir=ownrun --dataset=Dev --once > again.log 2>&1 || bad "eval again: $(cat again.log)"
grep -q "ckpt-00000005 (step 5) was already evaluated .*its scores: ownrun/eval_dev/score-00000005.txt. Pass --force" again.log \
  || bad "eval --once on a processed checkpoint: $(cat again.log)"
"$glossa" eval --model=$model --logdir=ownrun --dataset=Dev --once --force > force.log 2>&1 || bad "eval --force: $(cat force.log)"
grep -q "eval Dev · ckpt-00000005 (step 5) · $ndev examples" force.log || bad "--force did not evaluate: $(cat force.log)"
# Other data into the same eval_dev: refused, its best would mix two corpora.
austen_dev=$(sed -n "s/^datasets.dev : '\(.*\)'$/\1/p" run/control/params.txt)
if "$glossa" eval --model=$model --logdir=ownrun --dataset=Dev --once --force \
     --model_params_override="task.input.file_pattern : '$austen_dev'" > otherdata.log 2>&1; then
  bad "eval of other data into eval_dev succeeded"
fi
grep -q "ownrun/eval_dev holds the scores of other data" otherdata.log || bad "other data: $(cat otherdata.log)"
# The report's unigram baseline and Dev tokens come from the user's text, not Austen's.
"$glossa" report --model=$model --logdir=ownrun > own_report.log 2>&1 || bad "report own: $(cat own_report.log)"
tokens=$(sed -n 's/.* on Dev (\([0-9]*\) tokens):$/\1/p' own_report.log)
[ -n "$tokens" ] && [ "$tokens" -lt 3000 ] || bad "the report did not score own Dev (tokens '$tokens'): $(cat own_report.log)"
# A dataset given as '' reads nothing, and says which key to set.
out=$("$glossa" eval --model=$model --logdir=ownrun --dataset=Test --once 2>&1) && bad "eval on an empty Test succeeded"
grep -q "dataset Test reads no data: datasets.test is unset" <<<"$out" || bad "empty Test: $out"

# glossa tokenizer train: Glossa's ids written into the model, exactly the size asked.
"$glossa" tokenizer train --input=own/train.txt --model_prefix=own/spm --vocab_size=300 --num_threads=1 > tok.log 2>&1 \
  || bad "tokenizer train: $(cat tok.log)"
grep -q "^wrote own/spm.model and own/spm.vocab: 300 pieces, <unk> 0, <s> 1, </s> 2$" tok.log || bad "tokenizer said: $(cat tok.log)"
[ "$(sed -n '1p;2p;3p' own/spm.vocab | cut -f1 | tr '\n' ' ')" = "<unk> <s> </s> " ] || bad "spm.vocab starts: $(head -3 own/spm.vocab)"
out=$("$glossa" tokenizer train --input=own/train.txt --model_prefix=own/big --vocab_size=100000 2>&1) && bad "a vocabulary larger than the text allows succeeded"
grep -q "Vocabulary size too high (100000). Please set it to a value <= [0-9]*" <<<"$out" || bad "too large a vocabulary: $out"
out=$("$glossa" tokenizer train --input=own/none.txt --model_prefix=own/x --vocab_size=100 2>&1) && bad "tokenizer train on a missing file succeeded"
grep -q "own/none.txt" <<<"$out" || bad "missing input: $out"
out=$("$glossa" tokenizer train --input=own/train.txt --model_prefix=no/dir/x --vocab_size=100 2>&1) && bad "tokenizer train into a missing directory succeeded"
grep -q "no directory 'no/dir'" <<<"$out" || bad "missing directory: $out"
# A tokenizer of another size than the model's: refused when the model is built, every key named.
if "$glossa" train --model=$model --logdir=vocab --max_steps=2 --intra_op_threads=1 --random_seed=1 \
     --model_params_override="$short; $own; task.input.tokenizer.spm_model_file : '$tmp/own/spm.model'" > vocab.log 2>&1; then
  bad "training with a 300-piece tokenizer and a 2000-id model succeeded"
fi
grep -q "own/spm.model has 300 ids, but input.tokenizer.vocab_size is 2000, emb.vocab_size is 2000, softmax.num_classes is 2000" vocab.log \
  || bad "vocabulary mismatch: $(cat vocab.log)"
grep -q "ids must be in" vocab.log && bad "the mismatch surfaced at a step: $(cat vocab.log)"

# mt.text.*: your own pairs ("source<TAB>target"), one tokenizer for both sides. A toy translation:
# each line and its upper case.
upper() { tr '[:lower:]' '[:upper:]' < "$1"; }
upper own/train.txt > own/train_upper.txt
paste own/train.txt own/train_upper.txt > own/train.tsv
head -20 own/dev.txt > own/dev20.txt
paste own/dev20.txt <(upper own/dev20.txt) > own/dev.tsv
"$glossa" tokenizer train --input=own/train.txt,own/train_upper.txt --model_prefix=own/mtspm \
  --vocab_size=400 --num_threads=1 > mttok.log 2>&1 || bad "tokenizer train on both sides: $(cat mttok.log)"
grep -q "(a translation model, mt.text.\*: task.encoder.token_emb.vocab_size and task.decoder.token_emb.vocab_size" mttok.log \
  || bad "tokenizer train does not say the translation keys: $(cat mttok.log)"
mt=mt.text.TransformerTiny
mtshort="task.encoder.transformer_stack.num_layers : 1; task.decoder.num_trans_layers : 1; task.train.steps_per_loop : 3; task.decoder.target_seq_len : 24"
mtdata="datasets.train : 'text:$tmp/own/train.tsv'; datasets.dev : 'text:$tmp/own/dev.tsv'; datasets.test : ''; task.input.tokenizer.spm_model_file : '$tmp/own/mtspm.model'"
# A dataset nobody set names its key; a tokenizer of another size names every key that differs.
out=$("$glossa" train --model=$mt --logdir=mtnone --max_steps=1 --intra_op_threads=1 --random_seed=1 2>&1) \
  && bad "mt.text training with no data succeeded"
grep -q "dataset Train reads no data: datasets.train is unset" <<<"$out" || bad "mt.text with no data: $out"
out=$("$glossa" train --model=$mt --logdir=mtvocab --max_steps=1 --intra_op_threads=1 --random_seed=1 \
        --model_params_override="$mtshort; $mtdata" 2>&1) && bad "mt.text with a 400-piece tokenizer and 8000-id embeddings succeeded"
grep -q "own/mtspm.model has 400 ids, but input.tokenizer.vocab_size is 8000, encoder.token_emb.vocab_size is 8000, decoder.token_emb.vocab_size is 8000" <<<"$out" \
  || bad "mt.text vocabulary mismatch: $out"
grep -q "task.encoder.token_emb.vocab_size : 400; task.decoder.token_emb.vocab_size : 400" <<<"$out" || bad "the mismatch gives no fix: $out"
mtvocab="task.input.tokenizer.vocab_size : 400; task.encoder.token_emb.vocab_size : 400; task.decoder.token_emb.vocab_size : 400"
"$glossa" train --model=$mt --logdir=mtrun --max_steps=3 --intra_op_threads=1 --random_seed=1 \
  --model_params_override="$mtshort; $mtdata; $mtvocab" > mt_train.log 2>&1 || bad "mt.text train: $(cat mt_train.log)"
# Eval and decode read the run's pairs: 20 of them, no override.
"$glossa" eval --model=$mt --logdir=mtrun --dataset=Dev --once > mt_eval.log 2>&1 || bad "mt.text eval: $(cat mt_eval.log)"
grep -q "eval Dev · ckpt-00000003 (step 3) · 20 examples" mt_eval.log || bad "mt.text eval did not read own Dev: $(cat mt_eval.log)"
"$glossa" decode --model=$mt --logdir=mtrun --dataset=Dev --once > mt_decode.log 2>&1 || bad "mt.text decode: $(cat mt_decode.log)"
[ "$(grep -c ' ||| ' mtrun/decoder_dev/decoder_out_000000003 2>/dev/null)" = 20 ] \
  || bad "mt.text decode did not translate own Dev's 20 pairs: $(head -3 mtrun/decoder_dev/decoder_out_000000003 2>&1)"
grep -q "^$(head -1 own/dev20.txt) ||| $(head -1 own/dev20.txt | tr '[:lower:]' '[:upper:]') ||| " mtrun/decoder_dev/decoder_out_000000003 \
  || bad "the decoded pairs are not own Dev's: $(head -1 mtrun/decoder_dev/decoder_out_000000003)"
grep -q '^corpus_bleu: ' mtrun/decoder_dev/score-00000003.txt || bad "no BLEU: $(cat mtrun/decoder_dev/score-00000003.txt)"

# glossa onnx_feeds: the feeds of the exported ONNX network for given text, tokenized by the
# bundle; ONNX Runtime on them gives the Predictor's scores.
"$glossa" export --model=$model --logdir=ownrun --out=onnx_bundle --onnx > onnx_export.log 2>&1 || bad "export --onnx: $(cat onnx_export.log)"
printf 'You may convey a work\nThis License\n' > onnx_lines.txt
"$glossa" onnx_feeds --bundle=onnx_bundle --input=onnx_lines.txt --output=feeds.json > feeds.log 2>&1 || bad "onnx_feeds: $(cat feeds.log)"
/usr/bin/python3 - feeds.json <<'PY' || bad "feeds.json is not ort_run.js's format: $(head -c 300 feeds.json)"
import json, sys
f = json.load(open(sys.argv[1]))
assert sorted(f) == ["ids", "labels", "paddings"], sorted(f)
b, t = f["ids"]["dims"]
assert b == 2 and t > 1 and f["ids"]["type"] == "int64" and f["paddings"]["type"] == "float32"
assert all(len(v["data"]) == b * t and v["dims"] == [b, t] for v in f.values())
assert f["ids"]["data"][0] == 1  # <s>
PY
out=$("$glossa" onnx_feeds --bundle=onnx_bundle --graph=mt_decoder_step < onnx_lines.txt 2>&1) && bad "onnx_feeds on the decoder step succeeded"
grep -q "mt_decoder_step is run by a search" <<<"$out" || bad "decoder step: $out"
out=$("$glossa" onnx_feeds --bundle=b1 < onnx_lines.txt 2>&1) && bad "onnx_feeds on a bundle without ONNX succeeded"
grep -q "has no onnx/lm_score.onnx or onnx/mt_encoder.onnx" <<<"$out" || bad "no onnx: $out"
ort="$repo/bench/onnx/ort_run.js"
if command -v node > /dev/null && [ -d "$repo/bench/onnx/node_modules/onnxruntime-node" ]; then
  node "$ort" --model onnx_bundle/onnx/lm_score.onnx --feeds feeds.json > ort.json 2> ort.err || bad "ort_run.js: $(cat ort.err)"
  "$glossa" predict --bundle=onnx_bundle --input=onnx_lines.txt > predict.jsonl 2> predict.err || bad "predict: $(cat predict.err)"
  /usr/bin/python3 - ort.json predict.jsonl <<'PY' || bad "ONNX Runtime's scores differ from predict's: $(cat ort.json | head -c 300)"
import json, sys
ort = json.load(open(sys.argv[1]))["outputs"]["total_log_prob"]["data"]
pred = [json.loads(l)["total_log_prob"] for l in open(sys.argv[2]) if l.strip()]
assert len(ort) == len(pred) == 2, (ort, pred)
assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(ort, pred)), (ort, pred)
PY
else
  echo "SKIP: ONNX Runtime on onnx_feeds' feeds: no node or no $repo/bench/onnx/node_modules (scripts/setup.sh installs them)"
fi

# Issue 47. predict --output naming its input (by any name, or on stdin) is refused before
# anything is opened for writing: the input is intact.
printf 'It is a truth\nuniversally acknowledged\n' > same.txt
cp same.txt same.orig
ln -sf same.txt same.link
out=$("$glossa" predict --bundle=b1 --input=same.txt --output=same.link 2>&1) && bad "predict --output=its own input succeeded"
grep -q "output 'same.link' is the --input file 'same.txt' (the same device and inode)" <<<"$out" || bad "predict over its input: $out"
out=$("$glossa" predict --bundle=b1 --output=same.txt < same.txt 2>&1) && bad "predict --output=its stdin succeeded"
grep -q "output 'same.txt' is the file on standard input" <<<"$out" || bad "predict over its stdin: $out"
cmp -s same.txt same.orig || bad "predict destroyed its input: $(head -c 200 same.txt)"
# predict | head: the reader going away is an error and exit 1, not a silent SIGPIPE (141).
for i in $(seq 1 3000); do echo "It is a truth universally acknowledged"; done > many.txt
"$glossa" predict --bundle=b1 --input=many.txt 2> pipe.err | head -1 > /dev/null
rc=${PIPESTATUS[0]}
[ "$rc" = 1 ] || bad "predict | head exited $rc: $(cat pipe.err)"
grep -q "^glossa: ABORTED: cannot write stdout" pipe.err || bad "predict | head said: $(cat pipe.err)"
# NaN and Inf pass range checks: every float flag refuses them, naming the flag, before it runs.
for args in "serve --bundle=b1 --port=0 --watch_interval_secs=nan" \
            "train --model=$model --logdir=nanrun --saver_keep_checkpoint_every_n_hours=nan" \
            "train --model=$model --logdir=nanrun --saver_keep_checkpoint_every_n_hours=1e999" \
            "train --model=$model --logdir=nanrun --dist_timeout=nan" \
            "eval --model=$model --logdir=run --dataset=Dev --once --dist_timeout=nan"; do
  out=$(timeout 120 "$glossa" $args 2>&1) && bad "glossa $args succeeded"
  grep -q -- "--[a-z_]*: must be a finite number, got \(nan\|inf\|1e999\)" <<<"$out" || bad "glossa $args: $out"
done
[ -e nanrun ] && bad "a refused train created nanrun"
# A --mesh that does not fit the ranks is refused before any rank starts.
out=$(timeout 120 "$glossa" train --model=$model --logdir=meshrun --nproc_per_node=2 --mesh=data:3 --max_steps=1 2>&1) \
  && bad "a 3-rank mesh over 2 ranks succeeded"
grep -q -- "--mesh='data:3': data 3 = 3 ranks, but the job has 2" <<<"$out" || bad "bad mesh: $out"
grep -q "^\[rank\|rank [01] of 2" <<<"$out" && bad "ranks started for a bad mesh: $out"
# An expert-parallel model in one process (a 2-rank logdir resumed without its ranks): said when the
# model is built, not as a shape mismatch on restore or a failure at the first step.
out=$("$glossa" train --model=lm.austen.TransformerLmMoeTinyExpertParallel --logdir=ep1 --max_steps=1 \
        --intra_op_threads=1 --random_seed=1 2>&1) && bad "an expert-parallel model trained in one process"
grep -q "is sharded over the ranks of an 'expert' axis (its layer has num_devices = 2), but this run is one process: it needs a mesh with an 'expert' axis of 2 ranks: train it with --nproc_per_node=2" <<<"$out" \
  || bad "expert-parallel in one process: $out"

# report --html --watch: rewrites the file when the run writes, stops cleanly on SIGTERM.
"$glossa" report --logdir=ownrun --html=watch.html --watch --watch_interval=0.2 > watch.log 2>&1 &
wpid=$!
wait_for watch.log '^watching ownrun' 60 || bad "report --watch did not start: $(cat watch.log)"
first=$(grep -c '^wrote watch.html' watch.log)
"$glossa" train --model=$model --logdir=ownrun --max_steps=10 --intra_op_threads=1 --random_seed=1 \
  --model_params_override="$short; $own" > own_train2.log 2>&1 || bad "train on to 10: $(cat own_train2.log)"
wait_until "report --watch to rewrite watch.html after training" 60 \
  bash -c "[ \$(grep -c '^wrote watch.html' watch.log) -gt $first ]" || bad "no rewrite: $(cat watch.log)"
kill -TERM $wpid; wait $wpid || bad "report --watch did not exit 0 on SIGTERM: $(cat watch.log)"
grep -q '^stopped watching' watch.log || bad "report --watch did not say it stopped: $(cat watch.log)"
out=$("$glossa" report --logdir=ownrun --watch 2>&1) && bad "--watch without --html succeeded"
grep -q "give --html" <<<"$out" || bad "--watch without --html: $out"

# A checkout copied with its build/: scripts/build.sh configures afresh rather than building the
# original (CMakeCache.txt holds its absolute paths).
mkdir -p copied/build/CMakeFiles
printf 'CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere/glossa\nCMAKE_CACHEFILE_DIR:INTERNAL=/elsewhere/glossa/build\n' > copied/build/CMakeCache.txt
out=$(BUILD_DIR="$tmp/copied/build" bash "$repo/scripts/build.sh" --check-build-dir 2>&1) || bad "build.sh --check-build-dir: $out"
grep -q "was configured for source '/elsewhere/glossa' .* configuring afresh" <<<"$out" || bad "build.sh said: $out"
[ -e copied/build/CMakeCache.txt ] || [ -e copied/build/CMakeFiles ] && bad "build.sh kept the foreign cache"
mkdir -p ours/build
printf 'CMAKE_HOME_DIRECTORY:INTERNAL=%s\nCMAKE_CACHEFILE_DIR:INTERNAL=%s\n' "$repo" "$tmp/ours/build" > ours/build/CMakeCache.txt
out=$(BUILD_DIR="$tmp/ours/build" bash "$repo/scripts/build.sh" --check-build-dir 2>&1) || bad "build.sh --check-build-dir (ours): $out"
[ -e ours/build/CMakeCache.txt ] || bad "build.sh removed a cache of this checkout: $out"

# --load_library: a missing file and a library that is not Glossa's are errors naming them.
out=$("$glossa" list_models --load_library=$tmp/no/such.so 2>&1) && bad "--load_library of a missing file succeeded"
grep -q "load_library: the library '$tmp/no/such.so' does not exist" <<<"$out" || bad "missing library: $out"
libz=$(ls /usr/lib/x86_64-linux-gnu/libz.so.1 /lib/x86_64-linux-gnu/libz.so.1 2>/dev/null | head -1)
out=$("$glossa" list_models --load_library="$libz" 2>&1) && bad "--load_library of libz succeeded"
grep -q "'$libz' registered no Glossa model or class" <<<"$out" || bad "non-Glossa library: $out"
echo 'not an ELF' > notelf.so
out=$(GLOSSA_LIBRARIES=$tmp/notelf.so "$glossa" list_models 2>&1) && bad "GLOSSA_LIBRARIES with a text file succeeded"
grep -q "GLOSSA_LIBRARIES: cannot load '$tmp/notelf.so': .*notelf.so" <<<"$out" || bad "bad library: $out"

[ $fail = 0 ] && echo "new_user: all checks passed"
exit $fail
