#!/bin/sh
# The docker/compose.yaml cluster with plain `docker run`, from nothing and back (as root):
#
#   docker/cluster.sh up [--stand-in-base] [--extra-ca FILE]...   dockerd, image, containers
#   docker/cluster.sh down [--volumes] [--images]                  back to nothing
#   docker/cluster.sh status
#
# The work is done by docker/cluster.py (see its docstring); this wrapper finds a Python that has
# PyYAML, which orchestrate depends on: $PYTHON, else the one `orchestrate` runs with, else the
# repository's .venv, else python3.
set -eu

here=$(cd "$(dirname "$0")" && pwd)

has_yaml() {
    [ -n "$1" ] && "$1" -c 'import yaml' >/dev/null 2>&1
}

python=${PYTHON:-}
if [ -z "$python" ]; then
    if orchestrate=$(command -v orchestrate 2>/dev/null); then
        # The interpreter on the console script's #! line.
        candidate=$(sed -n '1s/^#! *//p' "$orchestrate" | cut -d' ' -f1)
        if has_yaml "$candidate"; then
            python=$candidate
        fi
    fi
fi
if [ -z "$python" ] && has_yaml "$here/../.venv/bin/python"; then
    python=$here/../.venv/bin/python
fi
if [ -z "$python" ]; then
    python=python3
fi
if ! has_yaml "$python"; then
    echo "cluster.sh: $python cannot import yaml; install orchestrate (pip install .) or set" \
        "PYTHON to a Python that has PyYAML" >&2
    exit 1
fi
exec "$python" "$here/cluster.py" "$@"
