#!/usr/bin/env bash
# scripts/prepare_bible_mt.sh on Debian's SWORD modules: the verse counts, aligned lines, Dev and
# Test books absent from Train, no markup left, and a SentencePiece model that round-trips. Given
# the glossa binary, then mt.bible.TransformerEnEsTiny end to end at a small size on that corpus:
# train, decode Test with BLEU and best-step tracking, report, export and translate with predict,
# and bad input.
#   bash tests/tools/bible_mt_test.sh [build/bin/glossa]
set -uo pipefail
glossa="${1:-}"
[ -z "$glossa" ] || glossa="$(cd "$(dirname "$glossa")" && pwd)/$(basename "$glossa")"
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # check, wait_for, wait_until, slowdown
if ! bash scripts/prepare_bible_mt.sh "$tmp/mt" 4000 > "$tmp/log" 2>&1; then
  echo "FAIL: prepare_bible_mt.sh: $(tail -3 "$tmp/log")"; exit 1
fi
check "counts: $(head -1 "$tmp/log")" grep -q "^train=30091 dev=353 test=640$" "$tmp/log"
for s in train dev test; do
  n=$(wc -l < "$tmp/mt/$s.keys")
  check "$s: en, es, tsv and keys align" test "$(wc -l < "$tmp/mt/$s.en")" -eq "$n" -a "$(wc -l < "$tmp/mt/$s.es")" -eq "$n" -a "$(wc -l < "$tmp/mt/$s.tsv")" -eq "$n"
  check "$s: two fields per tsv line" test "$(awk -F'\t' 'NF != 2' "$tmp/mt/$s.tsv" | wc -l)" -eq 0
  check "$s: no markup" bash -c "! grep -q '[<>]' '$tmp/mt/$s.en' '$tmp/mt/$s.es'"
done
books() { sed 's/ [0-9]*:[0-9]*$//' "$1" | sort -u; }
check "dev books are not in train" test -z "$(comm -12 <(books "$tmp/mt/train.keys") <(books "$tmp/mt/dev.keys"))"
check "test books are not in train" test -z "$(comm -12 <(books "$tmp/mt/train.keys") <(books "$tmp/mt/test.keys"))"
check "dev is Ruth, Jonah, Habakkuk, Philippians, II Peter" test "$(books "$tmp/mt/dev.keys" | tr '\n' ,)" = "Habakkuk,II Peter,Jonah,Philippians,Ruth,"
check "Genesis 1:1 pairs with its Spanish verse" grep -q "^In the beginning God created the heaven and the earth.	EN el principio crió Dios los cielos y la tierra.$" "$tmp/mt/train.tsv"
check "John 3:16 is in train" grep -qx "John 3:16" "$tmp/mt/train.keys"
rt=$(head -1 "$tmp/mt/test.es" | spm_encode --model="$tmp/mt/spm_4000.model" | spm_decode --model="$tmp/mt/spm_4000.model")
check "SentencePiece round-trips a Test verse" test "$rt" = "$(head -1 "$tmp/mt/test.es")"
check "SentencePiece ids: <unk> 0, <s> 1, </s> 2" bash -c "head -3 '$tmp/mt/spm_4000.vocab' | cut -f1 | tr '\n' , | grep -qx '<unk>,<s>,</s>,'"

if [ -n "$glossa" ]; then
  # The model's default vocabulary (8,000 pieces) in $tmp/bible_mt, found through GLOSSA_DATA_DIR.
  if ! bash scripts/prepare_bible_mt.sh "$tmp/bible_mt" > "$tmp/log8k" 2>&1; then
    echo "FAIL: prepare_bible_mt.sh 8000: $(tail -3 "$tmp/log8k")"; exit 1
  fi
  export GLOSSA_DATA_DIR="$tmp"
  # A small model: 1 + 1 layers of width 32, 30 steps, beam 2 over at most 24 tokens.
  cat > "$tmp/small.txt" <<'PARAMS'
