# Helpers the CTest shell scripts share (sourced; `fail` is the script's exit status). A test waits
# for events, never for a fixed time, and every wait is bounded and says what it waited for
# (docs/architecture.md, "Tests"; scripts/stress_tests.sh runs the suite under load).

fail=0

# check <description> <command...>: runs the command; a non-zero status is a FAIL line.
check() {
  local what="$1"; shift
  if ! "$@"; then echo "FAIL: $what"; fail=1; fi
}

# slowdown: how many times slower than alone a CPU-bound process runs here now (wall time over
# CPU time of a short busy loop, rounded up, 1 to 10): 1 on an idle machine, 2 to 4 beside other
# tests and CPU hogs. Bounds on how long something may take are multiplied by it, so that a busy
# machine stretches them while a hang still fails.
slowdown() {
  /usr/bin/python3 -c '
import math, time
w, c = time.perf_counter(), time.process_time()
x = 0
while time.process_time() - c < 0.3:
    x += sum(range(1000))
ratio = (time.perf_counter() - w) / max(time.process_time() - c, 1e-3)
print(min(10, max(1, math.ceil(ratio - 0.05))))'
}

# wait_for <file> <regex> <seconds>: returns once a line of <file> matches (following it across
# the atomic rewrites of a state file, and before it exists); fails after <seconds> times the
# slowdown, saying what it waited for.
wait_for() {
  local bound=$(( $3 * $(slowdown) ))
  if timeout "$bound" bash -c 'tail -F -n +1 "$1" 2>/dev/null | grep -q -m1 -e "$2"' _ "$1" "$2"; then
    return 0
  fi
  echo "timed out after $bound s waiting for a line matching '$2' in $1" >&2
  return 1
}

# wait_until <description> <seconds> <command...>: polls the command every 50 ms until it
# succeeds; fails after <seconds> times the slowdown with a FAIL line naming <description>.
wait_until() {
  local what="$1" bound=$(( $2 * $(slowdown) )); shift 2
  local deadline=$(( $(date +%s) + bound ))
  until "$@"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "FAIL: timed out after $bound s waiting for $what"
      fail=1
      return 1
    fi
    sleep 0.05
  done
}

# ranks_progress <log...>: for each rank, its last progress line ("step N/M ...") and last line,
# to say which rank did not arrive where a multi-process wait gave up. A launcher's log (lines
# "[rank R] ...") is split by rank; any other log is one rank's.
ranks_progress() {
  local log r
  for log in "$@"; do
    if grep -q '^\[rank [0-9]*\] ' "$log" 2>/dev/null; then
      for r in $(sed -n 's/^\[rank \([0-9]*\)\] .*/\1/p' "$log" | sort -un); do
        echo "  rank $r ($log): last step: $(grep "^\[rank $r\] step " "$log" | tail -1 | cut -c1-80); last line: $(grep "^\[rank $r\] " "$log" | tail -1 | cut -c1-160)"
      done
    else
      echo "  $log: last step: $(grep '^step ' "$log" 2>/dev/null | tail -1 | cut -c1-80); last line: $(tail -1 "$log" 2>/dev/null | cut -c1-160)"
    fi
  done
}

# wait_ranks <file> <regex> <seconds> <log...>: wait_for, and when it gives up, a FAIL line and
# each rank's progress (ranks_progress).
wait_ranks() {
  local file="$1" regex="$2" seconds="$3"; shift 3
  wait_for "$file" "$regex" "$seconds" && return 0
  echo "FAIL: no line matching '$regex' in $file: where each rank got to:"
  ranks_progress "$@"
  fail=1
  return 1
}

# wait_checkpoint <train dir> <step> <seconds> <log...>: returns once the state file
# (<train dir>/checkpoint) names a latest checkpoint of step <step> or later. That only grows,
# where a given step's name leaves the file as newer checkpoints push it out (a fast run can pass
# step 20 between two looks). Fails after <seconds> times the slowdown, saying the latest step
# and where each rank got to (ranks_progress of the logs).
wait_checkpoint() {
  local dir="$1" step="$2" bound got deadline
  bound=$(( $3 * $(slowdown) )); shift 3
  deadline=$(( $(date +%s) + bound ))
  while :; do
    got=$(sed -n 's/^model_checkpoint_path: "ckpt-0*\([0-9][0-9]*\)".*/\1/p' "$dir/checkpoint" 2>/dev/null)
    if [ -n "$got" ] && [ "$got" -ge "$step" ]; then return 0; fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "FAIL: timed out after $bound s waiting for a checkpoint of step $step or later in $dir (latest: ${got:-none}); where each rank got to:"
      ranks_progress "$@"
      fail=1
      return 1
    fi
    sleep 0.05
  done
}

# run_job <description> <log> <command...>: runs the command, its output to <log>; a non-zero
# status is a FAIL line with the status and where each rank got to (ranks_progress of <log>).
run_job() {
  local what="$1" log="$2" rc; shift 2
  "$@" > "$log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && return 0
  echo "FAIL: $what (rc $rc); where each rank got to:"
  ranks_progress "$log"
  fail=1
  return "$rc"
}
