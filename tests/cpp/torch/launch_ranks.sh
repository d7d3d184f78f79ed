#!/usr/bin/env bash
# launch_ranks.sh N PROGRAM [ARGS...]: runs PROGRAM as N processes with torchrun's variables
# (rank 0 serves the TCPStore, no agent), and fails when any rank fails or all do not finish in
# 120 s. Real processes, not threads: what LibTorch programs launched by hand or by a scheduler do.
set -u
n=$1
shift
# A port the kernel just handed out as free (a random one may be another program's listener).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((rank = 0; rank < n; rank++)); do
  RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port timeout 120 "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
exit $status
