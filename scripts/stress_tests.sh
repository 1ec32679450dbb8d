#!/usr/bin/env bash
# Runs the whole CTest suite again and again, half of the passes beside CPU hogs, and prints a
# table of every test: passes, failures, slowest time quiet and under load. A test that fails by
# chance shows up here before it fails someone's CI (docs/architecture.md, "Tests").
#
#   bash scripts/stress_tests.sh [passes] [hogs]
#
# passes (default 10): full `ctest -j$JOBS` runs. Passes 2, 4, ... run beside `hogs` (default 2)
# busy loops (`yes > /dev/null`); with hogs 0 every pass is quiet. Each pass keeps its CTest log,
# JUnit file and, for a failed test, its scratch directory (KEEP_TMP) under $STRESS_DIR/pass-N/.
# Environment: BUILD_DIR (default build; built beforehand by scripts/build.sh), JOBS (default 2),
# STRESS_DIR (default $BUILD_DIR/stress), CTEST_ARGS (more ctest arguments, e.g. "-R distributed").
# Exits 0 only when every pass ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: bash scripts/stress_tests.sh [passes] [hogs]" >&2; exit 2; }
passes="${1:-10}"
hogs="${2:-2}"
[[ "$passes" =~ ^[0-9]+$ ]] && [ "$passes" -ge 1 ] && [ "$passes" -le 1000 ] || {
  echo "stress_tests.sh: passes must be an integer in [1, 1000], got '$passes'" >&2; usage; }
[[ "$hogs" =~ ^[0-9]+$ ]] && [ "$hogs" -le 64 ] || {
  echo "stress_tests.sh: hogs must be an integer in [0, 64], got '$hogs'" >&2; usage; }
[ $# -le 2 ] || usage
build="${BUILD_DIR:-build}"
jobs="${JOBS:-2}"
stress_dir="${STRESS_DIR:-$build/stress}"
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "stress_tests.sh: $build/CTestTestfile.cmake is missing: build first (bash scripts/build.sh)" >&2
  exit 1
fi
mkdir -p "$stress_dir"
stress_dir="$(cd "$stress_dir" && pwd)"
read -r -a extra <<< "${CTEST_ARGS:-}"

hog_pids=()
stop_hogs() { for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done; hog_pids=(); }
trap 'stop_hogs' EXIT
trap 'stop_hogs; exit 130' INT TERM

cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "stress_tests.sh: $passes pass(es) of ctest -j$jobs on $(nproc) core(s) of ${cpu:-an unknown CPU}; even passes beside $hogs CPU hog(s); logs in $stress_dir"
failed_passes=0
for i in $(seq 1 "$passes"); do
  pass_dir="$stress_dir/pass-$i"
  rm -rf "$pass_dir"
  mkdir -p "$pass_dir/tmp"
  load=0
  if [ $((i % 2)) -eq 0 ]; then load="$hogs"; fi
  for _ in $(seq 1 "$load"); do
    yes > /dev/null &
    hog_pids+=($!)
  done
  echo "$load" > "$pass_dir/hogs"
  start=$(date +%s)
  TMPDIR="$pass_dir/tmp" KEEP_TMP=1 ctest --test-dir "$build" -j "$jobs" --output-on-failure \
    --output-junit "$pass_dir/junit.xml" "${extra[@]}" > "$pass_dir/ctest.log" 2>&1
  rc=$?
  stop_hogs
  took=$(( $(date +%s) - start ))
  summary="$(grep -E '^[0-9]+% tests passed' "$pass_dir/ctest.log" | tail -1)"
  if [ "$rc" -eq 0 ]; then
    rm -rf "$pass_dir/tmp"   # nothing failed: the scratch directories tell nothing
  else
    failed_passes=$((failed_passes + 1))
  fi
  echo "pass $i/$passes ($load hog(s)): rc $rc in ${took} s: ${summary:-no CTest summary; see $pass_dir/ctest.log}"
  if [ "$rc" -ne 0 ]; then
    grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Exception|Child aborted)' "$pass_dir/ctest.log" | sed 's/^/    /'
    echo "    log: $pass_dir/ctest.log; scratch directories: $pass_dir/tmp"
  fi
done

/usr/bin/python3 - "$stress_dir" "$passes" <<'PY'
import os, sys, xml.etree.ElementTree as ET
root, passes = sys.argv[1], int(sys.argv[2])
rows = {}
for i in range(1, passes + 1):
    d = os.path.join(root, f"pass-{i}")
    loaded = int(open(os.path.join(d, "hogs")).read()) > 0
    junit = os.path.join(d, "junit.xml")
    if not os.path.exists(junit):
        print(f"pass {i}: no JUnit file ({junit}): CTest did not finish")
        continue
    for case in ET.parse(junit).getroot().iter("testcase"):
        r = rows.setdefault(case.get("name"), {"runs": 0, "fail": 0, "quiet": 0.0, "load": 0.0, "where": []})
        if case.get("status") == "notrun" or case.find("skipped") is not None:
            continue
        t = float(case.get("time") or 0)
        r["runs"] += 1
        key = "load" if loaded else "quiet"
        r[key] = max(r[key], t)
        if case.find("failure") is not None or case.find("error") is not None:
            r["fail"] += 1
            r["where"].append(str(i))
w = max([len(n) for n in rows] + [4])
print()
print(f"{'test':<{w}}  passes  failures  slowest quiet (s)  slowest with hogs (s)  failed in pass")
for name in sorted(rows):
    r = rows[name]
    print(f"{name:<{w}}  {r['runs'] - r['fail']:>6}  {r['fail']:>8}  {r['quiet']:>17.1f}  {r['load']:>21.1f}  {','.join(r['where']) or '-'}")
PY
echo
echo "stress_tests.sh: $((passes - failed_passes)) of $passes pass(es) with no failure"
[ "$failed_passes" -eq 0 ]
