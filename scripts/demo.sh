#!/usr/bin/env bash
# The end-to-end demo on the embedded default: local Postgres workload -> ingest -> bronze -> dbt build.
set -euo pipefail
cd "$(dirname "$0")/.."
export CHANGELAKE_PG_DSN="${CHANGELAKE_PG_DSN:-$(bash scripts/pg.sh dsn)}"
export CHANGELAKE_WAREHOUSE="${CHANGELAKE_WAREHOUSE:-$PWD/warehouse}"
PY=.venv/bin/python
echo "demo: source ${CHANGELAKE_PG_DSN%%\?*}, warehouse $CHANGELAKE_WAREHOUSE"
$PY -m demo.workload --schema-only "$CHANGELAKE_PG_DSN"
.venv/bin/changelake-ingest -c config/demo.yml setup
echo "demo: running a shop workload (customers, orders, status changes, cancellations)"
$PY -m demo.workload "$CHANGELAKE_PG_DSN"
echo "demo: ingest run --once (drains the slot into bronze, then exits)"
.venv/bin/changelake-ingest -c config/demo.yml run --once
if [ -f dbt_project.yml ] && [ -f demo/summary.py ]; then
  echo "demo: dbt build"
  .venv/bin/dbt build --quiet --project-dir . --profiles-dir .
  $PY -m demo.summary
fi
