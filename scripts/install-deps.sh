#!/usr/bin/env bash
# Installs the Debian 12 packages HLEM needs to build, test and run. Idempotent: when every package
# is already installed it returns in well under a second without touching apt.
#   scripts/install-deps.sh               everything the README's two commands need
#   scripts/install-deps.sh --build-only  only what compiling the binaries needs (container images)
set -euo pipefail

build_only=0
case "${1:-}" in
  "") ;;
  --build-only) build_only=1 ;;
  *) echo "install-deps: unknown argument '$1' (--build-only or nothing)" >&2; exit 2 ;;
esac

packages=(
  cmake ninja-build g++ pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libucx-dev ucx-utils prometheus-cpp-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libeigen3-dev
  libtorch-dev libopenblas0-openmp
  libglpk-dev libxgboost-dev
)
if [ "$build_only" = 0 ]; then
  packages+=(
    gnuplot-nox
    clang-format-14 clang-14 libclang-rt-14-dev libfuzzer-14-dev
    # deploy/ checks (tests/deploy): promtool and a Prometheus server, yamllint
    prometheus yamllint
    # the end-to-end tests read the services' /metrics (tests/e2e/allocator_test.sh)
    curl
  )
  # Node.js runs the manifests' schema checks; a machine that has it from elsewhere keeps its own
  # (Debian's npm would conflict with a Node.js that bundles npm).
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -o DPkg::Lock::Timeout=300
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends \
    -o DPkg::Lock::Timeout=300 "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi

# The schema checks' npm packages (deploy/tests/package-lock.json), into deploy/tests/node_modules.
if [ "$build_only" = 0 ]; then
  tests_dir="$(cd "$(dirname "$0")/.." && pwd)/deploy/tests"
  installed="$tests_dir/node_modules/.package-lock.json"  # npm writes it on every install
  if [ ! -f "$installed" ] || [ "$tests_dir/package-lock.json" -nt "$installed" ]; then
    echo "install-deps: npm ci in deploy/tests"
    npm ci --prefix "$tests_dir" --no-audit --no-fund --loglevel=error
  fi
fi

# libtorch is 40x slower on the reference BLAS; make OpenBLAS (openmp) the provider when present.
openblas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
if [ -e "$openblas" ] && command -v update-alternatives >/dev/null; then
  current=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}')
  if [ "$current" != "$openblas" ]; then
    ${sudo_cmd[@]+"${sudo_cmd[@]}"} update-alternatives --set libblas.so.3-x86_64-linux-gnu "$openblas" || true
  fi
fi
