#!/usr/bin/env bash
# Sets up, builds and runs every test (the README's second command; .ci/run calls it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build="${BUILD_DIR:-build}"
if ctest --test-dir "$build" --output-on-failure; then
  exit 0
else
  status=$?
fi
# A long failing test prints thousands of lines before its failure; say last, where a reader of the
# log's tail sees it, which tests failed and how (gtest's failure lines, from ctest's full log).
log="$build/Testing/Temporary/LastTest.log"
if [[ -f "$log" ]]; then
  echo "=== the failures, from $log ==="
  grep -n -E '^\[  FAILED  \]|: Failure$|^(Expected|Value of|  Actual|Which is|With diff)|^(unknown file|C\+\+ exception)' "$log" \
    | head -n 120 || true
  # Each failing gtest's own lines: from its RUN line to its FAILED line (at most 60 lines each).
  awk '/^\[ RUN      \]/ { buf = ""; n = 0; name = $0 }
       { if (n < 60) { buf = buf $0 "\n"; n++ } }
       /^\[  FAILED  \] .*\([0-9]+ ms\)$/ { printf "--- %s\n%s", name, buf; shown++ }
       shown >= 5 { exit }' "$log" || true
fi
exit "$status"
