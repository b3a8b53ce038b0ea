#!/usr/bin/env bash
# The digital twin from the CLI (issue 6): `hlem sim run` on a generated trace of the local
# profile answers every request; the same trace, seed and commit give the same event-log hash in
# two separate processes (different address-space layouts, so hash-map seeds differ); another α
# gives another hash; `hlem sim compare` of a run against itself differs by nothing; bad input
# (a missing trace, a bad cost file, a file that is not an outcome CSV, α outside [0, 1], `fit`'s
# bad --cpu, --real and --slowdown-quantiles, --history-sketch without EMB sampling or on explicit
# events) is a clear error with exit code 2; a sketched run answers every request, repeatably.
# Usage: sim_cli_test.sh <build dir> <source dir>
set -euo pipefail
build=$1
src=$2
hlem="$build/tools/hlem"
dir=$(mktemp -d "${TMPDIR:-/tmp}/hlem_sim.XXXXXX")
trap 'rm -rf "$dir"' EXIT

"$hlem" workload generate --config "$src/deploy/local/workload.yaml" --regime steady \
  --duration 20s --seed 3 --out "$dir/t.trace" >/dev/null
# --phase-duration: every phase of the config this long (3 phases × 7 s = 21 s); a duration that
# does not parse or is not positive, or one combined with --regime, is a clear error (exit 2).
"$hlem" workload generate --config "$src/deploy/local/workload.yaml" --phase-duration 7s \
  --seed 3 --out "$dir/p.trace" | grep -q "over 21 s" || { echo "--phase-duration 7s: not 21 s" >&2; exit 1; }
# --warmup lengthens the first phase only: 3 × 7 s + 5 s.
"$hlem" workload generate --config "$src/deploy/local/workload.yaml" --phase-duration 7s \
  --warmup 5s --seed 3 --out "$dir/w.trace" | grep -q "over 26 s" || { echo "--warmup 5s: not 26 s" >&2; exit 1; }
code=0
"$hlem" workload generate --warmup soon --out "$dir/bad.trace" 2>"$dir/err.txt" || code=$?
[ "$code" -eq 2 ] && grep -q -- "--warmup" "$dir/err.txt" || { echo "--warmup soon: exit $code" >&2; cat "$dir/err.txt" >&2; exit 1; }
for bad in 0s abc; do
  code=0
  "$hlem" workload generate --phase-duration "$bad" --out "$dir/bad.trace" 2>"$dir/err.txt" || code=$?
  if [ "$code" -ne 2 ] || ! grep -q -- "--phase-duration" "$dir/err.txt"; then
    echo "--phase-duration $bad: exit $code" >&2; cat "$dir/err.txt" >&2; exit 1
  fi
done
code=0
"$hlem" workload generate --phase-duration 7s --regime burst --out "$dir/bad.trace" \
  2>"$dir/err.txt" || code=$?
# CLI11's own errors exit 2 too (common/cli.h), not CLI11's 108, and name the flags.
if [ "$code" -ne 2 ] || ! grep -q -- "--regime" "$dir/err.txt"; then
  echo "--phase-duration with --regime: exit $code" >&2; cat "$dir/err.txt" >&2; exit 1
fi
code=0
"$hlem" sim run --no-such-flag 2>"$dir/err.txt" || code=$?
[ "$code" -eq 2 ] || { echo "an unknown flag: exit $code" >&2; cat "$dir/err.txt" >&2; exit 1; }
"$hlem" sim run --help >/dev/null || { echo "--help did not exit 0" >&2; exit 1; }
sim() {  # sim <trace> <cost file> [flags]
  local trace=$1 costs=$2
  shift 2
  "$hlem" sim run --trace "$trace" --node-config "$src/deploy/local/node.yaml" --costs "$costs" "$@"
}
costs="$src/sim/costs/cpu-local.yaml"
sim "$dir/t.trace" "$costs" --alpha 0.5 --csv "$dir/a.csv" >"$dir/a.txt"
sim "$dir/t.trace" "$costs" --alpha 0.5 >"$dir/b.txt"
sim "$dir/t.trace" "$costs" --alpha 0.9 >"$dir/c.txt"
hash() { sed -n 's/.*log hash \([0-9a-f]*\).*/\1/p' "$1"; }
[ -n "$(hash "$dir/a.txt")" ] || { echo "no log hash printed" >&2; cat "$dir/a.txt" >&2; exit 1; }
if [ "$(hash "$dir/a.txt")" != "$(hash "$dir/b.txt")" ]; then
  echo "same trace and alpha, different log hashes: $(hash "$dir/a.txt") $(hash "$dir/b.txt")" >&2
  exit 1
fi
if [ "$(hash "$dir/a.txt")" = "$(hash "$dir/c.txt")" ]; then
  echo "alpha 0.5 and 0.9 gave the same log hash" >&2
  exit 1
fi
# Every request has exactly one outcome, all OK at this load.
requests=$(awk '/^requests/ {gsub(",", "", $2); print $2}' "$dir/a.txt")
ok=$(awk '/^requests/ {gsub(",", "", $4); print $4}' "$dir/a.txt")
rows=$(($(wc -l <"$dir/a.csv") - 1))
if [ "$requests" != "$ok" ] || [ "$rows" != "$requests" ] || [ "$requests" -lt 500 ]; then
  echo "requests $requests, OK $ok, CSV rows $rows" >&2
  exit 1
