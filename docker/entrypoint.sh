#!/bin/sh
# Run the Flower command as the owner of the files mounted from the host, whatever the
# user's uid: results written into ./runs then belong to that user, and private keys
# (mode 600 on the host) stay readable. Started as root (the image's default user);
# drops to:
#   the owner of $FEDFLEX_RUN_AS_OWNER_OF, if set, else of the first of
#   /app/certs/keys/* (a SuperNode's private key), /app/certs/server.key (the
#   SuperLink's), /app/runs (the results, mounted into the SuperLink; the image's own
#   copy belongs to uid 1000), /app/certs/ca.crt that is not owned by root, else uid/gid
#   1000 (the image's user "app"); root only when the files found are root's.
# Started as another user already (docker run --user ...): runs the command as is.
set -eu

if [ "$(id -u)" != 0 ]; then
    exec "$@"
fi

owner=""
for path in ${FEDFLEX_RUN_AS_OWNER_OF:-} /app/certs/keys/* /app/certs/server.key /app/runs /app/certs/ca.crt; do
    [ -e "$path" ] || continue
    owner="$(stat -c '%u:%g' "$path")"
    [ -n "${FEDFLEX_RUN_AS_OWNER_OF:-}" ] && break
    [ "${owner%%:*}" != 0 ] && break
    # a root-owned mount: keep looking; root only if nothing else is mounted
done
[ -n "$owner" ] || owner="1000:1000"
uid="${owner%%:*}"
gid="${owner##*:}"
if [ "$uid" = 0 ]; then
    exec "$@"
fi
# FLWR_HOME and HOME must be writable by that uid
export HOME=/tmp/home-$uid FLWR_HOME=/tmp/home-$uid/.flwr
mkdir -p "$FLWR_HOME"
chown -R "$uid:$gid" "$HOME"
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups "$@"
