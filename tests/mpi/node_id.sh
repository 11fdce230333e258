#!/bin/sh
# Runs a test rank as if on machine number (rank % 2): GPUIPC_NODE_ID.
GPUIPC_NODE_ID=$((${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}} % 2))
export GPUIPC_NODE_ID
exec "$@"