fi
# Bad input: exit 2 and a message naming the flag.
if sim "$dir/missing.trace" "$costs" 2>"$dir/err.txt"; then
  echo "a missing trace was accepted" >&2
  exit 1
fi
grep -q -- "--trace" "$dir/err.txt" || { cat "$dir/err.txt" >&2; exit 1; }
set +e
sim "$dir/t.trace" "$dir/t.trace" 2>"$dir/err.txt"
code=$?
set -e
[ "$code" = 2 ] && grep -q -- "--costs" "$dir/err.txt" || {
  echo "a bad cost file: exit $code" >&2
  cat "$dir/err.txt" >&2
  exit 1
}
# compare: a run against itself differs by nothing; a file that is not an outcome CSV is refused.
"$hlem" sim compare --real "$dir/a.csv" --sim "$dir/a.csv" --pool-s 5 >"$dir/cmp.txt"
grep -q '^overall .* 0.0% .* 0.0% .* +0.00' "$dir/cmp.txt" || { cat "$dir/cmp.txt" >&2; exit 1; }
set +e
"$hlem" sim compare --real "$dir/a.txt" --sim "$dir/a.csv" 2>"$dir/err.txt"
code=$?
"$hlem" sim sweep --trace "$dir/t.trace" --node-config "$src/deploy/local/node.yaml" \
  --costs "$costs" --alphas "0.5,2" 2>"$dir/err2.txt"
code2=$?
set -e
[ "$code" = 2 ] && grep -q "not a per-request outcome CSV" "$dir/err.txt" || {
  echo "compare of a bad CSV: exit $code" >&2; cat "$dir/err.txt" >&2; exit 1; }
[ "$code2" = 2 ] && grep -q -- "--alphas" "$dir/err2.txt" || {
  echo "sweep with alpha 2: exit $code2" >&2; cat "$dir/err2.txt" >&2; exit 1; }
# fit: a missing or malformed --cpu file, a CSV without stage timings and more slowdown
# quantiles than requests are clear errors naming what is wrong (exit 2).
fit() {  # fit <expected message> [flags]
  local expect=$1
  shift
  set +e
  "$hlem" sim fit --trace "$dir/t.trace" --node-config "$src/deploy/local/node.yaml" \
    --costs "$costs" --alpha 0.5 --max-iterations 1 "$@" >/dev/null 2>"$dir/err.txt"
  local code=$?
  set -e
  [ "$code" = 2 ] && grep -q -- "$expect" "$dir/err.txt" || {
    echo "sim fit $*: exit $code, expected 2 and '$expect'" >&2; cat "$dir/err.txt" >&2; exit 1; }
}
fit "--cpu: cannot read" --real "$dir/a.csv" --cpu "$dir/missing.cpu"
printf 'process cpu_s\nnode-0 lots\n' >"$dir/bad.cpu"
fit "bad.cpu:2: expected" --real "$dir/a.csv" --cpu "$dir/bad.cpu"
sed '1s/compute_ms/compute_x/' "$dir/a.csv" >"$dir/nostages.csv"
fit "--real: no stage timings" --real "$dir/nostages.csv"
fit "too few requests answered in both runs" --real "$dir/a.csv" --slowdown-quantiles 1000
# Sketched histories: a sampled run answers every request and repeats its hash; without EMB
# sampling, or on a trace with explicit events, the flag is refused naming it (exit 2).
sim "$dir/t.trace" "$costs" --emb-sample 4 --history-sketch >"$dir/s1.txt"
sim "$dir/t.trace" "$costs" --emb-sample 4 --history-sketch >"$dir/s2.txt"
sk_requests=$(awk '/^requests/ {gsub(",", "", $2); print $2}' "$dir/s1.txt")
sk_ok=$(awk '/^requests/ {gsub(",", "", $4); print $4}' "$dir/s1.txt")
[ "$sk_requests" = "$requests" ] && [ "$sk_ok" = "$requests" ] && [ -n "$(hash "$dir/s1.txt")" ] &&
  [ "$(hash "$dir/s1.txt")" = "$(hash "$dir/s2.txt")" ] || {
  echo "--history-sketch: requests $sk_requests, OK $sk_ok of $requests; hashes" \
    "$(hash "$dir/s1.txt") $(hash "$dir/s2.txt")" >&2; exit 1; }
"$hlem" workload generate --config "$src/deploy/local/workload.yaml" --regime steady \
  --duration 5s --seed 3 --explicit-events --out "$dir/x.trace" >/dev/null
refused() {  # refused <trace> [flags]: exit 2 naming --history-sketch
  local trace=$1
  shift
  set +e
  sim "$trace" "$costs" "$@" 2>"$dir/err.txt" >/dev/null
  local code=$?
  set -e
  [ "$code" = 2 ] && grep -q -- "--history-sketch: needs" "$dir/err.txt" || {
    echo "sim run $trace $*: exit $code" >&2; cat "$dir/err.txt" >&2; exit 1; }
}
refused "$dir/t.trace" --history-sketch
refused "$dir/x.trace" --emb-sample 4 --history-sketch
echo "sim CLI: $requests requests, hash $(hash "$dir/a.txt") twice, $(hash "$dir/c.txt") at alpha 0.9"
