#!/bin/bash
# Everything about channels that needs the GPU machine, in one command
# (about 5 minutes on the lent 2xH200; under 10):
#   1. build gpuipc with its tests and CUDA C helpers (build-bench/),
#   2. run the channel tests, channel_gpu included (CUDA kinds, staged
#      cudaMalloc memory, across two GPUs),
#   3. run bench/channel_vs_baselines.py (its own 8-minute budget), which
#      prints the markdown table and writes it to $OUT/channel_bench.md.
# Usage: bash bench/channel_device.sh [--quick]
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
B=build-bench
jobs=$(nproc)
[ "$jobs" -gt 16 ] && jobs=16
start=$(date +%s)
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON \
  -DGPUIPC_WERROR=OFF >/dev/null || exit 1
timeout 300 cmake --build "$B" -j "$jobs" 2>&1 | grep -E "error|warning: |Error" | head -40
echo "== build done after $(( $(date +%s) - start )) s"
# SKIP_TESTS=1: the channel tests ran already (tests/gpu/device_all.sh).
[ "${SKIP_TESTS:-0}" = 1 ] ||
  timeout 240 ctest --test-dir "$B" -R '^channel' --output-on-failure --timeout 200
echo "== channel tests done after $(( $(date +%s) - start )) s"
timeout 500 python3 bench/channel_vs_baselines.py "$@"
echo "== all done after $(( $(date +%s) - start )) s"
