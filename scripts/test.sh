#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it: lint, format check, pytest.
# As root it also installs the Debian packages the multi-host tests use (sshd, iproute2, iptables),
# and afterwards reruns the unit tests as an unprivileged user.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
    bash scripts/ci-system-deps.sh
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[worker,legacy-keras,dev,docs]'

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
# The manual, strict: a broken link, a missing page or snippet, or a reference that no longer
# builds fails here. The site goes to a temporary directory and is never committed.
site_dir="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site_dir"
rm -rf "$site_dir"
# pytest exits 5 when it collects nothing; under `set -e` that fails the run instead of passing.
.venv/bin/python -m pytest "$@"
if [ "$(id -u)" = 0 ]; then
    # The unit tests once more as an unprivileged user: they must need no root at all.
    bash scripts/unit-tests-unprivileged.sh
fi
