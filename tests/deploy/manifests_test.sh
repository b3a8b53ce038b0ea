#!/usr/bin/env bash
# deploy/ offline (issue 10): yamllint over deploy/; each overlay rendered with `kubectl kustomize`,
# validated against the Kubernetes schema and the project's checks (deploy/tests/check-manifests.mjs),
# its ConfigMaps' config files checked by the binaries' own --check-config; and the checker must
# reject manifests broken on purpose (so a pass means something).
#   manifests_test.sh BUILD_DIR SOURCE_DIR
# Exit 77 (ctest: skipped) when no kubectl with kustomize v4 or later is on the PATH (Debian 12's
# kubernetes-client is 1.20, kustomize v2); the message says so.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

kustomize_version=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p' || true)
if [ -z "$kustomize_version" ] || [ "$kustomize_version" -lt 4 ]; then
  echo "SKIPPED: needs kubectl with kustomize v4+ ('kubectl version --client' shows none)"
  exit 77
fi
command -v yamllint >/dev/null || fail "yamllint not installed (scripts/install-deps.sh)"
[ -d "$src/deploy/tests/node_modules/kubernetes-models" ] ||
  fail "deploy/tests/node_modules missing: run scripts/install-deps.sh (npm ci)"

echo "--- yamllint deploy/"
yamllint --strict -c "$src/deploy/.yamllint" "$src/deploy"

binaries=(
  --binary "hlem/embedding-shard=$build/embedding_shard/embedding_shard"
  --binary "hlem/serving-node=$build/serving_node/serving_node"
  --binary "hlem/router=$build/router/router"
  --binary "hlem/allocator=$build/allocator_service/allocator"
)
check() {  # check RENDERED OUT
  node "$src/deploy/tests/check-manifests.mjs" --rendered "$1" \
    --dockerfile "$src/deploy/docker/Dockerfile" --out "$2" "${binaries[@]}"
}

for overlay in small paper; do
  echo "--- overlay $overlay"
  rendered="$work/$overlay.yaml"
  kubectl kustomize "$src/deploy/k8s/overlays/$overlay" > "$rendered"
  check "$rendered" "$work/$overlay-config"
  # The config files as the pods see them, through the binaries' own validation.
  found=0
  for dir in "$work/$overlay-config"/*/; do
    if [ -f "$dir/node.yaml" ]; then
      "$build/serving_node/serving_node" --check-config --config "$dir/node.yaml"
      found=$((found + 1))
    fi
    if [ -f "$dir/shards.yaml" ]; then
      "$build/embedding_shard/embedding_shard" --check-config --config "$dir/shards.yaml"
      found=$((found + 1))
    fi
  done
  [ "$found" -ge 2 ] || fail "$overlay: expected a node.yaml and a shards.yaml in its ConfigMaps"
done

echo "--- deploy/observability"
kubectl kustomize "$src/deploy/observability" > "$work/observability.yaml"
check "$work/observability.yaml" "$work/observability-config"
for key in prometheus.yml hlem-recording.yml hlem-alerts.yml hlem-overview.json hlem-routing.json; do
  ls "$work"/observability-config/*/"$key" > /dev/null || fail "observability: no ConfigMap key $key"
done

echo "--- the checks reject broken manifests"
base="$work/small.yaml"
broken() {  # broken DESCRIPTION EXPECTED-MESSAGE SED-EXPRESSION
  sed "$3" "$base" > "$work/broken.yaml"
  cmp -s "$base" "$work/broken.yaml" && fail "mutation '$1' changed nothing"
  if check "$work/broken.yaml" "$work/broken-config" > "$work/broken.log" 2>&1; then
    fail "the checker accepted $1"
  fi
  grep -q -- "$2" "$work/broken.log" || { cat "$work/broken.log"; fail "$1: no '$2' in the report"; }
  echo "rejected: $1"
}
broken "a latest tag" "never latest" 's|image: hlem/router:0.1.0|image: hlem/router:latest|'
broken "a probe on a port the container lacks" "is not a container port" 's|port: 50053|port: 50099|'
broken "a flag the binary lacks" "no such flag" 's|--drain-timeout=2|--drain-timout=2|'
broken "a config key the ConfigMap lacks" "has no key" 's|--config=/etc/hlem/node.yaml|--config=/etc/hlem/nodes.yaml|'
broken "a shard address that is not the StatefulSet's pod" "the StatefulSet's pod is" \
  's|embedding-shard-0.embedding-shard:50051|embedding-shard-1.embedding-shard:50051|'
broken "the admin port open to all" "opens the admin port" 's|^    - port: metrics$|    - port: admin|'
broken "a grace period shorter than preStop + drain" "terminationGracePeriodSeconds" \
  's|terminationGracePeriodSeconds: 10|terminationGracePeriodSeconds: 6|'
broken "a schema error" "must be integer" 's|containerPort: 9464|containerPort: "9464"|'
broken "a router SLO other than the nodes'" "node.slo" 's|--drain-timeout=2|--slo-ms=40|'
broken "an admin port without the admin token" "listens without --admin-token-file" \
  's|--admin-token-file=/etc/hlem-tokens/admin.token|--log-level=info|g'
base="$work/paper.yaml"  # mutual TLS and tokens
broken "one plaintext container in a TLS cluster" "--tls differs" '0,/--tls=mtls/s//--tls=off/'
broken "a node admin caller without the admin token" "passes no --admin-token-file" \
  '0,/--admin-token-file=\/etc\/hlem-tokens\/admin.token/s//--log-level=info/'
broken "a TLS file outside every volume" "neither under a volume mount" \
  '0,/--tls-ca=\/etc\/hlem-tls\/ca.crt/s//--tls-ca=\/etc\/missing\/ca.crt/'
echo "PASS"
