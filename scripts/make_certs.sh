#!/usr/bin/env bash
# Certificates and keys for a TLS Flower federation with SuperNode authentication.
#
#   scripts/make_certs.sh [-o DIR] [-n NUM_NODE_KEYS] [-d DAYS] [-f] [HOST ...]
#
# Creates in DIR (default: $FEDFLEX_CERTS, else ~/.config/fedflex/certs: outside any
# checkout, since ca.key and the node keys are secrets; `certs/` is git-ignored in case):
#   ca.crt, ca.key            a self-signed certificate authority (EC P-384)
#   server.crt, server.key    the SuperLink's certificate, signed by the CA, valid for
#                             localhost, 127.0.0.1, ::1 and every HOST given (a name
#                             or an IP address: the address SuperNodes and `flwr`
#                             use to reach the SuperLink, e.g. its host name, its LAN
#                             IP, or `superlink` inside docker compose)
#   keys/supernode-I, keys/supernode-I.pub   (I = 0..NUM_NODE_KEYS-1, default 3)
#                             EC P-384 key pairs in OpenSSH format for SuperNode
#                             authentication: register the .pub file with
#                             `flwr supernode register`, start the SuperNode with
#                             `--auth-supernode-private-key keys/supernode-I`.
#
# The SuperLink gets --ssl-ca-certfile ca.crt --ssl-certfile server.crt
# --ssl-keyfile server.key; SuperNodes get --root-certificates ca.crt; the `flwr`
# CLI gets root-certificates = "<abs path>/ca.crt" in its SuperLink connection.
# ca.key signs further certificates: keep it off the machines of the federation.
#
# An existing DIR with a ca.crt is left alone unless -f is given.
set -euo pipefail

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

out="${FEDFLEX_CERTS:-${XDG_CONFIG_HOME:-$HOME/.config}/fedflex/certs}"
num_keys=3
days=365
force=0
while getopts "o:n:d:fh" opt; do
    case "$opt" in
        o) out="$OPTARG" ;;
        n) num_keys="$OPTARG" ;;
        d) days="$OPTARG" ;;
        f) force=1 ;;
        h) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
hosts=("$@")

if ! command -v openssl >/dev/null 2>&1; then
    echo "make_certs.sh: openssl is not installed (apt-get install openssl)" >&2
    exit 1
fi
if ! [[ "$num_keys" =~ ^[0-9]+$ ]]; then
    echo "make_certs.sh: -n must be a number of node keys, got '$num_keys'" >&2
    exit 2
fi
if [[ -e "$out/ca.crt" && "$force" -ne 1 ]]; then
    echo "make_certs.sh: $out/ca.crt exists; use -f to replace the certificates in $out" >&2
    exit 1
fi

mkdir -p "$out/keys"
umask 077

# --- subject alternative names -----------------------------------------------------
san="DNS:localhost,IP:127.0.0.1,IP:::1"
for h in "${hosts[@]}"; do
    if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then
        san="$san,IP:$h"
    else
        san="$san,DNS:$h"
    fi
done

# --- certificate authority ---------------------------------------------------------
openssl ecparam -name secp384r1 -genkey -noout -out "$out/ca.key"
openssl req -x509 -new -key "$out/ca.key" -sha384 -days "$days" \
    -subj "/CN=fedflex federation CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$out/ca.crt" 2>/dev/null

# --- SuperLink server certificate --------------------------------------------------
openssl ecparam -name secp384r1 -genkey -noout -out "$out/server.key.ec"
# PKCS#8 ("BEGIN PRIVATE KEY"): what uvicorn/ssl and grpc both read
openssl pkcs8 -topk8 -nocrypt -in "$out/server.key.ec" -out "$out/server.key"
rm -f "$out/server.key.ec"
openssl req -new -key "$out/server.key" -sha384 -subj "/CN=${hosts[0]:-localhost}" \
    -out "$out/server.csr"
ext="$(mktemp)"
trap 'rm -f "$ext"' EXIT
cat >"$ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$san
EOF
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days "$days" -sha384 -extfile "$ext" -out "$out/server.crt" 2>/dev/null
rm -f "$out/server.csr" "$out/ca.srl"

# --- SuperNode authentication keys (EC P-384, OpenSSH format) ----------------------
for ((i = 0; i < num_keys; i++)); do
    key="$out/keys/supernode-$i"
    rm -f "$key" "$key.pub"
    if command -v ssh-keygen >/dev/null 2>&1; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedflex-supernode-$i" -f "$key"
    else  # same format through Python's cryptography (a dependency of flwr; $PYTHON)
        "${PYTHON:-python3}" - "$key" "$i" <<'PY'
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

path, i = sys.argv[1], sys.argv[2]
key = ec.generate_private_key(ec.SECP384R1())
with open(path, "wb") as f:
    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption()))
pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
with open(path + ".pub", "wb") as f:
    f.write(pub + f" fedflex-supernode-{i}\n".encode())
PY
    fi
done

chmod 644 "$out/ca.crt" "$out/server.crt" "$out"/keys/*.pub 2>/dev/null || true
echo "make_certs.sh: wrote $out/{ca.crt,ca.key,server.crt,server.key} (SAN $san) and $num_keys SuperNode key pair(s) in $out/keys"
