#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it: lint, format check, pytest.
# As root it also installs the Debian packages the multi-host tests use (sshd, iproute2, iptables),
# and runs the unit tests that need no root as an unprivileged user (once: not again as root).
#
# What overlaps, on CI's two cores (docs/development.md has the time table):
#   - the jax-only venv installs beside pip's install of .venv, and so do, as root, the Debian
#     packages, then the unprivileged unit run; after pip, for the whole suite, the container
#     tests' image builds in the background (docker/cluster.sh build) from the wheels pip
#     already fetched, beside the checks and the lanes;
#   - one `pytest --collect-only` right after pip, beside a worker's imports being compiled once,
#     caches the rewritten test modules for the lanes' pytest processes;
#   - the checks (ruff, mypy, lint-imports, the manual) run beside pytest, their output shown
#     when they end;
#   - as root, the unprivileged unit run goes on beside pytest too;
#   - pytest itself runs its lanes side by side (pytest-xdist, --dist loadgroup): the Slurm and
#     Docker clusters' tests, the namespace cluster's, the local TensorFlow runs in two lanes,
#     and the plain tests wherever a worker is free (tests/conftest.py LANES);
#   - then the tests that measure the machine (marker quiet) run alone.
# Extra arguments go to pytest (`bash scripts/test.sh -k inventory`); `-n 0` runs it serially.
# At the end a table says where the time went: each phase, each cluster's build, each lane
# (scripts/phase_table.py).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s.%N)

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
# Byte code is cached (an environment may say not to, PYTHONDONTWRITEBYTECODE): otherwise every
# `orchestrate` the tests run compiles the controller again (about 0.08 s of CPU each, hundreds
# of them) and every pytest process rewrites and compiles each test module (about 8 s each).
unset PYTHONDONTWRITEBYTECODE
# Every phase's wall time goes here (the tests add their clusters' builds and each test, with
# its lane: tests/phase_log.py); scripts/phase_table.py prints the table at the end. Set it
# yourself to keep the log (it is emptied first), e.g. to see which test ran when in which lane.
export ORCHESTRATE_PHASE_LOG="${ORCHESTRATE_PHASE_LOG:-$logs/phases.jsonl}"
: >"$ORCHESTRATE_PHASE_LOG"

# phase KIND NAME COMMAND...: run COMMAND, record its wall time under NAME, keep its status.
phase() {
    local kind=$1 name=$2 begin status=0
    shift 2
    begin=$(date +%s.%N)
    "$@" || status=$?
    printf '{"kind": "%s", "name": "%s", "start": %s, "end": %s}\n' \
        "$kind" "$name" "$begin" "$(date +%s.%N)" >>"$ORCHESTRATE_PHASE_LOG"
    return "$status"
}

# The image of the container tests is built ahead, beside the checks and the first lanes, not
# inside the first test that needs it; only for the whole suite (no arguments), as root.
build_ahead=0
if [ "$(id -u)" = 0 ] && [ "$#" -eq 0 ]; then build_ahead=1; fi

# The Debian packages (as root) install beside pip: neither waits for the other.
apt_pid=
if [ "$(id -u)" = 0 ]; then
    phase setup "apt packages (scripts/ci-system-deps.sh)" \
        bash scripts/ci-system-deps.sh >"$logs/apt.log" 2>&1 &
    apt_pid=$!
    # A Debian python3 needs its python3-venv package (one of those) before it makes a venv.
    if ! python3 -c 'import ensurepip' 2>/dev/null; then wait "$apt_pid" || true; fi
fi
# --no-compile: pip's byte-compiling of every module it installs (TensorFlow's thousands among
# them) held up everything after it, about 12 s of CPU; a module is compiled when it is first
# imported instead (see the warm-up below), and most never are.
install_venv() {
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q --no-compile -e '.[worker,legacy-keras,dev,docs]'
}
# The install of .venv is the one step everything after it waits for, and pip keeps one core
# busy: what needs neither it nor the Debian packages (the jax-only venv below) runs beside it
# from the start, and the unprivileged unit run (its own venv) as soon as apt has finished.
phase setup "pip install of the project and its extras (.venv)" install_venv &
venv_pid=$!
# What a user of `job.keras: jax` installs, alone: `pip install '.[jax]'` (JAX, Keras 3, no
# TensorFlow), into .venv-jax, in the background. Every test that runs JAX runs its workers from
# it (tests/jaxonly.py waits for it): .venv has no JAX, which TensorFlow would import in each of
# the suite's TensorFlow processes (docs/development.md).
install_jax_only() {
    # From a copy of the checkout: a build in place writes build/ and *.egg-info beside the
    # code the lanes and the checks are reading.
    local source
    source="$(mktemp -d)"
    tar -c --exclude='./.venv*' --exclude=./.git --exclude=./docker/wheels . | tar -x -C "$source"
    python3 -m venv .venv-jax
    .venv-jax/bin/python -m pip install -q --no-compile "${source}[jax]"
    rm -rf "$source"
    touch .venv-jax/installed
}
rm -f .venv-jax/installed
phase setup "a jax-only install (.venv-jax: pip install '.[jax]'), in the background" \
    install_jax_only >"$logs/jax-only.log" 2>&1 &
jax_only_pid=$!
if [ -n "$apt_pid" ]; then
    apt_status=0
    wait "$apt_pid" || apt_status=$?
    cat "$logs/apt.log"
    if [ "$apt_status" -ne 0 ]; then exit "$apt_status"; fi
