#!/usr/bin/env bash
# A synthetic read-speech corpus for asr.synth.* (docs/asr.md): sentences from the Austen text
# (data/austen/{train,dev,test}.txt, public domain, split by chapter) spoken by Debian's espeak-ng
# in several English voices, speeds and pitches, resampled to 16 kHz 16-bit mono with sox. A Test or
# Dev sentence is never spoken in Train (the splits are by chapter, and any sentence that also
# occurs in Dev or Test is dropped from Train).
#
#   bash scripts/prepare_speech.sh [num_train=12000] [num_dev=200] [num_test=200] [out=data/speech]
#
# Writes <out>/wav/<split>/NNNNNN.wav and <out>/<split>.tsv ("wav/<split>/NNNNNN.wav<TAB>text"),
# and <out>/feature_stats.txt (per-bin log-mel mean and stddev of Train), then <out>/COMPLETE; with
# COMPLETE present for the same sizes it does nothing (but write lm_train.txt, lm_dev.txt and
# lexicon.txt, the speech LM's text and the word list, when they are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
num_train="${1:-12000}"
num_dev="${2:-200}"
num_test="${3:-200}"
out="${4:-data/speech}"
stamp="train=$num_train dev=$num_dev test=$num_test"
# Text for the speech LM (asr.synth.CharLm, shallow fusion in asr.synth.LasTinyLm): every sentence
# of the Austen Train chapters (none of Dev or Test, and none that also occurs there), normalised
# as the transcripts are, one per line, in <out>/lm_train.txt; the Dev chapters' in lm_dev.txt; and
# the words of lm_train.txt with their counts in lexicon.txt (the decoders' closed vocabulary).
lm_text() {
  [ -s "$out/lm_train.txt" ] && [ -s "$out/lm_dev.txt" ] && [ -s "$out/lexicon.txt" ] && return 0
  /usr/bin/python3 - "$out" <<'PY'
import os, sys
sys.path.insert(0, "scripts")
from speech_text import sentences
out = sys.argv[1]
held_out = set(sentences("dev", 1, 40)) | set(sentences("test", 1, 40))
for split, name in (("train", "lm_train.txt"), ("dev", "lm_dev.txt")):
    lines = [s for s in sentences(split, 1, 40) if split != "train" or s not in held_out]
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    print("prepare_speech: %d LM sentences in %s/%s" % (len(lines), out, name))
    if split == "train":
        counts = {}
        for s in lines:
            for w in s.split():
                counts[w] = counts.get(w, 0) + 1
        with open(os.path.join(out, "lexicon.txt.tmp"), "w") as f:
            for w, c in sorted(counts.items(), key=lambda x: (-x[1], x[0])):
                f.write("%s %d\n" % (w, c))
        os.replace(os.path.join(out, "lexicon.txt.tmp"), os.path.join(out, "lexicon.txt"))
        print("prepare_speech: %d words in %s/lexicon.txt" % (len(counts), out))
PY
}
if [ -f "$out/COMPLETE" ] && [ "$(cat "$out/COMPLETE")" = "$stamp" ] && [ -f "$out/feature_stats.txt" ]; then
  lm_text
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
import random, sys
sys.path.insert(0, "scripts")
from speech_text import sentences
out, counts = sys.argv[1], dict(train=int(sys.argv[2]), dev=int(sys.argv[3]), test=int(sys.argv[4]))
VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029"]
VARIANTS = ["", "+m1", "+m3", "+m5", "+f1", "+f2", "+f4"]

held_out = set()
chosen = {}
for split in ("test", "dev", "train"):
    seen = []
    for s in sentences(split, 4, 14):
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
  sox -q -V1 "$tmp" -r 16000 -b 16 -c 1 -e signed-integer "$OUT/$1"
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
# Per-bin mean and stddev of the log-mel features over (up to) 500 Train utterances, as Lingvo's
# recipes fix per_bin_mean / per_bin_stddev from their training data; asr.synth.* read them. The
# features are MelAsrFrontend's defaults (80 bins, 25/10 ms, pre-emphasis 0.97, periodic Hann,
# 1024-point FFT, TensorFlow's mel matrix), computed here with torch.stft as
# tests/reference/asr_frontend_reference.py does (the unit test holds the two equal).
/usr/bin/python3 - "$out" <<'PY'
import math, sys, wave
import torch
out = sys.argv[1]
RATE, STEP, WIN, NFFT, BINS = 16000, 160, 400, 1024, 80
mel = lambda f: 1127.0 * torch.log(1.0 + f / 700.0)
freqs = torch.linspace(0, RATE / 2, NFFT // 2 + 1, dtype=torch.float64)[1:]
edges = torch.linspace(float(mel(torch.tensor(125.0))), float(mel(torch.tensor(7600.0))), BINS + 2,
                       dtype=torch.float64)
m = mel(freqs).unsqueeze(1)
w = torch.clamp(torch.minimum((m - edges[:-2]) / (edges[1:-1] - edges[:-2]),
                              (edges[2:] - m) / (edges[2:] - edges[1:-1])), min=0)
w = torch.cat([torch.zeros(1, BINS, dtype=torch.float64), w])
window = torch.hann_window(WIN, periodic=True, dtype=torch.float64)
total, total_sq, n = torch.zeros(BINS, dtype=torch.float64), torch.zeros(BINS, dtype=torch.float64), 0
for line in open(out + "/train.tsv").readlines()[:500]:
    with wave.open(out + "/" + line.split("\t")[0]) as f:
        x = torch.frombuffer(bytearray(f.readframes(f.getnframes())), dtype=torch.int16).double()
    if x.numel() < WIN + 1:
        continue
    y = x[1:] - 0.97 * x[:-1]
    side = (NFFT - WIN) // 2
    spec = torch.stft(torch.nn.functional.pad(y, (side, side)), n_fft=NFFT, hop_length=STEP,
                      win_length=WIN, window=window, center=False, return_complex=True).abs().T
    feats = torch.log(torch.clamp(spec[:1 + (x.numel() - WIN - 1) // STEP] @ w, min=1.0))
    total += feats.sum(0)
    total_sq += (feats ** 2).sum(0)
    n += feats.shape[0]
mean = total / n
std = torch.sqrt(torch.clamp(total_sq / n - mean ** 2, min=1e-4))
with open(out + "/feature_stats.txt", "w") as f:
    f.write("per_bin_mean " + " ".join("%.5f" % v for v in mean.tolist()) + "\n")
    f.write("per_bin_stddev " + " ".join("%.5f" % v for v in std.tolist()) + "\n")
print("prepare_speech: feature statistics over %d frames" % n)
PY
lm_text
echo "$stamp" > "$out/COMPLETE"
echo "prepare_speech: $total utterances in $(( $(date +%s) - start )) s ($(du -sh "$out" | cut -f1))"
