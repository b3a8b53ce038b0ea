#!/usr/bin/env bash
# deploy/observability offline (issue 10): promtool check config (both scrape configs), check
# rules, the alerts' unit tests (promtool test rules), and every dashboard query: it parses
# (promtool, as a generated rules file), uses the datasource variable and names only metrics a
# binary exports or a rule records; the checks must reject a dashboard broken on purpose.
#   prometheus_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v promtool >/dev/null || fail "promtool not installed (scripts/install-deps.sh: prometheus)"
[ -d "$src/deploy/tests/node_modules/yaml" ] ||
  fail "deploy/tests/node_modules missing: run scripts/install-deps.sh (npm ci)"
prom="$src/deploy/observability/prometheus"

echo "--- promtool check config"
promtool check config "$prom/prometheus-local.yml"
# Debian's promtool is built without the Kubernetes service discovery: check the Kubernetes
# config as written where it can, else with that one block swapped for a static target (the
# relabelling, rule files and everything else as written).
if ! promtool check config "$prom/prometheus.yml" > "$work/k8s-check.log" 2>&1; then
  if grep -q "kubernetes_sd_configs not found" "$work/k8s-check.log"; then
    echo "(this promtool has no Kubernetes discovery: checking prometheus.yml with a static target)"
    cp -r "$prom" "$work/prom"
    node -e '
      const fs = require("fs"), f = process.argv[1];
      const s = fs.readFileSync(f, "utf8").replace(
        /    kubernetes_sd_configs:\n      - role: pod\n        namespaces:\n          own_namespace: true\n/,
        "    static_configs:\n      - targets: [\"127.0.0.1:9464\"]\n");
      fs.writeFileSync(f, s);' "$work/prom/prometheus.yml"
    grep -q 'targets: \["127.0.0.1:9464"\]' "$work/prom/prometheus.yml" || fail "substitution failed"
    promtool check config "$work/prom/prometheus.yml"
  else
    cat "$work/k8s-check.log"
    fail "prometheus.yml"
  fi
fi

echo "--- promtool check rules / test rules"
promtool check rules "$prom"/rules/*.yml
promtool test rules "$prom"/tests/*.yml

echo "--- dashboards"
# Every metric the binaries register (the names given to prometheus-cpp's builders).
grep -rhoE '"hlem_[a-z0-9_]+"' --include=*.cc --exclude=*_test.cc \
  "$src"/embedding_shard "$src"/serving_node "$src"/router "$src"/allocator_service "$src"/common \
  "$src"/tools/loadgen |
  tr -d '"' | sort -u > "$work/metrics.txt"
check() {  # check DASHBOARD_DIR
  node "$src/deploy/tests/check-observability.mjs" --rules "$prom/rules" --dashboards "$1" \
    --metrics "$work/metrics.txt" --out "$work/dashboard-rules.yml"
}
check "$src/deploy/observability/grafana/dashboards"
promtool check rules "$work/dashboard-rules.yml"

echo "--- the checks reject broken dashboards and rules"
mkdir -p "$work/broken"
cp "$src"/deploy/observability/grafana/dashboards/*.json "$work/broken/"
sed -i 's/hlem_node_alpha{kind=/hlem_node_alfa{kind=/' "$work/broken/hlem-overview.json"
if check "$work/broken" > "$work/broken.log" 2>&1; then fail "a dashboard naming an unknown metric passed"; fi
grep -q "hlem_node_alfa" "$work/broken.log" || { cat "$work/broken.log"; fail "unknown metric not named"; }
cp "$src"/deploy/observability/grafana/dashboards/*.json "$work/broken/"
sed -i '0,/hlem:router_latency_seconds:p50_1m/s//histogram_quantile(0.5, sum by (le) (rate(x[1m]))/' \
  "$work/broken/hlem-overview.json"
check "$work/broken" > /dev/null 2>&1 || true  # the name check fails it; the parse must too:
if promtool check rules "$work/dashboard-rules.yml" > /dev/null 2>&1; then
  fail "promtool accepted an unbalanced expression"
fi
echo "PASS"
