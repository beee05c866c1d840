#!/usr/bin/env bash
# Build fedflex's Docker images and run both compose demos end to end: plain HTTP
# (docker/docker-compose.yml) and TLS + SuperNode authentication
# (docker/docker-compose.tls.yml), each a SuperLink and 3 SuperNodes running the
# quickstart scenario cut to 3 clients. Prints each demo's rounds, time and final
# accuracy, the build time and the image sizes.
#
#   bash scripts/docker_e2e.sh [-r ROUNDS] [-p PORT] [-u UID] [-k|--keep]
#
#   -r ROUNDS  rounds per demo (default 3)
#   -p PORT    host port of the SuperLink (default 8000; published on 127.0.0.1 only)
#   -u UID     give the demos' results folder and the TLS keys (mode 600) to this uid
#              first (needs root), to show that the images do not need uid 1000;
#              default: they stay the caller's (root's, when run as root)
#   -k, --keep keep the work folder (certificates, CA key, node keys, flwr's config); by
#              default it is removed at the end, also on errors
# Results: runs/docker-e2e-STAMP/{plain,tls} (mounted as /app/runs, FEDFLEX_RUNS), logs in
# runs/docker-e2e-STAMP/logs (build, containers; no key material). The
# images stay (fedflex-superlink:0.1.0, fedflex-supernode:0.1.0); the images a rebuild
# replaced are pruned (dangling images labelled fedflex.image); the demos' containers and
# volumes are removed (`down -v`), also on errors. On a failure the last log lines of the
# failing containers are printed first.
#
# Needs: a Docker engine, Compose v2 (`docker compose version`; Debian/Ubuntu:
# docker/install-compose-v2.sh), openssl, and fedflex's Python environment on the host for
# the `flwr` CLI ($PYTHON; default: scripts/setup.sh's ${FEDFLEX_VENV:-~/.venvs/fedflex}, else python3).
#
# Stand-ins, used ONLY when a registry is out of reach (with a normal network the script
# builds exactly what `docker compose up --build` builds):
#   - python:3.11-slim cannot be pulled from Docker Hub -> a base image built from Debian
#     packages with debootstrap (Debian's python3.11 + pip), tagged fedflex-base:py311;
#   - pip inside a build cannot reach PyPI / PyTorch's index -> the host's pip downloads
#     the wheels into ~/.cache/fedflex-docker-wheels (again only when pyproject's
#     requirements change), served on 127.0.0.1:$FEDFLEX_WHEEL_PORT (default 8790) to a
#     --network host build. Torch: $TORCH_SPEC if set, else PyTorch's CPU index, else a
#     CPU wheel the host's pip has without an index (its find-links), else PyPI's torch.
# The build gets them through the compose files' variables (FEDFLEX_BASE_IMAGE,
# FEDFLEX_PIP_EXTRA_ARGS, FEDFLEX_BUILD_NETWORK), which the script prints: export them,
# serve the wheels (docs/deployment.md, section 3) and `docker compose ... up --build` works.
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
rounds=3
port=8000
as_uid=""
keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -r) rounds="$2"; shift 2 ;;
        -p) port="$2"; shift 2 ;;
        -u) as_uid="$2"; shift 2 ;;
        -k | --keep) keep=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "docker_e2e.sh: -r takes a number of rounds" >&2; exit 2; }
