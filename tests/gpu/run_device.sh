#!/usr/bin/env bash
# Build gpuipc on a GPU machine and run what needs the GPUs: every test
# (the GPU ones must pass, not skip), `gpuipc info` and `gpuipc topo`, the
# ring examples (all GPUs, and a ring of one), and the kinds benchmark.
#
#   tests/gpu/run_device.sh            # from the repository root
#
# Logs go to build-gpu/device-logs; when $OUT is set, the summary is copied
# there as summary.txt and every log as device-logs.tgz. The console gets
# the evidence lines and a summary table; the exit status is 0 only if every
# step passed.
#
# Settings: BUILD_DIR (build-gpu), JOBS (nproc), STEP_TIMEOUT (300 s, and
# each test's), SUITE_TIMEOUT (1200 s, the whole suite, one test at a time),
# RING_MIB (256), BENCH_N (200 imports per row).
set -u

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
out=$build/device-logs
jobs=${JOBS:-$(nproc)}
step_timeout=${STEP_TIMEOUT:-300}
suite_timeout=${SUITE_TIMEOUT:-1200}
ring_mib=${RING_MIB:-256}
bench_n=${BENCH_N:-200}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0

rows=()
failed=0

# step NAME LOG COMMAND...: run with a timeout, output to $out/LOG.
step() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$step_timeout" "$@" >"$out/$log" 2>&1
  local rc=$?
  local st=PASS
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    st=TIMEOUT
  elif [ $rc -ne 0 ]; then
    st="FAIL($rc)"
  fi
  [ "$st" = PASS ] || failed=1
  rows+=("$(printf '%-40s %-9s %5ss  %s' "$name" "$st" $((SECONDS - t0)) "$log")")
  return $rc
}

rm -rf "$out"
mkdir -p "$out"
echo "== gpuipc device run: $(date -u +%FT%TZ), logs in $out"
{
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total \
    --format=csv 2>&1
  echo
  nvidia-smi topo -m 2>&1
  echo
  nvcc --version 2>&1 | tail -n 2
  cmake --version 2>&1 | head -n 1
  gcc --version 2>&1 | head -n 1
  git -C "$root" log --oneline -1 2>&1
} >"$out/machine.txt" 2>&1
sed -n '1,3p' "$out/machine.txt"

# ---- build ----
if ! step "configure" configure.log cmake -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
  printf '%s\n' "${rows[@]}"
  exit 1
fi
step "build (-j$jobs)" build.log cmake --build "$build" -j "$jobs"
if ! grep -q "GPUIPC_HAVE_NVCC:INTERNAL=1\|building the CUDA C" \
    "$out/configure.log" "$build/CMakeCache.txt" 2>/dev/null; then
  rows+=("$(printf '%-40s %-9s' "nvcc found by CMake" "FAIL")")
  failed=1
fi

# ---- tests: all of them, one at a time (the GPU tests time GPU work) ----
# (over 300 s in all on 2 x H200 once the suite had 94 tests)
step_timeout=$suite_timeout step "ctest (all, -j1)" ctest.log \
  ctest --test-dir "$build" -j1 -V --timeout "$step_timeout"
# One row per test from ctest's own verdicts.
while read -r line; do
  name=$(sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*/\1/' <<<"$line")
  case "$line" in
  *"Passed"*) st=PASS ;;
  *"Skipped"* | *"Not Run"*) st=SKIP ;;
  *) st=FAIL ;;
  esac
  case "$name" in
  vmm | legacy | pool | event | foreign | topo | channel_blocks_gpu)
    # On a GPU machine the GPU tests must run.
    [ "$st" = SKIP ] && st="FAIL(skip)" && failed=1
    ;;
  esac
  rows+=("$(printf '%-40s %-9s' "  test $name" "$st")")
done < <(grep -E "Test +#[0-9]+: " "$out/ctest.log" | grep -E "sec$|Not Run")

# ---- the CLI ----
cli=$build/tools/gpuipc
step "gpuipc info" info.txt "$cli" info
step "gpuipc topo" topo.txt "$cli" topo
step "gpuipc topo --json" topo.json "$cli" topo --json

# ---- the rings ----
ex=$build/examples
step "ring_p2p (all GPUs)" ring_p2p.log "$ex/ring_p2p" "$ring_mib"
step "ring_p2p (ring of one)" ring_p2p_one.log \
  env CUDA_VISIBLE_DEVICES=0 "$ex/ring_p2p" "$ring_mib"
for kind in vmm legacy pool; do
  step "ring_ipc --kind $kind (all GPUs)" "ring_ipc_$kind.log" \
    "$ex/ring_ipc" --kind "$kind" --mib "$ring_mib"
done
step "ring_ipc (ring of one)" ring_ipc_one.log \
  env CUDA_VISIBLE_DEVICES=0 "$ex/ring_ipc" --mib "$ring_mib"

# ---- the benchmark ----
step "kinds_bench" kinds_bench.log "$build/bench/kinds_bench" --n "$bench_n" \
  --mib "$ring_mib"

# ---- evidence, then the summary ----
{
  echo "== what the GPU tests showed (from ctest.log)"
  grep -E "^[0-9]+: (--- |import: |two 1000-byte|export_foreign\(first|LEGACY buffers at|pool memory:|a foreign|the creator's bytes|fabric handles on|unknown GPU|producer: a GPU|consumer: after|producer: after|GPU[0-9] -> GPU[0-9]:|NVML:|NOTE)" \
    "$out/ctest.log" | sed -E 's/^[0-9]+: /  /' |
    awk '{ if (length($0) > 200) print substr($0, 1, 197) "..."; else print }'
  echo
  echo "== gpuipc topo"
  cat "$out/topo.txt"
  echo
  echo "== rings"
  grep -hE "^(ring_|  )" "$out"/ring_*.log
  echo
  echo "== kinds_bench"
  cat "$out/kinds_bench.log"
  echo
  echo "== summary"
  printf '%s\n' "${rows[@]}"
  echo
  if [ $failed -eq 0 ]; then
    echo "ALL PASSED"
  else
    echo "SOME STEPS FAILED: see the logs in $out"
  fi
} | tee "$out/summary.txt"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$out/summary.txt" "$OUT/summary.txt"
  tar -czf "$OUT/device-logs.tgz" -C "$build" device-logs
fi
exit $failed
