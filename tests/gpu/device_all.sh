#!/usr/bin/env bash
# Everything that needs the GPU machine, in one call (about 5 minutes on
# 2 x H200): every test with the GPU ones required to pass, gpuipc info and
# topo, the rings and kinds_bench (tests/gpu/run_device.sh); Umpire's
# example under mpirun with two ranks per GPU, every kind, both scopes; the
# channel benchmark against cudaMemcpyPeerAsync, NCCL and PyTorch
# (bench/channel_device.sh); the MPI channel benchmark when it is built.
# Logs and tables go to $OUT (default /tmp/gpuipc-device). The last lines
# printed are a PASS/FAIL summary.
set -u
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/gpuipc-device}
mkdir -p "$OUT"
summary=()

bash tests/gpu/run_device.sh >"$OUT/kinds.log" 2>&1
rc=$?
summary+=("run_device.sh (tests, info, topo, rings, kinds_bench): rc=$rc")
if [ $rc -ne 0 ]; then
  while read -r line; do summary+=("  $line"); done < <(
    sed -n '/== summary/,$p' "$OUT/kinds.log" | grep -E "FAIL|TIMEOUT")
fi

mpirun_base=(mpirun --allow-run-as-root --oversubscribe --bind-to none
  --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none)
mpirun_cmd=("${mpirun_base[@]}" -np 4)
if command -v mpirun >/dev/null && [ -x build-gpu/examples/umpire_mpi ]; then
  : >"$OUT/mpi.log"
  for scope in device node; do
    for kind in vmm legacy pool; do
      echo "== umpire_mpi $scope $kind" >>"$OUT/mpi.log"
      timeout 60 "${mpirun_cmd[@]}" build-gpu/examples/umpire_mpi "$scope" \
        "$kind" >>"$OUT/mpi.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] && st=PASS || st="FAIL(rc=$rc)"
      summary+=("umpire_mpi $scope $kind (4 ranks, 2 GPUs): $st")
    done
  done
fi

SKIP_TESTS=1 bash bench/channel_device.sh >"$OUT/chan.log" 2>&1
summary+=("channel benchmark: rc=$? (table in $OUT/channel_bench.md)")

if [ -x build-gpu/bench/mpi_channel_bench ]; then
  timeout 120 "${mpirun_base[@]}" -np 2 tests/mpi/node_id.sh \
    build-gpu/bench/mpi_channel_bench >"$OUT/mpi_chan.log" 2>&1
  summary+=("mpi_channel_bench: rc=$?")
fi

echo "== summary"
printf '%s\n' "${summary[@]}"
