#!/usr/bin/env bash
# Produces data/austen/{train,dev,test}.txt from Debian's r-cran-janeaustenr (public-domain texts of
# Jane Austen's six novels). One paragraph per line, long paragraphs cut at sentence ends to at
# most ~400 characters. Split by chapter (counted across all novels): chapter % 20 == 18 -> dev,
# 19 -> test, the rest -> train. Deterministic; the outputs are committed.
#   bash scripts/prepare_austen.sh [outdir]
set -euo pipefail
out="${1:-$(cd "$(dirname "$0")/.." && pwd)/data/austen}"
command -v Rscript >/dev/null || { echo "prepare_austen: needs Rscript and r-cran-janeaustenr (apt-get install r-cran-janeaustenr)" >&2; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
Rscript -e 'library(janeaustenr); for (b in c("sensesensibility","prideprejudice","mansfieldpark","emma","northangerabbey","persuasion")) writeLines(get(b), file.path(commandArgs(TRUE)[1], paste0(b, ".txt")))' "$tmp"
mkdir -p "$out"
/usr/bin/python3 - "$tmp" "$out" <<'PY'
import os, re, sys
src, out = sys.argv[1], sys.argv[2]
books = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]
splits = {"train": [], "dev": [], "test": []}
chapter = -1
def pieces(par):
    if len(par) <= 400:
        return [par]
    sents = re.split(r"(?<=[.!?;])\s+", par)
    outp, cur = [], ""
    for s in sents:
        if cur and len(cur) + 1 + len(s) > 400:
            outp.append(cur); cur = s
        else:
            cur = (cur + " " + s).strip()
    if cur: outp.append(cur)
    return outp
for b in books:
    text = open(os.path.join(src, b + ".txt"), encoding="utf-8").read()
    for par in re.split(r"\n\s*\n", text):
        par = " ".join(par.split())
        if not par:
            continue
        if re.match(r"^CHAPTER [0-9IVXLC]+\.?$", par, re.I) or re.match(r"^Chapter \d+$", par):
            chapter += 1
            continue
        if chapter < 0 or re.match(r"^(VOLUME|THE END|END OF)", par, re.I):
            continue
        k = chapter % 20
        split = "dev" if k == 18 else "test" if k == 19 else "train"
        splits[split].extend(pieces(par))
for name, lines in splits.items():
    with open(os.path.join(out, name + ".txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{name}: {len(lines)} lines, {sum(len(l) for l in lines)} chars")
PY
