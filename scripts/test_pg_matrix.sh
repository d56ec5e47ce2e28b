#!/usr/bin/env bash
# The PostgreSQL matrix: the PostgreSQL-facing integration tests (not the dbt and Spark flows, not
# MongoDB; tests/conftest.py's _pg_facing) on other majors, each against a cluster of its own.
# Usage: scripts/test_pg_matrix.sh [MAJOR...]   (default: 13 14 16 17 18; 15 is the main suite's)
# On 13, which ingest refuses (its pgoutput sends no logical messages), the matrix checks the
# refusal: nothing created, the supported majors named (test_pg_versions.py).
# `make test-pg-matrix` runs every major; `make test` (scripts/test.sh) runs the oldest and the
# newest supported (14 and 18). Extra pytest arguments: CHANGELAKE_MATRIX_PYTEST_ARGS.
# Installs nothing: `make setup` fetched the majors (scripts/pg_versions.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
majors=("$@")
[ ${#majors[@]} -gt 0 ] || majors=(13 14 16 17 18)
state=""
failed=()
cleanup() {
  if [ -n "$state" ]; then
    CHANGELAKE_STATE="$state" bash scripts/pg.sh stop >/dev/null 2>&1 || true
    rm -rf "$state"
  fi
}
trap cleanup EXIT
for major in "${majors[@]}"; do
  if [ "$major" = 13 ]; then
    echo "== PostgreSQL matrix: 13 (refused by ingest; the refusal is checked)"
    python -m pytest -q -p no:cacheprovider -n 0 \
      "tests/integration/test_pg_versions.py::test_an_unsupported_major_is_refused_before_anything_is_created" ||
      failed+=("$major")
    continue
  fi
  state="$(mktemp -d /tmp/changelake-matrix-"$major"-XXXXXX)"
  chmod 755 "$state"
  bindir=""
  [ "$major" = 15 ] || bindir="$(bash scripts/pg_versions.sh bindir "$major")"
  # A port below the ephemeral range (see tests/helpers/scratch_pg.py), apart from the tests' own.
  dsn="$(CHANGELAKE_STATE="$state" CHANGELAKE_PG_PORT=$((25600 + major)) CHANGELAKE_PG_BINDIR="$bindir" \
    bash scripts/pg.sh start | tail -n 1)"
  version="$(psql "$dsn" -Atc 'show server_version')"
  echo "== PostgreSQL matrix: $version ($dsn)"
  # shellcheck disable=SC2086  # CHANGELAKE_MATRIX_PYTEST_ARGS is a list of arguments
  CHANGELAKE_PG_DSN="$dsn" CHANGELAKE_PG_MATRIX="$major" python -m pytest tests/integration -q -p no:cacheprovider \
    -n "${CHANGELAKE_TEST_WORKERS:-2}" --durations=5 ${CHANGELAKE_MATRIX_PYTEST_ARGS:-} || failed+=("$major")
  cleanup
  state=""
done
# Every major runs; the matrix fails if any did.
if [ ${#failed[@]} -gt 0 ]; then
  echo "PostgreSQL matrix: failures on ${failed[*]}" >&2
  exit 1
fi
