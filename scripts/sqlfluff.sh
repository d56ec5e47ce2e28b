#!/usr/bin/env bash
# sqlfluff lint of the dbt SQL (sparksql dialect, dbt templater). The templater starts a Spark
# session like dbt does, so it gets a scratch warehouse of its own: it never contends for the
# embedded metastore of the warehouse a running `dbt build` holds.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d -t changelake-lint-XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
CHANGELAKE_WAREHOUSE="$scratch/warehouse" DBT_TARGET_PATH="$scratch/target" DBT_LOG_PATH="$scratch/logs" \
  .venv/bin/sqlfluff lint models macros tests/dbt --disable-progress-bar --nocolor
