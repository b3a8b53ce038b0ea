# Sourced by the scripts that run a real Prometheus on the local cluster (tests/deploy/
# prometheus_e2e_test.sh, scripts/prometheus-screenshot.sh): not run on its own.
#   free_port                       a loopback port that was free a moment ago
#   start_prometheus SRC RUN TARGETS PORT [SED-EXPRESSION]
#       copies SRC/deploy/observability/prometheus to RUN/prom, points prometheus-local.yml at
#       the TARGETS file `hlem cluster up` wrote (plus the optional sed edits), starts Prometheus
#       on 127.0.0.1:PORT with its data in RUN/tsdb and its log in RUN/prometheus.log, and sets
#       prom_pid. Returns 1 when the config could not be pointed at TARGETS.

free_port() {
  node -e 'const s = require("net").createServer(); s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}

start_prometheus() {
  local src=$1 run=$2 targets=$3 port=$4 extra=${5:-}
  cp -r "$src/deploy/observability/prometheus" "$run/prom"
  sed -i "s|[./]*/out/cluster/prometheus-targets.json|$targets|${extra:+; $extra}" \
    "$run/prom/prometheus-local.yml"
  grep -q "$targets" "$run/prom/prometheus-local.yml" || return 1
  prometheus --config.file="$run/prom/prometheus-local.yml" --storage.tsdb.path="$run/tsdb" \
    --web.listen-address="127.0.0.1:$port" > "$run/prometheus.log" 2>&1 &
  prom_pid=$!
}
