#!/usr/bin/env python3
"""Reference for tests/search/beam_search_test.cc: Lingvo's beam search (BeamSearchStepV2 +
TopKTerminatedHyps) written independently in PyTorch, run on random Markov "models" whose
log-probs at step t depend on the source and the previous token: logp[b, t, prev, :].

  /usr/bin/python3 tests/reference/beam_search_reference.py > tests/reference/beam_search_reference.json

Each case stores the model (as log-probs), the search settings and the expected top hypotheses
(ids with the terminal token, scores normalized by ((5 + len) / 5)^alpha). Besides the basic
search it covers force_eos_in_top_k, terminate_beams_independently, the end-of-chunk token with
is_last_chunk (true for every hypothesis from step last_chunk_from on), and merge_paths with
Lingvo's merging buffer: merged_topk_buffer_size_factor * K extensions per source, duplicates
(equal label sequences once the end-of-chunk is removed) merged on insertion, and once the buffer
has filled and kept its best K, anything not better than the K-th refused.
"""
import json
import math
import sys

import torch


class Settings:
    def __init__(self, **kw):
        self.sos, self.eos, self.eoc = 1, 2, -1
        self.alpha, self.delta, self.thr, self.beam_size = 0.0, 5.0, -100.0, 3.0
        self.force_last = self.ensure_full = False
        self.force_eos_top_k = self.force_eoc_top_k = self.independent = False
        self.merge, self.factor, self.allow_empty = False, 2, True
        self.last_chunk_from = -1
        self.eos_bias = self.eoc_bias = 0.0  # added to the logits of </s> and the end-of-chunk
        self.same_model = False
        self.__dict__.update(kw)


# Counts printed to stderr, to show that the cases exercise what they are meant to.
STATS = {"merges": 0, "refused_duplicates": 0, "eoc_ends": 0, "forced": 0, "skipped": 0}


def ext_key(e):
    """Extension order: higher score, then lower token, then lower parent."""
    return (-e["glob"], e["w"], e["parent"])


class MergeBuffer:
    """A source's buffer of extensions (Lingvo's TopK with epsilon dedupe), written from its spec."""

    def __init__(self, k, factor, merge):
        self.k, self.cap, self.merge = k, factor * k, merge
        self.items, self.full = [], False

    def add(self, e):
        if self.full and not ext_key(e) < ext_key(self.items[self.k - 1]):
            if self.merge and any(old["labels"] == e["labels"] for old in self.items):
                STATS["refused_duplicates"] += 1
            return
        for i, old in enumerate(self.items if self.merge else []):
            if old["labels"] == e["labels"]:
                STATS["merges"] += 1
                best = e if ext_key(e) < ext_key(old) else old
                merged = dict(best)
                m = max(e["glob"], old["glob"])
                merged["glob"] = m + math.log(math.exp(e["glob"] - m) + math.exp(old["glob"] - m))
                self.items[i] = merged
                break
        else:
            self.items.append(e)
        if len(self.items) >= self.cap:
            self.shrink()

    def shrink(self):
        self.items = sorted(self.items, key=ext_key)[:self.k]
        self.full = True

    def best(self):
        if len(self.items) > self.k:
            self.shrink()
        return sorted(self.items, key=ext_key)


def parent_entries(s, K, lp_row, cum, parent, last, last_chunk):
    """The extensions a parent proposes, best first, after the forced ones are put in."""
    V = lp_row.shape[0]
    m = K + 1 + (1 if s.eoc >= 0 else 0)
    cands = [{"glob": cum + float(lp_row[w]), "local": float(lp_row[w]), "w": w, "parent": parent}
             for w in range(V)]
    if last:  # </s> first, then the best others
        others = sorted([c for c in cands if c["w"] != s.eos], key=ext_key)[:m - 1]
        top = sorted(others + [cands[s.eos]], key=ext_key)
    else:
        top = sorted(cands, key=ext_key)[:m]
    if s.force_eos_top_k and all(e["w"] != s.eos for e in top):
        STATS["forced"] += 1
        top[-1] = cands[s.eos]
    if s.force_eoc_top_k and s.eoc >= 0 and last_chunk and all(e["w"] != s.eoc for e in top):
        STATS["forced"] += 1
        top[-2] = cands[s.eoc]
    return top


