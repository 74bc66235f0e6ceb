#!/usr/bin/env bash
# make test's pytest runs, after the set-up: every test and every notebook (nbval). As root, the hub test
# (tests/test_hub.py: two learners' servers as Slurm jobs, driven in headless Chromium) runs in a pytest of its
# own beside the notebooks, which submit nothing to Slurm: it spends most of its two minutes waiting for the
# hub, its jobs and the browser, and the machine has the cores to spare. Its report follows the others'.
# The exit status is non-zero when either run failed. Extra arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
[[ $venv == /* ]] || venv=$PWD/$venv
export PATH="$venv/bin:$PATH"
py=$venv/bin/python
if [[ $(id -u) != 0 ]]; then  # no hub here: its tests skip with the reason, in the one run
    exec "$py" -m pytest --nbval-lax --nbval-current-env --durations=40 "$@" notebooks tests
fi
mkdir -p build
"$py" -m pytest --durations=5 "$@" tests/test_hub.py >build/test_hub.log 2>&1 &
hub_pid=$!
"$py" -m pytest --nbval-lax --nbval-current-env --durations=40 "$@" notebooks tests --ignore=tests/test_hub.py
main=$?
wait "$hub_pid"
hub=$?
echo
echo "==================== tests/test_hub.py, run beside the notebooks (its log: build/test_hub.log) ===================="
cat build/test_hub.log
exit $(( main != 0 ? main : hub ))
