#!/usr/bin/env bash
# ThreadSanitizer for the service shells (issue 11): the gRPC code (async completion queues, the
# servers' handler threads, shutdown) that the test command's TSan stage leaves out (it builds the
# core libraries only). Builds the tests below under gcc's TSan (the tsan-services preset) with
# cmake/tsan_annotations preloaded into every test: it shows TSan the locking inside Debian's
# uninstrumented absl (ours and gRPC's) and the hand-offs of gRPC's completion queues (a tag from
# the thread that starts an operation to the thread that sees it complete). Races inside the
# uninstrumented libraries themselves (libgrpc, libabsl, libprotobuf) are not checked:
# cmake/tsan_annotations/suppressions.txt names them. Reports from every process (the integration
# tests start shards, nodes and a router, which inherit the preload) are written to files and
# printed at the end; any report fails the run.
# Run before each release; not in CI (the tests take about 3 minutes on 2 cores; the build is the
# whole tree under TSan).
# Usage: scripts/tsan-services.sh [build dir (build-tsan-services)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-tsan-services}
tests=(common_grpc_server_test common_grpc_security_test common_grpc_status_test
  common_shutdown_signal_test router_service_test allocator_service_test loadgen_test
  serving_service_test shard_integration_test node_pipeline_integration_test
  node_service_integration_test router_integration_test)
cmake --preset tsan-services -B "$build" > /dev/null
cmake --build "$build" --target tsan_absl_probe tsan_grpc_probe "${tests[@]}"
# The probes first: silent on hand-offs through locks and gRPC, a report for each real race.
ctest --test-dir "$build" --output-on-failure --no-tests=error -L tsan
# UCX's memory hooks (libucm) patch madvise and mmap; a thread that exits runs them after TSan
# has let go of it, and the process crashes. UCX works without them (no registration cache).
export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=0"
TSAN_OPTIONS+=":suppressions=$PWD/cmake/tsan_annotations/suppressions.txt"
pattern=$(IFS='|'; echo "${tests[*]}")
status=0
ctest --test-dir "$build" --output-on-failure --no-tests=error -R "^(${pattern})\$" || status=$?
found=0
for f in "$reports"/tsan.*; do
  [[ -e $f ]] || continue
  found=$((found + 1))
  echo "=== $f"
  cat "$f"
done
if ((found > 0)); then
  echo "tsan-services: $found process(es) reported (above)" >&2
  exit 1
fi
if ((status != 0)); then
  echo "tsan-services: tests failed (no TSan reports)" >&2
  exit "$status"
fi
echo "tsan-services: ${#tests[@]} test programs, no TSan reports"
