#!/bin/sh
# Which uid:gid a container started as root should run Flower as: the first user who can
# do everything the process must do with the files mounted from the host.
#
#   pick-uid.sh [-w DIR | -r FILE]...      prints UID:GID
#
#   -w DIR   a directory the process writes into (the results folder, /app/runs)
#   -r FILE  a file the process must read (a private key, a certificate)
#
# Candidates, in this order: the owner of each path given, in the order given (so the
# results folder first: results then belong to the user who owns it), then uid 1000 (the
# image's user "app"). Root-owned paths name no candidate. The first candidate that can
# read every -r FILE and write into every -w DIR (checked as that uid with setpriv, so
# modes, ACLs and directory permissions all count) wins; when none can, root (0:0), which
# can do all of it. Paths that do not exist are ignored. Not started as root: prints the
# current uid:gid (there is nobody else to become).
#
# Examples: keys and runs/ owned by 4242 (mode 600 / 755) -> 4242; a root-owned key with
# mode 600 -> root, whoever owns the rest; nothing mounted -> 1000.
# docker/entrypoint.sh calls it; tests/deploy/test_docker_uid.py runs it without Docker.
set -eu

if [ "$(id -u)" != 0 ]; then
    echo "$(id -u):$(id -g)"
    exit 0
fi

can() {  # UID GID [-w DIR | -r FILE]...: can that user do all of it?
    user=$1
    group=$2
    shift 2
    # shellcheck disable=SC2016  # the inner script expands its own arguments
    setpriv --reuid="$user" --regid="$group" --clear-groups sh -c '
        while [ $# -ge 2 ]; do
            if [ -e "$2" ]; then
                case "$1" in
                    -r) [ -r "$2" ] || exit 1 ;;
                    -w) [ -d "$2" ] && [ -w "$2" ] && [ -x "$2" ] || exit 1 ;;
                esac
            fi
            shift 2
        done' pick-uid "$@" 2>/dev/null
}

owners=""
flag=""
for arg in "$@"; do
    if [ -z "$flag" ]; then
        case "$arg" in
            -r | -w) flag=$arg ;;
            *) echo "pick-uid.sh: expected -r FILE or -w DIR, got '$arg'" >&2; exit 2 ;;
        esac
        continue
    fi
    flag=""
    [ -e "$arg" ] || continue
    owner="$(stat -c '%u:%g' "$arg")"
    [ "${owner%%:*}" = 0 ] || owners="$owners $owner"
done
[ -z "$flag" ] || { echo "pick-uid.sh: $flag needs a path" >&2; exit 2; }

for candidate in $owners 1000:1000; do
    if can "${candidate%%:*}" "${candidate##*:}" "$@"; then
        echo "$candidate"
        exit 0
    fi
done
echo 0:0
