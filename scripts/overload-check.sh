#!/usr/bin/env bash
# Overload on the local cluster (issue 11): 1 shard, 2 serving nodes whose queues refuse new
# requests once 20 ms behind (queue.max_delay), the router shedding when every node is above its
# load threshold (--all-overloaded shed) and beyond 16 calls in flight (--max-in-flight;
# HLEM_ROUTER_MAX_IN_FLIGHT overrides). The cluster's capacity is measured first (the load
# generator with 32 calls in flight at most: the OK answers per second);
# then 20 s at half of it (the baseline), 20 s at twice it, and 20 s at half again, back to back.
# Checked: at 2× the excess is shed with RESOURCE_EXHAUSTED (nothing else fails), the cluster
# still answers about its capacity, the admitted requests keep their P99; every process's memory
# stays bounded (RSS sampled every second); 10 s after the load drops every request is answered
# OK at the baseline's P99; and every request has exactly one outcome.
# Not in the test command: on a 2-core machine the load generator, the router, the nodes and the
# shard share the cores, and at twice the capacity the targets are met in some runs and missed in
# others (docs/reliability.md has the figures). Exit 1 after naming every target missed.
# HLEM_PIN_LOADGEN=1 gives the load generator a core of its own (taskset: the cluster on CPU 0,
# the load generator on CPU 1), so that its CPU time does not delay the cluster it measures; the
# cluster then has one core and a smaller capacity. HLEM_PIN_ROUTER=1 (with HLEM_PIN_LOADGEN)
# moves the router onto the load generator's core, away from the nodes and the shard, as a
# deployment whose routers run on hosts of their own (the serving nodes own their GPU hosts).
# HLEM_ROUTER_ADAPTIVE=1 adds the router's adaptive limit on calls in flight (--adaptive-in-flight,
# capped by --max-in-flight: docs/router.md); the capacity is then measured without it and the
# cluster started again with it. HLEM_OVERLOAD_CAPACITY=N takes N requests/s as the capacity
# instead of measuring it: an A/B of two configurations at the same offered load.
# Usage: scripts/overload-check.sh [build dir (build)] [source dir (.)]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
src=$(cd "${2:-.}" && pwd)
hlem="$build/tools/hlem"
run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_overload.XXXXXX")
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  "$hlem" cluster down --run-dir "$run/cluster" >/dev/null 2>&1 || true
  [ -n "${HLEM_KEEP_RUN:-}" ] && echo "kept $run" || rm -rf "$run"
}
trap cleanup EXIT
cluster_cpu=() loadgen_cpu=()
if [ -n "${HLEM_PIN_LOADGEN:-}" ]; then
  [ "$(nproc)" -ge 2 ] || { echo "overload-check.sh: HLEM_PIN_LOADGEN needs 2 CPUs" >&2; exit 2; }
  cluster_cpu=(taskset -c 0) loadgen_cpu=(taskset -c 1)
fi
fail() { echo "FAIL: $*" >&2; exit 1; }
missed=0
miss() { echo "TARGET MISSED: $*" >&2; missed=$((missed + 1)); }

