#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), then configures and builds Glossa into build/.
# BUILD_DIR and CMAKE_BUILD_TYPE may be overridden from the environment.
#
# A build directory configured for another source tree (a checkout copied with its build/: CMake's
# cache holds the original's absolute paths, and building there would compile the original's
# sources and write into its tree) is configured afresh: its CMake state is removed first.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
if [ "${1:-}" = "--check-build-dir" ]; then check_only=1; else check_only=0; fi

# Removes $build_dir's CMake and Ninja state when its cache names another source or build tree.
forget_foreign_cache() {
  local cache="$build_dir/CMakeCache.txt" src bin here_src here_bin
  [ -f "$cache" ] || return 0
  src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")"
  bin="$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$cache")"
  here_src="$(pwd -P)"
  here_bin="$(cd "$build_dir" && pwd -P)"
  if [ "$src" = "$here_src" ] && [ "$bin" = "$here_bin" ]; then return 0; fi
  echo "build.sh: $cache was configured for source '$src' and build '$bin', not this checkout" \
       "('$here_src', '$here_bin'): configuring afresh" >&2
  rm -rf "$cache" "$build_dir/CMakeFiles" "$build_dir/build.ninja" "$build_dir/.ninja_deps" \
         "$build_dir/.ninja_log" "$build_dir/cmake_install.cmake" "$build_dir/CTestTestfile.cmake"
}
forget_foreign_cache
[ "$check_only" = 1 ] && exit 0

bash scripts/setup.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}"
cmake --build "$build_dir" -j "$(nproc)"
