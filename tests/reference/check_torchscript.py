#!/usr/bin/python3
"""Checks a bundle's TorchScript network (glossa export --torchscript) with stock PyTorch (Debian's
python3-torch): torch.jit.load runs it on the token ids `glossa predict` reported and must give
the same per-token log-probabilities for a batch of different lengths: bit for bit in float32
where OpenBLAS gives a row the same bits whatever the GEMM's shape (its SkylakeX kernels on a
Xeon), and within float32 rounding (1e-6 of the largest value) with other kernel sets.

  /usr/bin/python3 tests/reference/check_torchscript.py BUNDLE PREDICTIONS.jsonl
PREDICTIONS.jsonl: `glossa predict --bundle=BUNDLE` output (ids and log_probs per line).
Exits 1 with the largest difference when they differ."""
import json
import sys

import torch

bundle, predictions = sys.argv[1], sys.argv[2]
manifest = json.load(open(f"{bundle}/MANIFEST.json"))
assert "torchscript/network.pt" in manifest["files"], "the manifest lists no torchscript/network.pt"
net = torch.jit.load(f"{bundle}/torchscript/network.pt")
rows = [json.loads(line) for line in open(predictions)]
assert len(rows) >= 2, "need at least two predictions"
sos, eos = 1, 2
t = max(len(r["ids"]) for r in rows)
ids = torch.full((len(rows), t), eos, dtype=torch.long)
labels = torch.full((len(rows), t), eos, dtype=torch.long)
paddings = torch.ones(len(rows), t)
for i, r in enumerate(rows):
    n = len(r["ids"])
    labels[i, :n] = torch.tensor(r["ids"])
    ids[i, 0] = sos
    ids[i, 1:n] = torch.tensor(r["ids"][:-1])
    paddings[i, :n] = 0
with torch.inference_mode():
    log_probs = net(ids, paddings)
assert log_probs.shape[:2] == ids.shape, log_probs.shape
assert torch.allclose(log_probs.exp().sum(-1), torch.ones(ids.shape), atol=1e-4), "not log-probs"
got = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
worst, scale = 0.0, 0.0
for i, r in enumerate(rows):
    n = len(r["ids"])
    want = torch.tensor(r["log_probs"], dtype=torch.float32)
    worst = max(worst, (got[i, :n] - want).abs().max().item())
    scale = max(scale, want.abs().max().item())
print(f"torchscript: {len(rows)} sentences, up to {t} tokens: largest difference {worst} "
      f"({'bit for bit' if worst == 0.0 else f'{worst / scale:.2g} of the largest value'})")
sys.exit(0 if worst <= 1e-6 * scale else 1)
