#!/usr/bin/env bash
# The README's main job (scripts/run-local.sh) over several seeds, one after another, and the
# mean and range per phase of the oracle static α's and HLEM's P99 and SLO satisfaction: one run
# on this shared 2-core machine cannot settle a difference of a few percent (docs/results/).
#
#   scripts/run-local-seeds.sh [--seeds 7,8,9,10,11] [--out DIR] [run-local.sh options...]
#   scripts/run-local-seeds.sh --summary DIR      # only the table, from the seed<N>/ folders of DIR
#
# Each seed's run-local.sh output and CSVs are kept in DIR/seed<N>/ (default out/local-seeds);
# the table goes to DIR/summary.txt. HLEM_BUILD_DIR is passed on. ~7.5 min a seed once built.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=7,8,9,10,11
out=out/local-seeds
summary_only=0
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) [ $# -ge 2 ] || { echo "run-local-seeds.sh: --seeds needs a value" >&2; exit 2; }
      seeds=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || { echo "run-local-seeds.sh: --out needs a value" >&2; exit 2; }
      out=$2; shift 2 ;;
    --summary) [ $# -ge 2 ] || { echo "run-local-seeds.sh: --summary needs a folder" >&2; exit 2; }
      out=$2; summary_only=1; shift 2 ;;
    --seed) echo "run-local-seeds.sh: use --seeds (a comma-separated list)" >&2; exit 2 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[[ "$seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || {
  echo "run-local-seeds.sh: --seeds '$seeds' is not a comma-separated list of numbers" >&2; exit 2; }

if [ "$summary_only" = 0 ]; then
  mkdir -p "$out"
  for s in ${seeds//,/ }; do
    echo "== seed $s ($(date +%T)): scripts/run-local.sh --seed $s ${pass[*]:-}"
    mkdir -p "$out/seed$s"
    bash scripts/run-local.sh --seed "$s" "${pass[@]}" >"$out/seed$s/run-local.txt" 2>&1 || {
      echo "run-local-seeds.sh: seed $s failed; its output: $out/seed$s/run-local.txt" >&2; exit 1; }
    cp out/local/main-job.txt out/local/sweep.txt out/local/static-phases.csv \
      out/local/hlem-phases.csv out/local/static-windows.csv out/local/hlem-windows.csv \
      out/local/allocator.log "$out/seed$s/"
    tail -4 "$out/seed$s/main-job.txt"
  done
fi

shopt -s nullglob
dirs=("$out"/seed*/)
[ ${#dirs[@]} -gt 0 ] || { echo "run-local-seeds.sh: no seed<N>/ folders in $out" >&2; exit 1; }
for d in "${dirs[@]}"; do
  for f in static-phases.csv hlem-phases.csv sweep.txt; do
    [ -f "$d$f" ] || { echo "run-local-seeds.sh: $d$f is missing" >&2; exit 1; }
  done
done

# One line per seed and phase: seed, phase, oracle α, P99 static, P99 HLEM, SLO static, SLO HLEM,
# the phase's place in the trace.
rows=$(for d in "${dirs[@]}"; do
  seed=${d%/}; seed=${seed##*/seed}
  oracle=$(awk '/^best static alpha on this grid:/ { print $7 }' "$d/sweep.txt")
  awk -F, -v seed="$seed" -v oracle="$oracle" '
    FNR == 1 { file++; next }
    file == 1 { p99[$1] = $8; slo[$1] = $9; order[++n] = $1; next }
    { hp99[$1] = $8; hslo[$1] = $9 }
    END { for (i = 1; i <= n; i++) { r = order[i]
      printf "%s %s %s %s %s %s %s %d\n", seed, r, oracle, p99[r], hp99[r], slo[r], hslo[r], i } }' \
    "$d/static-phases.csv" "$d/hlem-phases.csv"
done)

{
  echo "main job over seeds (${#dirs[@]} runs; $out): P99 ms and SLO satisfaction per phase"
  printf "%-5s %-7s %6s %9s %9s %8s %9s %9s\n" seed phase oracle "P99 stat" "P99 HLEM" change \
    "SLO stat" "SLO HLEM"
  echo "$rows" | sort -k8,8n -k1,1n | awk '{ printf "%-5s %-7s %6s %9.2f %9.2f %+7.1f%% %8.2f%% %8.2f%%\n",
    $1, $2, $3, $4, $5, 100 * ($5 - $4) / $4, 100 * $6, 100 * $7 }'
  echo
  echo "per phase over seeds: mean [min, max]; the change's median"
  echo "$rows" | awk '
    { p = $2; if (!(p in n)) order[++k] = p; n[p]++
      c = 100 * ($5 - $4) / $4
      add(p, "ps", $4); add(p, "ph", $5); add(p, "c", c); add(p, "ss", 100 * $6); add(p, "sh", 100 * $7)
      wins[p] += $5 < $4; cs[p, n[p]] = c }
    function add(p, key, v) { s[p, key] += v
      if (!((p, key) in lo) || v < lo[p, key]) lo[p, key] = v
      if (!((p, key) in hi) || v > hi[p, key]) hi[p, key] = v }
    function f(p, key, unit) { return sprintf("%.2f%s [%.2f, %.2f]", s[p, key] / n[p], unit, lo[p, key], hi[p, key]) }
    function median(p,   i, j, t, m, v) { m = n[p]
      for (i = 1; i <= m; i++) v[i] = cs[p, i]
      for (i = 2; i <= m; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
      return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
    END { for (i = 1; i <= k; i++) { p = order[i]
      printf "%-7s P99 static %s, HLEM %s; change %s, median %+.1f %%; HLEM lower in %d of %d\n", p,
        f(p, "ps", " ms"), f(p, "ph", " ms"), f(p, "c", " %"), median(p), wins[p], n[p]
      printf "%-7s SLO static %s, HLEM %s\n", "", f(p, "ss", " %"), f(p, "sh", " %") } }'

  # Paired windows: the same trace window in both runs (after the warm-up), HLEM's P99 and P50
  # minus the static run's, against what the nodes' α did in that window (the allocator's log:
  # the last `hlem` run in it; a decision closing window w sets α for w + 1). Node and load
  # generator windows line up to within a window, so this shows trends, not single windows.
  pairs=$(for d in "${dirs[@]}"; do
    [ -f "$d/allocator.log" ] || continue
    warmup=$(awk -F, 'NR == 2 { print $2 }' "$d/static-phases.csv")
    awk -F, -v warmup="$warmup" '
      FILENAME ~ /allocator[.]log$/ {
        if (!match($0, /decision id=[0-9]+ node=[^ ]+ window=[0-9]+ controller=[^ ]+ reason=[^ ]+ alpha_before=[0-9.]+ alpha_after=[0-9.]+/)) next
        split(substr($0, RSTART, RLENGTH), f, /[ =]/)
        id = f[3]; w = f[7]; ctl = f[9]; before = f[13]; after = f[15]
        if (ctl != last_ctl || id + 0 < last_id + 0) { run++; kind[run] = ctl }
        last_ctl = ctl; last_id = id
        move[run, w] += (after > before ? after - before : before - after); level[run, w] += after
        nodes[run, w]++
        next }
      FNR == 1 { file++; next }
      file == 1 { sp99[$1] = $6; sp50[$1] = $4; len = $2 / ($8 > 0 ? $8 : 1); next }
      { hp99[$1] = $6; hp50[$1] = $4 }
      END { for (r = run; r > 0 && kind[r] != "hlem"; r--) {}
        if (r == 0) exit
        for (w in hp99) {
          if (!(w in sp99) || w * len < warmup - 1e-6 || !((r, w - 1) in nodes)) continue
          printf "%.4f %.4f %.3f %.3f\n", move[r, w - 1] / nodes[r, w - 1],
            level[r, w - 1] / nodes[r, w - 1], hp99[w] - sp99[w], hp50[w] - sp50[w] } }' \
      "$d/allocator.log" "$d/static-windows.csv" "$d/hlem-windows.csv"
  done)
  if [ -n "$pairs" ]; then
    echo
    echo "paired windows (HLEM minus static, same trace window, after the warm-up), in thirds by"
    terciles() {  # terciles COLUMN NAME: median ΔP99 and ΔP50 per third of the windows by COLUMN
      echo "$pairs" | sort -g -k"$1","$1" | awk -v col="$1" -v name="$2" '
        { key[NR] = $col; d99[NR] = $3; d50[NR] = $4 }
        function med(a, lo, hi,   v, i, j, t, m) { m = 0
          for (i = lo; i <= hi; i++) v[++m] = a[i]
          for (i = 2; i <= m; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
          return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
        END { for (t = 0; t < 3; t++) { lo = int(t * NR / 3) + 1; hi = int((t + 1) * NR / 3); s = 0
          for (i = lo; i <= hi; i++) s += key[i]
          printf "  %s, third %d: %d windows, mean %.3f; median dP99 %+.2f ms, dP50 %+.2f ms\n",
            name, t + 1, hi - lo + 1, s / (hi - lo + 1), med(d99, lo, hi), med(d50, lo, hi) } }'
    }
    terciles 1 "the nodes' mean |move| in α"
    terciles 2 "the nodes' mean α"
    echo "$pairs" | awk '{ print $3 }' | sort -g | awk '{ v[NR] = $1 } END {
      printf "  all %d windows: median dP99 %+.2f ms\n", NR, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
  fi
} | tee "$out/summary.txt"
