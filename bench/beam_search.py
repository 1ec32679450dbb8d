#!/usr/bin/python3
"""The PyTorch eager peer of bench_beam_search: the same encoder-decoder Transformer
(mt.bible.TransformerEnEsTiny: token embedding x sqrt(d) + sinusoidal positions, pre-layer-norm
layers with per-dim-scaled multi-head attention and ReLU feed-forward blocks, final layer norms,
cross-attention with the source keys and values projected once, softmax tied to the target
embedding), its weights read from the same checkpoint, and the same search (Lingvo's beam search:
the top num_hyps+1 extensions of each hypothesis, </s> ending a hypothesis when within
valid_eos_max_logit_delta of its best extension, the best num_hyps live extensions per source, the
beam_size stopping window, ((5 + |Y|) / 5)^0.6 length normalization; a source done stops and leaves
the batch, as Glossa's terminate_beams_independently and drop_finished_sources), written with
batched tensor ops, cached keys and values, under torch.inference_mode, fp32. Reads the source ids Glossa
translated and reports sentences/s and target tokens/s (median over runs) and how many best
hypotheses equal Glossa's. Run with Debian's python3-torch:
  /usr/bin/python3 bench/beam_search.py --ckpt=runs/bible_tiny/train/ckpt-00001200.safetensors \
      --workdir=/tmp/glossa_bench_beam --batch=1"""
import argparse
import json
import math
import statistics
import struct
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--ckpt", required=True)
ap.add_argument("--workdir", default="/tmp/glossa_bench_beam")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--beam", type=int, default=4)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--target_seq_len", type=int, default=160)
a = ap.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)


def load_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or "/Adam/" in name or info["dtype"] != "F32":
            continue
        b, e = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]),
                                     dtype=torch.float32).view(info["shape"])
    return out


w = load_safetensors(a.ckpt)
root = next(k for k in w if k.endswith("encoder/token_emb/emb_var"))[:-len("encoder/token_emb/emb_var")]
g = lambda name: w[root + name]
d = g("encoder/token_emb/emb_var").shape[1]
eps = 1e-6
SOS, EOS = 1, 2


def ln(prefix):
    return (g(prefix + "/scale") + 1, g(prefix + "/bias"))


class Atten:
    def __init__(self, p):
        qw = g(p + "/atten/query/w")
        self.n, self.h = qw.shape[1], qw.shape[2]
        flat = lambda t: t.reshape(d, -1).t().contiguous()
        self.ln = ln(p + "/ln")
        self.q = (flat(qw), g(p + "/atten/query/b").reshape(-1))
        self.k = (flat(g(p + "/atten/key/w")), g(p + "/atten/key/b").reshape(-1))
        self.v = (flat(g(p + "/atten/value/w")), g(p + "/atten/value/b").reshape(-1))
        self.o = (g(p + "/atten/post/w").reshape(d, -1), g(p + "/atten/post/b"))
        self.qs = F.softplus(g(p + "/atten/per_dim_scale/per_dim_scale")) * (
            1.442695041 / math.sqrt(self.h))

    def split(self, y):  # [B, T, N*H] -> [B, N, T, H]
        return y.view(y.shape[0], y.shape[1], self.n, self.h).transpose(1, 2)

    def project_kv(self, src):
        return self.split(F.linear(src, *self.k)), self.split(F.linear(src, *self.v))

    def attend(self, x, k, v, bias):
        """x [B, T, D] (the residual input); k, v [B, N, S, H]; bias broadcast to [B, N, T, S]."""
        b, t, _ = x.shape
        h = F.layer_norm(x, (d,), *self.ln, eps)
        q = self.split(F.linear(h, *self.q)) * self.qs
        p = torch.softmax(q @ k.transpose(-1, -2) + bias, -1)
        return x + F.linear((p @ v).transpose(1, 2).reshape(b, t, -1), *self.o)


