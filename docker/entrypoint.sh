#!/bin/sh
# Run the Flower command as a user who can read and write what is mounted from the host,
# whatever the host user's uid: results written into ./runs then belong to that user, and
# private keys (mode 600 on the host) stay readable. Started as root (the image's default
# user), it drops to the uid that docker/pick-uid.sh (fedflex-pick-uid) picks from
#   -w /app/runs                the results folder (the image's own copy is root's, mode
#                               1777: it names nobody, and anybody may write it)
#   -r /app/certs/keys/*        a SuperNode's private key
#   -r /app/certs/server.key    the SuperLink's private key (and its certificates)
# i.e. the owner of the results folder, else of a key, else uid 1000 (the image's user
# "app"), whoever of them can read every key and write the results; root only when none
# can (root-owned keys of mode 600: root it is). FEDFLEX_RUN_AS_OWNER_OF=PATH: the owner
# of PATH instead, unchecked. FEDFLEX_APP (default /app): where to look, for tests.
# The SuperLink's state volume (/app/state) is handed to that uid, so a restart as
# another uid can still write its database.
# Started as another user already (docker run --user ...): runs the command as is.
set -eu

if [ "$(id -u)" != 0 ]; then
    exec "$@"
fi

app="${FEDFLEX_APP:-/app}"
pick=/usr/local/bin/fedflex-pick-uid  # docker/pick-uid.sh in the image
[ -f "$pick" ] || pick="$(dirname "$0")/pick-uid.sh"
if [ -n "${FEDFLEX_RUN_AS_OWNER_OF:-}" ]; then
    owner="$(stat -c '%u:%g' "$FEDFLEX_RUN_AS_OWNER_OF")"
else
    options=""
    for key in "$app"/certs/keys/* "$app/certs/server.key" "$app/certs/server.crt" "$app/certs/ca.crt"; do
        if [ -e "$key" ]; then options="$options -r $key"; fi
    done
    # paths under $app have no blanks: word splitting of $options is safe
    # shellcheck disable=SC2086
    owner="$(sh "$pick" -w "$app/runs" $options)"
fi
uid="${owner%%:*}"
gid="${owner##*:}"
if [ "$uid" = 0 ]; then
    exec "$@"
fi
if [ -d "$app/state" ]; then
    chown -R "$uid:$gid" "$app/state"
fi
# FLWR_HOME and HOME must be writable by that uid
export HOME="/tmp/home-$uid" FLWR_HOME="/tmp/home-$uid/.flwr"
mkdir -p "$FLWR_HOME"
chown -R "$uid:$gid" "$HOME"
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups "$@"
