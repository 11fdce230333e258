#!/usr/bin/env bash
# PyTorch and CuPy against gpuipc on a GPU machine (python3 with torch and
# cupy): builds the helper and runs tests/gpu/torch_import.py.
#
#   tests/gpu/torch_import.sh [DEVICE]     # from the repository root
#
# BUILD_DIR (build-gpu) is configured and built when needed. Exit 0 on
# success, 77 without a GPU.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target cuda_import >/dev/null
exec python3 "$root/tests/gpu/torch_import.py" "$build" "${1:-0}"