fi
lanes="not quiet"
unprivileged_pid=
if [ "$(id -u)" = 0 ]; then
    # The unit tests that need neither root nor TensorFlow run as an unprivileged user, and only
    # there; this pytest runs the rest (integration, and the unit tests marked tf or root).
    lanes="not quiet and (not unit or tf or root)"
    phase check "unit tests as an unprivileged user (own venv)" \
        bash scripts/unit-tests-unprivileged.sh >"$logs/unprivileged.log" 2>&1 &
    unprivileged_pid=$!
fi
venv_status=0
wait "$venv_pid" || venv_status=$?
if [ "$venv_status" -ne 0 ]; then exit "$venv_status"; fi
# What a worker imports (TensorFlow, both Kerases, TensorBoard's summaries), compiled once here in
# the background, so that the lanes' first workers, starting together, do not each compile it.
phase setup "a worker's imports, compiled once, in the background" \
    .venv/bin/python -c 'import tensorflow as tf, tf_keras, worker.loop, worker.mirrored, worker.summaries, worker.evaluate; tf.keras' \
    >"$logs/warm-up.log" 2>&1 &
warm_up_pid=$!
# One collection first, beside what follows until the lanes start, so that the lanes' pytest
# processes find the test modules rewritten and compiled instead of each doing it at once.
phase setup "pytest --collect-only, caching the rewritten test modules, in the background" \
    .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >"$logs/collect.log" 2>&1 &
collect_pid=$!
# The tests' MLflow tracking server in a venv of its own (pyproject.toml's tracking-server extra
# says why), installed beside the checks and the lanes; its tests wait for it (tests/mlflowserver.py).
# --no-compile here and for .venv-jax: byte-compiling every module of their packages took CPU
# from the lanes (the server's install alone took 363 s beside them); Python compiles what the
# tests import, when they import it.
install_tracking_server() {
    python3 -m venv .venv-mlflow
    .venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['tracking-server']))" >"$logs/tracking-server.txt"
    .venv-mlflow/bin/python -m pip install -q --no-compile -r "$logs/tracking-server.txt"
    touch .venv-mlflow/installed
}
rm -f .venv-mlflow/installed
phase setup "the MLflow tracking server's venv (.venv-mlflow), in the background" \
    install_tracking_server >"$logs/tracking-server.log" 2>&1 &
tracking_server_pid=$!
# The worker image's wheels (TensorFlow and the rest), from pip's cache of the install above,
# so that the image's build does not download them again (docker/Dockerfile, docker/wheels/).
image_wheels() {
    .venv/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['worker']))" >"$logs/image-requirements.txt"
    .venv/bin/python -m pip download -q -d docker/wheels -r "$logs/image-requirements.txt"
}
build_image() {
    phase setup "wheels for the worker image (pip download, from pip's cache)" image_wheels
    PYTHON=.venv/bin/python phase image "dockerd, stand-in base and worker image, in all" \
        sh docker/cluster.sh build --stand-in-base
}
image_pid=
if [ "$build_ahead" -eq 1 ]; then
    build_image >"$logs/image.log" 2>&1 &
    image_pid=$!
fi

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
phase check "checks: ruff, ruff format, mypy, lint-imports, mkdocs --strict" \
    checks >"$logs/checks.log" 2>&1 &
checks_pid=$!

# A -m of your own selects the tests instead: one run, in the lanes, the quiet ones among them.
own_selection=0
for argument in "$@"; do
    case "$argument" in -m | -m?*) own_selection=1 ;; esac
done

wait "$collect_pid" || { echo "--- pytest --collect-only failed:"; tail -n 30 "$logs/collect.log"; }
wait "$warm_up_pid" || { echo "--- a worker's imports failed:"; tail -n 30 "$logs/warm-up.log"; }
status=0
# pytest exits 5 when it collects nothing: that fails the run (status stays non-zero).
phase pytest "pytest, the lanes side by side" \
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
    phase pytest "pytest, the quiet tests alone" \
        .venv/bin/python -m pytest -n 0 --durations=0 --durations-min=1 -m quiet "$@" \
        || quiet_status=$?
    if [ "$quiet_status" -eq 5 ] && [ "$status" -eq 0 ]; then quiet_status=0; fi
fi

if ! wait "$jax_only_pid"; then
    echo "--- the jax-only venv failed to install:"
    tail -n 20 "$logs/jax-only.log"
fi
if ! wait "$tracking_server_pid"; then
    echo "--- the MLflow tracking server's venv failed to install:"
    tail -n 20 "$logs/tracking-server.log"
fi
if [ -n "$image_pid" ]; then
    echo "--- the worker image, built ahead (docker/cluster.sh build --stand-in-base)"
    wait "$image_pid" || echo "--- the image's build exited $? (the container tests say more)"
    grep '^cluster:' "$logs/image.log" || tail -n 20 "$logs/image.log"
fi

# The cgroups that tests/lanecpu.py counted each test's CPU in and could not remove yet (a process
# a test started still ran when its pytest ended): removed here, once empty.
if [ -d /sys/fs/cgroup/cpuacct ]; then
    find /sys/fs/cgroup/cpuacct -mindepth 1 -maxdepth 4 -type d -name 'orchestrate-lane-*' \
        -exec rmdir {} + 2>/dev/null || true
fi
printf '{"kind": "total", "name": "scripts/test.sh in all", "start": %s, "end": %s}\n' \
    "$started" "$(date +%s.%N)" >>"$ORCHESTRATE_PHASE_LOG"
python3 scripts/phase_table.py "$ORCHESTRATE_PHASE_LOG" "$started" || true
echo "--- pytest exited $status; the quiet tests $quiet_status"
for code in "$status" "$quiet_status" "$checks_status" "$unprivileged_status"; do
    if [ "$code" -ne 0 ]; then exit "$code"; fi
done