class FF:
    def __init__(self, p):
        self.ln = ln(p + "/ln")
        self.fc0 = (g(p + "/fc0/w").t().contiguous(), g(p + "/fc0/b"))
        self.fc1 = (g(p + "/fc1/w").t().contiguous(), g(p + "/fc1/b"))

    def __call__(self, x):
        h = F.layer_norm(x, (d,), *self.ln, eps)
        return x + F.linear(F.relu(F.linear(h, *self.fc0)), *self.fc1)


def count(prefix):
    return len({k.split(prefix + "/x_layers_")[1].split("/")[0] for k in w if prefix + "/x_layers_" in k})


enc_layers = [(Atten(f"encoder/transformer_stack/x_layers_{i}/self_atten"),
               FF(f"encoder/transformer_stack/x_layers_{i}/fflayer"))
              for i in range(count("encoder/transformer_stack"))]
dec_layers = [(Atten(f"decoder/decoder_trans/x_layers_{i}/self_atten"),
               Atten(f"decoder/decoder_trans/x_layers_{i}/cross_atten"),
               FF(f"decoder/decoder_trans/x_layers_{i}/fflayer"))
              for i in range(count("decoder/decoder_trans"))]
enc_ln, dec_ln = ln("encoder/transformer_stack/final_ln"), ln("decoder/decoder_trans/final_ln")
enc_emb, dec_emb, sm_b = g("encoder/token_emb/emb_var"), g("decoder/token_emb/emb_var"), g("decoder/softmax_bias")
inc = math.log(1e4) / max(d // 2 - 1, 1)
inv = torch.exp(torch.arange(d // 2, dtype=torch.float64) * -inc)


def positions(t):
    pos = torch.arange(t, dtype=torch.float64)[:, None] * inv
    return torch.cat([torch.sin(pos), torch.cos(pos)], 1).float()


NEG = torch.finfo(torch.float32).min
POS = positions(a.target_seq_len)


def encode(ids, paddings):
    x = enc_emb[ids] * math.sqrt(d) + positions(ids.shape[1])
    bias = torch.zeros(paddings.shape).masked_fill(paddings > 0.5, NEG)[:, None, None, :]
    for atten, ff in enc_layers:
        x = ff(atten.attend(x, *atten.project_kv(F.layer_norm(x, (d,), *atten.ln, eps)), bias))
    return F.layer_norm(x, (d,), *enc_ln, eps)


def beam_search(ids, paddings, K, T, alpha=0.6, beam_size=3.0, delta=5.0, thr=-100.0):
    """Each source stops once done (terminate_beams_independently) and leaves the batch: the
    rows of the live sources only are computed, hypothesis j * Bl + q of the Bl live sources."""
    B = ids.shape[0]
    live = torch.arange(B)  # the sources still running, in order
    Bl = B
    enc = encode(ids, paddings).repeat(K, 1, 1)  # hypothesis i reads source live[i % Bl]
    src_bias = torch.zeros(K * B, paddings.shape[1]).masked_fill(paddings.repeat(K, 1) > 0.5, NEG)[:, None, None, :]
    cross = [c.project_kv(enc) for _, c, _ in dec_layers]
    caches = [None] * len(dec_layers)
    cum = torch.zeros(K * B)
    best = torch.full((B,), -1e36)
    done = torch.zeros(B, dtype=torch.bool)
    tok = torch.full((K * B,), SOS, dtype=torch.long)
    # Per step, over all K * B hypotheses (h = j * B + b): the token and the parent.
    hist_tok, hist_par, finished = [], [], [[] for _ in range(B)]
    m = K + 1
    for t in range(T):
        x = (dec_emb[tok] * math.sqrt(d) + POS[t])[:, None, :]
        for li, (sa, ca, ff) in enumerate(dec_layers):
            h = F.layer_norm(x, (d,), *sa.ln, eps)
            k, v = sa.project_kv(h)
            if caches[li] is not None:
                k, v = torch.cat([caches[li][0], k], 2), torch.cat([caches[li][1], v], 2)
            caches[li] = (k, v)
            x = sa.attend(x, k, v, 0.0)
            x = ff(ca.attend(x, *cross[li], src_bias))
        lp = torch.log_softmax(F.linear(F.layer_norm(x[:, 0], (d,), *dec_ln, eps), dec_emb, sm_b), -1)
        vals, idx = (cum[:, None] + lp).topk(m, -1)  # each hypothesis' best extensions
        if t == 0:
            vals[B:] = -math.inf  # step 0: only the first hypothesis of each source is expanded
        full = torch.arange(K)[:, None] * B + live[None, :]  # [K, Bl]: row j * Bl + q's hypothesis
        full = full.reshape(-1)
        is_eos = idx == EOS
        ends = is_eos & (vals > vals[:, :1] - delta) & (lp.gather(1, idx) > thr) & torch.isfinite(vals)
        for i, j in ends.nonzero().tolist():
            b = int(live[i % Bl])
            raw = float(vals[i, j])
            best[b] = max(float(best[b]), raw)
            finished[b].append((raw / ((5.0 + t + 1) / 5.0) ** alpha, t + 1, t, int(full[i])))
        live_vals = vals.masked_fill(is_eos, -math.inf)
        lv = live_vals.view(K, Bl, m).permute(1, 0, 2).reshape(Bl, K * m)
        li_ = idx.view(K, Bl, m).permute(1, 0, 2).reshape(Bl, K * m)
        nv, pos = lv.topk(K, -1)  # [Bl, K]: the best live extensions of each source
        parent = (pos // m) * Bl + torch.arange(Bl)[:, None]
        cum, tok, par = nv.t().reshape(-1), li_.gather(1, pos).t().reshape(-1), parent.t().reshape(-1)
        step_tok = torch.full((K * B,), EOS, dtype=torch.long)
        step_par = torch.arange(K * B)
        step_tok[full] = tok
        step_par[full] = full[par]
        hist_tok.append(step_tok)
        hist_par.append(step_par)
        caches = [(k.index_select(0, par), v.index_select(0, par)) for k, v in caches]
        done[live] |= (cum.view(K, Bl) <= best[live] - beam_size).all(0)
        if bool(done.all()):
            break
        keep = ~done[live]
        if not bool(keep.all()):  # finished sources leave the batch
            q = keep.nonzero().squeeze(1)
            rows = (torch.arange(K)[:, None] * Bl + q[None, :]).reshape(-1)
            caches = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in caches]
            cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cross]
            src_bias, cum, tok = src_bias.index_select(0, rows), cum[rows], tok[rows]
            live, Bl = live[q], len(q)
    out = []
    for b in range(B):
        if not finished[b]:
            out.append([])
            continue
        score, length, t, i = sorted(finished[b], key=lambda f: (-f[0], f[1], f[2], f[3]))[0]
        ids_rev, h = [EOS], i
        for s in range(t - 1, -1, -1):
            ids_rev.append(int(hist_tok[s][h]))
            h = int(hist_par[s][h])
        out.append(ids_rev[::-1])
    return out


src = [json.loads(line) for line in open(f"{a.workdir}/src_ids.jsonl")]
want = [json.loads(line) for line in open(f"{a.workdir}/glossa_hyps.jsonl")]
batches = []
for i in range(0, len(src), a.batch):
    rows = src[i:i + a.batch]
    s = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), s, dtype=torch.long)
    pad = torch.ones(len(rows), s)
    for j, r in enumerate(rows):
        ids[j, :len(r)] = torch.tensor(r)
        pad[j, :len(r)] = 0
    batches.append((ids, pad))
sps, tps = [], []
with torch.inference_mode():
    for run in range(a.runs + 1):  # run 0 warms up
        hyps = []
        t0 = time.perf_counter()
        for ids, pad in batches:
            hyps += beam_search(ids, pad, a.beam, a.target_seq_len)
        dt = time.perf_counter() - t0
        if run > 0:
            sps.append(len(src) / dt)
            tps.append(sum(len(h) for h in hyps) / dt)
same = sum(h == w_ for h, w_ in zip(hyps, want))
print(f"torch_sentences_per_sec {statistics.median(sps):.3f} torch_tokens_per_sec "
      f"{statistics.median(tps):.1f} same_best_hypothesis {same}/{len(src)}")
