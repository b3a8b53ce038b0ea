#!/usr/bin/env bash
# The README's main job: a local HLEM cluster on synthetic data with a small HSTU behind the
# router, driven by a synthetic closed-loop workload (the allocator and the full load generator
# join in later issues).
#   1. installs missing Debian packages, builds the runtime targets (Release),
#   2. starts the `local` shard cluster (deploy/local/shards.yaml: 2 shards, replicated) and checks
#      rows read over UCX and gRPC byte for byte,
#   3. starts 2 serving nodes (deploy/local/node.yaml) on OS-chosen loopback ports,
#   4. starts the router in front of them (KV/EMB/load-aware routing, ARCHITECTURE §6),
#   5. drives the router with returning users whose histories grow (`hlem node drive --router`:
#      Zipf users and items, 64 candidates) and prints client latency and SLO figures, where the
#      router sent them and why, the router's view and each node's window statistics; then moves
#      α on both nodes and drives again,
#   6. runs the node benchmark (cold vs returning users, cost split; docs/perf/node.md),
#   7. stops everything (also on Ctrl-C or failure).
# Options: --quick (fewer requests, benchmark smoke pass), HLEM_JOBS=N (build parallelism).
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
build_dir=build-release
run_dir=out/local
bash scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHLEM_BUILD_TESTS=ON >/dev/null
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

requests=6000
[ "$quick" = 1 ] && requests=1000
drive() {
  "$build_dir/tools/hlem" node drive --router "$router" --servers "$node_list" --users 3000 \
    --requests "$requests" --concurrency 2 --first-events 64 --new-events 8 --candidates 64 \
    --slo-ms 50 --seed "$1"
  "$build_dir/tools/hlem" router state --server "$router"
  sleep 5.5  # let a statistics window close
  for n in "${nodes[@]}"; do "$build_dir/tools/hlem" node state --server "$n" --windows 3; done
}
echo "== driving the router: $requests requests, 3000 users (Zipf 1.0), alpha 0.5"
drive 1
echo "== alpha 0.5 -> 0.3 on both nodes (metadata only; refill runs in the background)"
for a in "${admins[@]}"; do "$build_dir/tools/hlem" node set-alpha --admin "$a" --alpha 0.3 --epoch 1 --decision 1; done
drive 2
stop_all

echo "== node benchmark (cold vs returning users, cost split; its own shard cluster)"
bench_args=()
[ "$quick" = 1 ] && bench_args+=(--smoke)
"$build_dir/bench/node_benchmark" "${bench_args[@]}"
echo "== done. Figures and how to read them: docs/perf/node.md; shard fetch benchmark:"
echo "   $build_dir/bench/shard_fetch_benchmark (docs/perf/embedding_shard.md)"