# The test node with its queue bounded in time (queue.max_delay, docs/node.md).
cp "$src/tests/e2e/shards.yaml" "$run/shards.yaml"
{ cat "$src/tests/e2e/node.yaml"; echo "queue: {max_delay: 20ms}"; } > "$run/node.yaml"
# start_cluster [ROUTER FLAGS...]: the cluster up, its router's address in $router, pids in $pids.
start_cluster() {
  "${cluster_cpu[@]}" "$hlem" cluster up --run-dir "$run/cluster" --nodes 2 --bin-dir "$build" \
    --shards-config "$run/shards.yaml" --node-config "$run/node.yaml" \
    --router-arg=--all-overloaded=shed \
    --router-arg=--max-in-flight=${HLEM_ROUTER_MAX_IN_FLIGHT:-16} "$@" > /dev/null
  router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run/cluster/cluster.state")"
  if [ -n "${HLEM_PIN_ROUTER:-}" ]; then
    [ -n "${HLEM_PIN_LOADGEN:-}" ] || fail "HLEM_PIN_ROUTER needs HLEM_PIN_LOADGEN"
    taskset -a -c -p 1 "$(awk '$1 == "router" {print $3}' "$run/cluster/cluster.state")" > /dev/null
  fi
  pids=$(awk '{print $3}' "$run/cluster/cluster.state")
}
adaptive=()
[ "${HLEM_ROUTER_ADAPTIVE:-0}" = 0 ] || adaptive=(--router-arg=--adaptive-in-flight)
# The capacity is the cluster's, measured without the adaptive limit (which would measure its own
# smaller one, and so be offered less); the cluster is then started again with it.
if [ -n "${HLEM_OVERLOAD_CAPACITY:-}" ]; then
  [[ "$HLEM_OVERLOAD_CAPACITY" =~ ^[0-9]+$ ]] ||
    fail "HLEM_OVERLOAD_CAPACITY: '$HLEM_OVERLOAD_CAPACITY' is not a whole number of requests/s"
  start_cluster "${adaptive[@]}"
  adaptive_started=1
else
  start_cluster
fi

trace() {  # trace NAME RATE SECONDS
  "$hlem" workload generate --config "$src/tests/e2e/workload.yaml" --rate "$2" \
    --regime steady --duration "${3}s" --seed 9 --out "$run/$1.trace" > /dev/null
}
replay() {  # replay NAME [LOADGEN FLAGS...]: the CSV and summary of one replay
  local name=$1
  shift
  "${loadgen_cpu[@]}" "$hlem" loadgen --trace "$run/$name.trace" --router "$router" --slo-ms 1000 --deadline-ms 2000 \
    --window-s 1 --quiet --csv "$run/$name.csv" "$@" > "$run/$name.txt" ||
    fail "loadgen $name: $(tail -3 "$run/$name.txt")"
  grep -q "every request recorded once" "$run/$name.txt" || fail "$name: the books do not balance"
}
col() { awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) { print i; exit } }' "$run/$1.csv"; }
# figures NAME FROM_S AWK-EXPR: over requests sent from FROM_S on, "count ok p99_ms" (p99 of OK ones).
figures() {
  local s l c
  s=$(col "$1" sent_s); l=$(col "$1" latency_ms); c=$(col "$1" code)
  awk -F, -v s="$s" -v l="$l" -v c="$c" -v from="$2" 'NR > 1 && $s >= from { n++; if ($c == "OK") { ok++; print $l > "/dev/stderr" } }
    END { printf "%d %d", n, ok }' "$run/$1.csv" 2> "$run/lat.txt"
  echo " $(sort -g "$run/lat.txt" | awk '{ v[NR] = $1 } END { i = int(0.99 * NR); if (i < 1) i = 1; print (NR ? v[i] : 0) }')"
}

# ---- capacity --------------------------------------------------------------------------------
if [ -n "${HLEM_OVERLOAD_CAPACITY:-}" ]; then
  capacity=$HLEM_OVERLOAD_CAPACITY how="given"
else
  trace capacity 1000 8
  replay capacity --max-in-flight 32
  read -r n ok _ <<<"$(figures capacity 2)"
  capacity=$(awk -v ok="$ok" 'BEGIN { printf "%d", ok / 6 }')  # OK answers/s after the first 2 s
  how="32 in flight"
