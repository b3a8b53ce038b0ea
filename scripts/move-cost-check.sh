#!/usr/bin/env bash
# Does moving α cost on the real cluster, apart from where α goes? (docs/results/README.md,
# "Where HLEM loses"). Per seed, the main job's trace is replayed once per arm through the local
# cluster with no allocator; this script pushes α to every node at each window start instead
# (`hlem node set-alpha` on the admin ports), node k getting
#   hold:    BASE every window,
#   dither:  BASE ± 0.02, the sign alternating by window and by node (the adapter's dither),
#   step:    BASE ± 0.06, the same (the PPO policy's largest action).
# Every arm pushes every window (same processes, same RPCs), so only the moves differ. Prints
# each arm's P99 and SLO satisfaction per phase, the median over windows of its window P99
# minus the hold arm's (the same trace window; after the warm-up), and how late the nodes' timers
# ran (hlem_node_timer*, docs/node.md "Background clock").
#
#   scripts/move-cost-check.sh [--seeds 7,8] [--alpha 0.9] [--phase-s 50] [--warmup-s 40]
#       [--arms hold,dither,step] [--node-config deploy/local/node.yaml] [--out out/move-cost]
# Needs a build (HLEM_BUILD_DIR, default build-release: run scripts/run-local.sh once). Writes
# OUT/seed<N>/<arm>-*.csv and OUT/summary.txt. ≈ 4 min a run (50 s phases).
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=7 base=0.9 phase_s=50 warmup_s=40 arms=hold,dither,step
node_config=deploy/local/node.yaml out=out/move-cost
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "move-cost-check.sh: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --seeds) seeds=$2 ;;
    --alpha) base=$2 ;;
    --phase-s) phase_s=$2 ;;
    --warmup-s) warmup_s=$2 ;;
    --arms) arms=$2 ;;
    --node-config) node_config=$2 ;;
    --out) out=$2 ;;
    *) echo "move-cost-check.sh: unknown argument '$1' (allowed: --seeds, --alpha, --phase-s, --warmup-s, --arms, --node-config, --out)" >&2
      exit 2 ;;
  esac
  shift 2
done
[[ "$seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "move-cost-check.sh: --seeds '$seeds' is not a comma-separated list of numbers" >&2; exit 2; }
[[ "$arms" =~ ^(hold|dither|step)(,(hold|dither|step))*$ ]] || { echo "move-cost-check.sh: --arms '$arms': a comma-separated list of hold, dither, step" >&2; exit 2; }
[[ "$phase_s" =~ ^[1-9][0-9]*$ ]] || { echo "move-cost-check.sh: --phase-s '$phase_s' is not a whole number of seconds" >&2; exit 2; }
[[ "$warmup_s" =~ ^[0-9]+$ ]] || { echo "move-cost-check.sh: --warmup-s '$warmup_s' is not a whole number of seconds" >&2; exit 2; }
awk -v a="$base" 'BEGIN { exit !(a ~ /^[0-9.]+$/ && a - 0.06 >= 0 && a + 0.06 <= 1) }' || {
  echo "move-cost-check.sh: --alpha '$base' must leave room for ±0.06 inside [0, 1]" >&2; exit 2; }
[ -f "$node_config" ] || { echo "move-cost-check.sh: --node-config '$node_config': no such file" >&2; exit 2; }

build_dir=${HLEM_BUILD_DIR:-build-release}
hlem="$build_dir/tools/hlem"
[ -x "$hlem" ] || { echo "move-cost-check.sh: no $hlem (build first: scripts/run-local.sh, or set HLEM_BUILD_DIR)" >&2; exit 1; }
run_dir=$out/cluster
slo_ms=25
window_s=5  # deploy/local/workload.yaml's decision window
mkdir -p "$run_dir"
pusher=
cleanup() {
  if [ -n "$pusher" ]; then kill "$pusher" 2>/dev/null || true; fi
  "$hlem" cluster down --run-dir "$run_dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM
cleanup

push() {  # push ARM: α to every node at each window start until killed
  local arm=$1 amp=0 w=0 k admin alpha
  case "$arm" in dither) amp=0.02 ;; step) amp=0.06 ;; esac
  local admins=()
  for f in "$run_dir"/node-*.ports; do
    admins+=("127.0.0.1:$(sed -n 's/^admin=//p' "$f")")
  done
  while :; do
    w=$((w + 1))
    k=0
    for admin in "${admins[@]}"; do
      alpha=$(awk -v b="$base" -v a="$amp" -v s=$(((w + k) % 2)) 'BEGIN { printf "%.2f", b + (s ? a : -a) }')
      "$hlem" node set-alpha --admin "$admin" --alpha "$alpha" --epoch 1 --decision "$w" \
        >/dev/null 2>&1 || echo "move-cost-check.sh: set-alpha $alpha on $admin failed" >&2
      k=$((k + 1))
    done
    sleep "$window_s"
  done
}

scrape_timers() {  # the nodes' critical clocks' punctuality (hlem_node_timer*), summed over the nodes
  local f port
  for f in "$run_dir"/node-*.ports; do
    port=$(sed -n 's/^metrics=//p' "$f")
    if [ -z "$port" ] || [ "$port" = 0 ]; then continue; fi
    # /metrics over bash's /dev/tcp: a fresh machine need not have curl
    { exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3; exec 3<&-; } 2>/dev/null || true
  done | awk '
    $1 == "hlem_node_timers_total{clock=\"critical\"}" { n += $2 }
    $1 == "hlem_node_timers_late_total{by=\"1ms\",clock=\"critical\"}" { l1 += $2 }
    $1 == "hlem_node_timers_late_total{by=\"10ms\",clock=\"critical\"}" { l10 += $2 }
    $1 == "hlem_node_timer_lag_seconds_total{clock=\"critical\"}" { lag += $2 }
    $1 == "hlem_node_timer_max_lag_seconds{clock=\"critical\"}" && $2 > max { max = $2 }
    $1 == "hlem_node_timer_busy_seconds_total{clock=\"critical\"}" { busy += $2 }
    END { if (n == 0) print "node timers: n/a (no hlem_node_timers_total)"
          else printf "node timers: %d run, %d late >= 1 ms, %d late >= 10 ms, mean lag %.3f ms, max %.1f ms, %.1f s inside timers\n", n, l1, l10, 1e3 * lag / n, 1e3 * max, busy }'
}

for seed in ${seeds//,/ }; do
  dir=$out/seed$seed
  mkdir -p "$dir"
  trace=$dir/main.trace
  "$hlem" workload generate --config deploy/local/workload.yaml --phase-duration "${phase_s}s" \
    --warmup "${warmup_s}s" --seed "$seed" --out "$trace" >/dev/null
  for arm in ${arms//,/ }; do
    echo "== seed $seed, $arm ($(date +%T)): cluster up, α $base pushed every ${window_s} s"
    "$hlem" cluster up --run-dir "$run_dir" --nodes 4 --bin-dir "$build_dir" --allocator none \
      --shards-config deploy/local/shards.yaml --node-config "$node_config" >/dev/null
    push "$arm" &
    pusher=$!
    router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run_dir/cluster.state")"
    "$hlem" loadgen --trace "$trace" --router "$router" --slo-ms "$slo_ms" --deadline-ms 2000 \
      --warmup-s "$warmup_s" --windows-csv "$dir/$arm-windows.csv" \
      --phases-csv "$dir/$arm-phases.csv" --quiet >"$dir/$arm-loadgen.txt"
    kill "$pusher" 2>/dev/null || true
    wait "$pusher" 2>/dev/null || true
    pusher=
    scrape_timers >"$dir/$arm-timers.txt"
    "$hlem" cluster down --run-dir "$run_dir" >/dev/null
    awk -F, 'NR > 1 { printf "   %-7s P99 %7.2f ms  SLO %6.2f %%\n", $1, $8, 100 * $9 }' "$dir/$arm-phases.csv"
    sed 's/^/   /' "$dir/$arm-timers.txt"
  done
done

{
  echo "move cost: α $base, every arm pushed every ${window_s} s; seeds $seeds; nodes $node_config"
  printf "%-5s %-7s %-7s %9s %9s   %s\n" seed arm phase "P99 ms" "SLO %" "median window dP99 vs hold"
  for seed in ${seeds//,/ }; do
    dir=$out/seed$seed
    for arm in ${arms//,/ }; do
      paired=n/a
      if [ "$arm" != hold ] && [ -f "$dir/hold-windows.csv" ]; then
        paired=$(awk -F, -v warm=$((warmup_s / window_s)) '
          FNR == 1 { file++; next }
          file == 1 { h[$1] = $6; next }
          ($1 in h) && $1 >= warm { d[++n] = $6 - h[$1] }
          END { for (i = 2; i <= n; i++) { t = d[i]; for (j = i - 1; j >= 1 && d[j] > t; j--) d[j + 1] = d[j]; d[j + 1] = t }
                if (n == 0) print "n/a"; else printf "%+.2f ms (%d windows)", n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2, n }' \
          "$dir/hold-windows.csv" "$dir/$arm-windows.csv")
      fi
      awk -F, -v seed="$seed" -v arm="$arm" -v paired="$paired" 'NR > 1 {
        printf "%-5s %-7s %-7s %9.2f %9.2f   %s\n", seed, arm, $1, $8, 100 * $9, (NR == 2 ? paired : "") }' \
        "$dir/$arm-phases.csv"
    done
  done
} | tee "$out/summary.txt"
