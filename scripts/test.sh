#!/usr/bin/env bash
# The test suite (what `make test` and CI run): lint, types, unit, integration (real PostgreSQL,
# Spark + Delta, dbt). Installs nothing itself: `make test` has run setup and started PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
export CHANGELAKE_PG_DSN="${CHANGELAKE_PG_DSN:-$(bash scripts/pg.sh dsn)}"
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check ingest tests demo bench examples && ruff format --check -q ingest tests demo bench examples
echo "== mypy --strict"; mypy
if [ -f dbt_project.yml ]; then echo "== sqlfluff"; bash scripts/sqlfluff.sh; fi
echo "== pytest"
# dbt runs 4 nodes at a time in the tests (small data: the data tests overlap; docs/dbt.md).
export CHANGELAKE_DBT_THREADS="${CHANGELAKE_DBT_THREADS:-4}"
# (C1-only JIT via CHANGELAKE_JVM_OPTS=-XX:TieredStopAtLevel=1 was tried here: it once filled the
# JVM's code cache in the dbt flow, so the tests keep the JVM default.)
# Every test that took a second or more, slowest first: CI's log keeps where the time goes.
durations=(--durations=0 --durations-min=1.0)
# A run narrowed by arguments: those tests on two pytest-xdist workers (tests/conftest.py's scheduler
# keeps the Spark and dbt tests on one of them). CHANGELAKE_TEST_WORKERS=0 runs them in this process.
if [ $# -gt 0 ]; then
  exec python -m pytest -q -p no:cacheprovider -n "${CHANGELAKE_TEST_WORKERS:-2}" "${durations[@]}" "$@"
fi
# The whole suite: two lanes side by side, each a pytest process (tests/conftest.py, LANE_ENV).
# - spark: every test that starts Spark or dbt, in order, one JVM with local[2] at a time (the
#   machine has 2 cores: two such JVMs side by side each slow down by more than half);
# - servers: the PostgreSQL, MongoDB and unit tests, which mostly wait on servers, and then the
#   PostgreSQL-facing integration tests again on the oldest and the newest supported majors (13 is
#   refused, 15 ran in the lane; docs/postgres.md; every major: `make test-pg-matrix`), each on a
#   cluster of its own: the matrix fills the time the servers lane would otherwise wait for the
#   Spark one.
# The spark lane prints as it goes; the servers lane writes its log, printed when both are done.
logs="$(mktemp -d /tmp/changelake-test-XXXXXX)"
servers() {
  local rc=0
  CHANGELAKE_TEST_LANE=servers python -m pytest tests -q -p no:cacheprovider -n 0 "${durations[@]}" || rc=1
  echo "== PostgreSQL matrix: 14 and 18"
  CHANGELAKE_TEST_WORKERS=0 bash scripts/test_pg_matrix.sh 14 18 || rc=1
  return $rc
}
echo "== pytest: lane servers (PostgreSQL, MongoDB, unit; then the matrix on 14 and 18) -> $logs/servers.log"
set -m  # the lane in a process group of its own: stopped whole if this script ends first
servers >"$logs/servers.log" 2>&1 &
servers_pid=$!
set +m
trap 'kill -- -"$servers_pid" 2>/dev/null || true' EXIT
echo "== pytest: lane spark (Spark and dbt)"
spark_rc=0
SECONDS=0
CHANGELAKE_TEST_LANE=spark python -m pytest tests -q -p no:cacheprovider -n 0 "${durations[@]}" || spark_rc=$?
echo "== lane spark: exit $spark_rc after $((SECONDS / 60)) min $((SECONDS % 60)) s"
servers_rc=0
wait "$servers_pid" || servers_rc=$?
trap - EXIT
echo "== lane servers (finished $(date -u -r "$logs/servers.log" +%H:%M:%S) UTC): exit $servers_rc"
cat "$logs/servers.log"
[ "$spark_rc" -eq 0 ] && [ "$servers_rc" -eq 0 ]
