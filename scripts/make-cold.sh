#!/usr/bin/env bash
# Puts this machine back to what a fresh one has before the test command's first run, so that a
# cold `.ci/run` can be measured (docs/development.md, "Where the time goes"): it removes what
# the suite's first run installed, built and cached, and nothing else.
#   - the container cluster, its images, the stand-in base and BuildKit's cache
#     (docker/cluster.sh down --volumes --images), then Docker's data directory;
#   - the Debian packages scripts/ci-system-deps.sh installed here (it records them in
#     /var/lib/orchestrate-ci/installed-packages; or those named after --yes), purged with what
#     they pulled in, and apt's downloaded archives and lists;
#   - pip's cache (root's and the unprivileged test user's) and that user's home;
#   - this checkout's .venv and docker/wheels/*.whl.
# Usage (as root, on a machine that is only for this): scripts/make-cold.sh --yes [PACKAGE...]
set -euo pipefail
cd "$(dirname "$0")/.."
readonly INSTALLED_RECORD=/var/lib/orchestrate-ci/installed-packages

if [[ "${1:-}" != "--yes" ]]; then
    echo "make-cold: this purges Debian packages and Docker's data on this machine;" \
        "run as: scripts/make-cold.sh --yes" >&2
    exit 2
fi
if [[ "$(id -u)" -ne 0 ]]; then
    echo "make-cold: must run as root (it purges packages)" >&2
    exit 1
fi

if [[ -x /usr/bin/docker ]] && [[ -x .venv/bin/python ]]; then
    PYTHON=.venv/bin/python sh docker/cluster.sh down --volumes --images || true
fi
rm -rf /var/lib/docker /var/lib/containerd /run/orchestrate-docker

# Only what ci-system-deps.sh installed here (it keeps the list; the packages a fresh machine
# already had stay), or the packages named after --yes.
shift
packages=("$@")
if [[ "${#packages[@]}" -eq 0 ]] && [[ -f "$INSTALLED_RECORD" ]]; then
    mapfile -t packages <"$INSTALLED_RECORD"
fi
if [[ "${#packages[@]}" -gt 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${packages[@]}" >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get autoremove --purge -y -qq >/dev/null
    rm -f "$INSTALLED_RECORD"
    echo "make-cold: purged ${packages[*]} and what they pulled in"
else
    echo "make-cold: no record of packages that ci-system-deps.sh installed; none purged"
fi
apt-get clean
rm -rf /var/lib/apt/lists/*

rm -rf /root/.cache/pip
if id orchestrate-unpriv >/dev/null 2>&1; then
    userdel --remove orchestrate-unpriv 2>/dev/null || true
fi
# Its pytest directory too: the account made again may get another uid, and pytest refuses a
# temporary directory another uid owns.
rm -rf /tmp/pytest-of-orchestrate-unpriv
rm -rf .venv
find docker/wheels -name '*.whl' -delete
echo "make-cold: done; the next scripts/test.sh starts from a fresh machine's state"
