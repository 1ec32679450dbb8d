#!/usr/bin/env bash
# The image and speech families end to end with the glossa program:
#  - image.fmnist.LeNet5 (when Debian's dataset-fashion-mnist is installed): a few training steps,
#    eval on Test, export, and `classify` through predict with base64 IDX images.
#  - scripts/prepare_speech.sh on a tiny slice (Test sentences never in Train), asr.synth.LasTiny
#    and CtcTiny at a small size: training (loss falls), the decoder job's WER/CER, export,
#    `transcribe` through predict (a synthetic utterance and, with pocketsphinx-testdata, a
#    LibriVox clip) from a bundle that carries the lexicon, asr.synth.CharLm and LasTinyLm
#    (shallow fusion), and bad manifests and WAVs.
#   bash tests/tools/image_asr_test.sh build/bin/glossa
set -uo pipefail
glossa="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # check, wait_for, wait_until, slowdown
one_line_error() {  # one_line_error <pattern> <args...>
  local pattern="$1"; shift
  local out
  if out=$("$glossa" "$@" 2>&1); then echo "FAIL: glossa $* succeeded"; fail=1; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then echo "FAIL: glossa $*: no '$pattern' in: $out"; fail=1; fi
}
first_last_loss() {  # the loss of the first and last progress lines
  grep -o '^step [0-9]*/[0-9]* ([0-9]*%) · loss [0-9.e+-]*' "$1" | awk '{print $NF}' | sed -n '1p;$p' | tr '\n' ' '
}
falls() { local a b; read -r a b <<<"$(first_last_loss "$1")"; awk -v a="$a" -v b="$b" 'BEGIN { exit !(b < a) }'; }

# ---- Image ----
fm=/usr/share/datasets/fashion-mnist
if [ -f "$fm/t10k-images-idx3-ubyte.gz" ]; then
  img=(--model=image.fmnist.LeNet5 --logdir="$tmp/lenet5" --random_seed=1)
  check "LeNet5 trains" "$glossa" train "${img[@]}" --max_steps=40 \
    --model_params_override='task.train.steps_per_loop : 10; task.input.batch_size : 64' > "$tmp/img_train.log" 2>&1
  check "LeNet5 loss falls: $(first_last_loss "$tmp/img_train.log")" falls "$tmp/img_train.log"
  check "LeNet5 eval Test" bash -c "'$glossa' eval ${img[*]} --dataset=Test --once 2>&1 | grep -q 'eval Test .* 10000 examples · accuracy 0\.[0-9]'"
  check "LeNet5 export" "$glossa" export "${img[@]}" --out="$tmp/lenet5_bundle" > /dev/null 2>&1
  /usr/bin/python3 - "$fm" > "$tmp/images.jsonl" <<'PY'
import base64, gzip, sys
raw = gzip.open(sys.argv[1] + "/t10k-images-idx3-ubyte.gz").read()
for i in range(4):
    img = b"\0\0\x08\x02" + (28).to_bytes(4, "big") * 2 + raw[16 + 784 * i:16 + 784 * (i + 1)]
    print('{"encoded": "%s", "top_k": 3}' % base64.b64encode(img).decode())
PY
  check "classify through predict" bash -c "'$glossa' predict --bundle='$tmp/lenet5_bundle' --subgraph=classify --input='$tmp/images.jsonl' > '$tmp/classes.jsonl' 2>/dev/null && test \$(grep -c '\"classes\":\[[0-9],[0-9],[0-9]\]' '$tmp/classes.jsonl') -eq 4"
  echo '{"encoded": "bm90IGFuIGltYWdl"}' > "$tmp/bad_image.jsonl"
  one_line_error "not an IDX, PGM \(P5/P2\) or PNG image" predict --bundle="$tmp/lenet5_bundle" --subgraph=classify --input="$tmp/bad_image.jsonl"
else
  echo "image: dataset-fashion-mnist is not installed (bash scripts/setup.sh): skipping the image part"
fi

# ---- Speech ----
if ! bash scripts/prepare_speech.sh 60 6 6 "$tmp/data/speech" > "$tmp/prep.log" 2>&1; then
  echo "FAIL: prepare_speech.sh: $(tail -3 "$tmp/prep.log")"; exit 1
fi
check "60 + 6 + 6 utterances" test "$(cat "$tmp/data/speech"/{train,dev,test}.tsv | wc -l)" -eq 72
check "Test sentences are never in Train" bash -c "! cut -f2 '$tmp/data/speech/test.tsv' | grep -qxFf - <(cut -f2 '$tmp/data/speech/train.tsv')"
check "16 kHz 16-bit mono WAVs" bash -c "soxi '$tmp/data/speech/wav/test/000000.wav' | grep -q 'Sample Rate    : 16000'"
check "prepare_speech is idempotent" bash -c "bash scripts/prepare_speech.sh 60 6 6 '$tmp/data/speech' | grep -q 'is complete'"
export GLOSSA_DATA_DIR="$tmp/data"
small='task.encoder.transformer_stack.num_layers : 1; task.encoder.conv_channels : 8; task.train.steps_per_loop : 10; task.train.save_interval_steps : 40; task.eval.decoder_samples_per_summary : 0'
las=(--model=asr.synth.LasTiny --logdir="$tmp/las" --random_seed=2)
check "LasTiny trains" "$glossa" train "${las[@]}" --max_steps=40 \
  --model_params_override="$small; task.decoder.num_trans_layers : 1" > "$tmp/las_train.log" 2>&1
