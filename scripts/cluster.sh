#!/usr/bin/env bash
# A real Spark standalone cluster on loopback, from what the pyspark package ships: a master, one
# worker, and a Spark Thrift Server (HiveThriftServer2) submitted to that master with Delta, for dbt's
# `cluster` target. Used by `make cluster-up/-down`, tests/cluster and bench/cluster_vs_local.py.
#
# Every daemon runs in its own session (setsid): a wrapping `timeout`, a closed terminal or a
# Ctrl-C in the caller does not take it down, and `down` stops each one by the PID recorded here
# (its whole process group, so the worker's executors go with it). Idempotent: `up` reuses what
# runs; `down` on a stopped cluster does nothing.
#
# Usage: scripts/cluster.sh up|down|status|env|serves
#   env prints the settings a client needs (CHANGELAKE_SPARK_MASTER, CHANGELAKE_THRIFT_PORT, ...);
#   serves exits 0 when a Thrift server runs for CHANGELAKE_WAREHOUSE (ops/scheduled_job.sh asks).
#
# CHANGELAKE_SPARK_LOCAL=1 starts the warm engine instead: the Thrift server alone, on a local[N]
# Spark in its own JVM (no master, no worker), which `make demo` and ops/scheduled_job.sh use so
# that dbt pays neither a JVM start nor a metastore boot per invocation (docs/dbt.md, "A warm
# engine"). Same ports, PIDs and logs; `down` and `status` serve both.
#
# Settings (environment; defaults in brackets):
#   CHANGELAKE_STATE [./.changelake]        PIDs and logs go to $CHANGELAKE_STATE/cluster
#   CHANGELAKE_WAREHOUSE [./warehouse]      the Thrift server's warehouse (dbt/) and Derby metastore
#                                           (_metastore/); must be the path ingest writes bronze under
#   CHANGELAKE_PYTHON [.venv/bin/python]    the Python whose pyspark install is SPARK_HOME
#   CHANGELAKE_SPARK_HOST [127.0.0.1]       the address every daemon binds
#   CHANGELAKE_MASTER_PORT [7077]           spark://host:port
#   CHANGELAKE_MASTER_UI_PORT [8980]        master web UI (and /json); not 8080, often taken
#   CHANGELAKE_WORKER_UI_PORT [8981]
#   CHANGELAKE_THRIFT_PORT [10000]          HiveServer2 (dbt's `cluster` target)
#   CHANGELAKE_THRIFT_UI_PORT [4050]        the Thrift server driver's UI and REST API; not 4040,
#                                           the default of a local Spark (ingest, dbt's session)
#   CHANGELAKE_WORKER_CORES [2]  CHANGELAKE_WORKER_MEMORY [2g]    what the worker offers
#   CHANGELAKE_EXECUTOR_MEMORY [768m]  CHANGELAKE_APP_CORES [1]   what the Thrift server takes:
#                                           one executor of 1 core, so an ingest app (config/cluster.yml
#                                           asks the same) still fits on the worker beside it
#   CHANGELAKE_THRIFT_DRIVER_MEMORY [1g]
#   CHANGELAKE_CODEGEN_CACHE [4000]         compiled query classes the server keeps (Spark's default,
#                                           100, is less than a build compiles: each build compiled
#                                           them again, a fifth of the server's CPU in a small one)
#   CHANGELAKE_ENGINE_WARMUP_ROUNDS [1]     after starting a Thrift server, `up` runs a build's
#                                           statement shapes on scratch tables this many times
#                                           (scripts/engine_warmup.py) so the first dbt build finds a
#                                           warm JIT; 0 skips it
set -euo pipefail
cd "$(dirname "$0")/.."

STATE="${CHANGELAKE_STATE:-$PWD/.changelake}/cluster"
WAREHOUSE="${CHANGELAKE_WAREHOUSE:-$PWD/warehouse}"
if [ -n "${CHANGELAKE_PYTHON:-}" ]; then PY="$CHANGELAKE_PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY="$(command -v python3)"; fi
HOST="${CHANGELAKE_SPARK_HOST:-127.0.0.1}"
MASTER_PORT="${CHANGELAKE_MASTER_PORT:-7077}"
MASTER_UI_PORT="${CHANGELAKE_MASTER_UI_PORT:-8980}"
WORKER_UI_PORT="${CHANGELAKE_WORKER_UI_PORT:-8981}"
THRIFT_PORT="${CHANGELAKE_THRIFT_PORT:-10000}"
THRIFT_UI_PORT="${CHANGELAKE_THRIFT_UI_PORT:-4050}"
WORKER_CORES="${CHANGELAKE_WORKER_CORES:-2}"
WORKER_MEMORY="${CHANGELAKE_WORKER_MEMORY:-2g}"
EXECUTOR_MEMORY="${CHANGELAKE_EXECUTOR_MEMORY:-768m}"
APP_CORES="${CHANGELAKE_APP_CORES:-1}"
THRIFT_DRIVER_MEMORY="${CHANGELAKE_THRIFT_DRIVER_MEMORY:-1g}"
CODEGEN_CACHE="${CHANGELAKE_CODEGEN_CACHE:-4000}"
LOCAL="${CHANGELAKE_SPARK_LOCAL:-0}"
LOCAL_CORES="${CHANGELAKE_LOCAL_CORES:-2}"
LOCAL_MEMORY="${CHANGELAKE_LOCAL_MEMORY:-2g}"
MASTER_URL="spark://$HOST:$MASTER_PORT"
MASTER_UI="http://$HOST:$MASTER_UI_PORT"
# Seconds to wait for each daemon to be ready (a cold JVM on a busy 2-core machine is slow).
READY_TIMEOUT_S="${CHANGELAKE_CLUSTER_TIMEOUT:-180}"
STOP_TIMEOUT_S=30