task.encoder.model_dim : 32
task.encoder.token_emb.embedding_dim : 32
task.encoder.position_emb.embedding_dim : 32
task.encoder.transformer_stack.num_layers : 1
task.encoder.transformer_stack.mdl_dim : 32
task.encoder.transformer_stack.num_atten_heads : 2
task.encoder.transformer_stack.hidden_dim : 64
task.decoder.model_dim : 32
task.decoder.token_emb.embedding_dim : 32
task.decoder.position_emb.embedding_dim : 32
task.decoder.num_trans_layers : 1
task.decoder.trans_decoder_tpl.num_heads : 2
task.decoder.trans_decoder_tpl.tr_fflayer_tpl.hidden_dim : 64
task.decoder.target_seq_len : 24
task.decoder.beam_search.num_hyps_per_beam : 2
task.train.max_steps : 30
task.train.learner.lr_schedule.model_dim : 32
task.eval.decoder_samples_per_summary : 16
PARAMS
  flags=(--model=mt.bible.TransformerEnEsTiny --logdir="$tmp/run" --random_seed=1 --model_params_file_override="$tmp/small.txt")
  quiet() { grep -v '^I[0-9]\{8\} \|^WARNING: Logging'; }
  check "train" bash -c "'$glossa' train ${flags[*]@Q} > '$tmp/train.log' 2>&1"
  check "train wrote step 30: $(tail -2 "$tmp/train.log" | quiet)" test -f "$tmp/run/train/ckpt-00000030.safetensors"
  check "decode Test" bash -c "'$glossa' decode --once ${flags[*]@Q} --dataset=Test > '$tmp/decode.log' 2>&1"
  check "decoder score has corpus_bleu: $(quiet < "$tmp/decode.log" | tail -2)" grep -q "^corpus_bleu: " "$tmp/run/decoder_test/score-00000030.txt"
  check "decoder tracks the best corpus_bleu step" grep -q "^best_step: 30$" "$tmp/run/decoder_test/best-corpus_bleu.txt"
  check "decoder_out: source ||| reference ||| hypothesis" bash -c "head -1 '$tmp/run/decoder_test/decoder_out_000000030' | grep -q '^.* ||| .* ||| '"
  # Sharded decoding over 2 workers gathers every hypothesis before corpus BLEU: the whole Dev
  # set gives the unsharded BLEU and the same translations.
  for d in dev1 dev2; do mkdir -p "$tmp/$d" && cp -r "$tmp/run/train" "$tmp/$d/"; done
  { cat "$tmp/small.txt"; echo "task.eval.decoder_samples_per_summary : 0"; } > "$tmp/all.txt"
  # Both decodes pin the bf16 kernels: measured choices may differ between a process with 2 ATen
  # threads and workers with 1 each (glossa/kernels/kernel_choice.h), and this compares sharding.
  all=(--model=mt.bible.TransformerEnEsTiny --random_seed=1 --model_params_file_override="$tmp/all.txt" --dataset=Dev --once --bf16_kernels=native)
  check "decode Dev" bash -c "'$glossa' decode ${all[*]@Q} --logdir='$tmp/dev1' > '$tmp/dev1.log' 2>&1"
  check "decode Dev --nproc_per_node=2" bash -c "'$glossa' decode ${all[*]@Q} --logdir='$tmp/dev2' --nproc_per_node=2 > '$tmp/dev2.log' 2>&1"
  b1=$(sed -n 's/^corpus_bleu: //p' "$tmp/dev1/decoder_dev/score-00000030.txt")
  b2=$(sed -n 's/^corpus_bleu: //p' "$tmp/dev2/decoder_dev/score-00000030.txt")
  out2="$tmp/dev2/decoder_dev/decoder_out_000000030"
  check "every Dev verse decoded once" test "$(wc -l < "$out2")" -eq 353 -a "$(cut -d'|' -f1 "$out2" | sort -u | wc -l)" -eq 353
  # The corpus BLEU is over every rank's hypotheses: `glossa bleu` on all 353 lines agrees.
  awk -F' [|][|][|] ' '{print $2 > "'"$tmp"'/ref2.txt"; print $3 > "'"$tmp"'/hyp2.txt"}' "$out2"
  want=$("$glossa" bleu --ref="$tmp/ref2.txt" --hyp="$tmp/hyp2.txt" | sed -n 's/^BLEU = \([0-9.]*\) .*/\1/p')
  check "sharded corpus_bleu $b2 is the BLEU of all 353 lines ($want)" test "$(/usr/bin/python3 -c "print('%.2f' % (100 * float('${b2:-nan}')))")" = "$want"
  # Beam scores near ties can break differently when a batch holds other sentences (fp rounding
  # of other shapes), so a few of this 30-step model's hypotheses may differ: the BLEU agrees
  # to 2% and 95% of the translations are identical.
  check "sharded BLEU '$b2' equals unsharded '$b1' (2%)" /usr/bin/python3 -c "import sys; a, b = float('${b1:-nan}'), float('${b2:-nan}'); sys.exit(abs(a - b) > 0.02 * a)"
  same=$(comm -12 <(sort "$tmp/dev1/decoder_dev/decoder_out_000000030") <(sort "$out2") | wc -l)
  check "the same translations ($same of 353)" test "$same" -ge 336
  check "report shows the best step" bash -c "'$glossa' report ${flags[*]@Q} --dataset=Test 2>/dev/null | grep -q '^best corpus_bleu on Test (decoder job, higher is better): .* at step 30'"
  check "export" bash -c "'$glossa' export ${flags[*]@Q} --out='$tmp/bundle' > '$tmp/export.log' 2>&1"
  printf 'In the beginning God created the heaven and the earth.\nAnd God said, Let there be light.\n' > "$tmp/src.txt"
  check "predict translates text lines with the beam" bash -c "'$glossa' predict --bundle='$tmp/bundle' --subgraph=translate --input='$tmp/src.txt' > '$tmp/tr.jsonl' 2>'$tmp/predict.log' && test \$(wc -l < '$tmp/tr.jsonl') -eq 2 && grep -q '\"translation\":' '$tmp/tr.jsonl' && grep -q '\"scores\":\\[-[0-9]' '$tmp/tr.jsonl'"
  # The plan made at load: this bundle computes in bfloat16, so int8 is refused naming the layer
  # (its export with --quantize=int8 would set float32 activations), never silently not applied.
  check "predict --precision=int8 on a bf16 bundle is refused" bash -c "! '$glossa' predict --bundle='$tmp/bundle' --subgraph=translate --input='$tmp/src.txt' --precision=int8 > /dev/null 2> '$tmp/int8.log' && grep -q 'int8 needs float32 activations' '$tmp/int8.log'"
  echo '{"source": "In the beginning", "num_hyps": 99}' > "$tmp/bad.jsonl"
  # Only the hypotheses the search found: no empty ones, no score of 0 ranked above real ones, and
  # as many scores as hyps (a 30-step model ends few hypotheses of a wide beam).
  printf '{"source": "In the beginning God created the heaven and the earth.", "num_hyps": 8}\n' > "$tmp/wide.jsonl"
  check "translate returns only real hypotheses" bash -c "'$glossa' predict --bundle='$tmp/bundle' --subgraph=translate --input='$tmp/wide.jsonl' > '$tmp/wide_out.jsonl' 2>/dev/null && /usr/bin/python3 -c \"
