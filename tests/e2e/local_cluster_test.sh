#!/usr/bin/env bash
# End to end on loopback (issue 6): a `hlem cluster up` whose node cannot start fails and leaves
# nothing running; an interrupted `up` leaves what it started to `down`; then `hlem cluster up` (1 shard, 2 serving nodes, router), 30 s of Steady at 10
# requests/s replayed open-loop by `hlem loadgen` (every request must be answered OK), `hlem
# cluster down`, and no process of the cluster left running.
# Usage: local_cluster_test.sh <build dir> <source dir>
set -euo pipefail
build=$1
src=$2
hlem="$build/tools/hlem"
run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_e2e.XXXXXX")
cleanup() {
  "$hlem" cluster down --run-dir "$run" >/dev/null 2>&1 || true
  rm -rf "$run"
}
trap cleanup EXIT

# A node that cannot start (its config is missing): up fails and stops the shard it had started.
if "$hlem" cluster up --run-dir "$run/bad" --nodes 1 --bin-dir "$build" \
  --shards-config "$src/tests/e2e/shards.yaml" --node-config "$run/missing.yaml"; then
  echo "cluster up succeeded without a node config" >&2
  exit 1
fi
# (no pgrep on a minimal Debian: scan /proc; "ba[d]" keeps grep from matching itself)
if grep -ls -- "$run/ba[d]/" /proc/[0-9]*/cmdline; then
  echo "a process of the failed start is still running" >&2
  exit 1
fi

# `up` interrupted half way (run-local.sh's trap on Ctrl-C; SIGTERM here, as a background job
# ignores SIGINT): `down` still stops what it had started.
"$hlem" cluster up --run-dir "$run/int" --nodes 2 --bin-dir "$build" \
  --shards-config "$src/tests/e2e/shards.yaml" --node-config "$src/tests/e2e/node.yaml" \
  >"$run/int.out" 2>&1 &
up=$!
for _ in $(seq 600); do [ -s "$run/int/cluster.state" ] && break; sleep 0.01; done
kill -TERM "$up"
if wait "$up"; then
  echo "cluster up finished before it was interrupted: the case was not exercised" >&2
  exit 1
fi
grep -qs -- "$run/in[t]/" /proc/[0-9]*/cmdline || { echo "nothing was running to stop" >&2; exit 1; }
"$hlem" cluster down --run-dir "$run/int"
sleep 0.5
if grep -ls -- "$run/in[t]/" /proc/[0-9]*/cmdline; then
  echo "a process of the interrupted start is still running after cluster down" >&2
  exit 1
fi

"$hlem" cluster up --run-dir "$run" --nodes 2 --bin-dir "$build" \
  --shards-config "$src/tests/e2e/shards.yaml" --node-config "$src/tests/e2e/node.yaml"
"$hlem" cluster status --run-dir "$run"
router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run/cluster.state")"
"$hlem" workload generate --config "$src/tests/e2e/workload.yaml" --out "$run/steady.trace"
"$hlem" loadgen --trace "$run/steady.trace" --router "$router" --slo-ms 1000 --deadline-ms 5000 \
  --fail-on-error --quiet --csv "$run/requests.csv"
# One CSV row per trace request, all OK.
requests=$(($(wc -l <"$run/requests.csv") - 1))
# The code column found by its header name (columns get added).
ok=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "code") c = i; next } $c == "OK"' \
  "$run/requests.csv" | wc -l)
echo "requests $requests, OK $ok"
[ "$requests" -gt 200 ] && [ "$ok" -eq "$requests" ]

pids=$(awk '{print $3}' "$run/cluster.state")
"$hlem" cluster down --run-dir "$run"
for pid in $pids; do
  # A zombie waiting for its reaper has an empty command line; a live process does not.
  if [ -s "/proc/$pid/cmdline" ]; then
    echo "process $pid still running after cluster down" >&2
    exit 1
  fi
done
if "$hlem" cluster status --run-dir "$run" 2>/dev/null; then
  echo "status still reports a cluster" >&2
  exit 1
fi
echo "local cluster end to end: ok"
