#!/usr/bin/env bash
# Trains mt.bible.TransformerEnEsTiny (English→Spanish, docs/mt.md) in a logdir, then decodes the
# held-out Test books with the beam and prints the Test BLEU beside the copy-the-source baseline.
# Builds the corpus first when data/bible_mt/ is missing (scripts/prepare_bible_mt.sh).
#   bash scripts/train_bible_mt.sh [logdir=runs/bible_tiny] [extra glossa flags...]
# Run it again and it resumes from the logdir (at its last step it only decodes).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
logdir="${1:-$root/runs/bible_tiny}"
shift || true
glossa="$root/build/bin/glossa"
[ -x "$glossa" ] || { echo "train_bible_mt: $glossa is missing; run scripts/build.sh first" >&2; exit 1; }
data="${GLOSSA_DATA_DIR:-$root/data}/bible_mt"
[ -f "$data/spm_8000.model" ] || bash "$root/scripts/prepare_bible_mt.sh" "$data"
model=mt.bible.TransformerEnEsTiny
common=(--model=$model --logdir="$logdir" --random_seed=1234 "$@")
quiet() { grep -v '^I[0-9]\{8\} \|^WARNING: Logging' >&2; }
echo "training $model in $logdir (TensorBoard: tensorboard --logdir $logdir)"
"$glossa" train "${common[@]}" 2> >(quiet)
"$glossa" decode --once "${common[@]}" --dataset=Test 2> >(quiet)
out=$(ls "$logdir"/decoder_test/decoder_out_* | sort | tail -1)
# decoder_out lines are "source ||| reference ||| hypothesis".
awk -F ' \\|\\|\\| ' '{print $3}' "$out" > "$logdir/decoder_test/test.hyp.es"
awk -F ' \\|\\|\\| ' '{print $2}' "$out" > "$logdir/decoder_test/test.ref.es"
awk -F ' \\|\\|\\| ' '{print $1}' "$out" > "$logdir/decoder_test/test.src.en"
echo "$model on Test (beam 4), $(wc -l < "$out") verses:"
printf "  model:           "; "$glossa" bleu --ref="$logdir/decoder_test/test.ref.es" --hyp="$logdir/decoder_test/test.hyp.es"
printf "  copy the source: "; "$glossa" bleu --ref="$logdir/decoder_test/test.ref.es" --hyp="$logdir/decoder_test/test.src.en"
echo "translations: $logdir/decoder_test/test.hyp.es; best steps: $glossa report ${common[*]} --dataset=Test"
