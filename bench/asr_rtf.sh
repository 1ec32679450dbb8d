#!/usr/bin/env bash
# Real-time factor (processing time / audio time; < 1 is faster than real time) of the log-mel
# frontend and of whole transcriptions with beam 4, on Test utterances of the synthetic corpus,
# from an exported asr.synth.* bundle. Trains nothing: give a logdir trained with
# `glossa train --model=asr.synth.LasTiny --logdir=runs/las`.
#   bash bench/asr_rtf.sh [logdir=runs/las] [build_dir=build] [n=50]
set -euo pipefail
cd "$(dirname "$0")/.."
logdir="${1:-runs/las}"
build="${2:-build}"
n="${3:-50}"
[ -x "$build/bin/bench_asr_rtf" ] || { echo "build first: bash scripts/build.sh"; exit 1; }
bash scripts/prepare_speech.sh > /dev/null
bundle=$(mktemp -d)/bundle
trap 'rm -rf "$(dirname "$bundle")"' EXIT
"$build/bin/glossa" export --model=asr.synth.LasTiny --logdir="$logdir" --out="$bundle" > /dev/null
"$build/bin/bench_asr_rtf" --bundle="$bundle" --manifest=data/speech/test.tsv --n="$n"
echo "reproduce: bash bench/asr_rtf.sh $logdir $build $n"
