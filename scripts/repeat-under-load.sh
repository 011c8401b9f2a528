#!/usr/bin/env bash
# Runs one pytest selection RUNS times in a row (default 10) beside LOAD busy loops (default one
# per CPU), as on a user's busy workstation, and prints how many runs passed. For an issue's
# note (how a test holds under load), not for CI: e.g.
#   scripts/repeat-under-load.sh tests/integration/test_dashboard_browser.py -k follows
# Each run's log is $LOGS/repeat-under-load.N.log (LOGS: default /tmp; give sessions that run
# side by side a directory each).
set -u
cd "$(dirname "$0")/.."
runs=${RUNS:-10}
loops=${LOAD:-$(nproc)}
python=${PYTHON:-.venv/bin/python}
logs=${LOGS:-/tmp}
pids=()
for _ in $(seq "$loops"); do
    "$python" -c "while True: pass" &
    pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
passed=0
for run in $(seq "$runs"); do
    started=$(date +%s)
    "$python" -m pytest -q -p no:cacheprovider "$@" >"$logs/repeat-under-load.$run.log" 2>&1
    status=$?
    [ "$status" -eq 0 ] && passed=$((passed + 1))
    echo "run $run: exit $status in $(($(date +%s) - started)) s, load $(cut -d' ' -f1 /proc/loadavg)" \
         "(log $logs/repeat-under-load.$run.log)"
done
echo "passed $passed of $runs beside $loops busy loops: $*"
[ "$passed" -eq "$runs" ]