import json, math, sys
r = json.loads(open('$tmp/wide_out.jsonl').readline())
n = r['num_hyps_found']
ok = (1 <= n <= 8 and r['hyps'].count(' ||| ') + 1 == n == len(r['scores']) == len(r['ids'])
      and all(isinstance(x, float) and math.isfinite(x) and x != 0.0 for x in r['scores']))
sys.exit(0 if ok else print(r) or 1)\""
  check "num_hyps out of range is an error naming it" bash -c "! '$glossa' predict --bundle='$tmp/bundle' --subgraph=translate --input='$tmp/bad.jsonl' > /dev/null 2> '$tmp/bad.log' && grep -q 'num_hyps' '$tmp/bad.log'"
  # A vocabulary shortlist from the training text, bundled through task.shortlist_file.
  check "glossa shortlist builds a shortlist: $(tail -1 "$tmp/sl.log" 2>/dev/null)" bash -c "'$glossa' shortlist --bundle='$tmp/bundle' --source='$tmp/bible_mt/train.en' --target='$tmp/bible_mt/train.es' --out='$tmp/shortlist.tsv' --per_source=20 --frequent=100 > '$tmp/sl.log' 2>&1 && grep -q '^shortlist: .* pairs, 100 frequent target pieces' '$tmp/sl.log' && head -1 '$tmp/shortlist.tsv' | grep -qx 'glossa_shortlist 1 8000 8000'"
  { cat "$tmp/small.txt"; echo "task.shortlist_file : \"$tmp/shortlist.tsv\""; } > "$tmp/small_sl.txt"
  check "export with task.shortlist_file bundles the shortlist: $(tail -1 "$tmp/export_sl.log" 2>/dev/null)" bash -c "'$glossa' export --model=mt.bible.TransformerEnEsTiny --logdir='$tmp/run' --model_params_file_override='$tmp/small_sl.txt' --allow_params_change --out='$tmp/bundle_sl' > '$tmp/export_sl.log' 2>&1 && cmp -s '$tmp/shortlist.tsv' '$tmp/bundle_sl/assets/shortlist.tsv'"
  check "predict translates with the bundled shortlist" bash -c "'$glossa' predict --bundle='$tmp/bundle_sl' --subgraph=translate --input='$tmp/src.txt' > '$tmp/tr_sl.jsonl' 2>/dev/null && test \$(wc -l < '$tmp/tr_sl.jsonl') -eq 2 && grep -q '\"translation\":' '$tmp/tr_sl.jsonl'"
  check "shortlist: --out a directory is an error naming it" bash -c "! '$glossa' shortlist --bundle='$tmp/bundle' --source='$tmp/src.txt' --target='$tmp/src.txt' --out='$tmp' > /dev/null 2> '$tmp/sl_dir.log' && grep -q \"is a directory\" '$tmp/sl_dir.log'"
  check "shortlist: files that do not align are an error naming them, and write nothing" bash -c "! '$glossa' shortlist --bundle='$tmp/bundle' --source='$tmp/src.txt' --target='$tmp/bible_mt/train.es' --out='$tmp/x.tsv' > /dev/null 2> '$tmp/sl_bad.log' && grep -q 'src.txt ends at line 2 but .*train.es goes on' '$tmp/sl_bad.log' && test ! -e '$tmp/x.tsv'"
  # Bad input: a missing corpus file fails the job, naming it.
  { cat "$tmp/small.txt"; echo "task.input.file_pattern : \"text:$tmp/missing.tsv\""; } > "$tmp/missing.txt"
  check "a missing input file is an error: $(tail -1 "$tmp/missing.log" 2>/dev/null)" bash -c "! '$glossa' train --model=mt.bible.TransformerEnEsTiny --logdir='$tmp/run2' --model_params_file_override='$tmp/missing.txt' > '$tmp/missing.log' 2>&1 && grep -q 'missing.tsv' '$tmp/missing.log'"
fi
[ "$fail" -eq 0 ] && echo "bible mt: all checks passed"
exit "$fail"
