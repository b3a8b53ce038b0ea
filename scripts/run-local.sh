#!/usr/bin/env bash
# The README's main job: a local HLEM cluster on synthetic data with a small HSTU behind the
# router, driven open-loop by the load generator from a workload trace (the allocator joins in a
# later issue).
#   1. installs missing Debian packages, builds the runtime targets (Release),
#   2. starts the `local` shard cluster (deploy/local/shards.yaml: 2 shards, replicated) and checks
#      rows read over UCX and gRPC byte for byte,
#   3. starts 2 serving nodes (deploy/local/node.yaml) on OS-chosen loopback ports,
#   4. starts the router in front of them (KV/EMB/load-aware routing, ARCHITECTURE §6),
#   5. writes workload traces (deploy/local/workload.yaml: users with item locality, growing
#      histories, 100 candidates; a Steady and a Trend phase) and replays them through the router
#      with `hlem loadgen` (open loop, the trace's Poisson arrivals): latency P50/P90/P99 and SLO
#      satisfaction per 5 s window and overall, errors by code, KV reuse; the router's view and
#      each node's window statistics; between the two, α moves on both nodes,
#   6. runs the node benchmark (cold vs returning users, cost split; docs/perf/node.md),
#   7. stops everything (also on Ctrl-C or failure).
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
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT INT TERM

# wait_port NAME PID KEY: the port a server wrote to $run_dir/NAME.ports.
wait_port() {
  local name=$1 pid=$2 key=$3
  for _ in $(seq 1 1200); do
    [ -s "$run_dir/$name.ports" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "$name exited; see $run_dir/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  local port
  port=$(awk -F= -v k="$key" '$1 == k {print $2}' "$run_dir/$name.ports")
  [ -n "$port" ] || { echo "$name did not start; see $run_dir/$name.log" >&2; exit 1; }
  echo "$port"
}

shards_config=deploy/local/shards.yaml
node_config=deploy/local/node.yaml
num_shards=$(awk '/num_shards:/ {print $2; exit}' "$shards_config")
echo "== starting ${num_shards} embedding shards ($shards_config); logs in $run_dir/"
for ((i = 0; i < num_shards; i++)); do
  rm -f "$run_dir/shard$i.ports"
  "$build_dir/embedding_shard/embedding_shard" --config "$shards_config" --shard-index "$i" \
    --ports-file "$run_dir/shard$i.ports" >"$run_dir/shard$i.log" 2>&1 &
  pids+=($!)
done
servers=()
for ((i = 0; i < num_shards; i++)); do
  port=$(wait_port "shard$i" "${pids[$i]}" grpc)
  servers+=("127.0.0.1:$port")
  echo "   shard $i serving on ${servers[-1]}"
done
shard_list=$(IFS=,; echo "${servers[*]}")

echo "== reading 100 000 Zipf rows through UCX and gRPC, verifying every byte"
for path in "ucx auto" "grpc auto"; do
  set -- $path
  "$build_dir/tools/hlem" shard fetch --config "$shards_config" --servers "$shard_list" \
    --transport "$1" --mode "$2" --rows 100000 --batch 1024
done

echo "== starting 2 serving nodes ($node_config)"
nodes=()
admins=()
for i in 0 1; do
  rm -f "$run_dir/node$i.ports"
  "$build_dir/serving_node/serving_node" --config "$node_config" --node-id "node-$i" \
    --shard-servers "$shard_list" --ports-file "$run_dir/node$i.ports" \
    >"$run_dir/node$i.log" 2>&1 &
  pids+=($!)
  port=$(wait_port "node$i" "${pids[-1]}" grpc)
  admin=$(wait_port "node$i" "${pids[-1]}" admin)
  nodes+=("127.0.0.1:$port")
  admins+=("127.0.0.1:$admin")
  echo "   node-$i serving on ${nodes[-1]} (admin ${admins[-1]}, metrics $(awk -F= '$1 == "metrics" {print $2}' "$run_dir/node$i.ports"))"
done
node_list=$(IFS=,; echo "${nodes[*]}")
"$build_dir/tools/hlem" node info --server "${nodes[0]}"

echo "== starting the router in front of both nodes"
rm -f "$run_dir/router.ports"
"$build_dir/router/router" --nodes "$node_list" --ports-file "$run_dir/router.ports" \
  >"$run_dir/router.log" 2>&1 &
pids+=($!)
router="127.0.0.1:$(wait_port router "${pids[-1]}" grpc)"
echo "   router serving on $router"
sleep 1  # the router takes each node's residency snapshot
"$build_dir/tools/hlem" router state --server "$router"

seconds=120
[ "$quick" = 1 ] && seconds=30
workload=deploy/local/workload.yaml
echo "== workload traces ($workload): ${seconds} s Steady, ${seconds} s Trend (hot ratio 0.2 -> 0.5)"
for regime in steady trend; do
  "$build_dir/tools/hlem" workload generate --config "$workload" --regime "$regime" \
    --duration "${seconds}s" --seed 1 --out "$run_dir/$regime.trace"
done
"$build_dir/tools/hlem" workload stats "$run_dir/steady.trace"
replay() {  # replay REGIME: the trace through the router, then the router's and nodes' views
  "$build_dir/tools/hlem" loadgen --trace "$run_dir/$1.trace" --router "$router" --slo-ms 50 \
    --deadline-ms 2000 --csv "$run_dir/$1-requests.csv" --windows-csv "$run_dir/$1-windows.csv"
  "$build_dir/tools/hlem" router state --server "$router"
  sleep 5.5  # let a statistics window close
  for n in "${nodes[@]}"; do "$build_dir/tools/hlem" node state --server "$n" --windows 3; done
}
echo "== replaying Steady through the router (alpha 0.5); per-request CSV in $run_dir/"
replay steady
echo "== alpha 0.5 -> 0.3 on both nodes (metadata only; refill runs in the background)"
for a in "${admins[@]}"; do "$build_dir/tools/hlem" node set-alpha --admin "$a" --alpha 0.3 --epoch 1 --decision 1; done
echo "== replaying Trend through the router (alpha 0.3)"
replay trend
stop_all

echo "== node benchmark (cold vs returning users, cost split; its own shard cluster)"
bench_args=()
[ "$quick" = 1 ] && bench_args+=(--smoke)
"$build_dir/bench/node_benchmark" "${bench_args[@]}"
echo "== done. Figures and how to read them: docs/perf/node.md; shard fetch benchmark:"
echo "   $build_dir/bench/shard_fetch_benchmark (docs/perf/embedding_shard.md)"
