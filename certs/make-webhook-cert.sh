#!/usr/bin/env bash
# Make a CA and a webhook serving certificate with openssl (for clusters without cert-manager).
#
#   certs/make-webhook-cert.sh [SERVICE] [NAMESPACE] [OUT_DIR]
#   defaults:                   switchyard-webhook switchyard-system ./certs/out
#
# Writes to OUT_DIR: ca.key, ca.crt (the CA; goes into the webhooks' caBundle),
# tls.key, tls.crt (the serving pair; goes into a kubernetes.io/tls Secret).
# ECDSA P-256 keys; the serving certificate has subjectAltName
# DNS:SERVICE.NAMESPACE.svc and DNS:SERVICE.NAMESPACE.svc.cluster.local and the
# serverAuth extended key usage. Existing files in OUT_DIR are overwritten.
# Environment: CA_DAYS (default 3650), CERT_DAYS (default 365).
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if (($# > 3)); then
  echo "usage: $0 [SERVICE] [NAMESPACE] [OUT_DIR]" >&2
  exit 2
fi

service="${1:-switchyard-webhook}"
namespace="${2:-switchyard-system}"
out="${3:-./certs/out}"
ca_days="${CA_DAYS:-3650}"
cert_days="${CERT_DAYS:-365}"

command -v openssl >/dev/null || { echo "openssl not found in PATH" >&2; exit 1; }

dns1="${service}.${namespace}.svc"
dns2="${service}.${namespace}.svc.cluster.local"

mkdir -p "$out"
umask 077
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# CA
openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca.key.ec"
openssl pkcs8 -topk8 -nocrypt -in "$work/ca.key.ec" -out "$out/ca.key"
cat >"$work/ca.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = ${service}.${namespace} webhook CA
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
openssl req -x509 -new -sha256 -key "$out/ca.key" -days "$ca_days" \
  -config "$work/ca.cnf" -out "$out/ca.crt"

# Serving key, CSR and certificate
openssl ecparam -name prime256v1 -genkey -noout -out "$work/tls.key.ec"
openssl pkcs8 -topk8 -nocrypt -in "$work/tls.key.ec" -out "$out/tls.key"
cat >"$work/tls.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = ${dns1}
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:${dns1}, DNS:${dns2}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
EOF
openssl req -new -sha256 -key "$out/tls.key" -config "$work/tls.cnf" -out "$work/tls.csr"
openssl x509 -req -sha256 -in "$work/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
  -set_serial "0x$(openssl rand -hex 16)" -days "$cert_days" \
  -extfile "$work/tls.cnf" -extensions v3_server -out "$out/tls.crt"

chmod 600 "$out/ca.key" "$out/tls.key"
chmod 644 "$out/ca.crt" "$out/tls.crt"

openssl verify -CAfile "$out/ca.crt" "$out/tls.crt" >/dev/null

ca_bundle="$(base64 <"$out/ca.crt" | tr -d '\n')"

cat <<EOF
Wrote ${out}/ca.key, ${out}/ca.crt, ${out}/tls.key, ${out}/tls.crt
Serving certificate names: ${dns1}, ${dns2}

Create the Secret:
  kubectl -n ${namespace} create secret tls ${service}-tls --cert=${out}/tls.crt --key=${out}/tls.key

caBundle for the webhook configurations (see webhooks/README.md):
${ca_bundle}
EOF
