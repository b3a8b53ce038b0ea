#!/usr/bin/env bash
# Bounded-time fuzzing (issue 11): runs every libFuzzer target of a build made with HLEM_FUZZ=ON
# (the asan and fuzz presets) for SECONDS each, starting from its seed corpus in the repo (read
# only: new inputs go to a scratch directory; a crash input is kept there and its path printed).
# The targets and their corpora are the ones ctest knows (label fuzz). Exit 1 when any target
# finds a crash, a leak, a timeout or runs out of memory.
# Usage: scripts/fuzz.sh [build dir (build-asan)] [seconds per target (15)]
set -euo pipefail
build=${1:-build-asan}
seconds=${2:-15}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/hlem_fuzz.XXXXXX")
mapfile -t commands < <(ctest --test-dir "$build" -N -V -L fuzz 2>/dev/null |
  sed -n 's/^[0-9]*: Test command: //p' | grep -- '"-runs=0"' || true)
[ "${#commands[@]}" -gt 0 ] || { echo "fuzz: no libFuzzer targets in $build (configure with HLEM_FUZZ=ON)" >&2; exit 1; }
failed=0
for command in "${commands[@]}"; do
  eval "set -- $command"  # ctest quotes each argument
  # A target configured but not built (the fuzz-services preset builds no libtorch target):
  # ctest then names no binary. Say so and go on.
  if [ "${1:-}" = "-runs=0" ] || [ ! -x "${1:-}" ]; then
    echo "fuzz: the target of corpus ${*: -1} is not built in $build, skipped"
    continue
  fi
  binary=$1 corpus=${3:?}
  name=$(basename "$binary")
  mkdir -p "$scratch/$name"
  start=$(date +%s)
  if "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$scratch/$name/" "$scratch/$name" "$corpus" > "$scratch/$name.log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$name.log")
    echo "fuzz: $name: ${runs:-?} inputs in $(( $(date +%s) - start )) s, nothing found"
  else
    failed=1
    echo "fuzz: $name FAILED; its log and the input: $scratch/$name.log, $scratch/$name/" >&2
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$scratch/$name.log" | head -10 >&2
  fi
done
[ "$failed" -eq 0 ] && rm -rf "$scratch"
exit "$failed"
