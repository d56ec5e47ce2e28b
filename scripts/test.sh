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
# Two workers (pytest-xdist): one runs the Spark and dbt modules in order, the other the
# PostgreSQL, MongoDB and unit modules, which mostly wait on servers (tests/conftest.py's
# scheduler). CHANGELAKE_TEST_WORKERS=0 runs everything in this process, one test at a time.
# Every test that took a second or more, slowest first: CI's log keeps where the time goes.
python -m pytest tests -q -p no:cacheprovider -n "${CHANGELAKE_TEST_WORKERS:-2}" \
    --durations=0 --durations-min=1.0 "$@"
# The PostgreSQL-facing integration tests again on the oldest and the newest supported majors (13 is
# refused, 15 ran above), each on a cluster of its own (docs/postgres.md; every major: `make
# test-pg-matrix`). Only for the whole suite: a run narrowed by arguments stops above.
if [ $# -eq 0 ]; then
  echo "== PostgreSQL matrix: 14 and 18"
  bash scripts/test_pg_matrix.sh 14 18
fi
