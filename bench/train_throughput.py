#!/usr/bin/python3
"""The PyTorch peer of bench_train_throughput: the same decoder-only Transformer LM (token embedding
scaled by sqrt(d) + sinusoidal positions, pre-layer-norm layers of causal multi-head attention with
biased q/k/v/o projections and a ReLU feed-forward block, final layer norm, full softmax), the same
initialization scale, Adam(0.9, 0.98, 1e-9), random tokens, tokens/s median over runs. With
--task=mt, the encoder-decoder of mt::TransformerModel::CommonParams: encoder and decoder layers
of that shape (the decoder's with cross-attention to the encoder), final layer norms, a softmax
tied to the target embedding, dropout 0.1 on the embedded inputs and the residual branches, label
smoothing 0.1; tokens/s counts target tokens.
With WORLD_SIZE > 1 in the environment (torchrun, or bench/distributed.sh), the model is wrapped in
DistributedDataParallel over Gloo (bucket_cap_mb 25, as Glossa's default buckets), each rank training
on batch / world of the global batch; rank 0 prints the global tokens/s.
Run with Debian's python3-torch: /usr/bin/python3 bench/train_throughput.py --model_dim=512 ..."""
import argparse, math, os, resource, statistics, time
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
for k, v in dict(model_dim=128, num_layers=2, num_heads=4, hidden_dim=0, vocab=2000, seq=128, batch=16,
                 steps=10, runs=3, threads=0, max_warmup=8).items():
    ap.add_argument("--" + k, type=int, default=v)
ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
ap.add_argument("--task", default="lm", choices=["lm", "mt"])
a = ap.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
d, L, H = a.model_dim, a.num_layers, a.num_heads
hid = a.hidden_dim or 4 * d
torch.manual_seed(1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc0, self.fc1 = nn.Linear(d, hid), nn.Linear(hid, d)

    def forward(self, x, mask):
        b, t, _ = x.shape
        h = self.ln1(x)
        split = lambda y: y.view(b, t, H, d // H).transpose(1, 2)
        q, k, v = split(self.q(h)) / math.sqrt(d // H), split(self.k(h)), split(self.v(h))
        p = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(mask, float("-inf")), -1)
        x = x + self.o((p @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc1(F.relu(self.fc0(self.ln2(x))))


class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, d)
        nn.init.normal_(self.emb.weight, std=1 / math.sqrt(d))
        self.layers = nn.ModuleList(Layer() for _ in range(L))
        self.ln = nn.LayerNorm(d)
        self.softmax = nn.Linear(d, a.vocab)
        pos = torch.arange(a.seq, dtype=torch.float32)[:, None]
        inc = math.log(1e4) / max(d // 2 - 1, 1)
        ts = torch.exp(torch.arange(d // 2, dtype=torch.float32) * -inc)
        self.register_buffer("pos", torch.cat([torch.sin(pos * ts), torch.cos(pos * ts)], 1))
        # A plain attribute, not a buffer: DDP broadcasts buffers, and Gloo has no bool type.
        self.mask = torch.triu(torch.ones(a.seq, a.seq, dtype=torch.bool), 1)

    def forward(self, ids, labels):
        x = self.emb(ids) * math.sqrt(d) + self.pos
        for layer in self.layers:
            x = layer(x, self.mask)
        logits = self.softmax(self.ln(x)).float()
        return F.cross_entropy(logits.view(-1, a.vocab), labels.view(-1))


class Atten(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, src=None, mask=None):
        b, t, _ = x.shape
        h = self.ln(x)
        kv = h if src is None else src
        split = lambda y: y.view(b, y.shape[1], H, d // H).transpose(1, 2)
        q, k, v = split(self.q(h)) / math.sqrt(d // H), split(self.k(kv)), split(self.v(kv))
        s = q @ k.transpose(-1, -2)
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        o = self.o((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t, d))
        return x + F.dropout(o, 0.1, self.training)


class Ff(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc0, self.fc1 = nn.LayerNorm(d), nn.Linear(d, hid), nn.Linear(hid, d)

    def forward(self, x):
        return x + F.dropout(self.fc1(F.relu(self.fc0(self.ln(x)))), 0.1, self.training)


class Mt(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(a.vocab, d), nn.Embedding(a.vocab, d)
        for e in (self.src_emb, self.tgt_emb):
            nn.init.normal_(e.weight, std=1 / math.sqrt(d))
        self.enc = nn.ModuleList(nn.ModuleList([Atten(), Ff()]) for _ in range(L))
        self.dec = nn.ModuleList(nn.ModuleList([Atten(), Atten(), Ff()]) for _ in range(L))
        self.enc_ln, self.dec_ln = nn.LayerNorm(d), nn.LayerNorm(d)
        self.bias = nn.Parameter(torch.zeros(a.vocab))
        pos = torch.arange(a.seq, dtype=torch.float32)[:, None]
        inc = math.log(1e4) / max(d // 2 - 1, 1)
        ts = torch.exp(torch.arange(d // 2, dtype=torch.float32) * -inc)
        self.register_buffer("pos", torch.cat([torch.sin(pos * ts), torch.cos(pos * ts)], 1))
        # A plain attribute, not a buffer: DDP broadcasts buffers, and Gloo has no bool type.
        self.mask = torch.triu(torch.ones(a.seq, a.seq, dtype=torch.bool), 1)

    def forward(self, src, ids, labels):
        x = F.dropout(self.src_emb(src) * math.sqrt(d) + self.pos, 0.1, self.training)
        for atten, ff in self.enc:
            x = ff(atten(x))
        enc = self.enc_ln(x)
        y = F.dropout(self.tgt_emb(ids) * math.sqrt(d) + self.pos, 0.1, self.training)
        for self_atten, cross, ff in self.dec:
            y = ff(cross(self_atten(y, mask=self.mask), src=enc))
        logits = F.linear(self.dec_ln(y), self.tgt_emb.weight, self.bias).float()
        return F.cross_entropy(logits.view(-1, a.vocab), labels.view(-1), label_smoothing=0.1)


model = Lm() if a.task == "lm" else Mt()
g = torch.Generator().manual_seed(7)
ids = torch.randint(3, a.vocab, (a.batch, a.seq), generator=g)
labels = ids.roll(-1, 1)
src = torch.randint(3, a.vocab, (a.batch, a.seq), generator=g)
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = 0
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    share = a.batch // world
    ids, labels, src = (t[rank * share:(rank + 1) * share].contiguous() for t in (ids, labels, src))
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
        loss = model(ids, labels) if a.task == "lm" else model(src, ids, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# Warm-up, with the rule of Glossa's bench (train_throughput.cc): steps until one takes under 256
# minor page faults (1 MiB of new pages), at most --max_warmup; one step for several ranks.
warmup_steps = 0
while True:
    before = minor_faults()
    step()
    warmup_steps += 1
    if world > 1 or minor_faults() - before < 256 or warmup_steps >= a.max_warmup:
        break
rates = []
for _ in range(a.runs):
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    rates.append(a.steps * a.batch * a.seq / (time.perf_counter() - t0))
if rank == 0:
    print(f"torch_tokens_per_sec {statistics.median(rates):.1f} threads {torch.get_num_threads()} "
          f"warmup_steps {warmup_steps}")
