#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz (built by `make fuzz-build` into BUILD) for SECONDS
# each: first its regression inputs (tests/fuzz/regressions/<target>/, each once: every crash the
# fuzzers found stays fixed), then fuzzing from the committed seeds (tests/fuzz/corpus/<target>/)
# plus the working corpus kept in BUILD/corpus/<target>/. A crash is written to BUILD/crashes/
# and fails the run: fix it and commit the input to tests/fuzz/regressions/<target>/.
#
# The targets run side by side, FUZZ_JOBS at a time (default: one per core). A libFuzzer process
# is single-threaded and -max_total_time is wall time, so each target still fuzzes SECONDS on a
# core of its own; only the wall time of the whole run shrinks. Each target's report is printed
# whole when it ends, in the targets' order.
#
# Usage: [FUZZ_JOBS=N] scripts/run_fuzzers.sh BUILD SECONDS
set -euo pipefail
shopt -s nullglob
build=$1
seconds=$2
jobs=${FUZZ_JOBS:-$(nproc)}
root=$(cd "$(dirname "$0")/.." && pwd)
targets=(schedule_validator checkpoint_manifest tcp_frames)
mkdir -p "$build/crashes"

# One target: its regression inputs, then SECONDS of fuzzing. Its report goes to
# BUILD/<target>.report, and its exit status says whether it passed.
fuzz_target() {
  local target=$1 binary="$build/fuzz_$1" regressions runs
  regressions=("$root/tests/fuzz/regressions/$target"/*)
  if [ ${#regressions[@]} -gt 0 ]; then
    if ! "$binary" "${regressions[@]}" > "$build/$target-regressions.log" 2>&1; then
      echo "fuzz $target: a regression input fails again"; tail -30 "$build/$target-regressions.log"
      return 1
    fi
  fi
  mkdir -p "$build/corpus/$target"
  if "$binary" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" \
      "$build/corpus/$target" "$root/tests/fuzz/corpus/$target" > "$build/$target.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/$target.log" | grep -o '[0-9]*$' || true)
    echo "fuzz $target: ${runs:-?} inputs in ${seconds} s, no crash, ${#regressions[@]} regression inputs pass"
  else
    echo "fuzz $target: CRASH (input in $build/crashes/)"; grep -B2 -A20 -m1 'ERROR\|runtime error\|deadly' "$build/$target.log" || tail -30 "$build/$target.log"
    return 1
  fi
}

for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n || true  # each target's status is read from its file below
  done
  rm -f "$build/$target.status"
  { if fuzz_target "$target" > "$build/$target.report" 2>&1; then echo 0; else echo 1; fi \
    > "$build/$target.status"; } &
done
wait
status=0
for target in "${targets[@]}"; do
  cat "$build/$target.report"
  [ "$(cat "$build/$target.status" 2>/dev/null)" = 0 ] || status=1
done
exit $status
