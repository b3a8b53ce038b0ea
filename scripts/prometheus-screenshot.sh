#!/usr/bin/env bash
# The screenshot of docs/operations.md: Prometheus' graph of α per node while the local cluster
# (4 serving nodes, the SmartAllocator) serves a Trend run, taken with headless Chromium.
#   scripts/prometheus-screenshot.sh [--out docs/img/prometheus-alpha-trend.png] [--duration-s 150]
# Needs a build (build/, or HLEM_BUILD_DIR), Debian's prometheus and chromium (apt). Takes about
# --duration-s + 30 s. Writes the PNG and, beside it, the α samples it shows (.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/img/prometheus-alpha-trend.png
duration_s=150
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --duration-s) duration_s=$2; shift 2 ;;
    *) echo "prometheus-screenshot.sh: unknown argument '$1' (--out FILE, --duration-s N)" >&2; exit 2 ;;
  esac
done
[[ "$duration_s" =~ ^[0-9]+$ ]] && [ "$duration_s" -ge 30 ] ||
  { echo "prometheus-screenshot.sh: --duration-s must be an integer >= 30" >&2; exit 2; }
build=${HLEM_BUILD_DIR:-build}
hlem="$build/tools/hlem"
for tool in prometheus chromium node; do
  command -v "$tool" >/dev/null || { echo "prometheus-screenshot.sh: $tool is not installed" >&2; exit 1; }
done
[ -x "$hlem" ] || { echo "prometheus-screenshot.sh: $hlem missing (build first)" >&2; exit 1; }

run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_shot.XXXXXX")
prom_pid=
cleanup() {
  "$hlem" cluster down --run-dir "$run/cluster" >/dev/null 2>&1 || true
  [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
  rm -rf "$run"
}
trap cleanup EXIT
promql() { node deploy/tests/promql.mjs "$@"; }

"$hlem" workload generate --config deploy/local/workload.yaml --regime trend \
  --duration "${duration_s}s" --out "$run/trend.trace"
"$hlem" cluster up --run-dir "$run/cluster" --nodes 4 --bin-dir "$build" \
  --shards-config deploy/local/shards.yaml --node-config deploy/local/node.yaml \
  --allocator hlem --allocator-arg=--weights=allocator_service/policies/ppo-local.mlp

# shellcheck source=../deploy/tests/local-prometheus.sh
. deploy/tests/local-prometheus.sh
port=$(free_port)
url="http://127.0.0.1:$port"
start_prometheus "$PWD" "$run" "$run/cluster/prometheus-targets.json" "$port" ||
  { echo "prometheus-screenshot.sh: could not point Prometheus at the cluster" >&2; exit 1; }
promql wait "$url" 'count(up{job="hlem"} == 1) >= 7' 60

router="127.0.0.1:$(awk '$1 == "router" {print $4}' "$run/cluster/cluster.state")"
echo "== Trend for ${duration_s} s through $router, Prometheus at $url"
"$hlem" loadgen --trace "$run/trend.trace" --router "$router" --slo-ms 25 --deadline-ms 2000 \
  --quiet | sed -n '1,4p'
sleep 6  # one more scrape after the last answer

expr='hlem_node_alpha{kind="target"}'
range="$((duration_s + 30))s"
mkdir -p "$(dirname "$out")"
end=$(date +%s)
node -e '
  const [url, expr, start, end, file] = process.argv.slice(1);
  fetch(`${url}/api/v1/query_range?query=${encodeURIComponent(expr)}&start=${start}&end=${end}&step=5`)
    .then((r) => r.json()).then((b) => {
      const rows = ["pod,unix_s,alpha"];
      for (const s of b.data.result) for (const [t, v] of s.values) rows.push(`${s.metric.pod},${t},${v}`);
      require("fs").writeFileSync(file, rows.join("\n") + "\n");
    });' "$url" "$expr" "$((end - duration_s - 30))" "$end" "${out%.png}.csv"
page="$url/graph?g0.expr=$(node -e 'process.stdout.write(encodeURIComponent(process.argv[1]))' "$expr")&g0.tab=0&g0.range_input=$range&g0.stacked=0&g0.show_exemplars=0"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$run/chromium" --hide-scrollbars --window-size=1400,900 \
  --virtual-time-budget=15000 --screenshot="$(realpath -m "$out")" "$page" 2>"$run/chromium.log" ||
  { tail -5 "$run/chromium.log"; exit 1; }
echo "wrote $out and ${out%.png}.csv ($(($(wc -l < "${out%.png}.csv") - 1)) samples)"
