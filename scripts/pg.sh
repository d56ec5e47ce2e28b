#!/usr/bin/env bash
# Project-owned PostgreSQL with wal_level=logical: install (Debian packages) if missing, init, start.
# Idempotent: a second call reuses the running cluster. Prints nothing but errors unless VERBOSE=1.
# Usage: scripts/pg.sh start|stop|dsn|status
# CHANGELAKE_PG_BINDIR runs another major's server (scripts/pg_versions.sh bindir MAJOR); psql is
# always Debian's, which speaks to every major.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE_DIR="${CHANGELAKE_STATE:-$PWD/.changelake}"
PGDATA_DIR="$STATE_DIR/pgdata"
PGPORT="${CHANGELAKE_PG_PORT:-54329}"
PGUSER_NAME=changelake
DSN="postgresql://$PGUSER_NAME@127.0.0.1:$PGPORT/changelake"

log() { [ "${VERBOSE:-0}" = 1 ] && echo "pg.sh: $*" >&2 || true; }

find_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/postgres" ] && { echo "$d"; return 0; }
  done
  return 1
}

server_bindir() { if [ -n "${CHANGELAKE_PG_BINDIR:-}" ]; then echo "$CHANGELAKE_PG_BINDIR"; else find_bindir; fi; }

install_pg() {
  if find_bindir >/dev/null; then return 0; fi
  echo "pg.sh: installing PostgreSQL from Debian packages (first run only)..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq postgresql postgresql-contrib >/dev/null
  # the Debian package starts its own default cluster; we do not use it
  find_bindir >/dev/null || { echo "pg.sh: PostgreSQL install failed" >&2; exit 1; }
}

as_pg() {
  # initdb/postgres refuse to run as root: run them as the 'postgres' OS user then.
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
  install_pg
  local bin psql; bin="$(server_bindir)"; psql="$(find_bindir)/psql"
  mkdir -p "$STATE_DIR"
  if [ "$(id -u)" = 0 ]; then chown postgres "$STATE_DIR"; chmod 755 "$STATE_DIR"; fi
  if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
    log "initdb $PGDATA_DIR"
    as_pg "$bin/initdb" -D "$PGDATA_DIR" -U "$PGUSER_NAME" --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >> "$PGDATA_DIR/postgresql.conf" <<CONF
# changelake: logical replication for ingest
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$PGDATA_DIR'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
max_connections = 200
max_slot_wal_keep_size = 10GB
shared_buffers = 256MB
fsync = on
logging_collector = off
CONF
    echo "host replication all 127.0.0.1/32 trust" >> "$PGDATA_DIR/pg_hba.conf"
  fi
  if as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
    log "already running on port $PGPORT"
  else
    as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" -l "$PGDATA_DIR/server.log" -w -t 60 start >/dev/null
  fi
  if ! "$psql" "postgresql://$PGUSER_NAME@127.0.0.1:$PGPORT/postgres" -tAc \
      "select 1 from pg_database where datname='changelake'" | grep -q 1; then
    "$psql" -q "postgresql://$PGUSER_NAME@127.0.0.1:$PGPORT/postgres" -c "create database changelake"
  fi
}

case "${1:-start}" in
  start) start; echo "$DSN" ;;
  stop) bin="$(server_bindir)"; as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" -m fast stop >/dev/null 2>&1 || true ;;
  dsn) echo "$DSN" ;;
  status) bin="$(server_bindir)"; as_pg "$bin/pg_ctl" -D "$PGDATA_DIR" status ;;
  *) echo "usage: $0 start|stop|dsn|status" >&2; exit 2 ;;
esac
