#!/usr/bin/env bash
# deploy/observability/prometheus end to end (issue 10): the local cluster (1 shard, 2 serving
# nodes, router, a static allocator at α 0.35) runs a 30 s trace from the load generator while a
# real Prometheus (Debian's, on loopback, prometheus-local.yml with its rules, scraping every
# second) scrapes it and the load generator (--metrics-listen). Every process's /metrics passes
# `promtool check metrics`; then, through the HTTP API: every target up, the routers' answer count
# equal to the load generator's (exactly: one answer per request), the load generator's metrics
# equal to its summary, the routers' SLO attainment and P99 against the same requests' router
# times as the load generator recorded them (and the client's own figures bounded by them),
# α per node equal to the allocator's, and the recording rules evaluated.
#   prometheus_e2e_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
hlem="$build/tools/hlem"
run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_prom.XXXXXX")
prom_pid=
cleanup() {
  "$hlem" cluster down --run-dir "$run/cluster" >/dev/null 2>&1 || true
  [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
  rm -rf "$run"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v prometheus >/dev/null || fail "prometheus not installed (scripts/install-deps.sh)"
promql() { node "$src/deploy/tests/promql.mjs" "$@"; }
value() { promql query "$url" "$1" | awk '{print $NF}'; }  # value QUERY: one sample's value
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }

slo_ms=5   # near the test cluster's median latency, so that both met and missed occur
alpha=0.35
"$hlem" cluster up --run-dir "$run/cluster" --nodes 2 --bin-dir "$build" \
  --shards-config "$src/tests/e2e/shards.yaml" --node-config "$src/tests/e2e/node.yaml" \
  --router-arg=--slo-ms=$slo_ms --allocator static --allocator-arg=--alpha=$alpha \
  --allocator-arg=--interval-s=1
targets="$run/cluster/prometheus-targets.json"
processes=$(grep -c '"targets"' "$targets")
[ "$processes" -eq 5 ] || fail "expected 5 scrape targets, $targets has $processes"

echo "--- promtool check metrics"
for address in $(grep -o '127\.0\.0\.1:[0-9]*' "$targets"); do
  promql metrics "$address" > "$run/metrics.txt"
  promtool check metrics < "$run/metrics.txt" || fail "promtool check metrics of $address"
  echo "$address: $(grep -c '^hlem_' "$run/metrics.txt") samples, lint clean"
done

echo "--- prometheus"
# shellcheck source=../../deploy/tests/local-prometheus.sh
. "$src/deploy/tests/local-prometheus.sh"
port=$(free_port)
loadgen_port=$(free_port)
url="http://127.0.0.1:$port"
start_prometheus "$src" "$run" "$targets" "$port" \
  "s|_interval: 5s|_interval: 1s|; s|127.0.0.1:9470|127.0.0.1:$loadgen_port|" ||
  fail "could not point the config at $targets"
grep -q "127.0.0.1:$loadgen_port" "$run/prom/prometheus-local.yml" || fail "no load generator job"
promql wait "$url" "count(up{job=\"hlem\"} == 1) == $processes" 60 ||
  { tail -20 "$run/prometheus.log"; fail "not every target up"; }

echo "--- load"
"$hlem" workload generate --config "$src/tests/e2e/workload.yaml" --out "$run/steady.trace"
"$hlem" loadgen --trace "$run/steady.trace" --router "127.0.0.1:$(awk '$1 == "router" {print $4}' \
  "$run/cluster/cluster.state")" --slo-ms $slo_ms --deadline-ms 5000 --fail-on-error --quiet \
  --metrics-listen "127.0.0.1:$loadgen_port" --metrics-hold-s 4 --csv "$run/requests.csv" \
  > "$run/loadgen.txt" &
loadgen_pid=$!
sleep 5  # some answers in: the load generator's /metrics has every family
promql metrics "127.0.0.1:$loadgen_port" | promtool check metrics || fail "loadgen /metrics lint"
wait "$loadgen_pid" || fail "hlem loadgen failed: $(cat "$run/loadgen.txt")"
head -4 "$run/loadgen.txt"
requests=$(sed -n 's/^requests \([0-9]*\), OK.*/\1/p' "$run/loadgen.txt")
p99_ms=$(sed -n 's/^latency of OK answers:.* p99 \([0-9.]*\) ms$/\1/p' "$run/loadgen.txt")
satisfied=$(sed -n 's/^SLO .* satisfied: \([0-9.]*\) %.*/\1/p' "$run/loadgen.txt")
[ -n "$requests" ] && [ -n "$p99_ms" ] && [ -n "$satisfied" ] || fail "cannot read the loadgen summary"

# Scraped once more after the last answer: the counters are final.
promql wait "$url" "sum(hlem_router_slo_requests_total) == $requests" 15 ||
  fail "the routers counted $(value 'sum(hlem_router_slo_requests_total)') answers, loadgen sent $requests"
echo "answers: $requests at the router and the load generator"
# The load generator's own metrics (by regime; this trace is one Steady phase): the same counts as
# its summary. It has exited: its series are stale now, their last samples are what it reported.
last() { echo "sum(last_over_time($1[5m]))"; }
promql wait "$url" "$(last hlem_loadgen_requests_total) == $requests" 15 ||
  fail "Prometheus has $(value "$(last hlem_loadgen_requests_total)") load generator requests"
loadgen_attainment=$(value "$(last 'hlem_loadgen_slo_requests_total{regime="steady",result="met"}') / $(last 'hlem_loadgen_slo_requests_total{regime="steady"}')")
near "$(awk -v a="$loadgen_attainment" 'BEGIN { print 100 * a }')" "$satisfied" 0.006 ||
  fail "the load generator's metrics say $loadgen_attainment, its summary $satisfied %"
echo "load generator metrics: $requests requests, steady attainment $loadgen_attainment (summary $satisfied %)"

# The router's figures against the same requests as the load generator recorded them: each
# answer carries the router's own time (router_ms, receipt to response), which is what its
# histogram and SLO counter measure; the client's latency adds the hops (at most the router's
# attainment, at least its P99 bucket's lower edge).
attainment=$(value 'sum(hlem_router_slo_requests_total{result="met"}) / sum(hlem_router_slo_requests_total)')
router_csv=$(awk -F, -v slo="$slo_ms" 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "router_ms") r = i; if ($i == "code") c = i }; next }
  { n++; if ($c == "OK" && $r <= slo) met++ } END { printf "%.6f", met / n }' "$run/requests.csv")
