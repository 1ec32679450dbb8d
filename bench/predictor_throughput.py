#!/usr/bin/python3
"""The PyTorch eager peer of bench_predictor: the same Transformer LM network (token embedding x
sqrt(d) + sinusoidal positions, pre-layer-norm layers of causal multi-head attention with a
learned per-dim query scale and a ReLU feed-forward block, final layer norm, full softmax), its
weights read from the bundle's weights.safetensors, scoring the same sentences in batches under
torch.inference_mode. Like Glossa's Predictor it takes strings: it tokenizes them with the
bundle's SentencePiece model (Debian's python3-sentencepiece) and returns per-token and total
log-probs, ids, lengths and pieces. Prints tokens/s (median over runs) for that whole path and for
the network alone on prebuilt tensors. It first checks that its ids and sentence scores equal
Glossa's (so both run the same model on the same tokens). Run with Debian's python3-torch:
  /usr/bin/python3 bench/predictor_throughput.py --workdir=/tmp/glossa_bench_predictor --batch=1"""
import argparse
import json
import math
import statistics
import struct
import sys
import time

import sentencepiece
import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--workdir", default="/tmp/glossa_bench_predictor")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--threads", type=int, default=0)
a = ap.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)


def load_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]), dtype=torch.float32).view(
            info["shape"])
    return out


w = load_safetensors(f"{a.workdir}/bundle/weights.safetensors")
root = next(k for k in w if k.endswith("/emb/emb_var"))[:-len("emb/emb_var")]
g = lambda name: w[root + name]
d = g("emb/emb_var").shape[1]
num_layers = len({k.split("/x_layers_")[1].split("/")[0] for k in w if "/x_layers_" in k})
eps = 1e-6


class Layer:
    def __init__(self, i):
        p = lambda n: g(f"stack/x_layers_{i}/{n}")
        self.ln1 = (p("self_atten/ln/scale") + 1, p("self_atten/ln/bias"))
        qw = p("self_atten/atten/query/w")
        self.n, self.h = qw.shape[1], qw.shape[2]
        flat = lambda t: t.reshape(d, -1).t().contiguous()  # [N*H, D] for F.linear
        self.q = (flat(qw), p("self_atten/atten/query/b").reshape(-1))
        self.k = (flat(p("self_atten/atten/key/w")), p("self_atten/atten/key/b").reshape(-1))
        self.v = (flat(p("self_atten/atten/value/w")), p("self_atten/atten/value/b").reshape(-1))
        self.o = (p("self_atten/atten/post/w").reshape(d, -1), p("self_atten/atten/post/b"))
        self.qs = F.softplus(p("self_atten/atten/per_dim_scale/per_dim_scale")) * (
            1.442695041 / math.sqrt(self.h))
        self.ln2 = (p("fflayer/ln/scale") + 1, p("fflayer/ln/bias"))
        self.fc0 = (p("fflayer/fc0/w").t().contiguous(), p("fflayer/fc0/b"))
        self.fc1 = (p("fflayer/fc1/w").t().contiguous(), p("fflayer/fc1/b"))

    def __call__(self, x, bias):
        b, t, _ = x.shape
        h = F.layer_norm(x, (d,), *self.ln1, eps)
        split = lambda y: y.view(b, t, self.n, self.h).transpose(1, 2)
        q = split(F.linear(h, *self.q)) * self.qs
        k, v = split(F.linear(h, *self.k)), split(F.linear(h, *self.v))
        p = torch.softmax(q @ k.transpose(-1, -2) + bias, -1)
        x = x + F.linear((p @ v).transpose(1, 2).reshape(b, t, -1), *self.o)
        h = F.layer_norm(x, (d,), *self.ln2, eps)
        return x + F.linear(F.relu(F.linear(h, *self.fc0)), *self.fc1)


