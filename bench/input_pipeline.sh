#!/usr/bin/env bash
# Input pipeline benchmark against the raw read speed of the same bytes, in one run.
#   bash bench/input_pipeline.sh [size_mb=300] [build_dir=build]
# Repeats ../shared/testdata/lingvo/translate_ende_wmt32k-train-00511-of-00512 (8,941 tf.Examples)
# into 4 shards of about size_mb in total (TFRecord files concatenate), warms the page cache, and
# reports medians of 3 runs: (a) records read with every CRC checked, 1 and 2 readers, against
# the raw read speed (`cat > /dev/null`): `read` hands each record out as a view into the
# reader's window (RecordReader::NextView), `read_copy` copies each into a string (Next); (b) tf.Example parse -> bucketing batcher -> padded
# tensors, records/s and MB/s.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mb="${1:-300}"
build="${2:-build}"
src=../shared/testdata/lingvo/translate_ende_wmt32k-train-00511-of-00512
if [ ! -f "$src" ]; then echo "SKIP: $src is absent"; exit 0; fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
src_mb=$(( $(stat -c %s "$src") / 1000000 + 1 ))
copies=$(( size_mb / src_mb / 4 + 1 ))
for s in 0 1 2 3; do
  out="$dir/wmt-0000$s-of-00004"
  for _ in $(seq "$copies"); do cat "$src"; done > "$out"
done
total=$(du -cb "$dir"/wmt-* | tail -1 | cut -f1)
cat "$dir"/wmt-* > /dev/null  # page cache
median() { sort -g | sed -n 2p; }
# MB/s of a command reading every byte (median of 3).
rate() {
  for _ in 1 2 3; do
    local s e
    s=$(date +%s%N); eval "$1"; e=$(date +%s%N)
    awk -v b="$total" -v ns="$((e - s))" 'BEGIN { printf "%.1f\n", b / (ns / 1e9) / 1e6 }'
  done | median
}
# The limit is the raw read speed of these page-cached files: `cat > /dev/null` (read(2) copies
# every byte from the page cache into cat's buffer; writing to /dev/null discards them). The
# ratios divide by it. `cat | wc -c` (every byte through a pipe as well) is printed for reference.
cat_null=$(rate 'cat "$dir"/wmt-* > /dev/null')
cat_pipe=$(rate 'cat "$dir"/wmt-* | wc -c > /dev/null')
echo "data: $(( total / 1000000 )) MB in 4 shards ($copies copies of the 8,941-record shard each)"
echo "limit: cat > /dev/null ${cat_null} MB/s (raw read speed; ratios below divide by it); cat | wc -c ${cat_pipe} MB/s (medians of 3)"
for mode in read read_copy pipeline; do
  for readers in 1 2; do
    [ "$mode" = read_copy ] && [ "$readers" = 2 ] && continue
    passes=1; [ "$mode" != pipeline ] && passes=8  # read modes: 8 passes, ~1 s to time
    line=$(for _ in 1 2 3; do "$build/bin/bench_input_pipeline" "$mode" "tfrecord:$dir/wmt@4" "$readers" "$passes"; done |
           sort -t= -k7 -g | sed -n 2p)
    mbs=$(sed -E 's/.*MB_per_s=([0-9.]+).*/\1/' <<<"$line")
    ratio=$(awk -v a="$mbs" -v b="$cat_null" 'BEGIN { printf "%.2f", a / b }')
    echo "$line  ratio_to_raw_read=${ratio}"
  done
done
echo "reproduce: bash bench/input_pipeline.sh $size_mb $build"