echo "SLO ${slo_ms} ms attainment: Prometheus $attainment; the answers' router times $router_csv; the client's $satisfied %"
# (the histogram and the counter take each answer's own router time: equal up to the CSV's
# rounding to the µs)
near "$attainment" "$router_csv" 0.004 ||
  fail "attainment: Prometheus $attainment, the answers' own router times $router_csv"
awk -v p="$attainment" -v l="$satisfied" 'BEGIN { exit !(l / 100 <= p + 0.005) }' ||
  fail "the client's attainment $satisfied % above the router's $attainment"
[ "$(awk -v l="$satisfied" 'BEGIN { print (l > 0.5 && l < 99.5) }')" = 1 ] ||
  echo "note: every or no request met the ${slo_ms} ms SLO ($satisfied %): the comparison is weak"

p99=$(value 'histogram_quantile(0.99, sum by (le) (hlem_router_request_duration_seconds_bucket))')
# The estimate lies in the bucket that holds the true P99: the answers' router times' P99 must
# lie in it too; the client's P99 (with the hops) at or above its lower edge.
edges=$(promql query "$url" 'sum by (le) (hlem_router_request_duration_seconds_bucket)' |
  sed -n 's/.*le="\([^"]*\)".*/\1/p' | grep -v Inf | sort -g)
bounds=$(awk -v p="$p99" 'BEGIN { lo = 0 } { if ($1 + 0 < p) lo = $1; else { print lo, $1; exit } }' <<<"$edges")
read -r lo hi <<<"$bounds"
router_p99=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "router_ms") r = i; next } { print $r }' \
  "$run/requests.csv" | sort -g | awk '{ v[NR] = $1 } END { print v[int(0.99 * NR + 0.999)] }')
echo "P99: Prometheus $p99 s (bucket $lo–$hi s); the answers' router times $router_p99 ms; the client's $p99_ms ms"
awk -v r="$router_p99" -v lo="$lo" -v hi="$hi" 'BEGIN { s = r / 1000; exit !(s >= lo - 0.0002 && s <= hi + 0.0002) }' ||
  fail "P99: the answers' router times give $router_p99 ms, outside Prometheus' bucket $lo–$hi s"
awk -v l="$p99_ms" -v lo="$lo" 'BEGIN { exit !(l / 1000 >= lo - 0.0005) }' ||
  fail "P99: the client's $p99_ms ms below Prometheus' bucket $lo–$hi s"

echo "--- α per node"
promql query "$url" 'hlem_node_alpha{kind="target"}' | tee "$run/alpha.txt"
[ "$(wc -l < "$run/alpha.txt")" -eq 2 ] || fail "expected α of 2 nodes"
while read -r labels v; do
  near "$v" "$alpha" 1e-9 || fail "node α $labels $v, the allocator set $alpha"
  pod=$(sed -n 's/.*pod="\([^"]*\)".*/\1/p' <<<"$labels")
  near "$(value "hlem_allocator_alpha{node=\"$pod\"}")" "$alpha" 1e-9 || fail "allocator's α of $pod"
  [ -n "$(value "hlem_allocator_last_decision{node=\"$pod\",reason=\"static\"}")" ] ||
    fail "no last decision of $pod with its reason"
done < "$run/alpha.txt"

echo "--- recording rules"
for rule in hlem:router_slo_attainment:ratio_rate1m hlem:router_latency_seconds:p99_1m \
  hlem:node_kv_hit:ratio_rate1m hlem:node_emb_hit:ratio_rate1m hlem:router_decisions:rate1m; do
  promql wait "$url" "$rule" 20 || fail "recording rule $rule has no sample"
done
echo "PASS"
