#!/usr/bin/env bash
# Builds the English-Spanish Bible corpus for machine translation (docs/mt.md) from Debian's
# public-domain SWORD modules: the King James Version (sword-text-kjv, module engKJV2006eb) and the
# Reina-Valera 1909 (sword-text-sparv, module spaRV1909eb), exported with mod2imp
# (libsword-utils). Verses are aligned by key. Dev books (Ruth, Jonah, Habakkuk, Philippians,
# II Peter) and Test books (Esther, Micah, Ephesians, James, I John) are never trained on. A joint
# SentencePiece vocabulary (unigram, ids <unk> 0, <s> 1, </s> 2) is trained on both sides of Train.
#   bash scripts/prepare_bible_mt.sh [out_dir=data/bible_mt] [vocab_size=8000]
# Writes <out_dir>/{train,dev,test}.{en,es,tsv,keys} and <out_dir>/spm_<vocab_size>.model/.vocab.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-data/bible_mt}"
vocab="${2:-8000}"
for tool in mod2imp spm_train; do
  command -v "$tool" > /dev/null || { echo "prepare_bible_mt.sh: '$tool' is missing: run bash scripts/setup.sh" >&2; exit 1; }
done
mkdir -p "$out"
start=$SECONDS
say() { echo "prepare_bible_mt.sh [$((SECONDS - start)) s]: $*" >&2; }
for module in engKJV2006eb spaRV1909eb; do
  say "exporting SWORD module $module"
  mod2imp "$module" > "$out/$module.imp" 2> "$out/$module.err" || true
  if ! grep -q '^\$\$\$Genesis 1:1$' "$out/$module.imp"; then
    echo "prepare_bible_mt.sh: SWORD module $module is not installed or empty ($(head -c 200 "$out/$module.err")): run bash scripts/setup.sh" >&2
    exit 1
  fi
done
say "aligning verses ($(grep -c '^\$\$\$' "$out/engKJV2006eb.imp") English keys)"
/usr/bin/python3 scripts/bible_mt.py "$out/engKJV2006eb.imp" "$out/spaRV1909eb.imp" "$out"
rm -f "$out"/*.imp "$out"/*.err
cat "$out/train.en" "$out/train.es" > "$out/spm_train_input.txt"
say "training SentencePiece ($vocab pieces) on $(wc -l < "$out/spm_train_input.txt") Train lines"
spm_train --input="$out/spm_train_input.txt" --model_prefix="$out/spm_$vocab" --vocab_size="$vocab" \
  --model_type=unigram --character_coverage=1.0 --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
  --input_sentence_size=100000 --shuffle_input_sentence=true --random_seed=1 \
  --num_threads="$(nproc)" > "$out/spm_train.log" 2>&1 &
spm=$!
# spm_train is silent for its whole run: say it is still going every 5 s.
while kill -0 "$spm" 2>/dev/null; do
  for _ in $(seq 50); do kill -0 "$spm" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$spm" 2>/dev/null; then say "training SentencePiece: still running"; fi
done
wait "$spm" || { tail -5 "$out/spm_train.log" >&2; exit 1; }
rm -f "$out/spm_train_input.txt"
say "wrote $out (spm_$vocab.model)"
echo "prepare_bible_mt.sh: wrote $out (spm_$vocab.model)"
