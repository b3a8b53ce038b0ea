#!/usr/bin/env bash
# GPU checks in one call, for a GPU host (the team's lent H200, or any CUDA machine): builds the
# CUDA-only part of the `cuda` device on its own (CUDA toolkit, CMake and a C++ compiler; no Debian
# packages), runs its self-check against the host reference, then measures the device's costs for
# the simulator into sim/costs/<device>.csv (also copied to $OUT when that is set).
#
#   scripts/gpu-check.sh [--quick]      # --quick: shorter measurements (about 1 minute)
#
# Env: CUDA_ARCH (default 90: H100/H200; 80 for A100), HLEM_GPU_BUILD (default build-gpu).
# Exit: 0 all passed, 1 a check failed, 77 no CUDA device visible.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${HLEM_GPU_BUILD:-$root/build-gpu}
arch=${CUDA_ARCH:-90}
quick=()
for a in "$@"; do
  case "$a" in
    --quick) quick=(--quick) ;;
    *) echo "gpu-check: unknown argument '$a' (known: --quick)" >&2; exit 2 ;;
  esac
done

export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found (CUDA toolkit under /usr/local/cuda?)" >&2; exit 1; }
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

start=$(date +%s)
echo "== build (sm_$arch) =="
cmake -S "$root/serving_node/device/cuda" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "build: $(( $(date +%s) - start )) s"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== self-check =="
rc=0
"$build/hlem_cuda_check" || rc=$?
if [ "$rc" -eq 77 ]; then
  echo "gpu-check: no CUDA device visible; nothing measured" >&2
  exit 77
fi

echo "== costs =="
mkdir -p "$root/sim/costs"
"$build/hlem_cuda_costs" --out "$root/sim/costs" "${quick[@]}" || rc=1
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$root"/sim/costs/*.csv "$OUT"/ 2>/dev/null || true
fi
echo "gpu-check: $( [ "$rc" -eq 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - start )) s"
exit "$rc"
