#!/usr/bin/python3
"""Builds the English-Spanish parallel corpus of scripts/prepare_bible_mt.sh from two SWORD modules
exported with mod2imp: the King James Version (engKJV2006eb, Debian's sword-text-kjv) and the
Reina-Valera 1909 (spaRV1909eb, sword-text-sparv). Verses are aligned by their key
("Genesis 1:1"); markup, footnotes and headings are removed; pairs with an empty side are dropped.
Whole books are held out: DEV_BOOKS and TEST_BOOKS never appear in train.
  /usr/bin/python3 scripts/bible_mt.py KJV.imp RV.imp OUT_DIR
Writes OUT_DIR/{train,dev,test}.{en,es,tsv}, the verse keys in OUT_DIR/{train,dev,test}.keys, and
prints the counts."""
import html
import os
import re
import sys

DEV_BOOKS = {"Ruth", "Jonah", "Habakkuk", "Philippians", "II Peter"}
TEST_BOOKS = {"Esther", "Micah", "Ephesians", "James", "I John"}
KEY = re.compile(r"^\$\$\$(.+) (\d+):(\d+)$")


def verses(path):
    out, key, lines = {}, None, []
    with open(path, encoding="utf-8", errors="strict") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("$$$"):
                if key:
                    out[key] = clean(" ".join(lines))
                m = KEY.match(line)
                key = (m.group(1), int(m.group(2)), int(m.group(3))) if m and m.group(3) != "0" else None
                lines = []
            elif key:
                lines.append(line)
    if key:
        out[key] = clean(" ".join(lines))
    return out


def clean(text):
    text = re.sub(r"<note\b.*?</note>", " ", text, flags=re.S)      # footnotes and cross-refs
    text = re.sub(r"<title\b.*?</title>", " ", text, flags=re.S)    # headings
    text = re.sub(r"<(div|milestone|chapter|lb|l)\b[^>]*>", " ", text)   # block markup: a space
    text = re.sub(r"<[^>]*>", "", text)                              # inline markup (w, q, ...)
    text = html.unescape(text).replace("¶", " ")
    return " ".join(text.split())


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    en, es, out = verses(sys.argv[1]), verses(sys.argv[2]), sys.argv[3]
    if not en or not es:
        sys.exit(f"bible_mt.py: no verses in {sys.argv[1] if not en else sys.argv[2]}")
    books = {k[0] for k in en}
    for b in DEV_BOOKS | TEST_BOOKS:
        if b not in books:
            sys.exit(f"bible_mt.py: book '{b}' is not in {sys.argv[1]}")
    os.makedirs(out, exist_ok=True)
    split = {"train": [], "dev": [], "test": []}
    for key in en:  # the KJV's verse order
        if key in es and en[key] and es[key]:
            name = "dev" if key[0] in DEV_BOOKS else "test" if key[0] in TEST_BOOKS else "train"
            split[name].append((en[key], es[key], f"{key[0]} {key[1]}:{key[2]}"))
    for name, pairs in split.items():
        for lang, i in (("en", 0), ("es", 1)):
            with open(os.path.join(out, f"{name}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(p[i] + "\n" for p in pairs)
        with open(os.path.join(out, f"{name}.tsv"), "w", encoding="utf-8") as f:
            f.writelines(f"{a}\t{b}\n" for a, b, _ in pairs)
        with open(os.path.join(out, f"{name}.keys"), "w", encoding="utf-8") as f:
            f.writelines(k + "\n" for _, _, k in pairs)
    print(" ".join(f"{name}={len(pairs)}" for name, pairs in split.items()))


if __name__ == "__main__":
    main()
