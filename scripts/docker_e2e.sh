#!/usr/bin/env bash
# Build fedflex's Docker images and run both compose demos end to end: plain HTTP
# (docker/docker-compose.yml) and TLS + SuperNode authentication
# (docker/docker-compose.tls.yml), each a SuperLink and 3 SuperNodes running the
# quickstart scenario cut to 3 clients. Prints rounds, times and image sizes.
#
#   bash scripts/docker_e2e.sh [-r ROUNDS] [-p PORT] [-u UID]
#
#   -r ROUNDS  rounds per demo (default 3)
#   -p PORT    host port of the SuperLink (default 8000; published on 127.0.0.1 only)
#   -u UID     run the TLS demo with runs/ and the keys owned by this uid (needs root),
#              to show that the images do not need uid 1000
# The images stay (fedflex-superlink:0.1.0, fedflex-supernode:0.1.0); the demos'
# containers and volumes are removed (`down -v`), also on errors.
#
# Needs: a Docker engine, Compose v2 (`docker compose version`), openssl, and fedflex's
# Python environment on the host for the `flwr` CLI ($PYTHON, default: python3 on PATH).
#
# Stand-ins, used ONLY when a registry is out of reach (with a normal network the script
# builds exactly what `docker compose up --build` builds):
#   - python:3.11-slim cannot be pulled from Docker Hub -> a base image built from Debian
#     packages with debootstrap (Debian's python3.11 + pip), tagged fedflex-base:py311;
#   - pip inside a build cannot reach PyPI / PyTorch's index -> the host's pip downloads
#     the wheels into ~/.cache/fedflex-docker-wheels, served on 127.0.0.1 to a
#     --network host build (the host's torch source decides the torch build: on a machine
#     without PyTorch's CPU index, set TORCH_SPEC, e.g. TORCH_SPEC='torch==2.13.0+cpu').
set -euo pipefail

rounds=3
port=8000
as_uid=""
while getopts "r:p:u:h" opt; do
    case "$opt" in
        r) rounds="$OPTARG" ;;
        p) port="$OPTARG" ;;
        u) as_uid="$OPTARG" ;;
        h) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) exit 2 ;;
    esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
flwr_bin="$(dirname "$("$py" -c 'import sys; print(sys.executable)')")/flwr"
[[ -x "$flwr_bin" ]] || flwr_bin="$(command -v flwr)"
work="$(mktemp -d "${TMPDIR:-/tmp}/fedflex-docker-e2e.XXXXXX")"
stamp="$(date +%Y%m%d-%H%M%S)"
project="fedflex-e2e"
export FEDFLEX_PORT="$port"
server_pid=""