[[ -z "$as_uid" || "$as_uid" =~ ^[0-9]+$ ]] || { echo "docker_e2e.sh: -u takes a numeric uid" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv_py="${FEDFLEX_VENV:-$HOME/.venvs/fedflex}/bin/python"  # scripts/setup.sh's environment
if [[ -n "${PYTHON:-}" ]]; then py="$PYTHON"; elif [[ -x "$venv_py" ]]; then py="$venv_py"; else py=python3; fi
flwr_bin="$(dirname "$("$py" -c 'import sys; print(sys.executable)')")/flwr"
[[ -x "$flwr_bin" ]] || flwr_bin="$(command -v flwr || true)"
work="$(mktemp -d "${TMPDIR:-/tmp}/fedflex-docker-e2e.XXXXXX")"
stamp="$(date +%Y%m%d-%H%M%S)"
project="fedflex-e2e"
export FEDFLEX_PORT="$port"
export FEDFLEX_CERTS="$work/certs"
results="$root/runs/docker-e2e-$stamp"  # mounted as /app/runs (FEDFLEX_RUNS)
logs="$results/logs"  # build and container logs: no keys, kept
mkdir -p "$logs"
server_pid=""
active=""  # the compose project that is up: "project file"
t_script=$(date +%s)

pip_download() {  # the host's pip, without the notes about find-links folders it skips
    "$py" -m pip download "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
say() { printf '[docker_e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

compose() {  # compose PROJECT FILE ARGS...
    local p="$1" f="$2"
    shift 2
    docker compose -p "$p" -f "$f" "$@"
}

show_failure() {  # the last log lines of the active demo's failing containers
    [[ -n "$active" ]] || return 0
    local p="${active%% *}" name state restarts shown=0
    say "containers of $p:"
    docker ps -a --filter "label=com.docker.compose.project=$p" \
        --format '  {{.Names}}\t{{.Status}}' >&2 || true
    while read -r name; do
        [[ -n "$name" ]] || continue
        read -r state restarts < <(docker inspect -f '{{.State.Status}} {{.RestartCount}}' "$name" 2>/dev/null || echo "gone 0")
        if [[ "$state" != running || "$restarts" != 0 || "$name" == *superlink* ]]; then
            say "last log lines of $name ($state, restarted $restarts times):"
            docker logs --tail 25 "$name" 2>&1 | sed 's/^/    /' >&2 || true
            shown=1
        fi
    done < <(docker ps -a --filter "label=com.docker.compose.project=$p" --format '{{.Names}}' | sort)
    [[ "$shown" == 1 ]] || say "(no container of $p left to show)"
    compose "$p" "${active#* }" logs --no-color >"$logs/failed-$p.log" 2>&1 || true
    say "all its logs: $logs/failed-$p.log"
}

on_exit() {
    local rc=$?
    trap - EXIT
    if [[ "$rc" != 0 ]]; then
        show_failure
    fi
    [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null
    compose "$project" docker/docker-compose.yml down -v >/dev/null 2>&1 || true
    compose "$project-tls" docker/docker-compose.tls.yml down -v >/dev/null 2>&1 || true
    rmdir "$logs" "$results" 2>/dev/null || true  # only if nothing got there
    if [[ "$keep" == 1 ]]; then
        say "kept $work (certificates, CA key, node keys, flwr's config): remove it when done"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- prerequisites
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd)"
docker compose version 2>/dev/null | grep -Eq 'v?2\.' \
    || die "Compose v2 is needed (docker compose version): bash docker/install-compose-v2.sh; Compose v1 (docker-compose 1.29) rejects the files"
command -v openssl >/dev/null || die "openssl is needed for the TLS demo"
[[ -x "$flwr_bin" ]] || die "flwr CLI not found next to $py nor on PATH (bash scripts/setup.sh, or set PYTHON to fedflex's python)"
if [[ -n "$as_uid" && "$(id -u)" != 0 ]]; then die "-u needs root (it chowns the results folder and keys)"; fi

# ---------------------------------------------------------------- base image
base="python:3.11-slim"
if ! docker image inspect "$base" >/dev/null 2>&1 && ! timeout 60 docker pull -q "$base" >/dev/null 2>&1; then
    base="fedflex-base:py311"
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        say "Docker Hub unreachable: building the stand-in base image $base from Debian packages"
        command -v debootstrap >/dev/null || die "debootstrap is needed for the stand-in base image"
        rootfs="$work/rootfs"
        debootstrap --variant=minbase \
            --include=python3,python3-pip,python3-venv,python-is-python3,passwd,ca-certificates \
            bookworm "$rootfs" http://deb.debian.org/debian >"$logs/debootstrap.log" 2>&1 \
            || die "debootstrap failed: see $logs/debootstrap.log"
        rm -f "$rootfs/usr/lib/python3.11/EXTERNALLY-MANAGED"  # a container's own Python
        tar -C "$rootfs" -c . | docker import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["python3"]' - "$base" >/dev/null
        rm -rf "$rootfs"
    fi
fi
say "base image: $base"
export FEDFLEX_BASE_IMAGE="$base"
export FEDFLEX_PIP_EXTRA_ARGS="${FEDFLEX_PIP_EXTRA_ARGS:-}"
export FEDFLEX_BUILD_NETWORK="${FEDFLEX_BUILD_NETWORK:-default}"

# ---------------------------------------------------------------- wheels (stand-in)
probe="import urllib.request; urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=15)"
if [[ -z "$FEDFLEX_PIP_EXTRA_ARGS" ]] && ! timeout 60 docker run --rm "$base" python -c "$probe" >/dev/null 2>&1; then
    wheels="${FEDFLEX_WHEELS:-$HOME/.cache/fedflex-docker-wheels}"
    wport="${FEDFLEX_WHEEL_PORT:-8790}"
    mkdir -p "$wheels"
    flwr_pin="$(grep -E '^ARG FLWR_VERSION=' docker/Dockerfile | cut -d= -f2)"
    mapfile -t requirements < <("$py" -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))
print(*p['build-system']['requires'], *p['project']['dependencies'], sep='\n')")
    key="$(printf '%s\n' "flwr[simulation]==$flwr_pin" "${requirements[@]}" "${TORCH_SPEC:-}" | sha256sum | cut -c1-16)"
    if [[ "$(cat "$wheels/.fedflex-key" 2>/dev/null)" == "$key" ]]; then
        say "PyPI unreachable from containers: wheels already in $wheels (requirements unchanged)"
    else
        say "PyPI unreachable from containers: the host's pip downloads the wheels into $wheels"
        t0=$(date +%s)
        # torch first, into a folder of its own: the wheel folder must hold one torch only
        # (the build installs the highest version it finds there)
        dl="$work/torch-wheels"
        if [[ -n "${TORCH_SPEC:-}" ]]; then
            pip_download -q -d "$dl" "$TORCH_SPEC" torchvision || die "pip download $TORCH_SPEC failed"
        elif pip_download -q -d "$dl" --timeout 20 --retries 1 \
            --index-url https://download.pytorch.org/whl/cpu torch torchvision >/dev/null 2>&1; then
            :
        else
            # a CPU torch the host's pip has without an index (its find-links), else PyPI's
            spec="torch"
            if pip_download -q --no-deps --no-index -d "$work/local-torch" torch >/dev/null 2>&1; then
                for whl in "$work"/local-torch/torch-*+cpu-*.whl; do
                    [[ -f "$whl" ]] && spec="torch==$(basename "$whl" | cut -d- -f2)"
                done
            fi
            say "no PyTorch CPU index: $spec"
            rm -rf "$dl"
            pip_download -q -d "$dl" "$spec" torchvision || die "pip download $spec torchvision failed"
        fi
        torch_version="$(find "$dl" -name 'torch-*.whl' | head -n 1 | xargs basename | cut -d- -f2)"
        rm -f "$wheels"/torch-*.whl "$wheels"/torchvision-*.whl
        mv "$dl"/*.whl "$wheels"/
        pip_download -q -d "$wheels" --find-links "$wheels" \
            "torch==$torch_version" "flwr[simulation]==$flwr_pin" "${requirements[@]}" \
            || die "pip download failed"
        echo "$key" >"$wheels/.fedflex-key"
        say "wheels downloaded in $(($(date +%s) - t0)) s"
    fi
    "$py" -c "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))" "$wport" 2>/dev/null \
        || die "port $wport (the wheel server) is in use: set FEDFLEX_WHEEL_PORT to a free port"
    "$py" -m http.server --bind 127.0.0.1 --directory "$wheels" "$wport" >/dev/null 2>&1 &
    server_pid=$!
    sleep 1
    # a fixed value: a build argument that changes rebuilds every layer after it
    export FEDFLEX_PIP_EXTRA_ARGS="--no-index --find-links http://127.0.0.1:$wport/"
    export FEDFLEX_BUILD_NETWORK=host
fi
say "build variables: FEDFLEX_BASE_IMAGE=$FEDFLEX_BASE_IMAGE FEDFLEX_PIP_EXTRA_ARGS=\"$FEDFLEX_PIP_EXTRA_ARGS\" FEDFLEX_BUILD_NETWORK=$FEDFLEX_BUILD_NETWORK"

# ---------------------------------------------------------------- build
t0=$(date +%s)
say "building fedflex-superlink:0.1.0 and fedflex-supernode:0.1.0 (docker compose build)"
compose "$project" docker/docker-compose.yml build >"$logs/build.log" 2>&1 \
    || { tail -n 40 "$logs/build.log" >&2; die "docker compose build failed (log above)"; }
build_s=$(($(date +%s) - t0))
if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    server_pid=""
fi
# the images this build replaced (and stages of earlier builds) are dangling now
pruned="$(docker image prune -f --filter label=fedflex.image 2>/dev/null | tail -n 1)"
torch_build="$(docker run --rm --entrypoint python fedflex-supernode:0.1.0 -c \
    'import torch; print(torch.__version__, "cuda" if torch.version.cuda else "cpu")')"
say "images built in ${build_s} s; torch in the image: $torch_build; pruned: ${pruned:-nothing}"

# ---------------------------------------------------------------- the demos
export FLWR_HOME="$work/flwr-home"
mkdir -p "$FLWR_HOME"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
if [[ -n "$as_uid" ]]; then
    chown "$as_uid:$as_uid" "$results"
fi
export FEDFLEX_RUNS="$results"

flwr_json() { "$flwr_bin" "$@" --format json 2>/dev/null; }

wait_nodes() {  # CONNECTION: until 3 SuperNodes are online (max 180 s)
    local conn="$1" deadline=$(($(date +%s) + 180)) n
    while :; do
        n="$(flwr_json supernode ls "$conn" | "$py" -c \
            'import json,sys; d=json.load(sys.stdin); print(sum(x.get("status")=="online" for x in d.get("nodes",[])))' \
            2>/dev/null || echo 0)"
        [[ "$n" -ge 3 ]] && return 0
        [[ $(date +%s) -ge $deadline ]] && die "only $n of 3 SuperNodes online after 180 s"
        if [[ -n "$(docker ps -a -q --filter "label=com.docker.compose.project=${active%% *}" \
            --filter label=com.docker.compose.service=superlink --filter status=exited)" ]]; then
            die "the SuperLink exited"
        fi
        sleep 3
    done
}

connection() {  # NAME ADDRESS [CA]
    {
        echo "[superlink]"
        echo "default = \"$1\""
        echo "[superlink.$1]"
        echo "address = \"$2\""
        if [[ -n "${3:-}" ]]; then echo "root-certificates = \"$3\""; else echo "insecure = true"; fi
    } >"$FLWR_HOME/config.toml"
}

declare -A demo_status demo_rounds demo_run demo_total demo_acc
run_demo() {  # NAME CONNECTION: one run of the quickstart; fills the demo_* tables
    local name="$1" conn="$2" start rid status out="runs/$1"
    local cfg="scenario=\"scenarios/quickstart.yaml\" out=\"$out\""
    cfg+=" overrides=\"num_clients=3 churn.kind=none strategy.sampler.clients_per_round=3 rounds=$rounds output.plots=false\""
    start=$(date +%s)
    rid="$(flwr_json run . "$conn" --run-config "$cfg" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["run-id"])')" \
        || die "flwr run ($name) failed"
    say "$name: run $rid started"
    while :; do
        status="$(flwr_json ls "$conn" --run-id "$rid" | "$py" -c \
            'import json,sys; print(json.load(sys.stdin)["runs"][0]["status"])' 2>/dev/null || echo unknown)"
        [[ "$status" == finished* ]] && break
        [[ $(($(date +%s) - start)) -gt 1800 ]] && { status="timeout"; break; }
        sleep 5
    done
    demo_run[$name]=$(($(date +%s) - start))
    demo_status[$name]="$status"
    demo_rounds[$name]=0
    [[ -f "$results/$name/metrics.jsonl" ]] && demo_rounds[$name]=$(wc -l <"$results/$name/metrics.jsonl")
    demo_acc[$name]="$("$py" -c 'import json,sys; a = json.load(open(sys.argv[1])).get("final_test_accuracy"); print("none" if a is None else f"{a:.4f}")' \
        "$results/$name/summary.json" 2>/dev/null || echo none)"
    if [[ "$status" != "finished:completed" || "${demo_rounds[$name]}" -ne "$rounds" ]]; then
        flwr_json ls "$conn" --run-id "$rid" >&2 || true
        die "$name demo: $status, ${demo_rounds[$name]} of $rounds rounds"
    fi
}

# plain HTTP
say "plain-HTTP demo: SuperLink + 3 SuperNodes"
t0=$(date +%s)
active="$project docker/docker-compose.yml"
compose "$project" docker/docker-compose.yml up -d >"$logs/up-plain.log" 2>&1 \
    || { cat "$logs/up-plain.log" >&2; die "compose up (plain) failed"; }
connection fedflex-docker "127.0.0.1:$port"
wait_nodes fedflex-docker
run_demo plain fedflex-docker
compose "$project" docker/docker-compose.yml logs --no-color >"$logs/plain.log" 2>&1 || true
compose "$project" docker/docker-compose.yml down -v >/dev/null 2>&1
active=""
demo_total[plain]=$(($(date +%s) - t0))
say "plain: ${demo_status[plain]}, ${demo_rounds[plain]}/$rounds rounds, run ${demo_run[plain]} s, final accuracy ${demo_acc[plain]}"

# TLS + node authentication
say "TLS + node-auth demo"
bash scripts/make_certs.sh -o "$FEDFLEX_CERTS" -n 3 superlink >/dev/null
if [[ -n "$as_uid" ]]; then  # keys owned by someone who is not uid 1000, mode 600
    chown -R "$as_uid:$as_uid" "$FEDFLEX_CERTS"
    chmod 600 "$FEDFLEX_CERTS"/keys/supernode-? "$FEDFLEX_CERTS/server.key" "$FEDFLEX_CERTS/ca.key"
    chmod o+r "$FEDFLEX_CERTS/ca.crt"
fi
t0=$(date +%s)
active="$project-tls docker/docker-compose.tls.yml"
compose "$project-tls" docker/docker-compose.tls.yml up -d superlink >"$logs/up-tls.log" 2>&1 \
    || { cat "$logs/up-tls.log" >&2; die "compose up superlink (tls) failed"; }
connection fedflex-docker-tls "127.0.0.1:$port" "$FEDFLEX_CERTS/ca.crt"
for i in 0 1 2; do
    for try in $(seq 30); do
        "$flwr_bin" supernode register "$FEDFLEX_CERTS/keys/supernode-$i.pub" fedflex-docker-tls \
            >"$logs/register-$i.log" 2>&1 && break
        [[ "$try" == 30 ]] && { cat "$logs/register-$i.log" >&2; die "flwr supernode register ($i) failed"; }
        sleep 2
    done
done
compose "$project-tls" docker/docker-compose.tls.yml up -d >>"$logs/up-tls.log" 2>&1 \
    || { cat "$logs/up-tls.log" >&2; die "compose up (tls) failed"; }
wait_nodes fedflex-docker-tls
run_demo tls fedflex-docker-tls
compose "$project-tls" docker/docker-compose.tls.yml logs --no-color >"$logs/tls.log" 2>&1 || true
compose "$project-tls" docker/docker-compose.tls.yml down -v >/dev/null 2>&1
active=""
demo_total[tls]=$(($(date +%s) - t0))
tls_owner="$(stat -c %u "$results/tls/metrics.jsonl" 2>/dev/null || echo none)"
say "tls: ${demo_status[tls]}, ${demo_rounds[tls]}/$rounds rounds, run ${demo_run[tls]} s, final accuracy ${demo_acc[tls]}"

# ---------------------------------------------------------------- report
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1/1e9}'; }
dangling="$(docker images -q --filter dangling=true --filter label=fedflex.image | wc -l)"
echo "base image:        $base"
echo "build:             ${build_s} s; torch: $torch_build"
echo "image sizes:       fedflex-superlink:0.1.0 $(size fedflex-superlink:0.1.0), fedflex-supernode:0.1.0 $(size fedflex-supernode:0.1.0) (shared layers); dangling fedflex images left: $dangling"
for name in plain tls; do
    printf '%-18s %s, %s of %s rounds, run %s s, up-to-down %s s, final accuracy %s\n' "$name demo:" \
        "${demo_status[$name]}" "${demo_rounds[$name]}" "$rounds" "${demo_run[$name]}" "${demo_total[$name]}" "${demo_acc[$name]}"
done
echo "results, logs:     $results (owned by uid $(stat -c %u "$results"); tls results written as uid $tls_owner)"
echo "whole script:      $(($(date +%s) - t_script)) s"
