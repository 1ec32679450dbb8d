#!/usr/bin/env python3
"""Reference for tests/search/beam_search_test.cc: Lingvo's beam search (BeamSearchStepV2 +
TopKTerminatedHyps) written independently in PyTorch, run on random Markov "models" whose
log-probs at step t depend on the source and the previous token: logp[b, t, prev, :].

  /usr/bin/python3 tests/reference/beam_search_reference.py > tests/reference/beam_search_reference.json

Each case stores the model (as log-probs), the search settings and the expected top hypotheses
(ids with </s>, scores normalized by ((5 + len) / 5)^alpha).
"""
import json
import math

import torch


def search(logp, K, T, sos, eos, alpha, delta, thr, beam_size, force_last, ensure_full):
    B, _, V, _ = logp.shape
    N = K * B
    cum = torch.zeros(N, dtype=torch.float64)
    best = torch.full((B,), -1e36, dtype=torch.float64)
    done = [False] * B
    nfin = [0] * B
    prev_tok = torch.full((N,), sos, dtype=torch.long)
    history = [[] for _ in range(N)]  # token path of each live hypothesis
    finished = [[] for _ in range(B)]
    for t in range(T):
        # log-probs of every hypothesis: its source's table at step t, row of its previous token
        src = torch.arange(N) % B
        lp = logp[src, t, prev_tok].to(torch.float32).to(torch.float64)  # [N, V]
        last = force_last and t == T - 1
        m = K + 1
        live = [[] for _ in range(B)]
        for i in range(N):
            if t == 0 and i >= B:
                continue
            g = cum[i] + lp[i]
            if last:
                others = torch.cat([g[:eos], torch.tensor([-math.inf], dtype=g.dtype), g[eos + 1:]])
                vals, idx = torch.topk(others, m - 1)
                cands = [(float(v), int(w)) for v, w in zip(vals, idx)] + [(float(g[eos]), eos)]
                cands.sort(key=lambda c: (-c[0], c[1]))
            else:
                vals, idx = torch.topk(g, m)
                cands = [(float(v), int(w)) for v, w in zip(vals, idx)]
            top = cands[0][0]
            for glob, w in cands:
                if w == eos:
                    if last or (glob > top - delta and float(lp[i, w]) > thr):
                        b = i % B
                        best[b] = max(float(best[b]), glob)
                        finished[b].append({"ids": history[i] + [eos], "raw": glob, "step": t,
                                            "index": i})
                        nfin[b] += 1
                else:
                    live[i % B].append((glob, w, i))
        new_cum = torch.full((N,), -math.inf, dtype=torch.float64)
        new_tok = torch.full((N,), eos, dtype=torch.long)
        new_hist = [None] * N
        for b in range(B):
            live[b].sort(key=lambda c: (-c[0], c[1], c[2]))
            for j in range(K):
                h = j * B + b
                if j < len(live[b]):
                    glob, w, parent = live[b][j]
                    new_cum[h] = glob
                    new_tok[h] = w
                    new_hist[h] = history[parent] + [w]
                else:
                    new_hist[h] = history[b] + [eos]
        all_done = True
        for b in range(B):
            if not done[b] and not (ensure_full and nfin[b] < K):
                done[b] = all(float(new_cum[j * B + b]) <= float(best[b]) - beam_size
                              for j in range(K))
            all_done = all_done and done[b]
        cum, prev_tok, history = new_cum, new_tok, new_hist
        if all_done:
            break
    out = []
    for b in range(B):
        for f in finished[b]:
            n = len(f["ids"])
            f["score"] = f["raw"] / (math.pow(n + 5.0, alpha) / math.pow(5.0, alpha))
        fs = sorted(finished[b], key=lambda f: (-f["score"], len(f["ids"]), f["step"], f["index"]))
        out.append([{"ids": f["ids"], "score": f["score"]} for f in fs[:K]])
    return out


def main():
    torch.manual_seed(20261201)
    cases = []
    settings = [
        # K, T, V, B, alpha, delta, thr, beam_size, force_last, ensure_full, temperature
        (1, 6, 7, 3, 0.0, 5.0, -100.0, 3.0, False, False, 1.0),
        (4, 8, 9, 2, 0.6, 5.0, -100.0, 3.0, False, False, 1.0),
        (3, 7, 6, 3, 1.0, 1.0, -3.0, 10.0, False, False, 0.5),
        (4, 5, 11, 2, 0.6, 5.0, -100.0, 3.0, True, False, 2.0),
        (2, 9, 8, 2, 0.2, 2.0, -4.0, 100.0, False, True, 1.0),
        (5, 6, 10, 1, 0.8, 0.5, -2.0, 1.0, True, True, 3.0),
        (8, 7, 12, 2, 0.6, 5.0, -100.0, 3.0, False, False, 1.5),
    ]
    for n, (K, T, V, B, alpha, delta, thr, beam_size, force_last, ensure_full, temp) in enumerate(
            settings):
        logits = torch.randn(B, T, V, V, dtype=torch.float64) * temp
        logp = torch.log_softmax(logits, -1).to(torch.float32).to(torch.float64)
        res = search(logp, K, T, 1, 2, alpha, delta, thr, beam_size, force_last, ensure_full)
        cases.append({
            "name": f"case{n}",
            "num_hyps_per_beam": K, "target_seq_len": T, "vocab": V, "num_beams": B,
            "length_normalization": alpha, "valid_eos_max_logit_delta": delta,
            "local_eos_threshold": thr, "beam_size": beam_size,
            "force_eos_in_last_step": force_last, "ensure_full_beam": ensure_full,
            "log_probs": logp.flatten().tolist(),
            "expected": res,
        })
    print(json.dumps({"generator": "tests/reference/beam_search_reference.py", "cases": cases}))


if __name__ == "__main__":
    main()