def search(logp, K, T, s):
    B, _, V, _ = logp.shape
    N = K * B
    cum = [0.0] * N
    best = [-1e36] * B
    done = [False] * B
    nfin = [0] * B
    prev_tok = torch.full((N,), s.sos, dtype=torch.long)
    history = [[] for _ in range(N)]  # token path of each live hypothesis
    finished = [[] for _ in range(B)]
    for t in range(T):
        src = torch.arange(N) % B
        lp = logp[src, t, prev_tok].to(torch.float32).to(torch.float64)  # [N, V]
        last = s.force_last and t == T - 1
        last_chunk = s.last_chunk_from >= 0 and t >= s.last_chunk_from
        skip = [s.independent and done[b] for b in range(B)]
        STATS["skipped"] += sum(skip)
        buffers = [MergeBuffer(K, s.factor, s.merge) for _ in range(B)]
        for i in range(N):
            b = i % B
            if (t == 0 and i >= B) or skip[b] or cum[i] == -math.inf:
                continue
            labels = [w for w in history[i] if w != s.eoc]
            top = parent_entries(s, K, lp[i], cum[i], i, last, last_chunk)
            threshold = top[0]["glob"] - s.delta
            terminal = None
            for e in top:
                e["labels"] = labels + ([e["w"]] if e["w"] != s.eoc else [])
                ok = e["glob"] > threshold and e["local"] > s.thr
                if e["w"] == s.eos:
                    if last or ok:
                        terminal = e
                elif s.eoc >= 0 and last_chunk and e["w"] == s.eoc:
                    if ok and (s.allow_empty or labels):
                        STATS["eoc_ends"] += 1
                        terminal = e  # the later (lower) of </s> and the end-of-chunk wins
                else:
                    buffers[b].add(e)
            if terminal is not None:
                best[b] = max(best[b], terminal["glob"])
                # Under merge_paths the search stores the average per step: the same sum.
                finished[b].append({"ids": history[i] + [terminal["w"]], "raw": terminal["glob"],
                                    "step": t, "index": i})
                nfin[b] += 1
        new_cum, new_tok, new_hist = list(cum), prev_tok.clone(), list(history)
        for b in range(B):
            if skip[b]:
                continue
            live = buffers[b].best()
            for j in range(K):
                h = j * B + b
                if j < len(live):
                    e = live[j]
                    new_cum[h], new_tok[h] = e["glob"], e["w"]
                    new_hist[h] = history[e["parent"]] + [e["w"]]
                else:
                    new_cum[h], new_tok[h], new_hist[h] = -math.inf, s.eos, history[b] + [s.eos]
        for b in range(B):
            if not done[b] and not (s.ensure_full and nfin[b] < K):
                done[b] = all(new_cum[j * B + b] <= best[b] - s.beam_size for j in range(K))
        cum, prev_tok, history = new_cum, new_tok, new_hist
        if all(done):
            break
    out = []
    for b in range(B):
        for f in finished[b]:
            n = len(f["ids"])
            f["score"] = f["raw"] / (math.pow(n + 5.0, s.alpha) / math.pow(5.0, s.alpha))
        fs = sorted(finished[b], key=lambda f: (-f["score"], len(f["ids"]), f["step"], f["index"]))
        out.append([{"ids": f["ids"], "score": f["score"]} for f in fs[:K]])
    return out