# The class each PID file's process must be running (guards against a recycled PID).
declare -A CLASS=(
  [master]=org.apache.spark.deploy.master.Master
  [worker]=org.apache.spark.deploy.worker.Worker
  [thrift]=org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
)

say() { echo "cluster.sh: $*" >&2; }
die() { say "$*"; exit 1; }

spark_home() {
  "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null \
    || die "no pyspark in $PY (set CHANGELAKE_PYTHON, or run make setup)"
}

pid_of() {  # the live PID of daemon $1, or nothing
  local f="$STATE/$1.pid" pid cmdline tries=0
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  # While a process execs (setsid -> env -> spark-submit -> spark-class -> java), /proc/PID/cmdline
  # reads empty for a moment: read again rather than call a starting daemon gone. A zombie's stays
  # empty; it is gone.
  while kill -0 "$pid" 2>/dev/null; do
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 0
    if [ -n "$cmdline" ]; then
      if [[ "$cmdline" == *"${CLASS[$1]}"* ]]; then echo "$pid"; fi
      return 0
    fi
    [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" != Z ] || return 0
    (( ++tries < 100 )) || return 0
    sleep 0.01
  done
}

start_daemon() {  # name, command...: start in a new session, record the PID
  local name="$1"; shift
  # setsid and env exec (setsid does not fork: a background child of a script is not a group
  # leader), and spark-class and spark-submit exec java, so $! is the JVM's PID and the leader of
  # its own process group.
  # Descriptors the caller holds open beyond stdio (a `flock` lock, a pipe) are closed first: a
  # daemon that kept them would hold the caller's lock, or its pipe, for as long as it runs.
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid "$@"
  ) >"$STATE/$name.log" 2>&1 </dev/null &
  local pid=$! tries=0
  echo "$pid" >"$STATE/$name.pid"
  # Until the forked shell has exec'd, the PID's command line is this script's: wait for the class.
  until [ -n "$(pid_of "$name")" ]; do
    kill -0 "$pid" 2>/dev/null || { tail -n 40 "$STATE/$name.log" >&2; die "$name exited at once; log: $STATE/$name.log"; }
    (( ++tries < 100 )) || die "$name (pid $pid) never started ${CLASS[$name]}"
    sleep 0.1
  done
}

exit_status() {  # how daemon $1, started by this invocation, ended: "exit status N" or "killed by SIGNAME"
  local pid rc=0
  pid="$(cat "$STATE/$1.pid" 2>/dev/null)" || { echo "no PID file"; return 0; }
  wait "$pid" 2>/dev/null || rc=$?
  # 127: not a child of this shell (another invocation started it), so its status is not known here.
  if (( rc == 127 )); then echo "its exit status is not known here"
  elif (( rc > 128 && rc < 160 )); then echo "killed by SIG$(kill -l $((rc - 128)))"
  else echo "exit status $rc"; fi
}

wait_for() {  # name, description, probe command...: poll until the probe succeeds
  local name="$1" what="$2" t0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ -z "$(pid_of "$name")" ]; then
      tail -n 40 "$STATE/$name.log" >&2 || true
      die "$name exited before $what ($(exit_status "$name")); log: $STATE/$name.log"
    fi
    if (( SECONDS - t0 > READY_TIMEOUT_S )); then
      tail -n 40 "$STATE/$name.log" >&2 || true
      die "$name: no $what after ${READY_TIMEOUT_S}s; log: $STATE/$name.log"
    fi
    sleep 0.5
  done
}

master_alive() { curl -sf "$MASTER_UI/json/" | grep -q '"status" *: *"ALIVE"'; }
worker_registered() { curl -sf "$MASTER_UI/json/" | grep -Eq '"aliveworkers" *: *[1-9]'; }
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