layers = [Layer(i) for i in range(num_layers)]
final_ln = (g("stack/final_ln/scale") + 1, g("stack/final_ln/bias"))
emb, sm_w, sm_b = g("emb/emb_var"), g("softmax/weight_0").t().contiguous(), g("softmax/bias_0")
inc = math.log(1e4) / max(d // 2 - 1, 1)
inv = torch.exp(torch.arange(d // 2, dtype=torch.float64) * -inc)


def network(ids, paddings):
    """Token ids [B, T] and paddings -> log P(next token) [B, T, V]."""
    b, t = ids.shape
    pos = torch.arange(t, dtype=torch.float64)[:, None] * inv
    x = emb[ids] * math.sqrt(d) + torch.cat([torch.sin(pos), torch.cos(pos)], 1).float()
    mask = (paddings > 0.5)[:, None, None, :] | torch.ones(t, t, dtype=torch.bool).triu(1)
    bias = torch.zeros(mask.shape).masked_fill(mask, torch.finfo(torch.float32).min)
    for layer in layers:
        x = layer(x, bias)
    return torch.log_softmax(F.linear(F.layer_norm(x, (d,), *final_ln, eps), sm_w, sm_b), -1)


def log_probs(ids, labels, paddings):
    return network(ids, paddings).gather(-1, labels[..., None])[..., 0] * (1 - paddings)


def tensors(token_lists):
    t = max(len(r) for r in token_lists) + 1
    ids = torch.full((len(token_lists), t), 2, dtype=torch.long)
    labels = torch.full((len(token_lists), t), 2, dtype=torch.long)
    paddings = torch.ones(len(token_lists), t)
    for j, toks in enumerate(token_lists):
        n = len(toks) + 1
        labels[j, :n - 1] = torch.tensor(toks, dtype=torch.long)
        ids[j, 0] = 1
        ids[j, 1:n] = labels[j, :n - 1]
        paddings[j, :n] = 0
    return ids, labels, paddings


sp = sentencepiece.SentencePieceProcessor(model_file=f"{a.workdir}/bundle/assets/spm_2k.model")


def score_text(texts):
    """Strings in, the fetches of Glossa's "default" subgraph out."""
    toks = sp.encode(texts)
    ids, labels, paddings = tensors(toks)
    lp = log_probs(ids, labels, paddings)
    lengths = (1 - paddings).sum(1).long()
    pieces = [" ".join(sp.id_to_piece(toks[j]) + ["</s>"]) for j in range(len(texts))]
    return {"log_probs": lp, "total_log_prob": lp.sum(1), "ids": labels, "lengths": lengths,
            "pieces": pieces}


rows = [json.loads(line) for line in open(f"{a.workdir}/ids.jsonl")]
texts = [line for line in open(f"{a.workdir}/sentences.txt", encoding="utf-8").read().split("\n")
         if line]
assert len(texts) == len(rows), (len(texts), len(rows))
text_batches = [texts[i:i + a.batch] for i in range(0, len(texts), a.batch)]
tokens = sum(len(r["ids"]) for r in rows)
with torch.inference_mode():
    worst, k = 0.0, 0
    for chunk in text_batches:  # the same tokens and model as Glossa's, and a warm-up
        out = score_text(chunk)
        for j in range(len(chunk)):
            n = int(out["lengths"][j])
            if out["ids"][j, :n].tolist() != rows[k]["ids"]:
                sys.exit(f"sentence {k}: SentencePiece gives other ids than Glossa's tokenizer")
            worst = max(worst, abs(out["total_log_prob"][j].item() - rows[k]["total_log_prob"]))
            k += 1
    if worst > 1e-3 * max(1.0, max(abs(r["total_log_prob"]) for r in rows) / 100):
        sys.exit(f"the PyTorch network scores differently from Glossa's: {worst}")
    prebuilt = [tensors(sp.encode(chunk)) for chunk in text_batches]
    rates, net_rates = [], []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        for chunk in text_batches:
            score_text(chunk)
        rates.append(tokens / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for ids, labels, paddings in prebuilt:
            network(ids, paddings)
        net_rates.append(tokens / (time.perf_counter() - t0))
print(f"torch_tokens_per_sec {statistics.median(rates):.1f} network_only "
      f"{statistics.median(net_rates):.1f} max_abs_diff {worst:.2e}")
