#!/usr/bin/env bash
# make test-busy: the slow and live tests while tools/cpu_hog.py keeps every core busy.
#
# A test that decides pass/fail by wall-clock time, or synchronises by sleeping,
# passes on an idle machine and fails on a loaded CI runner; this run shows it here.
# The hog is bounded: it stops by itself after HOG_MAX_S seconds (default 3600),
# and the EXIT trap kills it by its pid when pytest ends (pass, fail or Ctrl-C).
# Extra arguments go to pytest, e.g. tools/test_busy.sh tests/evaluator -x
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" tools/cpu_hog.py --max-seconds "${HOG_MAX_S:-3600}" &
hog=$!
trap 'kill -TERM "$hog" 2>/dev/null; wait "$hog" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
started=$(date +%s)
"$PY" -m pytest -q -m "slow or live" "$@"
rc=$?
echo "test-busy: pytest exited $rc after $(( $(date +%s) - started )) s under $(nproc) hog workers"
exit "$rc"
