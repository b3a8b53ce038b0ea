#!/usr/bin/env bash
# The README's main job: the `local` profile on loopback (real processes, small HSTU on the CPU)
# driven open-loop by the load generator through a Steady → Trend → Burst trace, once with the
# oracle static α and once with HLEM's SmartAllocator, both behind the KV–EMB-aware router (as
# in `hlem eval e2e`), side by side.
#   1. installs missing Debian packages, builds the runtime targets (Release),
#   2. writes the trace (deploy/local/workload.yaml, every phase shortened to --phase-s, after a
#      Steady warm-up of --warmup-s that both runs leave out: the caches fill and the
#      SmartAllocator, which starts at α 0.5 and moves at most 0.06 a window, settles),
#   3. picks the oracle static α: the best static α in hindsight on this trace, found in the
#      digital twin fitted to a local cluster (hlem sim sweep; sim/costs/cpu-local-cluster.yaml)
#      on a 0.05 grid (0.1 with --quick; the evaluation uses 0.02, ARCHITECTURE §8),
#   4. `hlem cluster up` with the allocator holding that α on every node (static), replays the
#      trace (progress bar), `hlem cluster down`,
#   5. the same with the allocator's SmartAllocator (allocator_service/policies/ppo-local.mlp),
#   6. prints P99, SLO satisfaction and throughput per phase for both runs, plots per-window P99
#      (out/local/main-job.png) and says where everything is.
# The cluster is stopped on exit, Ctrl-C or failure.
# Options: --quick (30 s phases and warm-up; CI runs it), --phase-s N (default 50), --warmup-s N
#   (default 40), --seed N (default 7), --hlem-arg FLAG (repeatable: passed to the HLEM run's
#   allocator, e.g. --hlem-arg=--deadband=0),
#   HLEM_JOBS=N (build parallelism), HLEM_BUILD_DIR=dir (default build-release; CI passes its own).
set -euo pipefail
cd "$(dirname "$0")/.."

phase_s=50 warmup_s=40 seed=7 grid=0.05
hlem_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) phase_s=30 warmup_s=30 grid=0.1; shift ;;
    --hlem-arg=*) hlem_args+=("--allocator-arg=${1#--hlem-arg=}"); shift ;;
    --hlem-arg)
      [ $# -ge 2 ] || { echo "run-local.sh: $1 needs a value" >&2; exit 2; }
      hlem_args+=("--allocator-arg=$2"); shift 2 ;;
    --phase-s|--warmup-s|--seed)
      [ $# -ge 2 ] || { echo "run-local.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in --phase-s) phase_s=$2 ;; --warmup-s) warmup_s=$2 ;; *) seed=$2 ;; esac
      shift 2 ;;
    *) echo "run-local.sh: unknown argument '$1' (allowed: --quick, --phase-s N, --warmup-s N, --seed N, --hlem-arg FLAG)" >&2
       exit 2 ;;
  esac
done
[[ "$phase_s" =~ ^[1-9][0-9]*$ ]] || { echo "run-local.sh: --phase-s '$phase_s' is not a whole number of seconds" >&2; exit 2; }
[[ "$warmup_s" =~ ^[0-9]+$ ]] || { echo "run-local.sh: --warmup-s '$warmup_s' is not a whole number of seconds" >&2; exit 2; }
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "run-local.sh: --seed '$seed' is not a number" >&2; exit 2; }

jobs=${HLEM_JOBS:-$(nproc)}
build_dir=${HLEM_BUILD_DIR:-build-release}
run_dir=out/local
workload=deploy/local/workload.yaml
weights=allocator_service/policies/ppo-local.mlp
slo_ms=25  # deploy/local/node.yaml's SLO (docs/calibration.md)
start=$SECONDS

bash scripts/install-deps.sh --run
# build.ninja, not CMakeCache.txt: cmake writes the cache also when configuring fails.
if [ ! -f "$build_dir/build.ninja" ]; then
  # a unity build: ~40 % less compile time on a fresh machine (docs/build.md)
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" --target embedding_shard serving_node router allocator hlem

mkdir -p "$run_dir"
hlem="$build_dir/tools/hlem"
trap '"$hlem" cluster down --run-dir "$run_dir" >/dev/null 2>&1 || true' EXIT INT TERM
"$hlem" cluster down --run-dir "$run_dir" >/dev/null 2>&1 || true  # a previous run's leftovers

trace="$run_dir/main.trace"
echo "== trace: $workload, a ${warmup_s} s warm-up, then Steady → Trend → Burst, ${phase_s} s each, seed $seed"
"$hlem" workload generate --config "$workload" --phase-duration "${phase_s}s" \
  --warmup "${warmup_s}s" --seed "$seed" \
  --out "$trace"

