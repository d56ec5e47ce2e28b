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
echo "demo: dbt build of silver (table_columns: the captured tables' shapes)"
started=$SECONDS
.venv/bin/dbt build --quiet --project-dir . --profiles-dir . --select silver
echo "demo: changelake-ingest gold generate (typed gold models of the demo's tables, with the source's comments)"
.venv/bin/changelake-ingest -c config/demo.yml gold generate --out models/demo --source shop
echo "demo: dbt build (gold and the demo's gold, with every data test and unit test)"
.venv/bin/dbt build --quiet --project-dir . --profiles-dir . --vars '{changelake_demo: true}'
built=$((SECONDS - started))
echo "demo: a scheduled round with nothing new: ingest run --once (commits only its drain marker), then"
echo "      dbt build as ops/scheduled_job.sh runs it (no unit tests); silver finds nothing new and skips"
.venv/bin/changelake-ingest -c config/demo.yml run --once
started=$SECONDS
.venv/bin/dbt build --quiet --project-dir . --profiles-dir . --vars '{changelake_demo: true}' \
  --exclude-resource-type unit_test
echo "demo: dbt times: ${built}s building the workload (silver, gold generate, gold; unit tests included)," \
  "$((SECONDS - started))s for the round with nothing new"
echo "demo: summary from gold"
.venv/bin/dbt show --quiet --project-dir . --profiles-dir . --limit 20 --inline "
  select counts.table_name, counts.live_records, counts.deleted_records,
         health.lag_bytes, health.events_last_hour
  from {{ ref('source_health') }} as health
  join (
    select source, table_name, count_if(not deleted) as live_records, count_if(deleted) as deleted_records
    from {{ ref('consumer_records') }} group by source, table_name
  ) as counts on counts.source = health.source
  order by counts.table_name"
echo "demo: done. Warehouse: $CHANGELAKE_WAREHOUSE (bronze/, dbt/silver.db, dbt/gold.db); try: dbt show --select shop__public__orders --vars '{changelake_demo: true}'"
