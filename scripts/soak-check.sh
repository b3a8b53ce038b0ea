#!/usr/bin/env bash
# Soak on the local cluster (issue 11): 1 shard, 2 serving nodes, the router, a static allocator;
# the capacity is measured first (as scripts/overload-check.sh does), then a 60 s Steady trace at
# 70 % of it is replayed back to back for MINUTES minutes. Every 10 s each process's resident
# memory (VmRSS), open file descriptors and threads are sampled. Checked, per process: the last
# quarter of the run against the first quarter after a 2-minute warm-up — mean RSS within 10 % + 16
# MiB, at most 4 more file descriptors (the most open), the fewest threads at most 4 more (gRPC's
# sync servers start threads for bursts and end them when idle, so the most threads moves with the
# load; a leaked thread never ends and raises the fewest) — and every request answered exactly once.
# Prints a table (docs/reliability.md has the figures). Not in the test command (30 minutes).
# Usage: scripts/soak-check.sh [build dir (build)] [source dir (.)] [minutes (30)]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
src=$(cd "${2:-.}" && pwd)
minutes=${3:-30}
hlem="$build/tools/hlem"
run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_soak.XXXXXX")
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  "$hlem" cluster down --run-dir "$run/cluster" >/dev/null 2>&1 || true
  [ -n "${HLEM_KEEP_RUN:-}" ] && echo "kept $run" || rm -rf "$run"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$minutes" -ge 4 ] || fail "minutes: at least 4 (2 of warm-up)"

cp "$src/tests/e2e/shards.yaml" "$src/tests/e2e/node.yaml" "$run/"
"$hlem" cluster up --run-dir "$run/cluster" --nodes 2 --bin-dir "$build" \
  --shards-config "$run/shards.yaml" --node-config "$run/node.yaml" \
  --allocator static --allocator-arg=--alpha=0.4 > /dev/null
router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run/cluster/cluster.state")"
pids=$(awk '{print $3}' "$run/cluster/cluster.state")

trace() {  # trace NAME RATE SECONDS
  "$hlem" workload generate --config "$src/tests/e2e/workload.yaml" --rate "$2" \
    --regime steady --duration "${3}s" --seed 9 --out "$run/$1.trace" > /dev/null
}
# Capacity: OK answers per second with 32 calls in flight, after the first 2 s.
trace capacity 1000 8
"$hlem" loadgen --trace "$run/capacity.trace" --router "$router" --deadline-ms 2000 --quiet \
  --max-in-flight 32 --csv "$run/capacity.csv" > /dev/null
capacity=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "sent_s") s = i; if ($i == "code") c = i }; next }
  $s >= 2 && $c == "OK" { ok++ } END { printf "%d", ok / 6 }' "$run/capacity.csv")
[ "$capacity" -ge 10 ] || fail "measured capacity $capacity requests/s: too small"
rate=$((capacity * 7 / 10))
echo "capacity $capacity requests/s; soaking at $rate/s (70 %) for $minutes min"
trace soak "$rate" 60

# "unix_s pid rss_kib fds threads" every 10 s.
( while true; do
    now=$(date +%s)
    for pid in $pids; do
      rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
      threads=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
      fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
      echo "$now $pid $rss $fds $threads"
    done
    sleep 10
  done ) > "$run/samples.txt" &
sampler=$!

t0=$(date +%s)
end=$((t0 + minutes * 60))
sent=0; ok=0; replays=0
while [ "$(date +%s)" -lt "$end" ]; do
  "$hlem" loadgen --trace "$run/soak.trace" --router "$router" --deadline-ms 2000 --quiet \
    --csv "$run/last.csv" > "$run/last.txt" || fail "loadgen: $(tail -3 "$run/last.txt")"
  n=$(sed -n 's/^every request recorded once: \([0-9]*\) sent or refused, \1 outcomes$/\1/p' "$run/last.txt")
  [ -n "$n" ] || fail "replay $replays: the books do not balance: $(cat "$run/last.txt")"
  k=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "code") c = i; next } $c == "OK"' "$run/last.csv" | wc -l)
  sent=$((sent + n)); ok=$((ok + k)); replays=$((replays + 1))
done
kill "$sampler"; sampler=
echo "$replays replays: $ok of $sent requests OK"

# Per process: first quarter after the warm-up against the last quarter.
warm=$((t0 + 120)); span=$(( (end - warm) / 4 ))
grew=0
printf "%-10s %22s %22s %14s %22s\n" process "RSS MiB first->last" "(max first->last)" "fds" "threads fewest (most)"
for pid in $pids; do
  name=$(awk -v p="$pid" '$3 == p {print $2}' "$run/cluster/cluster.state")
  read -r r1 r2 m1 m2 f1 f2 l1 l2 h1 h2 <<<"$(awk -v p="$pid" -v a="$warm" -v b="$((warm + span))" -v c="$((end - span))" '
    $2 != p { next }
    $1 >= a && $1 < b { n1++; r1 += $3; if ($3 > m1) m1 = $3; if ($4 > f1) f1 = $4; if ($5 > h1) h1 = $5; if (!l1 || $5 < l1) l1 = $5 }
    $1 >= c { n2++; r2 += $3; if ($3 > m2) m2 = $3; if ($4 > f2) f2 = $4; if ($5 > h2) h2 = $5; if (!l2 || $5 < l2) l2 = $5 }
    END { printf "%d %d %d %d %d %d %d %d %d %d", n1 ? r1 / n1 : 0, n2 ? r2 / n2 : 0, m1, m2, f1, f2, l1, l2, h1, h2 }' "$run/samples.txt")"
  [ "$r1" -gt 0 ] && [ "$r2" -gt 0 ] || fail "no samples of $name"
  printf "%-10s %10d -> %-9d %10d -> %-9d %5d -> %-6d %5d -> %-4d (%d -> %d)\n" "$name" $((r1 / 1024)) $((r2 / 1024)) \
    $((m1 / 1024)) $((m2 / 1024)) "$f1" "$f2" "$l1" "$l2" "$h1" "$h2"
  [ "$r2" -le $((r1 * 11 / 10 + 16384)) ] || { echo "GREW: $name RSS" >&2; grew=1; }
  [ "$f2" -le $((f1 + 4)) ] || { echo "GREW: $name file descriptors" >&2; grew=1; }
  [ "$l2" -le $((l1 + 4)) ] || { echo "GREW: $name threads" >&2; grew=1; }
done
[ "$grew" -eq 0 ] || exit 1
echo "PASS"
