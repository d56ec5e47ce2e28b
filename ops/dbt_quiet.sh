#!/usr/bin/env bash
# `dbt "$@"` without the start-up lines a local Spark session prints on stderr: the session target
# starts its JVM inside dbt's process, and the JVM ("WARNING: Using incubator modules") and Spark
# ("Setting default log level", "Setting Spark log level") write them before any log4j profile
# applies. Everything else dbt, Spark or the JVM prints (errors included) passes unchanged; the
# exit status is dbt's. Used by scripts/demo.sh and ops/scheduled_job.sh; the dbt of the project's
# .venv unless CHANGELAKE_DBT names another.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dbt="${CHANGELAKE_DBT:-$here/.venv/bin/dbt}"
[ -x "$dbt" ] || dbt="$(command -v dbt)" || { echo "dbt_quiet: no dbt (run make setup)" >&2; exit 1; }
startup='^(WARNING: Using incubator modules: jdk\.incubator\.vector|Setting default log level to "[A-Z]+"\.|To adjust logging level use sc\.setLogLevel\(newLevel\)\. For SparkR, use setLogLevel\(newLevel\)\.|Setting Spark log level to "[A-Z]+"\.)$'
# dbt's stdout goes straight to ours (fd 3); only its stderr passes the filter.
{ "$dbt" "$@" 2>&1 1>&3 3>&- | grep --line-buffered -Ev "$startup" >&2; } 3>&1
exit "${PIPESTATUS[0]}"
