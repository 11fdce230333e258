#!/usr/bin/env bash
# Runs the whole test suite many times in a row on a loaded machine, to
# find tests that fail only now and then.
#
#   tests/stress/suite_loop.sh [BUILD_DIR]
#
# Builds gpuipc in BUILD_DIR (default build-stress; RelWithDebInfo, or the
# type already configured there), starts two busy loops (each keeps a core
# busy), runs `ctest -j JOBS` RUNS times, stops the busy loops, and reports
# either "0 failures" or, for every test that failed, how often and its
# output. Exits 0 when no run failed.
# Environment: RUNS (20), JOBS (8), BUILD_JOBS (2), BUSY (2 busy loops).
# Every run's log stays in BUILD_DIR/stress/run-N.log. Ctrl-C (or SIGTERM,
# once the ctest under way ends) stops it, the busy loops included.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build-stress}
runs=${RUNS:-20}
jobs=${JOBS:-8}
busy=${BUSY:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== building in $build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "${BUILD_JOBS:-2}" >/dev/null

logs=$build/stress
rm -rf "$logs"
mkdir -p "$logs"

pids=()
stop_busy() {
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
}
trap stop_busy EXIT
trap 'exit 130' INT TERM # through the EXIT trap: no busy loop is left
for _ in $(seq 1 "$busy"); do
  (while :; do :; done) &
  pids+=($!)
done
echo "== $busy busy loops running (pids ${pids[*]}); $runs runs of ctest -j $jobs"

declare -A fails=() # test name -> number of runs it failed in
failed_runs=0
start=$SECONDS
for i in $(seq 1 "$runs"); do
  log=$logs/run-$i.log
  t0=$SECONDS
  if ctest --test-dir "$build" -j "$jobs" --output-on-failure >"$log" 2>&1; then
    echo "run $i/$runs: passed ($((SECONDS - t0)) s)"
    continue
  fi
  failed_runs=$((failed_runs + 1))
  # "The following tests FAILED:" then lines "  12 - name (Failed)".
  names=$(sed -n '/The following tests FAILED:/,$p' "$log" |
    sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (.*/\1/p')
  [ -n "$names" ] || names="(ctest itself: see $log)"
  echo "run $i/$runs: FAILED ($((SECONDS - t0)) s):" $names
  for n in $names; do
    fails[$n]=$((${fails[$n]:-0} + 1))
  done
done
stop_busy
trap - EXIT

echo
echo "== $runs runs in $((SECONDS - start)) s beside $busy busy loops:" \
  "$failed_runs failed"
if [ "$failed_runs" -eq 0 ]; then
  echo "0 failures"
  exit 0
fi
for n in "${!fails[@]}"; do
  echo
  echo "== $n failed in ${fails[$n]} of $runs runs; its output:"
  for log in "$logs"/run-*.log; do
    # From the test's result line to the next test's line.
    out=$(awk -v n="$n" '
      /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / { show = ($4 == n) }
      /^ *Start +[0-9]+: / { show = 0 }
      /^The following tests/ { show = 0 }
      show' "$log")
    if [ -n "$out" ]; then
      echo "-- $log"
      echo "$out"
    fi
  done
done
exit 1
