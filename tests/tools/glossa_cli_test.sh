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
exit $fail