check "LasTiny loss falls: $(first_last_loss "$tmp/las_train.log")" falls "$tmp/las_train.log"
check "LasTiny decodes Dev with WER and CER" bash -c "'$glossa' decode ${las[*]} --dataset=Dev --once --model_params_override='$small; task.decoder.num_trans_layers : 1' > '$tmp/las_decode.log' 2>&1 && grep -q 'decode Dev .* 6 decoded · wer [0-9.]*' '$tmp/las_decode.log' && grep -q '^cer: [0-9.]*' '$tmp'/las/decoder_dev/score-00000040.txt"
check "decoder_out lines: reference ||| hypothesis" bash -c "cat '$tmp'/las/decoder_dev/decoder_out_* 2>/dev/null | grep -q ' ||| '"
check "LasTiny export" "$glossa" export "${las[@]}" --model_params_override="$small; task.decoder.num_trans_layers : 1" --out="$tmp/las_bundle" > /dev/null 2>&1
{
  printf '{"wav": "%s", "num_hyps": 2}\n' "$(base64 -w0 "$tmp/data/speech/wav/test/000000.wav")"
  clip=/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav
  [ -f "$clip" ] && printf '{"wav": "%s"}\n' "$(base64 -w0 "$clip")"
} > "$tmp/wavs.jsonl"
check "the bundle carries the lexicon" test -s "$tmp/las_bundle/assets/lexicon.txt"
mv "$tmp/data/speech/lexicon.txt" "$tmp/lexicon.moved"  # the bundle must not need the corpus's
check "transcribe through predict" bash -c "'$glossa' predict --bundle='$tmp/las_bundle' --subgraph=transcribe --input='$tmp/wavs.jsonl' > '$tmp/transcripts.jsonl' 2>/dev/null && test \$(grep -c '\"transcript\":' '$tmp/transcripts.jsonl') -eq \$(wc -l < '$tmp/wavs.jsonl')"
mv "$tmp/lexicon.moved" "$tmp/data/speech/lexicon.txt"
# Shallow fusion: asr.synth.CharLm trains on lm_train.txt; LasTinyLm loads it at step 0
# (init_from_checkpoint_rules from $GLOSSA_SPEECH_LM), trains without changing it, and decodes.
lm_small='task.stack.num_layers : 1; task.train.steps_per_loop : 10; task.train.save_interval_steps : 10'
check "CharLm trains" "$glossa" train --model=asr.synth.CharLm --logdir="$tmp/charlm" --random_seed=2 --max_steps=10 \
  --model_params_override="$lm_small" > "$tmp/charlm.log" 2>&1
lasl=(--model=asr.synth.LasTinyLm --logdir="$tmp/lasl" --random_seed=2)
lasl_small="$small; task.decoder.num_trans_layers : 1; task.lm.stack.num_layers : 1"
check "LasTinyLm loads the CharLm and trains" bash -c "GLOSSA_SPEECH_LM='$tmp/charlm/train' '$glossa' train ${lasl[*]} --max_steps=10 --model_params_override='$lasl_small' > '$tmp/lasl.log' 2>&1 && grep -q 'initialized [0-9]* variables from init_from_checkpoint_rules' '$tmp/lasl.log'"
check "LasTinyLm decodes Dev with the fused LM" bash -c "GLOSSA_SPEECH_LM='$tmp/charlm/train' '$glossa' decode ${lasl[*]} --dataset=Dev --once --model_params_override='$lasl_small' > '$tmp/lasl_decode.log' 2>&1 && grep -q 'decode Dev .* 6 decoded · wer [0-9.]*' '$tmp/lasl_decode.log'"
check "LasTinyLm without its LM fails, naming the checkpoint" bash -c "! GLOSSA_SPEECH_LM='$tmp/no_lm' '$glossa' train --model=asr.synth.LasTinyLm --logdir='$tmp/lasl2' --max_steps=1 --model_params_override='$lasl_small' > '$tmp/lasl2.log' 2>&1 && grep -q '$tmp/no_lm' '$tmp/lasl2.log'"
sox -q "$tmp/data/speech/wav/test/000000.wav" -r 8000 "$tmp/8k.wav"
printf '{"wav": "%s"}\n' "$(base64 -w0 "$tmp/8k.wav")" > "$tmp/bad_wav.jsonl"
one_line_error "feed 'wav'\[0\]: 8000 Hz; the model takes 16000 Hz" predict --bundle="$tmp/las_bundle" --subgraph=transcribe --input="$tmp/bad_wav.jsonl"
# Bad corpora: a float WAV and a line without a tab, each named.
mkdir -p "$tmp/bad/speech/wav"
sox -q "$tmp/data/speech/wav/test/000000.wav" -e floating-point -b 32 "$tmp/bad/speech/wav/f.wav"
printf 'wav/f.wav\thello there\n' > "$tmp/bad/speech/train.tsv"
GLOSSA_DATA_DIR="$tmp/bad" one_line_error "f.wav: byte 20: WAV format 3 \(IEEE float\) is not integer PCM" \
  train --model=asr.synth.CtcTiny --logdir="$tmp/bad_run" --max_steps=2
printf 'no tab here\n' > "$tmp/bad/speech/train.tsv"
GLOSSA_DATA_DIR="$tmp/bad" one_line_error "a manifest line has no tab" \
  train --model=asr.synth.CtcTiny --logdir="$tmp/bad_run2" --max_steps=2
check "CtcTiny trains" "$glossa" train --model=asr.synth.CtcTiny --logdir="$tmp/ctc" --random_seed=2 --max_steps=30 \
  --model_params_override="$small" > "$tmp/ctc_train.log" 2>&1
check "CtcTiny loss falls: $(first_last_loss "$tmp/ctc_train.log")" falls "$tmp/ctc_train.log"
[ "$fail" -eq 0 ] && echo "image_asr_test: all checks passed"
exit "$fail"