say() { printf '[docker_e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

cleanup() {
    [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true
    docker compose -p "$project" -f docker/docker-compose.yml down -v >/dev/null 2>&1 || true
    FEDFLEX_CERTS="${FEDFLEX_CERTS:-$work/certs}" \
        docker compose -p "$project-tls" -f docker/docker-compose.tls.yml down -v >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ---------------------------------------------------------------- prerequisites
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd)"
docker compose version 2>/dev/null | grep -Eq 'v?2\.' \
    || die "Compose v2 is needed (docker compose version); Compose v1 (docker-compose 1.29) rejects the files' top-level name:"
command -v openssl >/dev/null || die "openssl is needed for the TLS demo"
[[ -x "$flwr_bin" ]] || die "flwr CLI not found next to $py nor on PATH (set PYTHON to fedflex's python)"

# ---------------------------------------------------------------- base image
base="python:3.11-slim"
if ! docker image inspect "$base" >/dev/null 2>&1 && ! timeout 120 docker pull -q "$base" >/dev/null 2>&1; then
    base="fedflex-base:py311"
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        say "Docker Hub unreachable: building the stand-in base image $base from Debian packages"
        command -v debootstrap >/dev/null || die "debootstrap is needed for the stand-in base image"
        rootfs="$work/rootfs"
        debootstrap --variant=minbase \
            --include=python3,python3-pip,python3-venv,python-is-python3,passwd,ca-certificates \
            bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
            || die "debootstrap failed: see $work/debootstrap.log"
        rm -f "$rootfs/usr/lib/python3.11/EXTERNALLY-MANAGED"  # a container's own Python
        tar -C "$rootfs" -c . | docker import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["python3"]' - "$base" >/dev/null
        rm -rf "$rootfs"
    fi
fi
say "base image: $base"

# ---------------------------------------------------------------- build
build_args=(--build-arg "BASE_IMAGE=$base")
network=()
probe="import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=15)"
if ! timeout 60 docker run --rm "$base" python -c "$probe" >/dev/null 2>&1; then
    wheels="${FEDFLEX_WHEELS:-$HOME/.cache/fedflex-docker-wheels}"
    say "PyPI unreachable from containers: wheels from the host's pip in $wheels, served on 127.0.0.1"
    mkdir -p "$wheels"
    flwr_pin="$(grep -E '^ARG FLWR_VERSION=' docker/Dockerfile | cut -d= -f2)"
    torch_spec="${TORCH_SPEC:-torch}"
    "$py" -m pip download -q -d "$wheels" --timeout 20 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch torchvision \
        >/dev/null 2>&1 \
        || "$py" -m pip download -q -d "$wheels" "$torch_spec" torchvision \
        || die "could not download torch for the wheel index"
    "$py" -m pip download -q -d "$wheels" "setuptools>=68" wheel "flwr[simulation]==$flwr_pin" "$root" \
        $(ls "$wheels"/torch-*.whl | head -n 1) \
        || die "pip download failed"
    wport="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    "$py" -m http.server --bind 127.0.0.1 --directory "$wheels" "$wport" >/dev/null 2>&1 &
    server_pid=$!
    sleep 1
    build_args+=(--build-arg "PIP_EXTRA_ARGS=--no-index --find-links http://127.0.0.1:$wport/")
    network=(--network host)
fi
t0=$(date +%s)
for target in superlink supernode; do
    say "building fedflex-$target:0.1.0"
    docker build -q "${network[@]}" "${build_args[@]}" -f docker/Dockerfile --target "$target" \
        -t "fedflex-$target:0.1.0" . >"$work/build-$target.log" 2>&1 \
        || { tail -n 30 "$work/build-$target.log" >&2; die "docker build --target $target failed"; }
done
build_s=$(($(date +%s) - t0))
[[ -n "$server_pid" ]] && { kill "$server_pid" 2>/dev/null || true; server_pid=""; }
torch_build="$(docker run --rm --entrypoint python fedflex-supernode:0.1.0 -c \
    'import torch; print(torch.__version__, "cuda" if torch.version.cuda else "cpu")')"
say "images built in ${build_s} s; torch in the image: $torch_build"

# ---------------------------------------------------------------- a demo
export FLWR_HOME="$work/flwr-home"
mkdir -p "$FLWR_HOME"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1

flwr_json() { "$flwr_bin" "$@" --format json 2>/dev/null; }

wait_nodes() {  # until 3 SuperNodes are online (max 180 s)
    local conn="$1" deadline=$(($(date +%s) + 180)) n
    while :; do
        n="$(flwr_json supernode ls "$conn" | "$py" -c \
            'import json,sys; d=json.load(sys.stdin); print(sum(x.get("status")=="online" for x in d.get("nodes",[])))' \
            2>/dev/null || echo 0)"
        [[ "$n" -ge 3 ]] && return 0
        [[ $(date +%s) -ge $deadline ]] && die "only $n of 3 SuperNodes online after 180 s"
        sleep 3
    done
}

run_demo() {  # conn out -> prints "rounds seconds status"
    local conn="$1" out="$2" t start rid status
    start=$(date +%s)
    local cfg="scenario=\"scenarios/quickstart.yaml\" out=\"$out\""
    cfg+=" overrides=\"num_clients=3 churn.kind=none strategy.sampler.clients_per_round=3 rounds=$rounds output.plots=false\""
    rid="$(flwr_json run . "$conn" --run-config "$cfg" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["run-id"])')" \
        || die "flwr run failed"
    while :; do
        status="$(flwr_json ls "$conn" --run-id "$rid" | "$py" -c \
            'import json,sys; print(json.load(sys.stdin)["runs"][0]["status"])' 2>/dev/null || echo unknown)"
        [[ "$status" == finished* ]] && break
        [[ $(($(date +%s) - start)) -gt 1800 ]] && { status="timeout"; break; }
        sleep 5
    done
    t=$(($(date +%s) - start))
    local n=0
    [[ -f "$root/$out/metrics.jsonl" ]] && n=$(wc -l <"$root/$out/metrics.jsonl")
    echo "$n $t $status"
}

connection() {  # name address [ca]
    {
        echo "[superlink]"
        echo "default = \"$1\""
        echo "[superlink.$1]"
        echo "address = \"$2\""
        if [[ -n "${3:-}" ]]; then echo "root-certificates = \"$3\""; else echo "insecure = true"; fi
    } >"$FLWR_HOME/config.toml"
}

mkdir -p runs

# plain HTTP
say "plain-HTTP demo: SuperLink + 3 SuperNodes"
t0=$(date +%s)
docker compose -p "$project" -f docker/docker-compose.yml up -d >"$work/up-plain.log" 2>&1 \
    || { cat "$work/up-plain.log" >&2; die "compose up (plain) failed"; }
connection fedflex-docker "127.0.0.1:$port"
wait_nodes fedflex-docker
read -r plain_rounds plain_s plain_status < <(run_demo fedflex-docker "runs/docker-e2e-plain-$stamp")
plain_total=$(($(date +%s) - t0))
docker compose -p "$project" -f docker/docker-compose.yml logs --no-color >"$work/plain.log" 2>&1 || true
docker compose -p "$project" -f docker/docker-compose.yml down -v >/dev/null 2>&1
say "plain: $plain_status, $plain_rounds/$rounds rounds, run ${plain_s} s, demo ${plain_total} s"

# TLS + node authentication
say "TLS + node-auth demo"
export FEDFLEX_CERTS="$work/certs"
bash scripts/make_certs.sh -o "$FEDFLEX_CERTS" -n 3 superlink >/dev/null
tls_out="runs/docker-e2e-tls-$stamp"
if [[ -n "$as_uid" ]]; then  # results and keys owned by someone who is not uid 1000
    mkdir -p "$root/runs"
    chown "$as_uid:$as_uid" "$root/runs"
    chown -R "$as_uid:$as_uid" "$FEDFLEX_CERTS"
    chmod 600 "$FEDFLEX_CERTS"/keys/supernode-? "$FEDFLEX_CERTS/server.key"
    chmod o+r "$FEDFLEX_CERTS/ca.crt"
fi
t0=$(date +%s)
docker compose -p "$project-tls" -f docker/docker-compose.tls.yml up -d superlink >"$work/up-tls.log" 2>&1 \
    || { cat "$work/up-tls.log" >&2; die "compose up superlink (tls) failed"; }
connection fedflex-docker-tls "127.0.0.1:$port" "$FEDFLEX_CERTS/ca.crt"
for i in 0 1 2; do
    for _ in $(seq 30); do
        "$flwr_bin" supernode register "$FEDFLEX_CERTS/keys/supernode-$i.pub" fedflex-docker-tls >/dev/null 2>&1 && break
        sleep 2
    done
done
docker compose -p "$project-tls" -f docker/docker-compose.tls.yml up -d >>"$work/up-tls.log" 2>&1 \
    || { cat "$work/up-tls.log" >&2; die "compose up (tls) failed"; }
wait_nodes fedflex-docker-tls
read -r tls_rounds tls_s tls_status < <(run_demo fedflex-docker-tls "$tls_out")
tls_total=$(($(date +%s) - t0))
docker compose -p "$project-tls" -f docker/docker-compose.tls.yml logs --no-color >"$work/tls.log" 2>&1 || true
tls_owner="$(stat -c %u "$root/$tls_out/metrics.jsonl" 2>/dev/null || echo none)"
say "tls: $tls_status, $tls_rounds/$rounds rounds, run ${tls_s} s, demo ${tls_total} s; results owned by uid $tls_owner"

# ---------------------------------------------------------------- report
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1/1e9}'; }
echo "base image:        $base"
echo "build (2 targets): ${build_s} s; torch: $torch_build"
echo "image sizes:       fedflex-superlink:0.1.0 $(size fedflex-superlink:0.1.0), fedflex-supernode:0.1.0 $(size fedflex-supernode:0.1.0) (one shared base layer set)"
echo "plain demo:        $plain_status, $plain_rounds of $rounds rounds, run ${plain_s} s, up-to-down ${plain_total} s"
echo "tls demo:          $tls_status, $tls_rounds of $rounds rounds, run ${tls_s} s, up-to-down ${tls_total} s, results uid $tls_owner"
echo "logs:              $work"
[[ "$plain_status" == "finished:completed" && "$tls_status" == "finished:completed" ]] \
    && [[ "$plain_rounds" -eq "$rounds" && "$tls_rounds" -eq "$rounds" ]]
