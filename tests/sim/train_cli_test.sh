#!/usr/bin/env bash
# PPO training from the CLI (issue 7): `hlem train-ppo` with the same flags writes the same weights
# file byte for byte in two separate processes, another seed another file; the file records the
# command that reproduces it and loads as the ppo controller of `hlem sim run`, which then decides
# every window by the policy; bad input (a bad --hidden, a missing --workload, a missing or
# wrongly shaped --weights file, --history-sketch without sampled rows) is a clear error with exit
# code 2. A sketched, calibrated run with the P99 tie-break (how the paper policy is trained) works.
# Usage: train_cli_test.sh <build dir> <source dir>
set -euo pipefail
build=$1
src=$2
hlem="$build/tools/hlem"
dir=$(mktemp -d "${TMPDIR:-/tmp}/hlem_train.XXXXXX")
trap 'rm -rf "$dir"' EXIT

train() {  # train <out> [flags]
  local out=$1
  shift
  "$hlem" train-ppo --workload "$src/deploy/local/workload.yaml" \
    --node-config "$src/deploy/local/node.yaml" --costs "$src/sim/costs/cpu-local-cluster.yaml" \
    --iterations 2 --steps 40 --episode-s 30 --out "$out" "$@"
}
train "$dir/a.mlp" --seed 3 >"$dir/a.txt"
train "$dir/b.mlp" --seed 3 >/dev/null
train "$dir/c.mlp" --seed 4 >/dev/null
a=$(grep -v '^#' "$dir/a.mlp" | sha256sum | cut -d' ' -f1)
b=$(grep -v '^#' "$dir/b.mlp" | sha256sum | cut -d' ' -f1)
c=$(grep -v '^#' "$dir/c.mlp" | sha256sum | cut -d' ' -f1)
[ "$a" = "$b" ] || { echo "same seed, different weights: $a $b" >&2; exit 1; }
[ "$a" != "$c" ] || { echo "seeds 3 and 4 gave the same weights" >&2; exit 1; }
grep -q '^#   hlem train-ppo .*--seed 3' "$dir/a.mlp" || {
  echo "the file does not record its command" >&2; head -5 "$dir/a.mlp" >&2; exit 1; }
[ "$(grep -c '^ *2 ' "$dir/a.txt")" = 1 ] || { echo "no second iteration line" >&2; cat "$dir/a.txt" >&2; exit 1; }
# The paper profile's way: sampled rows, sketched first visits, calibrated router, P99 tie-break;
# the file records every one of those flags.
train "$dir/s.mlp" --seed 3 --emb-sample 4 --history-sketch --calibrate-costs --p99-weight 0.5 \
  --rate 30 >/dev/null
grep -q '^#   hlem train-ppo .*--rate 30 .*--emb-sample 4 --history-sketch --calibrate-costs --p99-weight 0.5 ' \
  "$dir/s.mlp" || { echo "the sketched run's file lacks its flags" >&2; head -5 "$dir/s.mlp" >&2; exit 1; }
s=$(grep -v '^#' "$dir/s.mlp" | sha256sum | cut -d' ' -f1)
[ "$s" != "$a" ] || { echo "the sketched run trained the same weights as the plain one" >&2; exit 1; }

# The trained actor runs as the ppo controller.
"$hlem" workload generate --config "$src/deploy/local/workload.yaml" --regime steady \
  --duration 30s --seed 5 --out "$dir/t.trace" >/dev/null
sim() {
  "$hlem" sim run --trace "$dir/t.trace" --node-config "$src/deploy/local/node.yaml" \
    --costs "$src/sim/costs/cpu-local-cluster.yaml" --controller ppo "$@"
}
sim --weights "$dir/a.mlp" --alpha 0.5 >"$dir/run.txt"
grep -q '^allocator: [0-9]* decisions, policy [0-9]*$\|^allocator: [0-9]* decisions, policy [0-9]*;' \
  "$dir/run.txt" || { echo "no policy decisions" >&2; cat "$dir/run.txt" >&2; exit 1; }

# Bad input: exit 2 and a message naming the flag.
expect_usage() {  # expect_usage <text> <command...>
  local text=$1
  shift
  set +e
  "$@" >/dev/null 2>"$dir/err.txt"
  local code=$?
  set -e
  [ "$code" = 2 ] && grep -q -- "$text" "$dir/err.txt" || {
    echo "$*: exit $code, expected 2 and '$text'" >&2; cat "$dir/err.txt" >&2; exit 1; }
}
expect_usage "--hidden" train "$dir/x.mlp" --hidden 64,x
expect_usage "--workload" "$hlem" train-ppo --workload "$dir/missing.yaml" --out "$dir/x.mlp" \
  --node-config "$src/deploy/local/node.yaml" --costs "$src/sim/costs/cpu-local-cluster.yaml"
expect_usage "--history-sketch: needs --emb-sample 2" train "$dir/x.mlp" --history-sketch
expect_usage "--weights" sim --weights "$dir/missing.mlp"
expect_usage "--weights" sim
# An actor of the wrong shape (2 outputs, not the 7 actions).
printf 'hlem-mlp 1\nactivation tanh\nnormaliser 7\n0 0 0 0 0 0 0\n1 1 1 1 1 1 1\nclip 5\nlayers 1\nlayer 7 2\n%s\n%s\n0 0\n' \
  "1 0 0 0 0 0 0" "0 1 0 0 0 0 0" >"$dir/shape.mlp"
expect_usage "--weights: .*the actor maps 7 inputs to 2 outputs" sim --weights "$dir/shape.mlp"
echo "train CLI: weights $a twice (seed 3), $c with seed 4; $(grep '^allocator' "$dir/run.txt")"
