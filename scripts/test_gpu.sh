#!/usr/bin/env bash
# make test-gpu: on a bare x86-64 machine with one or more NVIDIA GPUs and a CUDA build of torch
# (PY, default python3), builds shardwise against that torch for the GPU it finds, runs every
# CUDA test and the GPU benchmarks, and writes the tables to benchmarks/results/DATE-*-gpu.md.
# Nothing is fetched: Python packages the trainer needs and the machine lacks (omegaconf,
# pydantic) come from .whl/ when present (`make gpu-wheels` fills it where pip can reach PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
day=$(date +%Y-%m-%d)
results=benchmarks/results
log() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "test-gpu: $PY's torch sees no CUDA device; run this on a GPU machine" >&2
  exit 2
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  log "installing .whl/ into /tmp/shardwise-site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /tmp/shardwise-site .whl/*.whl
  export PYTHONPATH=/tmp/shardwise-site${PYTHONPATH:+:$PYTHONPATH}
fi

log "building for $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')"
arch=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} SHARDWISE_WITH_CUDA=1
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
command -v ccache >/dev/null || unset PYTORCH_NVCC
"$PY" -m pip install -q --no-build-isolation --no-deps -e .

log "CUDA tests"
status=0
"$PY" -m pytest -ra -p no:cacheprovider -m "not slow" tests/gpu \
  tests/python/test_cast_ops.py tests/python/test_optim_ops.py tests/python/test_shard_ops.py \
  tests/distributed/test_backend.py::test_cuda_tensors_go_through_nccl || status=$?

log "GPU benchmarks"
cd benchmarks
"$PY" bench_cast.py --device cuda --min-time 0.1 --output "results/$day-cast-gpu.md"
"$PY" bench_shard_copies.py --device cuda --output "results/$day-shard-copies-gpu.md"
"$PY" bench_optim.py --device cuda --output "results/$day-optim-gpu.md"
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
"$PY" bench_fsdp.py --device cuda --world "$gpus" --batch 8 \
  --output "results/$day-fsdp-gpu.md"
cd ..
log "done: tests exit $status; tables in $results/$day-*-gpu.md"
exit "$status"
