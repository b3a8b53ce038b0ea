#!/usr/bin/env bash
# The allocator on loopback (issue 7): `hlem cluster up --allocator static` (1 shard, 2 nodes,
# router, allocator pushing α = 0.3 every second); both nodes' α target becomes 0.3 (their own
# metrics), the allocator logs one line per decision and exports hlem_allocator_alpha; a node
# killed with SIGKILL does not stop the allocator, which keeps serving and leaves the other node
# at its α; bad config (ppo without weights, weights of the wrong shape) is a start-up error with
# exit code 2 naming the flag.
# Usage: allocator_test.sh <build dir> <source dir>
set -euo pipefail
build=$1
src=$2
hlem="$build/tools/hlem"
allocator="$build/allocator_service/allocator"
run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_alloc.XXXXXX")
cleanup() {
  "$hlem" cluster down --run-dir "$run" >/dev/null 2>&1 || true
  rm -rf "$run"
}
trap cleanup EXIT

# Bad config first: exit 2, the flag named, nothing started.
expect_usage() {  # expect_usage <text> <flags...>
  local text=$1
  shift
  set +e
  "$allocator" --nodes 127.0.0.1:1 "$@" >/dev/null 2>"$run/err.txt"
  local code=$?
  set -e
  [ "$code" = 2 ] && grep -q -- "$text" "$run/err.txt" || {
    echo "allocator $*: exit $code, expected 2 and '$text'" >&2; cat "$run/err.txt" >&2; exit 1; }
}
expect_usage "--weights" --controller ppo
expect_usage "--weights" --controller hlem --weights "$run/missing.mlp"
printf 'hlem-mlp 1\nactivation tanh\nnormaliser 7\n0 0 0 0 0 0 0\n1 1 1 1 1 1 1\nclip 5\nlayers 1\nlayer 7 2\n%s\n%s\n0 0\n' \
  "1 0 0 0 0 0 0" "0 1 0 0 0 0 0" >"$run/shape.mlp"
expect_usage "7 inputs to 2 outputs" --controller ppo --weights "$run/shape.mlp"
expect_usage "--alpha-min" --alpha-min 0.8 --alpha-max 0.2
expect_usage "--deadband" --deadband 1.5

"$hlem" cluster up --run-dir "$run" --nodes 2 --bin-dir "$build" \
  --shards-config "$src/tests/e2e/shards.yaml" --node-config "$src/tests/e2e/node.yaml" \
  --allocator static --allocator-arg=--alpha=0.3 --allocator-arg=--interval-s=1 >/dev/null
metrics_of() { sed -n 's/^metrics=//p' "$run/$1.ports"; }
node_alpha() {  # node_alpha <name>: its α target
  curl -s "http://127.0.0.1:$(metrics_of "$1")/metrics" |
    awk '/^hlem_node_alpha\{kind="target"\}/ {print $2}'
}
deadline=$((SECONDS + 60))
until [ "$(node_alpha node-0)" = 0.3 ] && [ "$(node_alpha node-1)" = 0.3 ]; do
  if [ $SECONDS -gt $deadline ]; then
    echo "the nodes' alpha did not become 0.3: $(node_alpha node-0) $(node_alpha node-1)" >&2
    tail -20 "$run/allocator.log" >&2
    exit 1
  fi
  sleep 1
done
# The allocator logs a round's decisions and sets its gauges when the round ends, after the
# nodes took their α; its gauge shows the α each node reported at its next poll: wait for both.
decision_logged() {
  grep -q 'decision id=[0-9]* node=node-0 .* alpha_after=0.300 .* applied=true' "$run/allocator.log"
}
allocator_gauge() {  # allocator_gauge <node>: hlem_allocator_alpha of that node
  local metrics
  metrics=$(curl -s "http://127.0.0.1:$(metrics_of allocator)/metrics") || return 0
  awk -v n="$1" '$1 == "hlem_allocator_alpha{node=\"" n "\"}" {print $2}' <<<"$metrics"
}
deadline=$((SECONDS + 15))
until decision_logged && [ "$(allocator_gauge node-1)" = 0.3 ]; do
  if [ $SECONDS -gt $deadline ]; then
    decision_logged || { echo "no decision line" >&2; cat "$run/allocator.log" >&2; exit 1; }
    echo "hlem_allocator_alpha for node-1 is '$(allocator_gauge node-1)', not 0.3" >&2
    exit 1
  fi
  sleep 0.5
done

# A node dies: the allocator keeps serving; the other node keeps its α.
kill -9 "$(awk '$2 == "node-1" {print $3}' "$run/cluster.state")"
sleep 4
status=$("$hlem" cluster status --run-dir "$run" || true)  # exit 1: node-1 is down
grep -q '^allocator .* serving$' <<<"$status" || {
  echo "the allocator stopped serving after a node died" >&2; tail -20 "$run/allocator.log" >&2; exit 1; }
[ "$(node_alpha node-0)" = 0.3 ] || { echo "node-0 lost its alpha" >&2; exit 1; }
echo "allocator e2e: both nodes at alpha 0.3, $(grep -c 'decision id=' "$run/allocator.log") decisions logged, survived a node's death"