echo "== oracle static α: every α on a $grid grid in the twin on this trace (hindsight)"
alphas=$(awk -v step="$grid" 'BEGIN { for (a = 0; a <= 1 + 1e-9; a += step) printf "%s%.2f", (a > 0 ? "," : ""), a }')
"$hlem" sim sweep --trace "$trace" --warmup-s "$warmup_s" --alphas "$alphas" \
  --csv "$run_dir/sweep.csv" | tee "$run_dir/sweep.txt"
oracle=$(awk '/^best static alpha on this grid:/ { print $7 }' "$run_dir/sweep.txt")
[ -n "$oracle" ] || { echo "run-local.sh: the sweep named no best α" >&2; exit 1; }

run() {  # run NAME ALLOCATOR_FLAGS...: cluster up, replay the trace, cluster down
  local name=$1
  shift
  echo "== $name: hlem cluster up (2 shards, 4 serving nodes, router, allocator $*)"
  "$hlem" cluster up --run-dir "$run_dir" --nodes 4 --bin-dir "$build_dir" \
    --shards-config deploy/local/shards.yaml --node-config deploy/local/node.yaml "$@"
  local router
  router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run_dir/cluster.state")"
  echo "== $name: replaying the trace through the router ($((warmup_s + 3 * phase_s)) s)"
  "$hlem" loadgen --trace "$trace" --router "$router" --slo-ms "$slo_ms" --deadline-ms 2000 \
    --warmup-s "$warmup_s" --csv "$run_dir/$name-requests.csv" \
    --windows-csv "$run_dir/$name-windows.csv" --phases-csv "$run_dir/$name-phases.csv" \
    | tee "$run_dir/$name-loadgen.txt" | sed -n '1,/^phase/p;/^steady\|^trend\|^burst/p'
  "$hlem" router state --server "$router" >"$run_dir/$name-router.txt"
  "$hlem" cluster down --run-dir "$run_dir"
}
run static --allocator static --allocator-arg="--alpha=$oracle"
run hlem --allocator hlem --allocator-arg="--weights=$weights" "${hlem_args[@]}"

echo
echo "== local cluster (4 CPU nodes, small HSTU, SLO $slo_ms ms), first $warmup_s s left out;"
echo "   oracle static α $oracle (twin, hindsight) vs HLEM's SmartAllocator, same router"
awk -F, '
  FNR == 1 { file++; next }
  file == 1 { p99[$1] = $8; slo[$1] = $9; tput[$1] = $10; order[++n] = $1; next }
  { hp99[$1] = $8; hslo[$1] = $9; htput[$1] = $10 }
  END {
    printf "%-7s %14s %12s %8s   %11s %11s   %12s %12s\n", "phase", "P99 static ms",
           "P99 HLEM ms", "change", "SLO static", "SLO HLEM", "static ok/s", "HLEM ok/s"
    for (i = 1; i <= n; i++) {
      r = order[i]
      change = p99[r] > 0 ? 100 * (hp99[r] - p99[r]) / p99[r] : 0
      printf "%-7s %14.2f %12.2f %+7.1f%%   %10.2f%% %10.2f%%   %12.1f %12.1f\n", r, p99[r],
             hp99[r], change, 100 * slo[r], 100 * hslo[r], tput[r], htput[r]
    }
  }' "$run_dir/static-phases.csv" "$run_dir/hlem-phases.csv" | tee "$run_dir/main-job.txt"

# The decision window of the workload (a "window: 5s" line), in seconds: the plot's x unit.
window_s=$(sed -n 's/^window:[[:space:]]*\([0-9.]*\)s\([[:space:]].*\)\{0,1\}$/\1/p' "$workload" | head -1)
window_s=${window_s:-5}
if command -v gnuplot >/dev/null; then
  cat >"$run_dir/main-job.gp" <<EOF
set terminal pngcairo size 900,450
set output '$run_dir/main-job.png'
set datafile separator ','
set title 'local cluster, P99 per ${window_s} s window (warm-up ${warmup_s} s | Steady | Trend | Burst, ${phase_s} s each)'
set xlabel 'time (s)'
set ylabel 'P99 (ms)'
set arrow from $warmup_s, graph 0 to $warmup_s, graph 1 nohead dt 3
set arrow from $((warmup_s + phase_s)), graph 0 to $((warmup_s + phase_s)), graph 1 nohead dt 2
set arrow from $((warmup_s + 2 * phase_s)), graph 0 to $((warmup_s + 2 * phase_s)), graph 1 nohead dt 2
# x: the window index × the workload's window
plot '$run_dir/static-windows.csv' every ::1 using (\$1*$window_s):6 with linespoints title 'static α $oracle (oracle)', \
     '$run_dir/hlem-windows.csv' every ::1 using (\$1*$window_s):6 with linespoints title 'HLEM'
EOF
  gnuplot "$run_dir/main-job.gp" && echo "plot: $run_dir/main-job.png"
fi
echo "per-request, per-window and per-phase CSV, the router's view, logs: $run_dir/ (static-*,"
echo "hlem-*, sweep.*)"
echo "main job done in $((SECONDS - start)) s"
