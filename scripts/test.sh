#!/usr/bin/env bash
# Sets up, builds and runs every test (the README's second command; .ci/run calls it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure
