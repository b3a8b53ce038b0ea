#!/usr/bin/env bash
# The allocator's controllers side by side in the twin (docs/allocator.md): held-out Steady, Trend
# and Burst traces of the local profile (seeds not used in training), each replayed once per
# controller from the same starting α; prints one row per (regime, controller): P99, SLO
# satisfaction, reward (SLO fraction − max(0, P99 − SLO) ÷ SLO over the whole run after the
# warm-up), the decisions by reason and each node's final α.
# With --oracle, also α*_t of every window of each trace (`hlem sim oracle`, the parent following
# α*; minutes per trace, kept in out/alloc/<regime>-<seed>.oracle.csv and reused) and each
# controller's gap: the mean over windows after the warm-up and over nodes of |α − α*_t|, α being
# the one in force during window t (decided after window t − 1, or the static/starting α); and
# gap_eps, the mean distance from α to the nearest grid α whose reward is within 0.01 of α*'s
# (where the reward curve is flat, α* is one of many equally good αs); and the regret against the
# oracle trajectory per window.
# Usage: scripts/allocator-eval.sh [--weights allocator_service/policies/ppo-local.mlp]
#        [--seed 103] [--duration-s 180] [--alpha 0.5] [--warmup-s 30] [--oracle]
#        [--regimes "steady trend burst"] [--controllers "ppo ppo+adapter hlem ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
weights=allocator_service/policies/ppo-local.mlp seed=103 duration=180 alpha=0.5 warmup=30 oracle=0
eps=0.01  # gap_eps: the distance to the nearest α whose reward is within eps of α*'s
regimes="steady trend burst"
controllers="static-0.5 static-0.9 kv_only pid bo milp xgboost lstm recovery ppo ppo+recovery ppo+adapter hlem"
while [ $# -gt 0 ]; do
  case "$1" in
    --weights) weights=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --duration-s) duration=$2; shift 2 ;;
    --alpha) alpha=$2; shift 2 ;;
    --warmup-s) warmup=$2; shift 2 ;;
    --oracle) oracle=1; shift ;;
    --regimes) regimes=$2; shift 2 ;;
    --controllers) controllers=$2; shift 2 ;;
    *) echo "allocator-eval.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
hlem=${HLEM_BUILD_DIR:-build-release}/tools/hlem
[ -x "$hlem" ] || { echo "allocator-eval.sh: $hlem missing: build first" >&2; exit 2; }
[ -f "$weights" ] || { echo "allocator-eval.sh: --weights $weights missing" >&2; exit 2; }
out=out/alloc
mkdir -p "$out"
printf '%-7s %-14s %8s %8s %8s %13s %7s  %s\n' regime controller p99_ms slo_% reward gap/gap_eps \
  regret decisions
for regime in $regimes; do
  trace="$out/$regime-$seed.trace"
  [ -f "$trace" ] || "$hlem" workload generate --config deploy/local/workload.yaml \
    --regime "$regime" --duration "${duration}s" --seed "$seed" --out "$trace" >/dev/null
  star="$out/$regime-$seed.oracle.csv"
  if [ "$oracle" = 1 ] && [ ! -f "$star" ]; then
    "$hlem" sim oracle --trace "$trace" --csv "$star" >"$out/$regime-$seed.oracle.txt"
  fi
  for name in $controllers; do
    flags=(--controller "$name" --alpha "$alpha")
    case "$name" in
      static-*) flags=(--controller static --alpha "${name#static-}"); name="static ${name#static-}" ;;
      kv_only) flags=(--controller static --alpha 0) ;;
      hlem|ppo*) flags+=(--weights "$weights") ;;
    esac
    run="$out/$regime-${name// /-}"
    "$hlem" sim run --trace "$trace" --warmup-s "$warmup" "${flags[@]}" \
      --decisions-csv "$run.decisions.csv" --windows-csv "$run.windows.csv" >"$run.txt"
    gap=- regret=-
    if [ -f "$star" ]; then
      # regret: the mean over windows after the warm-up of reward*_t − reward_t, reward* the
      # oracle trajectory's (the parent following α*), reward_t the run's window reward from its
      # windows CSV (SLO fraction − max(0, min(P99 ÷ SLO, 4) − 1); over 1 % failed: −4 + SLO
      # fraction, as sim::Reward). Negative: better than the per-window greedy oracle.
      slo_ms=$(awk '/^SLO [0-9.]+ ms satisfied/ { print $2 + 0 }' "$run.txt")
      regret=$(awk -F, -v warm="$warmup" -v slo="$slo_ms" '
        FNR == 1 { file++; next }
        file == 1 { best[$1] = $4; next }
        ($1 * 5 >= warm) && ($1 in best) && $2 > 0 {
          norm = $6 / slo; if (norm > 4) norm = 4
          if (($2 - $3) > 0.01 * $2) norm = 4
          r = $7 - (norm > 1 ? norm - 1 : 0)
          sum += best[$1] - r; count++
        }
        END { printf "%.3f", count ? sum / count : 0 }' "$star" "$run.windows.csv")
    fi
    if [ -f "$star" ]; then
      start=$(awk '/^sim: / { for (i = 1; i < NF; i++) if ($i == "alpha") print $(i + 1) + 0 }' "$run.txt")
      gap=$(awk -F, -v start="$start" -v warm="$warmup" -v nodes=4 '
        FNR == 1 { file++; next }
        file == 1 { star[$1] = $3; best[$1] = $4; curve[$1] = $8; next }
        { at[$2, $1 + 1] = $3 }  # in force from the next window
        END {
          for (w in star) {
            if (w * 5 < warm) continue
            # the α grid points whose reward is within eps of the best (the near-optimal set)
            m = split(curve[w], pts, " ")
            for (n = 0; n < nodes; n++) {
              a = start
              for (k = w; k >= 0; k--) if ((n, k) in at) { a = at[n, k]; break }
              d = a - star[w]; sum += d < 0 ? -d : d; count++
              near = 1
              for (i = 1; i <= m; i++) {
                split(pts[i], ar, ":")
                if (ar[2] + 0 < best[w] - eps) continue
                e = a - ar[1]; e = e < 0 ? -e : e
                if (e < near) near = e
              }
              sum_eps += near
            }
          }
          printf "%.3f/%.3f", count ? sum / count : 0, count ? sum_eps / count : 0
        }' eps="$eps" "$star" "$run.decisions.csv")
    fi
    awk -v regime="$regime" -v name="$name" -v gap="$gap" -v regret="$regret" '
      /^latency of OK answers/ { p99 = $12 + 0 }
      /^SLO [0-9.]+ ms satisfied/ { slo = $5 + 0; target = $2 + 0 }
      /^allocator:/ { sub(/^allocator: /, ""); sub(/; first.*/, ""); decisions = $0 }
      END {
        over = p99 > target ? (p99 - target) / target : 0
        printf "%-7s %-14s %8.2f %8.2f %8.4f %13s %7s  %s\n", regime, name, p99, slo,
               slo / 100 - over, gap, regret, decisions == "" ? "-" : decisions
      }' "$run.txt"
  done
done
