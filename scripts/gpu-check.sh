#!/usr/bin/env bash
# GPU checks in one call, for a GPU host (the team's lent H200, or any CUDA machine): builds the
# CUDA-only part of the `cuda` device on its own (CUDA toolkit, CMake and a C++ compiler; no Debian
# packages), runs its self-check against the host reference, then measures the device's costs for
# the simulator into sim/costs/<device>.csv (also copied to $OUT when that is set), then checks the
# paged HSTU attention kernel against its host reference and times it (hlem_cuda_attention), then
# checks the CUDA HSTU runner's scores against the libtorch runner's (fixtures in the bundle),
# times its layers and fits the twin's model-step cost to them (sim/costs/<device>-model.csv;
# hlem_cuda_model).
#
#   scripts/gpu-check.sh [--quick] [--tests DIR]
#     --quick      shorter measurements (about 1 minute)
#     --tests DIR  also run the main tree's GPU tests from a bundle made by --bundle (they need
#                  Debian's libraries, which a bare GPU host lacks: the bundle carries them)
#   scripts/gpu-check.sh --bundle BUILD DIR
#     on the build machine: builds the GPU tests (cuda_device_test) in BUILD, a configured main
#     tree, and copies them with every shared library they load except the C library's into DIR
#     (DIR/bin, DIR/lib), the GPU benchmarks likewise (gpu_node_benchmark, DIR/bench), and writes
#     HSTU fixtures from the libtorch runner (DIR/fixtures), for a GPU host to run with --tests DIR
#
# Env: CUDA_ARCH (default 90: H100/H200; 80 for A100), HLEM_GPU_BUILD (default build-gpu).
# Exit: 0 all passed, 1 a check failed, 77 no CUDA device visible.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${HLEM_GPU_BUILD:-$root/build-gpu}
arch=${CUDA_ARCH:-90}
gpu_tests=(cuda_device_test)
gpu_benchmarks=(gpu_node_benchmark)
quick=()
tests=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --tests) tests=${2:?--tests needs a directory}; shift ;;
    --bundle)
      main_build=${2:?--bundle needs a build directory}
      bundle=${3:?--bundle needs an output directory}
      cmake --build "$main_build" --target "${gpu_tests[@]}" "${gpu_benchmarks[@]}"
      rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/bench" "$bundle/lib"
      for t in "${gpu_tests[@]}" "${gpu_benchmarks[@]}"; do
        binary=$(find "$main_build" -type f -name "$t" -perm -u+x | head -1)
        [ -n "$binary" ] || { echo "gpu-check: $t not built in $main_build" >&2; exit 1; }
        dir=bin
        [[ " ${gpu_benchmarks[*]} " == *" $t "* ]] && dir=bench
        strip -o "$bundle/$dir/$t" "$binary"
        # The CUDA toolkit's own libraries (cuBLAS is 600 MB) are on the GPU host already.
        ldd "$binary" | awk '$3 ~ /^\// {print $3}' |
          grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/usr/local/cuda' |
          while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
      done
      # HSTU fixtures from the libtorch runner (fresh seeds each bundle): hlem_cuda_model checks
      # the CUDA runner's scores against them.
      cmake --build "$main_build" --target hlem_hstu_fixture
      fixture_tool=$(find "$main_build" -type f -name hlem_hstu_fixture -perm -u+x | head -1)
      mkdir -p "$bundle/fixtures"
      seed=$(( $(date +%s) % 1000000 ))
      for preset in small paper; do
        "$fixture_tool" --preset "$preset" --seed "$seed" --out "$bundle/fixtures/$preset.bin"
      done
      echo "gpu-check: bundle in $bundle ($(du -sh "$bundle" | cut -f1)): ${gpu_tests[*]} ${gpu_benchmarks[*]}"
      exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (known: --quick, --tests DIR, --bundle BUILD DIR)" >&2
       exit 2 ;;
  esac
  shift
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

if [ -n "$tests" ]; then
  echo "== main-tree GPU tests ($tests) =="
  cuda_root=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
  cuda_lib=$cuda_root/lib64:$cuda_root/lib:$cuda_root/targets/x86_64-linux/lib
  for t in "$tests"/bin/*; do
    # A hang must not eat the lease: each test binary gets 3 minutes.
    LD_LIBRARY_PATH="$tests/lib:$cuda_lib" timeout 180 "$t" || rc=1
  done
fi

echo "== costs =="
mkdir -p "$root/sim/costs"
"$build/hlem_cuda_costs" --out "$root/sim/costs" "${quick[@]}" || rc=1
echo "== paged HSTU attention =="
"$build/hlem_cuda_attention" "${quick[@]}" || rc=1
echo "== HSTU model (CUDA runner) =="
fixtures=()
[ -n "$tests" ] && [ -d "$tests/fixtures" ] && fixtures=("$tests"/fixtures/*.bin)
"$build/hlem_cuda_model" "${quick[@]}" --costs-out "$root/sim/costs" "${fixtures[@]}" || rc=1
if [ -n "$tests" ] && [ -d "$tests/bench" ]; then
  echo "== a whole serving node on the GPU (gpu_node_benchmark) =="
  requests=15
  [ ${#quick[@]} -gt 0 ] && requests=5
  for b in "$tests"/bench/*; do
    LD_LIBRARY_PATH="$tests/lib:$cuda_lib" timeout 300 "$b" --requests "$requests" \
      --costs-out "$root/sim/costs" || rc=1
  done
  if [ -x "$tests/bench/gpu_node_benchmark" ]; then
    echo "== the same requests on the cpu device with no model: the host's own work here =="
    LD_LIBRARY_PATH="$tests/lib:$cuda_lib" timeout 300 "$tests/bench/gpu_node_benchmark" \
      --device cpu --requests "$requests" || rc=1
  fi
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$root"/sim/costs/*.csv "$OUT"/ 2>/dev/null || true
fi

echo "gpu-check: $( [ "$rc" -eq 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - start )) s"
exit "$rc"
