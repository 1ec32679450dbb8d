#!/usr/bin/env bash
# The README's main job: trains lm.austen.TransformerLmTiny on the embedded Jane Austen data
# (data/austen/), then prints its Dev log-perplexity beside a unigram baseline on the same split,
# and a few sampled continuations of Dev prompts. Resumes when the log directory has checkpoints.
#   bash scripts/train_austen.sh [logdir] [extra glossa flags...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
logdir="${1:-$root/runs/austen_tiny}"
shift || true
glossa="$root/build/bin/glossa"
[ -x "$glossa" ] || { echo "train_austen: $glossa is missing; run scripts/build.sh first" >&2; exit 1; }
common=(--model=lm.austen.TransformerLmTiny --logdir="$logdir" --random_seed=1234 "$@")
echo "training lm.austen.TransformerLmTiny in $logdir (TensorBoard: tensorboard --logdir $logdir)"
"$glossa" train "${common[@]}" 2> >(grep -v '^I[0-9]\{8\} \|^WARNING: Logging' >&2)
"$glossa" report "${common[@]}" --dataset=Dev 2> >(grep -v '^I[0-9]\{8\} \|^WARNING: Logging' >&2)
