#!/bin/sh
# Channel rendezvous under CPU load: OPENERS processes pair on one name,
# ROUNDS times, while spinning children keep every CPU busy; every opener
# must pair. About 10 s on 2 CPUs, so it is not part of ctest.
#   tests/stress/channel_rendezvous.sh [BUILD_DIR [ROUNDS [OPENERS [SPINNERS]]]]
# (defaults: build, 100, 4, twice the CPUs). Exit 0 when nothing failed.
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
prog=$build/tests/stress_channel_rendezvous
[ -x "$prog" ] || { echo "$prog: not built" >&2; exit 2; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpuipc-stress.XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
GPUIPC_DIR=$dir "$prog" "$@" >"$dir/out" 2>&1
rc=$?
grep -v '^pair:' "$dir/out"
exit $rc
