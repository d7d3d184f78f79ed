#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz (built by `make fuzz-build` into BUILD) for SECONDS
# each: first its regression inputs (tests/fuzz/regressions/<target>/, each once: every crash the
# fuzzers found stays fixed), then fuzzing from the committed seeds (tests/fuzz/corpus/<target>/)
# plus the working corpus kept in BUILD/corpus/<target>/. A crash is written to BUILD/crashes/
# and fails the run: fix it and commit the input to tests/fuzz/regressions/<target>/.
#
# Usage: scripts/run_fuzzers.sh BUILD SECONDS
set -euo pipefail
shopt -s nullglob
build=$1
seconds=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$build/crashes"
status=0
for target in schedule_validator checkpoint_manifest tcp_frames; do
  binary="$build/fuzz_$target"
  regressions=("$root/tests/fuzz/regressions/$target"/*)
  if [ ${#regressions[@]} -gt 0 ]; then
    if ! "$binary" "${regressions[@]}" > "$build/$target-regressions.log" 2>&1; then
      echo "fuzz $target: a regression input fails again"; tail -30 "$build/$target-regressions.log"
      status=1
      continue
    fi
  fi
  mkdir -p "$build/corpus/$target"
  if "$binary" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" \
      "$build/corpus/$target" "$root/tests/fuzz/corpus/$target" > "$build/$target.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/$target.log" | grep -o '[0-9]*$')
    echo "fuzz $target: ${runs:-?} inputs in ${seconds} s, no crash, ${#regressions[@]} regression inputs pass"
  else
    echo "fuzz $target: CRASH (input in $build/crashes/)"; grep -B2 -A20 -m1 'ERROR\|runtime error\|deadly' "$build/$target.log" || tail -30 "$build/$target.log"
    status=1
  fi
done
exit $status
