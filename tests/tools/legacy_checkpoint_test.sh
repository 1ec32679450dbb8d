#!/usr/bin/env bash
# A checkpoint written by wave 1 (before TransformerLmTask took emb/position_emb/stack/softmax
# sub-Params) loads into today's model and evaluates to the same Dev log-perplexity that wave 1's
# evaler printed for it (7.613638126590431 on the first 32 Dev examples), so the variable names
# did not change. The checkpoint is a 1-layer, 8-wide lm.austen.TransformerLmTiny after 3 steps.
#   legacy_checkpoint_test.sh <glossa> <dir with train/checkpoint and train/ckpt-00000003.*>
set -u
glossa="$1"
src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src" "$tmp/lm"
# Wave 1's overrides were 'task.model_dim : 8; task.hidden_dim : 16; task.num_layers : 1;
# task.num_heads : 2'; today the same shape is set through the sub-Params.
shape='task.emb.embedding_dim : 8; task.position_emb.embedding_dim : 8; task.softmax.input_dim : 8;'
shape+=' task.stack.num_layers : 1; task.stack.mdl_dim : 8; task.stack.hidden_dim : 16;'
shape+=' task.stack.num_atten_heads : 2; task.eval.samples_per_summary : 32'
# Wave 1's checkpoints carry no checksums: every loader refuses them until the user vouches for
# them with `glossa adopt_checkpoint`, which rewrites them with checksums (issue 47 item 4).
if "$glossa" eval --model=lm.austen.TransformerLmTiny --logdir="$tmp/lm" --dataset=Dev --once \
    --intra_op_threads=1 "--model_params_override=$shape" > "$tmp/refused.log" 2>&1; then
  echo "FAIL: eval loaded a checkpoint without checksums (exit 0)"; cat "$tmp/refused.log"; exit 1
fi
if ! grep -q "carries no checksums.*glossa adopt_checkpoint" "$tmp/refused.log"; then
  echo "FAIL: the refusal does not say how to adopt the checkpoint:"; cat "$tmp/refused.log"; exit 1
fi
if [ ! -f "$tmp/lm/train/ckpt-00000003.safetensors" ]; then
  echo "FAIL: the refused eval moved the checkpoint:"; ls -la "$tmp/lm/train"; exit 1
fi
if ! "$glossa" adopt_checkpoint --checkpoint="$tmp/lm/train/ckpt-00000003" > "$tmp/adopt.log" 2>&1 ||
    ! grep -q "adopted .*ckpt-00000003: [0-9]* tensors rewritten with checksums" "$tmp/adopt.log"; then
  echo "FAIL: adopt_checkpoint:"; cat "$tmp/adopt.log"; exit 1
fi
if ! "$glossa" adopt_checkpoint --checkpoint="$tmp/lm/train/ckpt-00000003.safetensors" 2>&1 |
    grep -q "already carries Glossa's checksums and verifies: nothing to do"; then
  echo "FAIL: a second adopt_checkpoint did not find the checksums"; exit 1
fi
if ! "$glossa" eval --model=lm.austen.TransformerLmTiny --logdir="$tmp/lm" --dataset=Dev --once \
    --intra_op_threads=1 "--model_params_override=$shape" > "$tmp/eval.log" 2>&1; then
  echo "FAIL: eval of the wave-1 checkpoint failed:"; cat "$tmp/eval.log"; exit 1
fi
got=$(sed -n 's/.*"tag":"log_pplx","value":\([0-9.e+-]*\).*/\1/p' "$tmp/lm/eval_dev/metrics.jsonl")
if ! awk -v g="$got" 'BEGIN { d = g - 7.613638126590431; if (d < 0) d = -d; exit !(g != "" && d < 1e-6) }'; then
  echo "FAIL: log_pplx of the wave-1 checkpoint is '$got', wave 1 printed 7.613638126590431"
  cat "$tmp/eval.log"; exit 1
fi
# A checkpoint of another shape fails with an error that names the variable and says how to
# convert it (init_from_checkpoint_rules), and exits non-zero.
wide='task.emb.embedding_dim : 16; task.position_emb.embedding_dim : 16; task.softmax.input_dim : 16;'
wide+=' task.stack.num_layers : 1; task.stack.mdl_dim : 16; task.stack.hidden_dim : 16;'
wide+=' task.stack.num_atten_heads : 2; task.eval.samples_per_summary : 32'
rm -rf "$tmp/lm/eval_dev"
if "$glossa" eval --model=lm.austen.TransformerLmTiny --logdir="$tmp/lm" --dataset=Dev --once \
    --intra_op_threads=1 "--model_params_override=$wide" > "$tmp/bad.log" 2>&1; then
  echo "FAIL: a checkpoint of the wrong shape evaluated (exit 0)"; cat "$tmp/bad.log"; exit 1
fi
if ! grep -q "lm/lm/emb/emb_var" "$tmp/bad.log"; then
  echo "FAIL: the shape error does not name the variable:"; cat "$tmp/bad.log"; exit 1
fi
echo "legacy checkpoint: log_pplx $got (wave 1: 7.613638126590431)"
# Warm start from it through init_from_checkpoint_rules (docs/formats.md, 'Variable names'):
# every variable of layer 0 and the embedding comes from the checkpoint, the rest is initialized.
rules="task.train.init_from_checkpoint_rules : {\"$tmp/lm/train/ckpt-00000003\": [[(\"lm/lm/(emb|stack/x_layers_0/self_atten)/(.*)\", \"lm/lm/%s/%s\")], []]}"
if ! "$glossa" train --model=lm.austen.TransformerLmTiny --logdir="$tmp/warm" --max_steps=1 \
    --intra_op_threads=1 "--model_params_override=$shape; $rules" > "$tmp/warm.log" 2>&1; then
  echo "FAIL: warm start from the wave-1 checkpoint failed:"; cat "$tmp/warm.log"; exit 1
fi
if ! grep -q "initialized 12 variables from init_from_checkpoint_rules" "$tmp/warm.log"; then
  echo "FAIL: expected 12 variables initialized from the rules:"; cat "$tmp/warm.log"; exit 1
fi
echo "warm start: $(grep -o 'initialized [0-9]* variables[^"]*' "$tmp/warm.log")"
