"""Sentences of the Austen text (data/austen/<split>.txt) normalised as the synthetic speech
corpus's transcripts are: lowercase, letters, apostrophes inside words and single spaces.
Used by scripts/prepare_speech.sh for the spoken sentences and for the speech LM's text."""
import re


def sentences(split, min_words, max_words):
    text = open("data/austen/%s.txt" % split, encoding="utf-8").read().replace("--", " ")
    for s in re.split(r"(?<=[.!?;:])\s+", text):
        words = re.sub(r"[^a-z' ]", " ", s.lower().replace("\u2019", "'")).split()
        words = [w.strip("'") for w in words if w.strip("'")]
        if min_words <= len(words) <= max_words:
            yield " ".join(words)
