#!/usr/bin/env bash
# make test-gpu: on a bare x86-64 machine with one or more NVIDIA GPUs and a CUDA build of torch
# (PY, default python3), builds shardwise against that torch for the GPU it finds, runs every
# CUDA test and the GPU benchmarks, and writes the tables to benchmarks/results/DATE-*-gpu.md.
# Nothing is fetched: Python packages the trainer needs and the machine lacks (omegaconf,
# pydantic) come from .whl/ when present (`make gpu-wheels` fills it where pip can reach PyPI).
# GPU time is scarce: every step has its own time limit (STEP_LIMIT seconds, default 240) and a
# failing step does not stop the ones after it; each step's log lands in LOGS (build/gpu-logs).
# Each test runs in a pytest-xdist worker, so a crash fails that test alone (docs/gpu.md).
# The exit status is the first failing step's. SNAPSHOT=FILE.tgz: the logs and tables packed
# there after every step (for a machine that may be taken back mid-run).
# PARTS=tests or PARTS=bench: only the tests or only the benchmarks (default both), so that a short
# lease can run them as two calls on one warm machine; REUSE_BUILD=1 skips the build when
# shardwise already imports (the second of such calls). BENCHES: the benchmarks to run, a comma
# list of llama-1b, cast, shard-copies, optim, fsdp, compile (default all).
# SHARDWISE_LIBRARY_PREFIX (setup.py): the C++ library built elsewhere against the same torch
# (cmake --install prefix); only the Python module is built here, and the library is built here
# after all if that module does not import.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PY:-python3}
STEP_LIMIT=${STEP_LIMIT:-240}
PARTS=${PARTS:-tests,bench}
BENCHES=${BENCHES:-llama-1b,cast,shard-copies,optim,fsdp,compile}
LOGS=$(realpath -m "${LOGS:-build/gpu-logs}")
day=$(date +%Y-%m-%d)
results=benchmarks/results
mkdir -p "$LOGS"
status=0

