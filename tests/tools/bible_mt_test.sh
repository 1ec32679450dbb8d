#!/usr/bin/env bash
# scripts/prepare_bible_mt.sh on Debian's SWORD modules: the verse counts, aligned lines, Dev and
# Test books absent from Train, no markup left, and a SentencePiece model that round-trips.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { local what="$1"; shift; if ! "$@"; then echo "FAIL: $what"; fail=1; fi; }
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
[ "$fail" -eq 0 ] && echo "bible mt corpus: all checks passed"
exit "$fail"
