#!/usr/bin/env bash
# The end-to-end demo on the embedded default: local Postgres workload -> ingest -> bronze -> dbt build.
# dbt runs on the warm engine (a Spark Thrift server on local[2], scripts/cluster.sh with
# CHANGELAKE_SPARK_LOCAL=1), started beside the workload and stopped at the end
# (CHANGELAKE_KEEP_ENGINE=1 leaves it running for `dbt ... --target engine`); CHANGELAKE_DEMO_TARGET=local
# runs dbt in-process instead (a JVM per dbt command).
set -euo pipefail
cd "$(dirname "$0")/.."
export CHANGELAKE_PG_DSN="${CHANGELAKE_PG_DSN:-$(bash scripts/pg.sh dsn)}"
export CHANGELAKE_WAREHOUSE="${CHANGELAKE_WAREHOUSE:-$PWD/warehouse}"
PY=.venv/bin/python
TARGET="${CHANGELAKE_DEMO_TARGET:-engine}"
DBT=(ops/dbt_quiet.sh --quiet)
echo "demo: source ${CHANGELAKE_PG_DSN%%\?*}, warehouse $CHANGELAKE_WAREHOUSE"
engine_log=""
if [ "$TARGET" = engine ]; then
  mkdir -p "$CHANGELAKE_WAREHOUSE"
  engine_log="$CHANGELAKE_WAREHOUSE/engine-up.log"
  echo "demo: starting the warm engine (Spark Thrift server on local[2]) beside the workload; log $engine_log"
  CHANGELAKE_SPARK_LOCAL=1 bash scripts/cluster.sh up >"$engine_log" 2>&1 &
  engine_pid=$!
  if [ "${CHANGELAKE_KEEP_ENGINE:-0}" != 1 ]; then
    trap 'bash scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
  fi
fi
$PY -m demo.workload --schema-only "$CHANGELAKE_PG_DSN"
.venv/bin/changelake-ingest -c config/demo.yml setup
echo "demo: running a shop workload (customers, orders, status changes, cancellations)"
$PY -m demo.workload "$CHANGELAKE_PG_DSN"
echo "demo: ingest run --once (drains the slot into bronze, then exits)"
.venv/bin/changelake-ingest -c config/demo.yml run --once
if [ -n "$engine_log" ]; then
  wait "$engine_pid" || { cat "$engine_log" >&2; echo "demo: the warm engine did not start" >&2; exit 1; }
  tail -n 1 "$engine_log"
fi
# One build: silver, gold and the demo's typed gold (models/demo, generated earlier from the same
# workload's shapes and kept in the repository). Then `gold generate` checks them against this run's
# table_columns and rewrites any that differ, and only those are built again.
# The rounds run as a schedule runs them (ops/scheduled_job.sh): dbt build without the unit tests,
# and the job's state (the bronze versions this build read) for the next round's skip decision.
export CHANGELAKE_CONFIG=config/demo.yml DBT_TARGET="$TARGET" DBT_PROFILES_DIR=.
export CHANGELAKE_DBT_ARGS='build --project-dir . --exclude-resource-type unit_test --vars {"changelake_demo":true}'
echo "demo: dbt build as ops/scheduled_job.sh runs it (silver, gold and the demo's typed gold, with their data tests; the unit tests run in make test)"
started=$SECONDS
CHANGELAKE_JOB_INGEST=0 ops/scheduled_job.sh
echo "demo: changelake-ingest gold generate (typed gold models of the demo's tables, with the source's comments)"
generated="$(.venv/bin/changelake-ingest -c config/demo.yml gold generate --out models/demo --source shop)"
echo "$generated"
if ! grep -q ": 0 written," <<<"$generated"; then
  echo "demo: dbt build of the rewritten gold models"
  "${DBT[@]}" build --project-dir . --profiles-dir . --target "$TARGET" --vars '{changelake_demo: true}' \
    --exclude-resource-type unit_test --select path:models/demo
fi
built=$((SECONDS - started))
echo "demo: a scheduled round with nothing new (ops/scheduled_job.sh): ingest run --once commits only its"
echo "      drain marker and raised positions; the job reads bronze's Delta logs (no JVM), finds nothing"
echo "      silver would load since the last build, and skips dbt"
started=$SECONDS
ops/scheduled_job.sh
echo "demo: times on target $TARGET: ${built}s building the workload (dbt build, gold generate, gold)," \
  "$((SECONDS - started))s for the round with nothing new (ingest and the skip decision)"
echo "demo: summary from gold"
"${DBT[@]}" show --project-dir . --profiles-dir . --target "$TARGET" --limit 20 --inline "
  select counts.table_name, counts.live_records, counts.deleted_records,
         health.lag_bytes, health.events_last_hour
  from {{ ref('source_health') }} as health
  join (
    select source, table_name, count_if(not deleted) as live_records, count_if(deleted) as deleted_records
    from {{ ref('consumer_records') }} group by source, table_name
  ) as counts on counts.source = health.source
  order by counts.table_name"
echo "demo: done. Warehouse: $CHANGELAKE_WAREHOUSE (bronze/, dbt/silver.db, dbt/gold.db); try: dbt show --select shop__public__orders --vars '{changelake_demo: true}'"