check_warehouse() {  # a running cluster serves one warehouse; refuse to silently use another
  [ -f "$STATE/warehouse" ] || return 0
  local running; running="$(cat "$STATE/warehouse")"
  [ "$running" = "$WAREHOUSE" ] \
    || die "the cluster in $STATE serves warehouse $running, not $WAREHOUSE; run 'scripts/cluster.sh down' first"
}

up() {
  mkdir -p "$STATE"
  case "$WAREHOUSE" in /*) ;; *) WAREHOUSE="$PWD/$WAREHOUSE" ;; esac
  if [ -n "$(pid_of thrift)" ]; then check_warehouse; fi
  local sh; sh="$(spark_home)"
  ls "$sh"/jars/delta-spark_*.jar >/dev/null 2>&1 \
    || die "no Delta jars in $sh/jars; run: bash scripts/delta_jars.sh $PY"
  export SPARK_HOME="$sh" SPARK_LOCAL_IP="$HOST"
  # The launcher sizes Master, Worker and HiveThriftServer2 by SPARK_DAEMON_MEMORY (over
  # --driver-memory), so each daemon gets its own value.
  local daemon_memory="${SPARK_DAEMON_MEMORY:-256m}"
  export SPARK_LOCAL_DIRS="$STATE/local" SPARK_PID_DIR="$STATE"
  export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PY}"
  mkdir -p "$STATE/local" "$STATE/work" "$WAREHOUSE/_metastore"
  local t0=$SECONDS
  if [ "$LOCAL" = 1 ]; then
    if [ -n "$(pid_of master)" ]; then die "a standalone cluster runs in $STATE; run 'scripts/cluster.sh down' first"; fi
    up_local
    return
  fi
  if [ -n "$(pid_of thrift)" ] && [ -z "$(pid_of master)" ]; then
    die "the warm engine (local Spark) runs in $STATE; run 'scripts/cluster.sh down' first"
  fi

  if [ -z "$(pid_of master)" ]; then
    start_daemon master env SPARK_DAEMON_MEMORY="$daemon_memory" "$sh/bin/spark-class" org.apache.spark.deploy.master.Master \
      --host "$HOST" --port "$MASTER_PORT" --webui-port "$MASTER_UI_PORT"
  fi
  wait_for master "web UI at $MASTER_UI" master_alive

  if [ -z "$(pid_of worker)" ]; then
    start_daemon worker env SPARK_DAEMON_MEMORY="$daemon_memory" "$sh/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host "$HOST" --cores "$WORKER_CORES" --memory "$WORKER_MEMORY" --webui-port "$WORKER_UI_PORT" \
      --work-dir "$STATE/work" "$MASTER_URL"
  fi
  wait_for worker "registration with the master" worker_registered
  say "master $MASTER_URL and worker ready ($((SECONDS - t0)) s)"

  start_thrift "$sh" "$THRIFT_DRIVER_MEMORY" --master "$MASTER_URL" --name changelake-thrift \
    --executor-memory "$EXECUTOR_MEMORY" --conf spark.cores.max="$APP_CORES" \
    --conf spark.sql.shuffle.partitions=2 --conf spark.databricks.delta.snapshotPartitions=2 \
    --conf spark.sql.sources.parallelPartitionDiscovery.parallelism=2 \
    --conf spark.driver.extraJavaOptions="-Dderby.system.home=$WAREHOUSE/_metastore ${CHANGELAKE_JVM_OPTS:-}" \
    --conf spark.executor.extraJavaOptions="${CHANGELAKE_JVM_OPTS:-}"
  wait_for thrift "HiveServer2 on port $THRIFT_PORT" port_open "$THRIFT_PORT"
  warm_up
  say "thrift server ready on $HOST:$THRIFT_PORT, warehouse $WAREHOUSE ($((SECONDS - t0)) s in all)"
}

up_local() {  # the warm engine: the Thrift server on a local Spark, settings as profiles.yml's local target
  local sh t0=$SECONDS; sh="$(spark_home)"
  start_thrift "$sh" "$LOCAL_MEMORY" --master "local[$LOCAL_CORES]" --name changelake-engine \
    --conf spark.sql.shuffle.partitions="$LOCAL_CORES" --conf spark.databricks.delta.snapshotPartitions="$LOCAL_CORES" \
    --conf spark.sql.sources.parallelPartitionDiscovery.parallelism="$LOCAL_CORES" \
    --conf spark.driver.extraJavaOptions="-Dderby.system.home=$WAREHOUSE/_metastore -Dlog4j2.configurationFile=file:$PWD/dbt_log4j2.properties ${CHANGELAKE_JVM_OPTS:-}"
  wait_for thrift "HiveServer2 on port $THRIFT_PORT" port_open "$THRIFT_PORT"
  warm_up
  say "warm engine (local[$LOCAL_CORES]) ready on $HOST:$THRIFT_PORT, warehouse $WAREHOUSE ($((SECONDS - t0)) s)"
}

# A fresh JVM interprets Spark's planner, Delta's log replay and commit path and the metastore client
# until the JIT compiles them: the first build on a new server ran its first nodes 3-10x slower than
# on a warm one. A server this invocation started runs those statement shapes first, on scratch
# tables of its own (nothing of the warehouse is read or written), then reports ready.
STARTED_THRIFT=0
warm_up() {
  local rounds="${CHANGELAKE_ENGINE_WARMUP_ROUNDS:-1}" t0=$SECONDS
  [ "$STARTED_THRIFT" = 1 ] && [ "$rounds" -gt 0 ] || return 0
  "$PY" scripts/engine_warmup.py "$HOST" "$THRIFT_PORT" "$STATE/warmup" "$rounds" >"$STATE/warmup.log" 2>&1 \
    || die "the Thrift server started but its warm-up failed (a Delta statement failed on it): $(tail -n 3 "$STATE/warmup.log")"
  say "warmed up in $((SECONDS - t0)) s (CHANGELAKE_ENGINE_WARMUP_ROUNDS=$rounds)"
}

start_thrift() {  # spark home, driver memory, then the master and its own settings: the Thrift server with Delta
  local sh="$1" memory="$2"; shift 2
  [ -z "$(pid_of thrift)" ] || return 0
  STARTED_THRIFT=1
  echo "$WAREHOUSE" >"$STATE/warehouse"
  start_daemon thrift env SPARK_DAEMON_MEMORY="$memory" "$sh/bin/spark-submit" \
    --class org.apache.spark.sql.hive.thriftserver.HiveThriftServer2 \
    --driver-memory "$memory" \
    "$@" \
    --conf spark.driver.host="$HOST" \
    --conf spark.driver.bindAddress="$HOST" \
    --conf spark.ui.port="$THRIFT_UI_PORT" \
    --conf spark.ui.showConsoleProgress=false \
    --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
    --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
    --conf spark.sql.session.timeZone=UTC \
    --conf spark.sql.codegen.cache.maxEntries="$CODEGEN_CACHE" \
    --conf spark.sql.warehouse.dir="$WAREHOUSE/dbt" \
    --conf "spark.hadoop.javax.jdo.option.ConnectionURL=jdbc:derby:;databaseName=$WAREHOUSE/_metastore/metastore_db;create=true" \
    spark-internal \
    --hiveconf hive.server2.thrift.bind.host="$HOST" \
    --hiveconf hive.server2.thrift.port="$THRIFT_PORT"
}

stop_one() {
  local name="$1" pid t0=$SECONDS
  pid="$(pid_of "$name")"
  rm -f "$STATE/$name.pid"
  [ -n "$pid" ] || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if (( SECONDS - t0 > STOP_TIMEOUT_S )); then
      say "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT_S}s; sending SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.2
  done
  # Anything left in its process group (an executor the worker spawned) goes too.
  if pgrep -g "$pid" >/dev/null 2>&1; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
  say "$name stopped"
}

down() {
  [ -d "$STATE" ] || return 0
  stop_one thrift
  stop_one worker
  stop_one master
  rm -f "$STATE/warehouse"
}

status() {
  local name pid rc=0
  for name in master worker thrift; do
    pid="$(pid_of "$name")"
    if [ -n "$pid" ]; then echo "$name: running (pid $pid)"; else echo "$name: stopped"; rc=3; fi
  done
  [ -f "$STATE/warehouse" ] && echo "warehouse: $(cat "$STATE/warehouse")"
  echo "master: $MASTER_URL (UI $MASTER_UI)"
  echo "thrift: $HOST:$THRIFT_PORT (driver UI http://$HOST:$THRIFT_UI_PORT)"
  echo "logs: $STATE"
  return $rc
}

print_env() {
  echo "export CHANGELAKE_SPARK_MASTER=$MASTER_URL"
  echo "export CHANGELAKE_SPARK_HOST=$HOST"
  echo "export CHANGELAKE_THRIFT_PORT=$THRIFT_PORT"
  echo "export CHANGELAKE_WAREHOUSE=$WAREHOUSE"
}

serves() {  # exit 0 when a Thrift server (cluster or warm engine) runs for $CHANGELAKE_WAREHOUSE
  case "$WAREHOUSE" in /*) ;; *) WAREHOUSE="$PWD/$WAREHOUSE" ;; esac
  [ -n "$(pid_of thrift)" ] && [ -f "$STATE/warehouse" ] && [ "$(cat "$STATE/warehouse")" = "$WAREHOUSE" ] \
    && port_open "$THRIFT_PORT"
}

case "${1:-}" in
  up) up ;;
  serves) serves ;;
  down) down ;;
  status) status ;;
  env) print_env ;;
  *) echo "usage: $0 up|down|status|env|serves" >&2; exit 2 ;;
esac
