#!/usr/bin/env bash
# Silver kept fresh: `changelake-ingest run` streams continuously while dbt builds back to back on
# the warm engine, each round only when ingest committed something silver would load since the
# last successful build (the check of ops/scheduled_job.sh: Delta logs, no JVM), else a short pause.
# Runs until SIGTERM or SIGINT: then ingest stops (it commits what it holds; exit 0), the round in
# progress is stopped (dbt and its wrappers, before the engine; the next start redoes the round:
# the models are idempotent), and the warm engine is stopped if this script started it.
# Exit codes: 0 stopped on request; otherwise ingest's (it ended on its own: 2 needs a person, 75
# retry later, as ops/scheduled_job.sh says).
# Environment: CHANGELAKE_CONFIG, CHANGELAKE_WAREHOUSE and CHANGELAKE_DBT_ARGS as ops/scheduled_job.sh
# reads them, and
#   CHANGELAKE_CONTINUOUS_PAUSE [2]    seconds before looking again when nothing was new
#   CHANGELAKE_CONTINUOUS_BACKOFF [30] seconds before retrying after a failed dbt round
set -uo pipefail
cd "$(dirname "$0")/.."
PATH="$PWD/.venv/bin:$PATH"
export CHANGELAKE_WAREHOUSE="${CHANGELAKE_WAREHOUSE:-$PWD/warehouse}"
pause="${CHANGELAKE_CONTINUOUS_PAUSE:-2}"
backoff="${CHANGELAKE_CONTINUOUS_BACKOFF:-30}"
say() { echo "continuous: $*" >&2; }

started_engine=0
if ! bash scripts/cluster.sh serves 2>/dev/null; then
  say "starting the warm engine (scripts/cluster.sh, local Spark)"
  CHANGELAKE_SPARK_LOCAL=1 bash scripts/cluster.sh up || exit 1
  started_engine=1
fi
changelake-ingest run &
ingest_pid=$!
round_pid=""

finish() {
  local rc="$1"
  # The round is a process group of its own (setsid below): dbt and its wrappers stop with it, and
  # are gone before the engine is (else dbt fails loudly against a stopped engine, or, on an
  # engine this script did not start, goes on building after "stopped").
  if [ -n "$round_pid" ]; then
    kill -TERM -- "-$round_pid" 2>/dev/null
    wait "$round_pid" 2>/dev/null
  fi
  kill -TERM "$ingest_pid" 2>/dev/null
  wait "$ingest_pid" 2>/dev/null
  if [ "$started_engine" = 1 ]; then bash scripts/cluster.sh down >/dev/null 2>&1; fi
  say "stopped"
  exit "$rc"
}
trap 'finish 0' TERM INT

while kill -0 "$ingest_pid" 2>/dev/null; do
  started=$SECONDS
  # The round in the background, so a signal is handled at once rather than after dbt; in a
  # process group of its own (setsid keeps the PID), which finish() stops whole.
  CHANGELAKE_JOB_INGEST=0 DBT_TARGET=engine setsid bash ops/scheduled_job.sh 2>&1 &
  round_pid=$!
  wait "$round_pid"
  rc=$?
  round_pid=""
  if [ "$rc" -eq 3 ]; then
    sleep "$pause" &  # nothing new for silver
  elif [ "$rc" -ne 0 ]; then
    say "dbt round failed (exit $rc); retrying in ${backoff}s"
    sleep "$backoff" &
  else
    say "silver built in $((SECONDS - started))s"
    continue
  fi
  wait $!
done
wait "$ingest_pid"
rc=$?
say "ingest ended (exit $rc)"
finish "$rc"
