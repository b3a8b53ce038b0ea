#!/usr/bin/env bash
# The static-α sweep of the `local` profile (issue 6, docs/calibration.md): for each α on a grid,
# a fresh local cluster (hlem cluster up), α pushed to every node, the same workload trace
# replayed through the router (hlem loadgen), the overall P50/P99, SLO satisfaction and KV reuse
# recorded, the cluster stopped. Prints a table and writes out/sweep/<regime>.csv.
# Usage: scripts/alpha-sweep.sh [--regime steady|trend|burst] [--seconds 120] [--alphas "0.1 0.3 0.5"]
#        [--slo-ms 25] [--nodes 4] [--warmup-s 30]   HLEM_BUILD_DIR=dir (default build-release)
# The trace runs warmup + seconds; the first warmup seconds (caches filling from empty) are left
# out of the overall figures.
# Run it on an otherwise idle machine: the figures are latencies. Each run also leaves
# <regime>-alpha<A>.cpu: CPU seconds per process (the cluster's and the load generator's), which
# `hlem sim fit --cpu` reads.
set -euo pipefail
cd "$(dirname "$0")/.."

regime=steady seconds=120 alphas="0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9" slo_ms=25 nodes=4 warmup=30
while [ $# -gt 0 ]; do
  case "$1" in
    --regime) regime=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --alphas) alphas=$2; shift 2 ;;
    --slo-ms) slo_ms=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --warmup-s) warmup=$2; shift 2 ;;
    *) echo "alpha-sweep.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$regime" in steady|trend|burst) ;; *) echo "alpha-sweep.sh: --regime: steady|trend|burst" >&2; exit 2 ;; esac

build_dir=${HLEM_BUILD_DIR:-build-release}
hlem="$build_dir/tools/hlem"
for b in "$hlem" "$build_dir/serving_node/serving_node" "$build_dir/router/router" \
         "$build_dir/embedding_shard/embedding_shard"; do
  [ -x "$b" ] || { echo "alpha-sweep.sh: $b missing: build first (scripts/run-local.sh builds them)" >&2; exit 2; }
done
out=out/sweep
run="$out/cluster"
mkdir -p "$out"
trap '"$hlem" cluster down --run-dir "$run" >/dev/null 2>&1 || true' EXIT INT TERM

trace="$out/$regime.trace"
"$hlem" workload generate --config deploy/local/workload.yaml --regime "$regime" \
  --duration "$((seconds + warmup))s" --seed 1 --out "$trace"
csv="$out/$regime.csv"
echo "alpha,requests,ok,p50_ms,p90_ms,p99_ms,slo_satisfaction_pct,kv_reuse_pct" >"$csv"
printf "%6s %9s %9s %9s %9s %8s %8s\n" alpha requests p50_ms p90_ms p99_ms slo_% kv_%
for alpha in $alphas; do
  "$hlem" cluster up --run-dir "$run" --nodes "$nodes" --bin-dir "$build_dir" \
    --shards-config deploy/local/shards.yaml --node-config deploy/local/node.yaml >/dev/null
  router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run/cluster.state")"
  for n in $(awk '$1 == "node" {print "127.0.0.1:" $4}' "$run/cluster.state"); do
    admin="127.0.0.1:$("$hlem" node info --server "$n" | sed -n 's/.*admin port \([0-9]*\).*/\1/p')"
    "$hlem" node set-alpha --admin "$admin" --alpha "$alpha" --epoch 1 --decision 1 >/dev/null
  done
  sleep 1  # the router's residency snapshots
  report="$out/$regime-alpha$alpha.txt"
  loadgen_cpu=$( { TIMEFORMAT='%3U %3S'; time "$hlem" loadgen --trace "$trace" --router "$router" \
    --slo-ms "$slo_ms" --warmup-s "$warmup" --quiet --windows-csv "$out/$regime-alpha$alpha-windows.csv" \
    --csv "$out/$regime-alpha$alpha.csv" >"$report"; } 2>&1 | tail -n 1)
  # CPU seconds (user + system) of every process over the run, for the twin's cost fit.
  {
    echo "process cpu_s"
    awk '{print $2, $3}' "$run/cluster.state" | while read -r name pid; do
      awk -v n="$name" -v hz="$(getconf CLK_TCK)" '{printf "%s %.3f\n", n, ($14 + $15) / hz}' "/proc/$pid/stat"
    done
    echo "$loadgen_cpu" | awk '{printf "loadgen %.3f\n", $1 + $2}'
  } >"$out/$regime-alpha$alpha.cpu"
  "$hlem" cluster down --run-dir "$run" >/dev/null
  requests=$(awk '/^requests/ {gsub(",", "", $2); print $2}' "$report")
  ok=$(awk '/^requests/ {print $4}' "$report")
  read -r p50 p90 p99 < <(awk '/^latency of OK answers/ {print $6, $9, $12}' "$report")
  slo=$(awk '/satisfied:/ {print $5}' "$report")
  kv=$(awk '/^KV reuse/ {print $3}' "$report")
  printf "%6s %9s %9s %9s %9s %8s %8s\n" "$alpha" "$requests" "$p50" "$p90" "$p99" "$slo" "$kv"
  echo "$alpha,$requests,$ok,$p50,$p90,$p99,$slo,$kv" >>"$csv"
done
echo "written: $csv (per-window CSV and reports beside it)"
