#!/usr/bin/env bash
# Installs the Debian 12 packages HLEM needs to build, test and run. Idempotent: when every package
# is already installed it returns in well under a second without touching apt.
#   scripts/install-deps.sh               everything the README's two commands need (the tests'
#                                         toolchain too: clang, libFuzzer, promtool, Node.js, ...)
#   scripts/install-deps.sh --run         what building and running the binaries and the main job
#                                         need (its plots: gnuplot); no network beyond apt
#   scripts/install-deps.sh --build-only  only what compiling the binaries needs (container images)
set -euo pipefail

mode=all
case "${1:-}" in
  "") ;;
  --build-only) mode=build ;;
  --run) mode=run ;;
  *) echo "install-deps: unknown argument '$1' (--run, --build-only or nothing)" >&2; exit 2 ;;
esac

packages=(
  cmake ninja-build g++ pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libucx-dev ucx-utils prometheus-cpp-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libeigen3-dev
  libtorch-dev libopenblas0-openmp
  libglpk-dev libxgboost-dev
)
[ "$mode" != build ] && packages+=(gnuplot-nox)
if [ "$mode" = all ]; then
  packages+=(
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

# As root apt runs directly; otherwise through sudo (env: sudo drops DEBIAN_FRONTEND otherwise).
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  if [ ${#sudo_cmd[@]} -gt 0 ] && ! command -v sudo >/dev/null; then
    echo "install-deps: not root and no sudo: install these as root first: ${missing[*]}" >&2
    exit 1
  fi
  ${sudo_cmd[@]+"${sudo_cmd[@]}"} apt-get update -o DPkg::Lock::Timeout=300
  ${sudo_cmd[@]+"${sudo_cmd[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y \
    --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi

# The schema checks' npm packages (deploy/tests/package-lock.json), into deploy/tests/node_modules.
if [ "$mode" = all ]; then
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
  if [ "$current" != "$openblas" ] && { [ ${#sudo_cmd[@]} -eq 0 ] || command -v sudo >/dev/null; }; then
    ${sudo_cmd[@]+"${sudo_cmd[@]}"} update-alternatives --set libblas.so.3-x86_64-linux-gnu "$openblas" || true
  fi
fi