fi
[ "$capacity" -ge 20 ] || fail "capacity $capacity requests/s: too small to test"
half=$((capacity / 2)); double=$((capacity * 2))
echo "capacity: $capacity requests/s ($how); baseline $half/s, overload $double/s"
if [ ${#adaptive[@]} -gt 0 ] && [ -z "${adaptive_started:-}" ]; then
  "$hlem" cluster down --run-dir "$run/cluster" > /dev/null
  start_cluster "${adaptive[@]}"
fi
[ ${#adaptive[@]} -eq 0 ] || echo "router: adaptive limit on calls in flight (--adaptive-in-flight)"

# RSS of every process of the cluster, every second: "unix_s pid kib".
( while true; do
    now=$(date +%s)
    for pid in $pids; do
      kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) && echo "$now $pid $kib"
    done
    sleep 1
  done ) > "$run/rss.txt" &
sampler=$!

trace baseline "$half" 20
trace overload "$double" 20
trace recovery "$half" 20
t_base=$(date +%s); replay baseline
t_over=$(date +%s); replay overload --max-in-flight 100000
t_rec=$(date +%s); replay recovery
t_end=$(date +%s)
kill "$sampler"; sampler=

read -r bn bok bp99 <<<"$(figures baseline 5)"
read -r on ook op99 <<<"$(figures overload 5)"
read -r rn rok rp99 <<<"$(figures recovery 10)"
codes=$(awk -F, -v c="$(col overload code)" 'NR > 1 { print $c }' "$run/overload.csv" | sort | uniq -c | tr '\n' ' ')
shed=$(awk -F, -v c="$(col overload code)" 'NR > 1 && $c == "RESOURCE_EXHAUSTED"' "$run/overload.csv" | wc -l)
other=$(awk -F, -v c="$(col overload code)" 'NR > 1 && $c != "OK" && $c != "RESOURCE_EXHAUSTED"' "$run/overload.csv" | wc -l)
goodput=$(awk -v ok="$ook" 'BEGIN { printf "%.1f", ok / 15 }')
echo "baseline: $bok/$bn OK, P99 $bp99 ms"
echo "overload: $ook/$on OK ($goodput/s), P99 of admitted $op99 ms; codes: $codes"
echo "recovery (from 10 s after the drop): $rok/$rn OK, P99 $rp99 ms"

[ "$bok" -eq "$bn" ] || miss "the baseline at half the capacity had failures"
[ "$shed" -gt 0 ] || miss "nothing was shed at twice the capacity"
[ "$other" -le $((on / 100)) ] || miss "$other requests failed otherwise than shed at twice the capacity"
awk -v g="$goodput" -v c="$capacity" 'BEGIN { exit !(g >= 0.7 * c) }' ||
  miss "goodput $goodput/s under overload, capacity $capacity/s"
awk -v o="$op99" -v b="$bp99" 'BEGIN { exit !(o <= 3 * b + 20) }' ||
  miss "admitted P99 $op99 ms under overload against $bp99 ms at the baseline"
[ "$rok" -eq "$rn" ] || miss "$((rn - rok)) failures 10 s after the load dropped"
awk -v r="$rp99" -v b="$bp99" 'BEGIN { exit !(r <= 2 * b + 10) }' ||
  miss "P99 $rp99 ms 10 s after the load dropped, $bp99 ms at the baseline"

# Memory: per process, the peak during the overload against the peak during the baseline.
for pid in $pids; do
  read -r base peak after <<<"$(awk -v p="$pid" -v a="$t_base" -v o="$t_over" -v r="$t_rec" -v e="$t_end" '
    $2 == p && $1 >= a && $1 < o && $3 > b { b = $3 }
    $2 == p && $1 >= o && $1 < r && $3 > m { m = $3 }
    $2 == p && $1 >= r && $1 <= e { last = $3 }
    END { print b + 0, m + 0, last + 0 }' "$run/rss.txt")"
  name=$(awk -v p="$pid" '$3 == p {print $2}' "$run/cluster/cluster.state")
  echo "RSS $name: baseline peak $((base / 1024)) MiB, overload peak $((peak / 1024)) MiB, after $((after / 1024)) MiB"
  [ "$base" -gt 0 ] && [ "$peak" -gt 0 ] || fail "no RSS samples of $name"
  [ "$peak" -le $((base * 3 / 2 + 65536)) ] || miss "$name's memory grew under overload"
done
[ "$missed" -eq 0 ] || { echo "$missed target(s) missed"; exit 1; }
echo "PASS"
