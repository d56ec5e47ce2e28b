"""Postgres test helpers: throwaway sources, in-process capture, bronze reads."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path
from typing import Any

import psycopg

from ingest.events import lsn_to_int
from tests.helpers.delta_rows import read

ROOT = Path(__file__).resolve().parents[2]
# One change of the `test_decoding` output plugin: the independent oracle of the crash tests.
TD_LINE = re.compile(r"^table (?P<table>[^:]+): (?P<action>INSERT|UPDATE|DELETE|TRUNCATE):(?P<rest>.*)$")


class PgSource:
    """A throwaway schema with its own publication and slot; dropped at teardown."""

    def __init__(self, dsn: str, tables_sql: str, table_names: list[str]) -> None:
        self.dsn = dsn
        self.suffix = secrets.token_hex(4)
        self.schema = f"t_{self.suffix}"
        self.name = f"src_{self.suffix}"
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(f"create schema {self.schema}")
        self.conn.execute(f"set search_path = {self.schema}")
        self.conn.execute(tables_sql)
        self.tables = [f"{self.schema}.{t}" for t in table_names]

    def config(self, **extra: Any) -> Any:
        from ingest.config import PostgresSource

        return PostgresSource(kind="postgres", name=self.name, dsn=self.dsn, tables=self.tables, **extra)

    def execute(self, sql: str, params: Any = None) -> None:
        self.conn.execute(sql, params)

    def reconnect(self) -> None:
        """A new session after the server restarted (a restore, a promotion), on the same schema."""
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(f"set search_path = {self.schema}")

    def current_wal(self) -> int:
        """The server's current WAL position."""
        row = self.conn.execute("select pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return lsn_to_int(str(row[0]))

    def drop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            for slot in c.execute(
                "select slot_name from pg_replication_slots where slot_name like %s", (f"%{self.suffix}%",)
            ).fetchall():
                drop_slot(c, slot[0])
            c.execute(f"drop publication if exists changelake_{self.name}")
            c.execute(f"drop schema if exists {self.schema} cascade")
        self.conn.close()


def drop_slot(conn: Any, slot: str) -> None:
    """Drop a replication slot, ending the walsender that holds it first.

    pg_terminate_backend only signals the walsender: the slot stays active until it has exited, so
    the drop is retried (it raced the exit in a fresh-clone CI run: "slot ... is active for PID").
    """
    deadline = time.monotonic() + 30
    while True:
        conn.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots "
            "where slot_name = %s and active_pid is not null",
            (slot,),
        )
        try:
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def confirmed_flush(dsn: str, slot: str) -> int:
    """The slot's confirmed_flush_lsn as an integer."""
    with psycopg.connect(dsn) as c:
        row = c.execute(
            "select confirmed_flush_lsn - '0/0'::pg_lsn from pg_replication_slots where slot_name = %s", (slot,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def capture_once(warehouse: Path, src: Any, max_events: int = 200_000, snapshots: bool = False, **kw: Any) -> Any:
    """Run the stream writer in this process with `--once` semantics; returns the capture.

    Snapshots are off unless asked for: most tests look at the stream alone.
    """
    from ingest.bronze.writer import BronzeWriter
    from ingest.config import BatchConfig
    from ingest.progress import Progress
    from ingest.sources.postgres.capture import PostgresCapture

    cap = PostgresCapture(
        src,
        BatchConfig(max_events=max_events, max_seconds=5),
        BronzeWriter(warehouse),
        Progress(src.name, enabled=False),
        snapshots=snapshots,
        **kw,
    )
    cap.run(once=True, should_stop=lambda: False)
    return cap


def prepare(src: Any) -> None:
    """Create the publication and slot of `src` (what `changelake-ingest setup` does)."""
    from ingest.sources.postgres.admin import prepare_source

    prepare_source(src).close()


def bronze_events(warehouse: Path, source: str, with_messages: bool = False) -> list[Any]:
    """The source's bronze.wal_events rows in position order."""
    where = f"source = '{source}'" + ("" if with_messages else " and action != 'message'")
    return read(warehouse / "bronze" / "wal_events", where, "commit_lsn, commit_index")


def bronze_count(warehouse: Path, source: str) -> int:
    """How many events of `source` bronze holds so far; 0 while ingest has not created the table yet."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return len(bronze_events(warehouse, source))
    except TableNotFoundError:
        return 0