def main():
    torch.manual_seed(20261201)
    cases = []
    settings = [
        # K, T, V, B, alpha, delta, thr, beam_size, force_last, ensure_full, temperature
        (1, 6, 7, 3, 0.0, 5.0, -100.0, 3.0, False, False, 1.0, {}),
        (4, 8, 9, 2, 0.6, 5.0, -100.0, 3.0, False, False, 1.0, {}),
        (3, 7, 6, 3, 1.0, 1.0, -3.0, 10.0, False, False, 0.5, {}),
        (4, 5, 11, 2, 0.6, 5.0, -100.0, 3.0, True, False, 2.0, {}),
        (2, 9, 8, 2, 0.2, 2.0, -4.0, 100.0, False, True, 1.0, {}),
        (5, 6, 10, 1, 0.8, 0.5, -2.0, 1.0, True, True, 3.0, {}),
        (8, 7, 12, 2, 0.6, 5.0, -100.0, 3.0, False, False, 1.5, {}),
        # Lingvo's newer options; the biases (added to the logits) make </s> rare and the
        # end-of-chunk (0) frequent, so that paths merge and hypotheses end with it.
        (3, 8, 9, 2, 0.6, 5.0, -100.0, 3.0, False, False, 1.0,
         {"force_eos_top_k": True, "eos_bias": -2.0}),
        (2, 9, 8, 3, 0.0, 2.0, -100.0, 0.5, False, False, 1.0, {"independent": True}),
        (3, 9, 8, 3, 0.3, 2.0, -100.0, 0.5, False, True, 1.0, {"independent": True}),
        (3, 7, 6, 2, 0.0, 5.0, -100.0, 3.0, False, False, 1.0,
         {"eoc": 0, "last_chunk_from": 4, "eos_bias": -3.0, "eoc_bias": 1.0}),
        (3, 7, 6, 2, 0.6, 3.0, -100.0, 3.0, False, False, 1.0,
         {"eoc": 0, "last_chunk_from": 3, "force_eoc_top_k": True, "allow_empty": False,
          "eos_bias": -3.0, "eoc_bias": -2.0}),
        (3, 7, 5, 2, 0.0, 5.0, -100.0, 5.0, False, False, 1.0,
         {"eoc": 0, "merge": True, "last_chunk_from": 5, "eos_bias": -4.0, "eoc_bias": 1.5}),
        (3, 7, 5, 2, 0.0, 5.0, -100.0, 5.0, False, False, 1.0,
         {"eoc": 0, "merge": True, "last_chunk_from": 5, "factor": 5, "same_model": True}),
        (4, 8, 6, 2, 0.4, 5.0, -100.0, 5.0, True, False, 0.7,
         {"eoc": 0, "merge": True, "last_chunk_from": 6, "eos_bias": -4.0, "eoc_bias": 1.0}),
    ]
    for n, (K, T, V, B, alpha, delta, thr, beam_size, force_last, ensure_full, temp,
            extra) in enumerate(settings):
        if not extra.get("same_model"):  # else the previous case's model, searched otherwise
            logits = torch.randn(B, T, V, V, dtype=torch.float64) * temp
            logits[..., 2] += extra.get("eos_bias", 0.0)
            if extra.get("eoc", -1) >= 0:
                logits[..., extra["eoc"]] += extra.get("eoc_bias", 0.0)
            logp = torch.log_softmax(logits, -1).to(torch.float32).to(torch.float64)
        s = Settings(alpha=alpha, delta=delta, thr=thr, beam_size=beam_size,
                     force_last=force_last, ensure_full=ensure_full, **extra)
        for key in STATS:
            STATS[key] = 0
        res = search(logp, K, T, s)
        print(f"case{n}: {STATS}", file=sys.stderr)
        case = {
            "name": f"case{n}",
            "num_hyps_per_beam": K, "target_seq_len": T, "vocab": V, "num_beams": B,
            "length_normalization": alpha, "valid_eos_max_logit_delta": delta,
            "local_eos_threshold": thr, "beam_size": beam_size,
            "force_eos_in_last_step": force_last, "ensure_full_beam": ensure_full,
        }
        if extra:
            case.update({
                "force_eos_in_top_k": s.force_eos_top_k,
                "force_last_chunk_eoc_in_top_k": s.force_eoc_top_k,
                "terminate_beams_independently": s.independent,
                "target_eoc_id": s.eoc, "merge_paths": s.merge,
                "merged_topk_buffer_size_factor": s.factor,
                "allow_empty_terminated_hyp": s.allow_empty,
                "last_chunk_from": s.last_chunk_from,
            })
        case["log_probs"] = logp.flatten().tolist()
        case["expected"] = res
        cases.append(case)
    print(json.dumps({"generator": "tests/reference/beam_search_reference.py", "cases": cases}))


if __name__ == "__main__":
    main()
