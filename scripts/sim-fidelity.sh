#!/usr/bin/env bash
# The twin's fidelity against real local-cluster runs (docs/simulator.md): fits the cost model to
# one real run (`hlem sim fit`: stage medians, background CPU, per-request slowdown, then rounds
# matching the latency distribution), then replays every real run's trace in the twin with the fitted
# costs and sets the two side by side (`hlem sim compare`, 30 s pools after the warm-up).
# Usage: scripts/sim-fidelity.sh [--fit steady-0.5-run1] [--warmup-s 30]
# Inputs: out/real/<regime>-<alpha>-run<k>.csv (per-request CSVs of scripts/alpha-sweep.sh runs,
# copied there; the fitted run's .cpu file beside it, when there, fits background_cpu too) and
# the traces they replayed, out/sweep/<regime>.trace. Writes out/simfit/:
# the fitted cost file, the twin's CSVs, and fidelity.txt (a line per run, fitted run first).
set -euo pipefail
cd "$(dirname "$0")/.."
fit=steady-0.5-run1 warmup=30
while [ $# -gt 0 ]; do
  case "$1" in
    --fit) fit=$2; shift 2 ;;
    --warmup-s) warmup=$2; shift 2 ;;
    *) echo "sim-fidelity.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
hlem=${HLEM_BUILD_DIR:-build-release}/tools/hlem
[ -x "$hlem" ] || { echo "sim-fidelity.sh: $hlem missing: build first" >&2; exit 2; }
[ -f "out/real/$fit.csv" ] || { echo "sim-fidelity.sh: out/real/$fit.csv missing" >&2; exit 2; }
out=out/simfit
mkdir -p "$out"
regime_of() { echo "${1%%-*}"; }
alpha_of() { local r=${1#*-}; echo "${r%%-*}"; }

cpu_flag=()
[ -f "out/real/$fit.cpu" ] && cpu_flag=(--cpu "out/real/$fit.cpu")
"$hlem" sim fit --real "out/real/$fit.csv" --trace "out/sweep/$(regime_of "$fit").trace" \
  --alpha "$(alpha_of "$fit")" --warmup-s "$warmup" --out "$out/cpu-fitted.yaml" "${cpu_flag[@]}" \
  --slowdown-quantiles 32 --latency-rounds 10 \
  | tee "$out/fit.txt"

: >"$out/fidelity.txt"
for csv in "out/real/$fit.csv" $(ls out/real/*-run*.csv | grep -v "/$fit.csv"); do
  name=$(basename "$csv" .csv)
  regime=$(regime_of "$name") alpha=$(alpha_of "$name")
  sim_csv="$out/$regime-$alpha.sim.csv"
  "$hlem" sim run --trace "out/sweep/$regime.trace" --alpha "$alpha" \
    --costs "$out/cpu-fitted.yaml" --warmup-s "$warmup" --csv "$sim_csv" >"$out/$regime-$alpha.sim.txt"
  echo "== $name$([ "$name" = "$fit" ] && echo ' (fitted)')" >>"$out/fidelity.txt"
  "$hlem" sim compare --real "$csv" --sim "$sim_csv" --pool-s 30 --warmup-s "$warmup" >>"$out/fidelity.txt"
done
grep -E "^==|^pool|^overall" "$out/fidelity.txt"
