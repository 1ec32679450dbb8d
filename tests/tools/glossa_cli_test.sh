#!/usr/bin/env bash
# The glossa program: good commands succeed; bad input prints one clear line and exits non-zero.
set -u
glossa="$1"
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_ok() {  # expect_ok <pattern> <args...>
  local pattern="$1"; shift
  if ! out=$("$glossa" "$@" 2>&1); then echo "FAIL: glossa $* exited non-zero: $out"; fail=1; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then echo "FAIL: glossa $*: no '$pattern' in: $out"; fail=1; fi
}
expect_error() {  # expect_error <pattern> <args...>
  local pattern="$1"; shift
  if out=$("$glossa" "$@" 2>&1); then echo "FAIL: glossa $* succeeded: $out"; fail=1; return; fi
  if ! grep -qE -- "$pattern" <<<"$out"; then echo "FAIL: glossa $*: no '$pattern' in: $out"; fail=1; fi
  if [ "$(wc -l <<<"$out")" -gt 2 ]; then echo "FAIL: glossa $*: error is not one line: $out"; fail=1; fi
}

expect_ok "Usage|help" --help
# The probe UseBestBlasKernels times each OpenBLAS kernel set with (glossa/runtime/blas_kernels.h):
# one line, a positive time, exit 0, and nothing else run.
if probe=$(GLOSSA_BLAS_PROBE=1 OPENBLAS_CORETYPE=Haswell "$glossa" train --no_such_flag 2>/dev/null); then
  if ! awk '$1 == "blas_probe_seconds" && $2 > 0 { ok = 1 } END { exit !(ok && NR == 1) }' <<<"$probe"; then
    echo "FAIL: the BLAS probe printed: $probe"; fail=1
  fi
else
  echo "FAIL: the BLAS probe exited non-zero: $probe"; fail=1
fi
expect_error "unregistered class no.such.Model" inspect_params no.such.Model
echo "this line has no colon" > "$tmp/bad.txt"
expect_error "A subcommand is required" 

# The rest needs a registered class with Params(); the library registers classes as the layers
# arrive, so use the first one that has Params when there is one.
key=$("$glossa" list | awk '{print $1}' | while read -r k; do
  if "$glossa" inspect_params "$k" >/dev/null 2>&1; then echo "$k"; break; fi; done)
if [ -n "$key" ]; then
  expect_ok " : " inspect_params "$key"
  expect_error "cannot open params file '$tmp/missing.txt'" \
    inspect_params "$key" --params_file="$tmp/missing.txt"
  expect_error "params text line 1: 'this line has no colon' is not in <key> : <value> format" \
    inspect_params "$key" --params_file="$tmp/bad.txt"
  expect_error "--params_override: params text line 1: no_such_param_xyz" \
    inspect_params "$key" --params_override="no_such_param_xyz : 1"
else
  expect_ok "no classes registered|\\(" list
fi

# bleu: corpus BLEU of line-aligned files (Lingvo's BleuScorer, docs/mt.md).
printf 'the cat is on the mat\nthere is a cat here\n' > "$tmp/ref.txt"
cp "$tmp/ref.txt" "$tmp/same.txt"
expect_ok "^BLEU = 100.00 \(2 sentences; n-gram matches 11/11 9/9 7/7 5/5; hyp/ref tokens 11/11\)" bleu --ref="$tmp/ref.txt" --hyp="$tmp/same.txt"
printf 'the the the the the the the\nthere is a cat\n' > "$tmp/hyp.txt"
# Unigrams 2 + 4 of 11, bigrams 3/9, trigrams 2/7, 4-grams 1/5; 11 hyp vs 11 ref tokens:
# 100 * (6/11 * 3/9 * 2/7 * 1/5)^(1/4) = 31.93.
expect_ok "^BLEU = 31.93 " bleu --ref="$tmp/ref.txt" --hyp="$tmp/hyp.txt"
printf 'one line\n' > "$tmp/short.txt"
expect_error "short.txt ends at line 1 but .*ref.txt goes on: the files must align" bleu --ref="$tmp/ref.txt" --hyp="$tmp/short.txt"
expect_error "separator_type must be" bleu --ref="$tmp/ref.txt" --hyp="$tmp/same.txt" --separator_type=xyz
expect_error "--hyp" bleu --ref="$tmp/ref.txt" --hyp="$tmp/no_such_file.txt"
exit $fail
