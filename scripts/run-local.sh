#!/usr/bin/env bash
# The README's main job (for now: the embedding-shard cluster; later issues grow it into the full
# local HLEM cluster driven by the load generator).
#   1. installs missing Debian packages, builds the runtime targets (Release),
#   2. starts the `local` shard cluster (deploy/local/shards.yaml: 2 shards, replicated) on
#      OS-chosen loopback ports,
#   3. reads Zipf-distributed rows through every data path (UCX get / gather / mapped, gRPC),
#      checking every byte against the generator, and prints the rates,
#   4. runs the fetch benchmark (1 GiB tables, UCX vs gRPC vs a local in-process gather),
#   5. stops the cluster (also on Ctrl-C or failure).
# Options: --quick (smaller benchmark), HLEM_JOBS=N (build parallelism).
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
cmake --build "$build_dir" -j "$jobs" --target embedding_shard hlem shard_fetch_benchmark

mkdir -p "$run_dir"
pids=()
stop_cluster() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
trap stop_cluster EXIT INT TERM

config=deploy/local/shards.yaml
num_shards=$(awk '/num_shards:/ {print $2; exit}' "$config")
echo "== starting ${num_shards} embedding shards ($config); logs in $run_dir/"
for ((i = 0; i < num_shards; i++)); do
  rm -f "$run_dir/shard$i.ports"
  "$build_dir/embedding_shard/embedding_shard" --config "$config" --shard-index "$i" \
    --ports-file "$run_dir/shard$i.ports" >"$run_dir/shard$i.log" 2>&1 &
  pids+=($!)
done
servers=()
for ((i = 0; i < num_shards; i++)); do
  for _ in $(seq 1 600); do
    [ -s "$run_dir/shard$i.ports" ] && break
    kill -0 "${pids[$i]}" 2>/dev/null || { echo "shard $i exited; see $run_dir/shard$i.log" >&2; exit 1; }
    sleep 0.1
  done
  port=$(awk -F= '/^grpc=/ {print $2}' "$run_dir/shard$i.ports")
  [ -n "$port" ] || { echo "shard $i did not start; see $run_dir/shard$i.log" >&2; exit 1; }
  servers+=("127.0.0.1:$port")
  echo "   shard $i serving on ${servers[-1]} (metrics: $(awk -F= '/^metrics=/ {print $2}' "$run_dir/shard$i.ports"))"
done
server_list=$(IFS=,; echo "${servers[*]}")

echo "== reading 500 000 Zipf rows (1 024 per batch) through each data path, verifying every byte"
for path in "ucx get" "ucx gather" "ucx mapped" "ucx auto" "grpc auto"; do
  set -- $path
  "$build_dir/tools/hlem" shard fetch --config "$config" --servers "$server_list" \
    --transport "$1" --mode "$2" --rows 500000 --batch 1024
done
stop_cluster

echo "== fetch benchmark (its own single-shard cluster with 1 GiB tables; a few minutes)"
bench_args=()
[ "$quick" = 1 ] && bench_args+=(--smoke)
"$build_dir/bench/shard_fetch_benchmark" "${bench_args[@]}"
echo "== done. Figures and how to read them: docs/perf/embedding_shard.md"
