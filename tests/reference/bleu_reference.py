#!/usr/bin/env python3
"""Reference cases for corpus BLEU with Lingvo's rules (lingvo/core/scorers.py BleuScorer),
written independently of the C++ code (glossa/metrics/bleu.cc) from the algorithm's definition:

  tokens        text.split() (Python's Unicode whitespace), after optional unsegmenting
                ("bpe": drop "@@ "; "wpm"/"spm": drop spaces, "\u2581" -> space; then strip())
  matches[n]    sum over sentences of |hyp n-grams ∩ ref n-grams| as multisets (clipped counts)
  counts[n]     sum over sentences of the number of hyp n-grams
  precision     exp(mean of log(matches[n] / counts[n]) over the orders with matches[n] > 0),
                0 when no order has a match (no smoothing)
  brevity       exp(1 - ref_tokens / hyp_tokens) when hyp_tokens < ref_tokens, else 1
  BLEU          brevity * precision

Corpora are drawn from a seeded generator over a small vocabulary (so n-grams repeat and clip),
with Unicode whitespace (tabs, U+00A0, U+3000, U+2009) between tokens, empty and very short
hypotheses, and subword-segmented variants. Writes tests/reference/bleu_reference.json.
Regenerate from the repository root:  /usr/bin/python3 tests/reference/bleu_reference.py
"""
import collections
import json
import math
import os
import random

SPACES = [" ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\u2009"]
VOCAB = ["el", "la", "de", "que", "y", "a", "en", "dios", "señor", "casa", "tierra", "dijo",
         "naïve", "日本", "über"]


def unsegment(text, kind):
    if kind == "bpe":
        return text.replace("@@ ", "").strip()
    if kind in ("wpm", "spm"):
        return text.replace(" ", "").replace("\u2581", " ").strip()
    return text


def bleu(refs, hyps, max_ngram, kind):
    matches = [0] * max_ngram
    counts = [0] * max_ngram
    ref_len = hyp_len = 0
    for ref, hyp in zip(refs, hyps):
        r = unsegment(ref, kind).split()
        h = unsegment(hyp, kind).split()
        ref_len += len(r)
        hyp_len += len(h)
        for n in range(1, max_ngram + 1):
            rg = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            hg = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            matches[n - 1] += sum((rg & hg).values())
            counts[n - 1] += sum(hg.values())
    logs = [math.log(m / c) for m, c in zip(matches, counts) if m > 0 and c > 0]
    if not logs:
        score = 0.0
    else:
        score = math.exp(sum(logs) / len(logs))
        if hyp_len < ref_len:
            score *= math.exp(1 - ref_len / hyp_len)
    return score, matches, counts, ref_len, hyp_len


def join(rng, words):
    return (rng.choice(["", " ", "\t"]) + "".join(
        (rng.choice(SPACES) if i else "") + w for i, w in enumerate(words)) +
            rng.choice(["", " ", "\u3000"]))


def segment(rng, words, kind):
    """Splits words into subword pieces the way each kind marks them."""
    if kind == "bpe":
        pieces = []
        for w in words:
            if len(w) > 2 and rng.random() < 0.5:
                k = rng.randint(1, len(w) - 1)
                pieces += [w[:k] + "@@", w[k:]]
            else:
                pieces.append(w)
        return " ".join(pieces)
    pieces = []
    for w in words:
        if len(w) > 2 and rng.random() < 0.5:
            k = rng.randint(1, len(w) - 1)
            pieces += ["\u2581" + w[:k], w[k:]]
        else:
            pieces.append("\u2581" + w)
    return " ".join(pieces)


def main():
    rng = random.Random(20261201)
    cases = []
    for c in range(40):
        kind = ["", "", "bpe", "spm", "wpm"][c % 5]
        max_ngram = [4, 4, 4, 1, 2, 3][c % 6]
        refs, hyps = [], []
        for _ in range(rng.randint(1, 12)):
            ref = [rng.choice(VOCAB) for _ in range(rng.randint(0, 14))]
            mode = rng.random()
            if mode < 0.3:    # a noisy copy
                hyp = [w if rng.random() < 0.7 else rng.choice(VOCAB) for w in ref]
            elif mode < 0.5:  # short
                hyp = ref[:rng.randint(0, 3)]
            elif mode < 0.6:  # repeats a word (clipping)
                hyp = [rng.choice(ref or VOCAB)] * rng.randint(1, 8)
            else:
                hyp = [rng.choice(VOCAB) for _ in range(rng.randint(0, 16))]
            if kind:
                refs.append(segment(rng, ref, kind))
                hyps.append(segment(rng, hyp, kind))
            else:
                refs.append(join(rng, ref))
                hyps.append(join(rng, hyp))
        score, matches, counts, ref_len, hyp_len = bleu(refs, hyps, max_ngram, kind)
        cases.append({"refs": refs, "hyps": hyps, "max_ngram": max_ngram, "separator_type": kind,
                      "bleu": score, "matches": matches, "counts": counts,
                      "ref_tokens": ref_len, "hyp_tokens": hyp_len})
    # Hand-worked checks of this reference itself.
    assert bleu(["a b c d"], ["a b c d"], 4, "")[0] == 1.0
    s = bleu(["hyp matches ref str", "almost right"], ["hyp matches ref str", "almost write"], 4, "")
    assert abs(s[0] - math.exp((math.log(5 / 6) + math.log(3 / 4)) / 4)) < 1e-15, s
    assert bleu(["a b"], ["c d"], 4, "")[0] == 0.0
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bleu_reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/reference/bleu_reference.py", "cases": cases}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
