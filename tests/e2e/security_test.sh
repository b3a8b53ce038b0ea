#!/usr/bin/env bash
# Access control on the local cluster (issue 11): `hlem cluster up --security-dir` runs every gRPC
# channel (shard, node, admin, router, allocator) over mutual TLS, the nodes' admin port behind the
# admin bearer token and the router behind the frontend token. Checks:
#   - the load generator with the CA, its client certificate and the frontend token: every request
#     OK; the allocator (mTLS + admin token) sets the nodes' α;
#   - without TLS, with a certificate of another CA, without a token, with the admin token at the
#     router: every request refused (UNAVAILABLE, UNAUTHENTICATED, PERMISSION_DENIED), each
#     answered once;
#   - the admin port: no token -> UNAUTHENTICATED, the frontend token -> PERMISSION_DENIED, the
#     admin token -> applied; the shard refuses plaintext and answers over mTLS;
#   - a rotated frontend token: the old one refused, the new one accepted, without a restart.
# Usage: security_test.sh <build dir> <source dir>
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
hlem="$build/tools/hlem"
run=$(mktemp -d "${TMPDIR:-/tmp}/hlem_security.XXXXXX")
cleanup() {
  "$hlem" cluster down --run-dir "$run/cluster" >/dev/null 2>&1 || true
  [ -n "${HLEM_KEEP_RUN:-}" ] && echo "kept $run" || rm -rf "$run"
  true
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
port_of() { awk -v n="$1" '$2 == n {print $4}' "$run/cluster/cluster.state"; }

# The test PKI (scripts/make-certs.sh made it) and two tokens.
sec="$run/security"
mkdir -p "$sec"
cp "$src"/common/testdata/tls/a/{ca.crt,tls.crt,tls.key} "$sec/"
echo "admin-$RANDOM-$RANDOM" > "$sec/admin.token"
echo "frontend-$RANDOM-$RANDOM" > "$sec/frontend.token"
other="$src/common/testdata/tls/b"
mtls=(--tls mtls --tls-ca "$sec/ca.crt" --tls-cert "$sec/tls.crt" --tls-key "$sec/tls.key")

cp "$src/tests/e2e/node.yaml" "$src/tests/e2e/shards.yaml" "$run/"
"$hlem" workload generate --config "$src/tests/e2e/workload.yaml" --out "$run/steady.trace" >/dev/null
"$hlem" cluster up --run-dir "$run/cluster" --nodes 2 --bin-dir "$build" \
  --shards-config "$run/shards.yaml" --node-config "$run/node.yaml" --security-dir "$sec" \
  --allocator static --allocator-arg=--alpha=0.4 --allocator-arg=--interval-s=1 >/dev/null
"$hlem" cluster status --run-dir "$run/cluster" >/dev/null || fail "cluster status over mTLS"
router="127.0.0.1:$(port_of router)"
node0="127.0.0.1:$(port_of node-0)"
shard0="127.0.0.1:$(port_of shard0)"

# replay NAME N [flags...]: N requests; prints the count of each status code.
replay() {
  local name=$1 n=$2
  shift 2
  "$hlem" loadgen --trace "$run/steady.trace" --router "$router" --limit "$n" --speed 4 \
    --deadline-ms 3000 --quiet --csv "$run/$name.csv" "$@" > "$run/$name.txt" 2>&1 || true
  grep -q "every request recorded once: $n sent or refused, $n outcomes" "$run/$name.txt" ||
    fail "$name: the books do not balance: $(cat "$run/$name.txt")"
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "code") c = i; next } { n[$c]++ }
           END { for (k in n) printf "%s=%d ", k, n[k]; print "" }' "$run/$name.csv"
}
expect_all() {  # expect_all NAME N CODE [flags...]
  local name=$1 n=$2 code=$3
  shift 3
  local got
  got=$(replay "$name" "$n" "$@")
  [ "$got" = "$code=$n " ] || fail "$name: expected $code for all $n requests, got: $got"
  echo "$name: $got"
}

expect_all with_credentials 40 OK "${mtls[@]}" --token-file "$sec/frontend.token"
expect_all plaintext 5 UNAVAILABLE
expect_all other_ca 5 UNAVAILABLE --tls mtls --tls-ca "$other/ca.crt" --tls-cert "$other/tls.crt" \
  --tls-key "$other/tls.key"
expect_all server_tls_only 5 UNAVAILABLE --tls tls --tls-ca "$sec/ca.crt"
expect_all no_token 5 UNAUTHENTICATED "${mtls[@]}"
expect_all admin_token_at_router 5 PERMISSION_DENIED "${mtls[@]}" --token-file "$sec/admin.token"

# The allocator reached the nodes' admin port (mTLS + admin token) and set α.
for _ in $(seq 50); do
  "$hlem" node state --server "$node0" "${mtls[@]}" 2>/dev/null | grep -q "alpha 0.400 -> 0.400" && break
  sleep 0.2
done
"$hlem" node state --server "$node0" "${mtls[@]}" | grep -q "alpha 0.400 -> 0.400" ||
  fail "the allocator did not set node-0's alpha to 0.4 over mTLS"
echo "allocator: node-0 alpha 0.4"

# The admin port itself.
admin="127.0.0.1:$("$hlem" node info --server "$node0" "${mtls[@]}" | sed -n 's/.*admin port \([0-9]*\).*/\1/p')"
set_alpha() { "$hlem" node set-alpha --admin "$admin" --alpha 0.6 --epoch 18000000000000000000 "$@" 2>&1; }
out=$(set_alpha "${mtls[@]}") && fail "set-alpha without a token succeeded: $out"
grep -q UNAUTHENTICATED <<< "$out" || fail "set-alpha without a token: $out"
out=$(set_alpha "${mtls[@]}" --admin-token-file "$sec/frontend.token") &&
  fail "set-alpha with the frontend token succeeded: $out"
grep -q PERMISSION_DENIED <<< "$out" || fail "set-alpha with the frontend token: $out"
out=$(set_alpha --admin-token-file "$sec/admin.token") && fail "set-alpha over plaintext succeeded"
out=$(set_alpha "${mtls[@]}" --admin-token-file "$sec/admin.token") ||
  fail "set-alpha with the admin token: $out"
grep -q "alpha target 0.600" <<< "$out" || fail "set-alpha with the admin token: $out"
echo "admin port: no token refused, frontend token refused, admin token applied"

# The shard: plaintext refused, mTLS answered.
"$hlem" shard info --server "$shard0" >/dev/null 2>&1 && fail "the shard answered plaintext"
"$hlem" shard info --server "$shard0" "${mtls[@]}" | grep -q "^num_shards: 1" ||
  fail "the shard did not answer over mTLS"
echo "shard: plaintext refused, mTLS answered"

# Token rotation without a restart (re-read within 0.5 s of the change).
cp "$sec/frontend.token" "$run/old.token"
echo "frontend-rotated-$RANDOM" > "$sec/frontend.token.new"
mv "$sec/frontend.token.new" "$sec/frontend.token"
sleep 1
expect_all old_token 5 PERMISSION_DENIED "${mtls[@]}" --token-file "$run/old.token"
expect_all rotated_token 5 OK "${mtls[@]}" --token-file "$sec/frontend.token"
echo "PASS"
