#!/bin/sh
# Runs a test rank as if on machine number (rank % 2): GPUIPC_NODE_ID.
# With BAD_RANK=N, rank N gets the invalid value "two" instead.
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
GPUIPC_NODE_ID=$((rank % 2))
[ "$rank" = "${BAD_RANK:-}" ] && GPUIPC_NODE_ID=two
export GPUIPC_NODE_ID
exec "$@"
