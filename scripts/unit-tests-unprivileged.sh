#!/usr/bin/env bash
# Runs the unit tests once more as an unprivileged user, in a copy of the working tree: they must
# need no root, no TensorFlow and no network namespace (the controller-side tests run on fakes).
#
# The project's .venv may use a Python under /root (pyenv), which another user cannot read, so
# this builds its own small venv from Debian's /usr/bin/python3 with the controller and pytest.
# Usage (as root): scripts/unit-tests-unprivileged.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

readonly TEST_USER=orchestrate-unpriv
readonly PYTHON=/usr/bin/python3

if [[ "$(id -u)" -ne 0 ]]; then
    echo "unit-tests-unprivileged: run as root (it creates the user $TEST_USER)" >&2
    exit 1
fi
if ! id "$TEST_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash "$TEST_USER"
fi
home=$(getent passwd "$TEST_USER" | cut -d: -f6)
# pytest refuses a /tmp/pytest-of-USER that another uid owns: one left by an earlier account of
# this name (scripts/make-cold.sh deletes the user; the next one may get another uid).
stale=/tmp/pytest-of-$TEST_USER
if [[ -e "$stale" ]] && [[ "$(stat -c %u "$stale")" != "$(id -u "$TEST_USER")" ]]; then
    rm -rf "$stale"
fi
work="$home/orchestrate"
rm -rf "$work"
mkdir -p "$work"
# Tracked and new (not ignored) files: what a clone of this tree would hold.
{ git ls-files -z --cached --others --exclude-standard; printf '.git\0'; } \
    | tar --null -T - -cf - | tar -C "$work" -xf -
# The reference schemas sit beside the checkout (../shared/specs): the same place for the copy.
if [[ -d ../shared/specs ]]; then
    rm -rf "$home/shared"
    mkdir -p "$home/shared"
    cp -r ../shared/specs "$home/shared/specs"
    chown -R "$TEST_USER:" "$home/shared"
fi
chown -R "$TEST_USER:" "$work"

as_user() { runuser -u "$TEST_USER" -- env -i HOME="$home" PATH=/usr/bin:/bin "$@"; }
as_user "$PYTHON" -m venv "$work/.venv"
# Extras the unit tests import: ansible (the Ansible host-source tests read inventories with the
# real ansible-core) and dashboard (its unit tests import the server module, uvicorn).
# pytest and httpx (pinned as in pyproject.toml): bench_dashboard, which test_bench_imports imports.
# --no-compile: the tests import a small part of ansible-core's thousands of modules; byte-compiling
# them all took CPU from the lanes beside this run.
as_user "$work/.venv/bin/pip" install -q --disable-pip-version-check --no-compile -e "${work}[ansible,dashboard]" pytest==9.1.1 numpy httpx==0.28.1
cd "$work"
# Tests that start TensorFlow (marked tf) need the worker extra, and those marked root chown
# files to another account (they ran as root just before); everything else runs here.
as_user "$work/.venv/bin/python" -m pytest -q -p no:cacheprovider -m "not tf and not root" tests/unit "$@"
