#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), then configures and builds Glossa into build/.
# BUILD_DIR and CMAKE_BUILD_TYPE may be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}"
cmake --build "$build_dir" -j "$(nproc)"
