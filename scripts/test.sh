#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it: lint, format check, pytest.
# As root it also installs the Debian packages the multi-host tests use (sshd, iproute2, iptables),
# and runs the unit tests that need no root as an unprivileged user (once: not again as root).
#
# What overlaps, on CI's two cores (docs/development.md has the time table):
#   - the checks (ruff, mypy, lint-imports, the manual) run beside pytest, their output shown
#     when they end;
#   - as root, the unprivileged unit run runs beside pytest too;
#   - pytest itself runs its lanes side by side (pytest-xdist, --dist loadgroup): the Slurm and
#     Docker clusters' tests, the namespace cluster's, the local TensorFlow runs in two lanes,
#     and the plain tests wherever a worker is free (tests/conftest.py LANES);
#   - then the tests that measure the machine (marker quiet) run alone.
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

lanes="not quiet"
unprivileged_pid=
if [ "$(id -u)" = 0 ]; then
    # The unit tests that need neither root nor TensorFlow run as an unprivileged user, and only
    # there; this pytest runs the rest (integration, and the unit tests marked tf or root).
    lanes="not quiet and (not unit or tf or root)"
    bash scripts/unit-tests-unprivileged.sh >"$logs/unprivileged.log" 2>&1 &
    unprivileged_pid=$!
fi
# A -m of your own selects the tests instead: one run, in the lanes, the quiet ones among them.
own_selection=0
for argument in "$@"; do
    case "$argument" in -m | -m?*) own_selection=1 ;; esac
done

status=0
# pytest exits 5 when it collects nothing: that fails the run (status stays non-zero).
.venv/bin/python -m pytest -n 4 --dist loadgroup --durations=0 --durations-min=1 \
    -m "$lanes" "$@" || status=$?

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

# The tests that measure the machine, alone now that nothing else runs. Their selection may be
# empty (extra arguments such as -k): exit 5 then counts as nothing to do, since the run above
# ran tests.
quiet_status=0
if [ "$own_selection" -eq 0 ]; then
    echo "--- pytest, the quiet tests alone (marker quiet)"
    .venv/bin/python -m pytest -n 0 --durations=0 --durations-min=1 -m quiet "$@" \
        || quiet_status=$?
    if [ "$quiet_status" -eq 5 ] && [ "$status" -eq 0 ]; then quiet_status=0; fi
fi

echo "--- pytest exited $status; the quiet tests $quiet_status"
for code in "$status" "$quiet_status" "$checks_status" "$unprivileged_status"; do
    if [ "$code" -ne 0 ]; then exit "$code"; fi
done
