#!/usr/bin/env bash
# ASan + UBSan for the service shells (issue 11): the gRPC code that the test command's sanitizer
# stages leave out (they build the core libraries only, to fit CI's time). Builds the whole tree
# under clang-14 (the fuzz-services preset: ASan, UBSan, libFuzzer coverage in every library),
# runs the service tests that do not need libtorch (libtorch 1.13's headers do not compile under
# clang-14 in C++20: docs/reliability.md), then fuzzes every target built there for SECONDS each.
# Then the libtorch targets (the node's service with its HSTU model, the model's tests, the
# libtorch fuzz targets' corpora) under gcc's ASan + UBSan (the asan-torch preset): gcc compiles
# libtorch's headers; libtorch itself is not instrumented.
# Run before each release; not in CI (about 30 minutes on 2 cores from scratch).
# Usage: scripts/asan-services.sh [seconds per fuzz target (60)]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
tests=(common_grpc_server_test common_grpc_security_test common_grpc_status_test
  common_shutdown_signal_test router_service_test allocator_service_test loadgen_test)
cmake --preset fuzz-services > /dev/null
cmake --build --preset fuzz-services
cmake --build build-fuzz-services --target "${tests[@]}"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pattern=$(IFS='|'; echo "${tests[*]}")
ctest --test-dir build-fuzz-services --output-on-failure --no-tests=error -R "^(${pattern})\$"
scripts/fuzz.sh build-fuzz-services "$seconds"
torch_tests=(serving_model_test serving_service_test hstu_weights_fuzz infer_request_fuzz)
cmake --preset asan-torch > /dev/null
cmake --build --preset asan-torch
pattern=$(IFS='|'; echo "${torch_tests[*]}")
ctest --test-dir build-asan-torch --output-on-failure --no-tests=error -R "^(${pattern})\$"
