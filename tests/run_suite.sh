#!/usr/bin/env bash
# make test's pytest run. The whole suite on $TEST_WORKERS xdist workers (tests/schedule.py orders it); then,
# when a few tests failed, those tests once more, one at a time, on a machine the suite no longer loads. A test
# that fails again fails the run. One that passes alone is named in a FLAKY line: it failed only under the
# parallel run's load, and the line is there for whoever makes it robust.
set -u
BIN=${BIN:-.venv/bin}
RERUN_MAX=${RERUN_MAX:-6}   # more failures than this is no load: the run fails without rerunning
LASTFAILED=.pytest_cache/v/cache/lastfailed

rm -f "$LASTFAILED"  # only this run's failures are rerun
t0=$(date +%s)
"$BIN/pytest" -q -n "${TEST_WORKERS:-4}" --dist loadgroup --durations=25
rc=$?
echo "make test: pytest took $(( $(date +%s) - t0 )) s"
if [ "$rc" -ne 1 ]; then
    exit "$rc"
fi
failed=$("$BIN/python" -c 'import json, sys; print("\n".join(sorted(json.load(open(sys.argv[1])))))' "$LASTFAILED" \
         2>/dev/null) || failed=""
n=$(printf '%s' "$failed" | grep -c . || true)
if [ "$n" -lt 1 ] || [ "$n" -gt "$RERUN_MAX" ]; then
    echo "make test: $n test(s) failed; not rerun (at most $RERUN_MAX are)"
    exit "$rc"
fi
echo "make test: $n test(s) failed in the parallel run; running them again, one at a time:"
printf '  %s\n' $failed
t1=$(date +%s)
"$BIN/pytest" -q --lf
rc=$?
echo "make test: the rerun took $(( $(date +%s) - t1 )) s"
if [ "$rc" -eq 0 ]; then
    printf 'make test: FLAKY (failed under the parallel run'"'"'s load, passed alone): %s\n' $failed
fi
exit "$rc"
