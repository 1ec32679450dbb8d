#!/usr/bin/env bash
# A synthetic read-speech corpus for asr.synth.* (docs/asr.md): sentences from the Austen text
# (data/austen/{train,dev,test}.txt, public domain, split by chapter) spoken by Debian's espeak-ng
# in several English voices, speeds and pitches, resampled to 16 kHz 16-bit mono with sox. A Test or
# Dev sentence is never spoken in Train (the splits are by chapter, and any sentence that also
# occurs in Dev or Test is dropped from Train).
#
#   bash scripts/prepare_speech.sh [num_train=4000] [num_dev=200] [num_test=200] [out=data/speech]
#
# Writes <out>/wav/<split>/NNNNNN.wav and <out>/<split>.tsv ("wav/<split>/NNNNNN.wav<TAB>text"),
# then <out>/COMPLETE; with COMPLETE present for the same sizes it does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
num_train="${1:-4000}"
num_dev="${2:-200}"
num_test="${3:-200}"
out="${4:-data/speech}"
stamp="train=$num_train dev=$num_dev test=$num_test"
if [ -f "$out/COMPLETE" ] && [ "$(cat "$out/COMPLETE")" = "$stamp" ]; then
  echo "prepare_speech: $out is complete ($stamp)"
  exit 0
fi
for tool in espeak-ng sox; do
  command -v "$tool" >/dev/null || { echo "prepare_speech: $tool is missing: bash scripts/setup.sh installs it" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
# Sentences and their voice, speed and pitch: one job line per utterance.
/usr/bin/python3 - "$out" "$num_train" "$num_dev" "$num_test" <<'PY'
import random, re, sys
out, counts = sys.argv[1], dict(train=int(sys.argv[2]), dev=int(sys.argv[3]), test=int(sys.argv[4]))
VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029"]
VARIANTS = ["", "+m1", "+m3", "+m5", "+f1", "+f2", "+f4"]

def sentences(split):
    text = open("data/austen/%s.txt" % split, encoding="utf-8").read().replace("--", " ")
    for s in re.split(r"(?<=[.!?;:])\s+", text):
        words = re.sub(r"[^a-z' ]", " ", s.lower().replace("\u2019", "'")).split()
        words = [w.strip("'") for w in words if w.strip("'")]
        if 4 <= len(words) <= 14:
            yield " ".join(words)

held_out = set()
chosen = {}
for split in ("test", "dev", "train"):
    seen = []
    for s in sentences(split):
        if s in held_out or s in seen:
            continue
        seen.append(s)
    random.Random(split).shuffle(seen)
    chosen[split] = seen[:counts[split]]
    if len(chosen[split]) < counts[split]:
        sys.exit("prepare_speech: only %d %s sentences" % (len(chosen[split]), split))
    if split != "train":
        held_out.update(seen)
with open(out + "/jobs.txt", "w") as jobs:
    for split, sents in chosen.items():
        rng = random.Random("voices-" + split)
        with open("%s/%s.tsv" % (out, split), "w") as tsv:
            for i, s in enumerate(sents):
                path = "wav/%s/%06d.wav" % (split, i)
                voice = rng.choice(VOICES) + rng.choice(VARIANTS)
                jobs.write("%s\t%s\t%d\t%d\t%s\n" % (path, voice, rng.randint(130, 190), rng.randint(30, 70), s))
                tsv.write("%s\t%s\n" % (path, s))
PY
mkdir -p "$out/wav/train" "$out/wav/dev" "$out/wav/test"
total=$(wc -l < "$out/jobs.txt")
echo "prepare_speech: synthesising $total utterances ($stamp) into $out"
synth() {  # path voice speed pitch text
  local tmp="$OUT/$1.22k.wav"
  espeak-ng -v "$2" -s "$3" -p "$4" -w "$tmp" "$5"
  sox -q "$tmp" -r 16000 -b 16 -c 1 -e signed-integer "$OUT/$1"
  rm -f "$tmp"
}
export -f synth
export OUT="$out"
# Two workers; a heartbeat line every 500 utterances.
awk -F'\t' '{print $1 "\t" $2 "\t" $3 "\t" $4 "\t" $5}' "$out/jobs.txt" |
  tr '\t\n' '\0\0' | xargs -0 -n 5 -P "$(nproc)" bash -c 'synth "$@"' _ &
pid=$!
last=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  sleep 0.2
  if [ $(( $(date +%s) - last )) -ge 5 ]; then
    last=$(date +%s)
    echo "prepare_speech: $(find "$out/wav" -name '??????.wav' | wc -l)/$total utterances, $(( last - start )) s"
  fi
done
wait "$pid"
n=$(find "$out/wav" -name '??????.wav' | wc -l)
[ "$n" -eq "$total" ] || { echo "prepare_speech: only $n of $total utterances were written" >&2; exit 1; }
rm -f "$out/jobs.txt"
echo "$stamp" > "$out/COMPLETE"
echo "prepare_speech: $total utterances in $(( $(date +%s) - start )) s ($(du -sh "$out" | cut -f1))"
