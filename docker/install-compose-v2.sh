#!/bin/sh
# Install Docker Compose v2 (the `docker compose` CLI plugin) from the distribution's
# packages, as root. fedflex's compose files need v2: Compose v1 (`docker-compose` 1.29,
# Debian 12's `docker-compose` package) rejects their top-level `name:`.
#
#   sh docker/install-compose-v2.sh        (as root, or with sudo)
#
#   Ubuntu 22.04 and later      apt-get install docker-compose-v2        (universe)
#   Debian 13 (trixie) and later apt-get install docker-compose          (2.x there)
#   Debian 12 (bookworm)        Debian 13's docker-compose package (2.26, Go, needs only
#                               libc6 >= 2.34: bookworm has 2.36), fetched with apt from a
#                               temporary source list that leaves the system's apt alone
#   with Docker's own apt repository (docker-ce): apt-get install docker-compose-plugin
# Each puts the plugin in /usr/libexec/docker/cli-plugins/, where both Debian's docker.io
# client and Docker's own look. Does nothing when `docker compose version` is v2 already.
set -eu

if docker compose version 2>/dev/null | grep -Eq 'version v?2\.'; then
    docker compose version
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "install-compose-v2.sh: run it as root (sudo)" >&2; exit 1; }
# shellcheck disable=SC1091  # the system's own file
. /etc/os-release
export DEBIAN_FRONTEND=noninteractive

case "${ID:-}:${VERSION_ID:-}" in
    ubuntu:*)
        apt-get update -q
        apt-get install -y docker-compose-v2
        ;;
    debian:12*)
        tmp="$(mktemp -d)"
        trap 'rm -rf "$tmp"' EXIT
        mkdir -p "$tmp/lists/partial"
        echo "deb http://deb.debian.org/debian trixie main" >"$tmp/sources.list"
        apt_tmp="-o Dir::Etc::SourceList=$tmp/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$tmp/lists"
        # shellcheck disable=SC2086  # $apt_tmp is a list of options
        apt-get $apt_tmp update -q
        chmod 755 "$tmp"
        # shellcheck disable=SC2086
        (cd "$tmp" && apt-get $apt_tmp download docker-compose)
        apt-get install -y "$tmp"/docker-compose_*.deb
        ;;
    debian:1[3-9]* | debian:)  # 13 and later; testing / unstable have no VERSION_ID
        apt-get update -q
        apt-get install -y docker-compose
        ;;
    *)
        echo "install-compose-v2.sh: ${PRETTY_NAME:-this system} is neither Debian nor Ubuntu;" \
            "install Docker's docker-compose-plugin (docs.docker.com/compose/install/linux/)" >&2
        exit 1
        ;;
esac
docker compose version
