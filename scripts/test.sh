#!/usr/bin/env bash
# `make test`'s pytest run: the Spark tests (spark_jobs/tests: JVM-bound), then the
# harness's (drills and chaos cycles, ~3.5 min alone), in a second pytest process beside
# the rest (mostly waiting on real servers: failovers, sessions, timeouts), so the two
# overlap on two cores instead of queueing. The Spark tests alone took ~8.5 min beside a
# ~15.5 min main run; with the harness's moved over, the halves are about even. Each
# process has its own temporary directory and its own port range (UNDERSTUDY_PORT_RANGE,
# read by understudy_operator.local.ports), so neither promises a port the other holds.
# Two pure model checks (~45 s of CPU) run in the second half too: with them the main run
# ended ~110 s after the second (781 s against 670 s on 11-29).
# The second run's output follows the main one's; the exit status is the first failure's.
# (The main run leaves the second's folders out with --ignore-glob: --ignore is not
# honoured for a testpaths folder here.)
#
#   scripts/test.sh              both halves side by side
#   scripts/test.sh ARGS...      one pytest process with ARGS (a selection: -k, a path, ...)
#   TEST_SERIAL=1 scripts/test.sh   both halves one after the other
set -uo pipefail
cd "$(dirname "$0")/.."

PYTEST=(.venv/bin/python -m pytest -m "not e2e" --durations=20)
# Main-tree tests that run in the second half (paths; the main run ignores them).
SECOND_EXTRA=(tests/test_model_check_chains.py tests/test_model_check_routes.py)
MAIN_IGNORE=(--ignore-glob="spark_jobs/tests/*" --ignore-glob="harness/tests/*")
for t in "${SECOND_EXTRA[@]}"; do MAIN_IGNORE+=(--ignore-glob="$t"); done
if (($#)); then
  exec "${PYTEST[@]}" "$@"
fi

base="$(mktemp -d /tmp/understudy-test.XXXXXX)"
second_log="$base/second.log"
second_pid=""
# Interrupted: the second run stops too (pytest stops its servers on SIGINT/SIGTERM).
trap '[ -n "$second_pid" ] && kill -INT "$second_pid" 2>/dev/null; wait; exit 130' INT TERM
started=$(date +%s)

run_second() {
  UNDERSTUDY_PORT_RANGE=21000-32000 "${PYTEST[@]}" spark_jobs/tests harness/tests "${SECOND_EXTRA[@]}" \
    --basetemp "$base/second" \
    -p no:cacheprovider >"$second_log" 2>&1
}

if [ "${TEST_SERIAL:-}" = 1 ]; then
  UNDERSTUDY_PORT_RANGE=10000-21000 "${PYTEST[@]}" "${MAIN_IGNORE[@]}" --basetemp "$base/main"
  main_rc=$?
  run_second
  second_rc=$?
else
  run_second &
  second_pid=$!
  UNDERSTUDY_PORT_RANGE=10000-21000 "${PYTEST[@]}" "${MAIN_IGNORE[@]}" --basetemp "$base/main"
  main_rc=$?
  echo "test: waiting for the Spark and harness tests (pid $second_pid)..."
  wait "$second_pid"
  second_rc=$?
fi
echo
echo "===================== spark_jobs/tests and harness/tests ======================"
cat "$second_log"
echo "test: main run exit $main_rc, Spark and harness run exit $second_rc, $(( $(date +%s) - started )) s in all"
if ((main_rc == 0 && second_rc == 0)); then
  rm -rf "$base"
else
  echo "test: the runs' temporary directories are kept in $base"
fi
if ((main_rc != 0)); then exit "$main_rc"; fi
exit "$second_rc"
