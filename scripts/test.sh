#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it: lint, format check, pytest.
# As root it also installs the Debian packages the multi-host tests use (sshd, iproute2, iptables),
# and runs the unit tests that need no root as an unprivileged user (once: not again as root).
#
# What overlaps, on CI's two cores (docs/development.md has the time table):
#   - the checks (ruff, mypy, lint-imports, the manual) run beside pytest, their output shown
#     when they end;
#   - as root, the unprivileged unit run runs beside pytest too;
#   - pytest itself runs its lanes side by side (pytest-xdist, --dist loadgroup): the Slurm, the
#     Docker and the namespace clusters' tests, the local TensorFlow runs one at a time, and
#     the plain tests wherever a worker is free (tests/conftest.py LANES).
# Extra arguments go to pytest (`bash scripts/test.sh -k inventory`); `-n 0` runs it serially.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
    bash scripts/ci-system-deps.sh
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[worker,legacy-keras,dev,docs]'

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

checks() {
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy
    .venv/bin/lint-imports
    # The manual, strict: a broken link, a missing page or snippet, or a reference that no
    # longer builds fails here. The site goes to a temporary directory and is never committed.
    local site_dir
    site_dir="$(mktemp -d)"
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site_dir"
    rm -rf "$site_dir"
}
checks >"$logs/checks.log" 2>&1 &
checks_pid=$!

unit_selection=()
unprivileged_pid=
if [ "$(id -u)" = 0 ]; then
    # The unit tests that need neither root nor TensorFlow run as an unprivileged user, and only
    # there; this pytest runs the rest (integration, and the unit tests marked tf or root).
    unit_selection=(-m "not unit or tf or root")
    bash scripts/unit-tests-unprivileged.sh >"$logs/unprivileged.log" 2>&1 &
    unprivileged_pid=$!
fi

status=0
# pytest exits 5 when it collects nothing: that fails the run (status stays non-zero).
.venv/bin/python -m pytest -n 4 --dist loadgroup --durations=0 --durations-min=1 \
    "${unit_selection[@]}" "$@" || status=$?

echo "--- checks: ruff, ruff format, mypy, lint-imports, mkdocs --strict"
checks_status=0
wait "$checks_pid" || checks_status=$?
cat "$logs/checks.log"
echo "--- checks exited $checks_status"
unprivileged_status=0
if [ -n "$unprivileged_pid" ]; then
    echo "--- unit tests as an unprivileged user (scripts/unit-tests-unprivileged.sh)"
    wait "$unprivileged_pid" || unprivileged_status=$?
    cat "$logs/unprivileged.log"
    echo "--- unprivileged unit tests exited $unprivileged_status"
fi
echo "--- pytest exited $status"
if [ "$status" -ne 0 ]; then exit "$status"; fi
if [ "$checks_status" -ne 0 ]; then exit "$checks_status"; fi
exit "$unprivileged_status"
