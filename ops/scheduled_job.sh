#!/usr/bin/env bash
# One scheduled round (cron, a systemd timer, an Airflow BashOperator): ingest every source up to
# its current position, then `dbt build` what is new. Exit codes for the scheduler:
#   0   done
#   75  a source was unreachable (EX_TEMPFAIL: retry later); dbt still built what bronze holds
#   2   an error someone must fix (config, a lost slot): the message on stderr says what and how
#   1   an internal error (report it)
# Environment: CHANGELAKE_CONFIG (ingest's YAML), CHANGELAKE_WAREHOUSE (the same warehouse for dbt),
# DBT_PROFILES_DIR and DBT_TARGET as dbt reads them. Run from the project directory.
# A round whose ingest committed nothing silver would load since the last successful dbt build of
# the same project and target (only logical messages - the drain marker, heartbeats - and raised
# positions; ingest/ops/bronze_news.py reads the Delta logs, no JVM) skips dbt and says so; the
# state is in <warehouse>/_scheduled_job (a local warehouse only; on an object store dbt always
# runs and finds out itself, in seconds, that nothing is new). CHANGELAKE_DBT_ALWAYS=1 runs dbt
# anyway; CHANGELAKE_DBT_ARGS replaces `build --exclude-resource-type unit_test` (unit tests are
# for CI, data tests check this round's rows: docs/dbt.md). dbt runs through ops/dbt_quiet.sh: no JVM or
# Spark start-up lines in the job's log, errors as dbt prints them.
set -uo pipefail
cd "$(dirname "$0")/.."
PATH="$PWD/.venv/bin:$PATH"

ingest_rc=0
# CHANGELAKE_JOB_INGEST=0: dbt only (ops/continuous.sh, whose ingest runs continuously beside it);
# a round with nothing to build then exits 3 instead of 0.
nothing_rc=0
if [ "${CHANGELAKE_JOB_INGEST:-1}" != 0 ]; then changelake-ingest run --once || ingest_rc=$?; else nothing_rc=3; fi
case "$ingest_rc" in
  0) ;;
  75) echo "scheduled_job: a source is unreachable; building what bronze already holds" >&2 ;;
  *) exit "$ingest_rc" ;;
esac

warehouse="${CHANGELAKE_WAREHOUSE:-$PWD/warehouse}"
if [ ! -d "$warehouse/bronze/wal_events/_delta_log" ]; then
  [ "$nothing_rc" = 0 ] && echo "scheduled_job: no bronze yet at $warehouse (ingest has never reached a source): nothing to build" >&2
  [ "$ingest_rc" -ne 0 ] && exit "$ingest_rc"
  exit "$nothing_rc"
fi
# Skip dbt when ingest committed nothing silver would load since the last successful build: only
# logical messages (the drain marker of `run --once`, heartbeats) and raised positions.
state_dir="$warehouse/_scheduled_job"
project="$(cat dbt_project.yml profiles.yml $(find models macros tests/dbt -type f | sort) | sha256sum) ${DBT_TARGET:-} ${CHANGELAKE_DBT_ARGS:-}"
versions="$(python -m ingest.ops.bronze_news versions "$warehouse/bronze")" || exit 1
if [ "${CHANGELAKE_DBT_ALWAYS:-0}" != 1 ] && [ -f "$state_dir/built_project" ] \
  && [ "$(cat "$state_dir/built_project")" = "$project" ]; then
  news_rc=0
  why="$(python -m ingest.ops.bronze_news news "$warehouse/bronze" "$state_dir/built_from")" || news_rc=$?
  case "$news_rc" in
    3) [ "$nothing_rc" = 0 ] && echo "scheduled_job: ingest committed nothing new for silver since the last dbt build; dbt skipped" >&2
       [ "$ingest_rc" -ne 0 ] && exit "$ingest_rc"
       exit "$nothing_rc" ;;
    0) echo "scheduled_job: $why; running dbt" >&2 ;;
    *) exit 1 ;;
  esac
fi
# The warm engine when one serves this warehouse (`make engine-up`): dbt connects to it instead of
# starting a JVM and booting the metastore for the round. DBT_TARGET chooses explicitly.
target="${DBT_TARGET:-}"
if [ -z "$target" ]; then
  target=local
  if CHANGELAKE_WAREHOUSE="$warehouse" bash scripts/cluster.sh serves 2>/dev/null; then target=engine; fi
fi
# After a failed build, the next one checks whole tables (CHANGELAKE_FULL_TESTS, macro
# changelake_full_tests): its models may all be skipped as unchanged, and a data test of skipped
# models passes without a query, so the failed check would turn green with nothing fixed.
mkdir -p "$state_dir"
full_tests="${CHANGELAKE_FULL_TESTS:-}"
if [ -f "$state_dir/build_failed" ]; then
  echo "scheduled_job: the last dbt build failed; this one runs every data test on whole tables" >&2
  full_tests=1
fi
# shellcheck disable=SC2086  # CHANGELAKE_DBT_ARGS is a list of arguments
CHANGELAKE_FULL_TESTS="$full_tests" ops/dbt_quiet.sh ${CHANGELAKE_DBT_ARGS:-build --exclude-resource-type unit_test} \
  --target "$target" || { dbt_rc=$?; touch "$state_dir/build_failed"; exit "$dbt_rc"; }
rm -f "$state_dir/build_failed"
printf '%s\n' "$versions" > "$state_dir/built_from" && printf '%s\n' "$project" > "$state_dir/built_project"
exit "$ingest_rc"
