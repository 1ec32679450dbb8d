#!/usr/bin/env bash
# Real-time factor (processing time / audio time; < 1 is faster than real time) of the log-mel
# frontend and of whole transcriptions (the model's own decoding: LasTiny beam 4, LasTinyLm beam 16
# with the fused LM), on Test utterances of the synthetic corpus, from an exported asr.synth.*
# bundle. Trains nothing: give a logdir trained with
# `glossa train --model=asr.synth.LasTiny --logdir=runs/las` (or the model given).
#   bash bench/asr_rtf.sh [logdir=runs/las] [build_dir=build] [n=50] [model=asr.synth.LasTiny]
set -euo pipefail
cd "$(dirname "$0")/.."
logdir="${1:-runs/las}"
build="${2:-build}"
n="${3:-50}"
model="${4:-asr.synth.LasTiny}"
[ -x "$build/bin/bench_asr_rtf" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
bash scripts/prepare_speech.sh > /dev/null
bundle=$(mktemp -d)/bundle
trap 'rm -rf "$(dirname "$bundle")"' EXIT
"$build/bin/glossa" export --model="$model" --logdir="$logdir" --out="$bundle" > /dev/null
"$build/bin/bench_asr_rtf" --bundle="$bundle" --manifest=data/speech/test.tsv --n="$n"
echo "reproduce: bash bench/asr_rtf.sh $logdir $build $n $model"
