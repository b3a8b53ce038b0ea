#!/usr/bin/env bash
# The README's main job: the `local` profile on loopback with a small HSTU, driven open-loop by
# the load generator from workload traces (the allocator joins in a later issue).
#   1. installs missing Debian packages, builds the runtime targets (Release),
#   2. `hlem cluster up`: 2 embedding shards (deploy/local/shards.yaml, replicated), 4 serving
#      nodes (deploy/local/node.yaml) and the router (KV/EMB/load-aware routing, ARCHITECTURE §6),
#      each a daemon with its log in out/local/,
#   3. checks rows read from the shards over UCX and gRPC byte for byte,
#   4. writes workload traces (deploy/local/workload.yaml: users with item locality, growing
#      histories, 100 candidates; a Steady and a Trend phase) and replays them through the router
#      with `hlem loadgen` (open loop, the trace's Poisson arrivals): latency P50/P90/P99 and SLO
#      satisfaction per 5 s window and overall, errors by code, KV reuse; the router's view and
#      each node's window statistics; between the two, α moves on every node,
#   5. `hlem cluster down` (also on Ctrl-C or failure), then runs the node benchmark (cold vs
#      returning users, cost split; docs/perf/node.md).
# Options: --quick (shorter traces, benchmark smoke pass), HLEM_JOBS=N (build parallelism),
# HLEM_BUILD_DIR=dir (default build-release).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    *) echo "run-local.sh: unknown argument '$arg' (allowed: --quick)" >&2; exit 2 ;;
  esac
done

jobs=${HLEM_JOBS:-$(nproc)}
build_dir=${HLEM_BUILD_DIR:-build-release}
run_dir=out/local
bash scripts/install-deps.sh
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHLEM_BUILD_TESTS=ON >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" --target embedding_shard serving_node router hlem node_benchmark

mkdir -p "$run_dir"
hlem="$build_dir/tools/hlem"
trap '"$hlem" cluster down --run-dir "$run_dir" >/dev/null 2>&1 || true' EXIT INT TERM
"$hlem" cluster down --run-dir "$run_dir" >/dev/null 2>&1 || true  # a previous run's leftovers

shards_config=deploy/local/shards.yaml
echo "== hlem cluster up: shards ($shards_config), 4 serving nodes (deploy/local/node.yaml), router"
"$hlem" cluster up --run-dir "$run_dir" --nodes 4 --bin-dir "$build_dir" \
  --shards-config "$shards_config" --node-config deploy/local/node.yaml
router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run_dir/cluster.state")"
nodes=($(awk '$1 == "node" {print "127.0.0.1:" $4}' "$run_dir/cluster.state"))
shard_list=$(awk '$1 == "shard" {print "127.0.0.1:" $4}' "$run_dir/cluster.state" | paste -sd,)
admins=()
for n in "${nodes[@]}"; do
  admins+=("127.0.0.1:$("$hlem" node info --server "$n" | sed -n 's/.*admin port \([0-9]*\).*/\1/p')")
done
"$hlem" node info --server "${nodes[0]}"

echo "== reading 100 000 Zipf rows through UCX and gRPC, verifying every byte"
for transport in ucx grpc; do
  "$hlem" shard fetch --config "$shards_config" --servers "$shard_list" \
    --transport "$transport" --mode auto --rows 100000 --batch 1024
done
sleep 1  # the router takes each node's residency snapshot
"$hlem" router state --server "$router"

seconds=120
[ "$quick" = 1 ] && seconds=30
workload=deploy/local/workload.yaml
echo "== workload traces ($workload): ${seconds} s Steady, ${seconds} s Trend (hot ratio 0.2 -> 0.5)"
for regime in steady trend; do
  "$hlem" workload generate --config "$workload" --regime "$regime" \
    --duration "${seconds}s" --seed 1 --out "$run_dir/$regime.trace"
done
"$hlem" workload stats "$run_dir/steady.trace"
replay() {  # replay REGIME: the trace through the router, then the router's and nodes' views
  "$hlem" loadgen --trace "$run_dir/$1.trace" --router "$router" --slo-ms 25 \
    --deadline-ms 2000 --csv "$run_dir/$1-requests.csv" --windows-csv "$run_dir/$1-windows.csv"
  "$hlem" router state --server "$router"
  sleep 5.5  # let a statistics window close
  for n in "${nodes[@]}"; do "$hlem" node state --server "$n" --windows 3; done
}
echo "== replaying Steady through the router (alpha 0.5); per-request CSV in $run_dir/"
replay steady
echo "== alpha 0.5 -> 0.3 on every node (metadata only; refill runs in the background)"
for a in "${admins[@]}"; do "$hlem" node set-alpha --admin "$a" --alpha 0.3 --epoch 1 --decision 1; done
echo "== replaying Trend through the router (alpha 0.3)"
replay trend
echo "== hlem cluster down"
"$hlem" cluster down --run-dir "$run_dir"

echo "== node benchmark (cold vs returning users, cost split; its own shard cluster)"
bench_args=()
[ "$quick" = 1 ] && bench_args+=(--smoke)
"$build_dir/bench/node_benchmark" "${bench_args[@]}"
echo "== done. Figures and how to read them: docs/perf/node.md; shard fetch benchmark:"
echo "   $build_dir/bench/shard_fetch_benchmark (docs/perf/embedding_shard.md)"
