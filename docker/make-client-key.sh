#!/bin/sh
# Create the key pair orchestrate logs in to the worker containers with, next to this script:
#   docker/client_key      private, used by the controller (ssh_key in docker/inventory.yaml)
#   docker/client_key.pub  public, mounted read-only into every container (docker/compose.yaml)
# Both are git-ignored (docker/.gitignore). An existing key is kept; delete both files for a new
# one, then recreate the containers (`docker compose -f docker/compose.yaml up -d
# --force-recreate`) so they pick it up.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
key=$here/client_key

if [ -d "$key.pub" ]; then
    echo "make-client-key: $key.pub is a directory (Docker creates one when the key is missing" \
        "at 'compose up'); remove it (rmdir, as its owner) and run this again" >&2
    exit 1
fi
if [ -e "$key" ] && [ -e "$key.pub" ]; then
    echo "make-client-key: keeping the existing $key and $key.pub"
    exit 0
fi
if [ -e "$key" ] || [ -e "$key.pub" ]; then
    echo "make-client-key: only one of $key and $key.pub exists; delete it and run this again" >&2
    exit 1
fi
command -v ssh-keygen >/dev/null 2>&1 || {
    echo "make-client-key: ssh-keygen not found; install OpenSSH's client" >&2
    exit 1
}
ssh-keygen -q -t ed25519 -N '' -C "orchestrate-docker-client" -f "$key"
echo "make-client-key: created $key and $key.pub"