# step NAME COMMAND...: runs COMMAND under the time limit, its output in LOGS/NAME.log and here.
step() {
  local name=$1 rc
  shift
  printf '\n== %s (%ss)\n' "$name" "$SECONDS"
  timeout --kill-after=10 "$STEP_LIMIT" "$@" 2>&1 | tee "$LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    printf '== %s FAILED (exit %s%s)\n' "$name" "$rc" "$([ "$rc" -eq 124 ] && echo ', timed out')"
    [ "$status" -ne 0 ] || status=$rc
  fi
  if [ -n "${SNAPSHOT:-}" ]; then
    tar czf "$SNAPSHOT" -C "$root" "${LOGS#"$root"/}" \
      $(cd "$root" && compgen -G "$results/$day-*-gpu.md") 2>/dev/null || true
  fi
  return "$rc"
}

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "test-gpu: $PY's torch sees no CUDA device; run this on a GPU machine" >&2
  exit 2
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /tmp/shardwise-site .whl/*.whl
  export PYTHONPATH=/tmp/shardwise-site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
  [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' |
  tee "$LOGS/machine.log"

arch=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} SHARDWISE_WITH_CUDA=1
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
command -v ccache >/dev/null || unset PYTORCH_NVCC
import_check=("$PY" -c 'import shardwise; print("shardwise", shardwise.__version__)')
built=0
if [ "${REUSE_BUILD:-0}" = 1 ] && "${import_check[@]}"; then
  echo "test-gpu: REUSE_BUILD=1 and shardwise imports: not rebuilding"
  built=1
elif [ -n "${SHARDWISE_LIBRARY_PREFIX:-}" ] &&
  ! { step build-prebuilt "$PY" -m pip install --no-build-isolation --no-deps -e . &&
    step import-prebuilt "${import_check[@]}"; }; then
  echo "test-gpu: the library at $SHARDWISE_LIBRARY_PREFIX did not work here; building it"
  unset SHARDWISE_LIBRARY_PREFIX
  status=0
fi
if [ "$built" = 0 ] && [ -z "${SHARDWISE_LIBRARY_PREFIX:-}" ]; then
  STEP_LIMIT=$((STEP_LIMIT * 2)) step build \
    "$PY" -m pip install --no-build-isolation --no-deps -e . || exit "$status"
  step import "${import_check[@]}" || exit "$status"
fi

step toolchain bash scripts/toolchain_report.sh

# Each test in a worker process (pytest-xdist, which the GPU images have): a crash fails that test
# alone and the log names it ("worker 'gwN' crashed while running 'TEST'"). Without xdist, each
# file in a pytest run of its own. Each folder runs apart: their conftest modules share a name.
pytest=("$PY" -m pytest -ra -p no:cacheprovider -m "not slow" --timeout 300)
xdist=$("$PY" -c 'import xdist; print(1)' 2>/dev/null || echo 0)
isolated_step() { # NAME FILE...
  local name=$1 f
  shift
  if [ "$xdist" = 1 ]; then
    step "$name" "${pytest[@]}" -p xdist -n "${GPU_WORKERS:-4}" --max-worker-restart 100 "$@"
  else
    for f in "$@"; do step "$name-$(basename "$f" .py)" "${pytest[@]}" "$f"; done
  fi
}
run_tests() {
  isolated_step exceptions tests/python/test_cxx_runtime.py
  isolated_step cuda-op-tests tests/python/test_cast_ops.py tests/python/test_optim_ops.py \
    tests/python/test_lamb.py \
    tests/python/test_shard_ops.py
  STEP_LIMIT=$((STEP_LIMIT * 2)) isolated_step gpu-tests tests/gpu
  step nccl-tests "${pytest[@]}" \
    tests/distributed/test_backend.py::test_cuda_tensors_go_through_nccl
  # The FSDP guide's launch line: torchrun's auto starts one process per GPU here
  step fsdp-guide-launch "$PY" -m torch.distributed.run --standalone --nproc_per_node=auto \
    -m shardwise.train --config examples/configs/fsdp.yaml --use-fsdp training.max_steps=3 \
    training.checkpoint.dir=build/fsdp-guide-launch
}

wanted() { [[ ,$BENCHES, == *,$1,* ]]; }
run_benchmarks() { # in benchmarks/
  local gpus
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  # A Llama-style model of about 1.1B parameters (bf16), with MFU.
  ! wanted llama-1b || STEP_LIMIT=$((STEP_LIMIT * 2)) step bench-llama-1b "$PY" bench_fsdp.py \
    --device cuda --world "$gpus" --model 1b --llama --batch 4 --steps 5 --warmup 2 \
    --frameworks shardwise,fsdp2,ddp,shardwise-mp,fsdp2-mp,compute \
    --output "results/$day-fsdp-llama-1b-gpu.md"
  ! wanted cast || step bench-cast "$PY" bench_cast.py --device cuda --min-time 0.1 \
    --output "results/$day-cast-gpu.md"
  ! wanted shard-copies || step bench-shard-copies "$PY" bench_shard_copies.py --device cuda \
    --output "results/$day-shard-copies-gpu.md"
  ! wanted optim || step bench-optim "$PY" bench_optim.py --device cuda \
    --output "results/$day-optim-gpu.md"
  ! wanted fsdp || step bench-fsdp "$PY" bench_fsdp.py --device cuda --world "$gpus" --batch 8 \
    --output "results/$day-fsdp-gpu.md"
  ! wanted compile || step bench-compile "$PY" bench_compile.py --device cuda --model medium \
    --batch 8 --output "results/$day-compile-medium-gpu.md"
}

[[ ,$PARTS, != *,tests,* ]] || run_tests
if [[ ,$PARTS, == *,bench,* ]]; then
  cd benchmarks && run_benchmarks
  cd ..
fi
printf '\n== done (%ss): exit %s; tables in %s/%s-*-gpu.md, logs in %s\n' \
  "$SECONDS" "$status" "$results" "$day" "$LOGS"
exit "$status"
