#!/usr/bin/env bash
# One scheduled round (cron, a systemd timer, an Airflow BashOperator): ingest every source up to
# its current position, then `dbt build` what is new. Exit codes for the scheduler:
#   0   done
#   75  a source was unreachable (EX_TEMPFAIL: retry later); dbt still built what bronze holds
#   2   an error someone must fix (config, a lost slot): the message on stderr says what and how
#   1   an internal error (report it)
# Environment: CHANGELAKE_CONFIG (ingest's YAML), CHANGELAKE_WAREHOUSE (the same warehouse for dbt),
# DBT_PROFILES_DIR and DBT_TARGET as dbt reads them. Run from the project directory.
set -uo pipefail
cd "$(dirname "$0")/.."
PATH="$PWD/.venv/bin:$PATH"

ingest_rc=0
changelake-ingest run --once || ingest_rc=$?
case "$ingest_rc" in
  0) ;;
  75) echo "scheduled_job: a source is unreachable; building what bronze already holds" >&2 ;;
  *) exit "$ingest_rc" ;;
esac

warehouse="${CHANGELAKE_WAREHOUSE:-$PWD/warehouse}"
if [ ! -d "$warehouse/bronze/wal_events/_delta_log" ]; then
  echo "scheduled_job: no bronze yet at $warehouse (ingest has never reached a source): nothing to build" >&2
  exit "$ingest_rc"
fi
dbt build --target "${DBT_TARGET:-local}" || exit $?
exit "$ingest_rc"
