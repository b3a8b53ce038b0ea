#!/usr/bin/env bash
# Makes a CA and one certificate/key pair signed by it for HLEM's gRPC TLS (docs/reliability.md,
# "Access"): every process serves and dials with the same pair; with --tls=mtls the servers also
# require it from their clients. For local clusters and tests; in production use your PKI (e.g.
# cert-manager writing the same three files into a Secret).
#
#   scripts/make-certs.sh DIR [NAME...]
#
# Writes DIR/ca.crt, DIR/tls.crt, DIR/tls.key (the names of a Kubernetes TLS Secret) and, when they
# do not exist yet, DIR/admin.token and DIR/frontend.token (32 random bytes, hex). The certificate
# names localhost, 127.0.0.1, ::1, hlem.internal and every NAME given (e.g. '*.hlem-node.hlem.svc').
# Key: ECDSA P-256; valid 10 years. Needs the openssl command.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [NAME...]" >&2
  exit 2
fi
dir=$1
shift
command -v openssl > /dev/null || { echo "$0: needs openssl (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
san="DNS:localhost,DNS:hlem.internal,IP:127.0.0.1,IP:::1"
for name in "$@"; do san+=",DNS:$name"; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/ca.key"
openssl req -x509 -new -key "$tmp/ca.key" -sha256 -days 3650 -subj "/CN=hlem-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$tmp/ca.crt" 2> /dev/null
openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/ec.key"
openssl pkcs8 -topk8 -nocrypt -in "$tmp/ec.key" -out "$tmp/tls.key"
openssl req -new -key "$tmp/tls.key" -subj "/CN=hlem" -out "$tmp/tls.csr" 2> /dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
  "$san" > "$tmp/ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days 3650 -sha256 -extfile "$tmp/ext" -out "$tmp/tls.crt" 2> /dev/null
umask 077
cp "$tmp/ca.crt" "$tmp/tls.crt" "$tmp/tls.key" "$dir/"
for token in admin frontend; do
  [[ -s "$dir/$token.token" ]] || openssl rand -hex 32 > "$dir/$token.token"
done
echo "$dir: ca.crt tls.crt tls.key admin.token frontend.token ($san)"
