"""`verify` on real PostgreSQL and bronze when it cannot compare (docs/verify.md), without dbt.

Silver here is consumer_records as dbt would fold the initial snapshot (one live record per page
row, at its watermark), written with delta-rs: enough for the refusals, which never reach a
comparison of changed rows. tests/integration/test_verify.py runs the real dbt.
"""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from psycopg.conninfo import make_conninfo

from ingest.bronze.writer import BronzeWriter
from ingest.sources.postgres.verify import verify_tables
from ingest.verify import Status, silver_path
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare
from tests.integration.test_pg_encoding import DbSource

pytestmark = pytest.mark.integration


def fold_snapshot(warehouse: Path, source: str) -> None:
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}' and record_pk is not null")
    rows = [
        {
            "source": source,
            "table_schema": p.table_schema,
            "table_name": p.table_name,
            "record_pk": p.record_pk,
            "record": p.record,
            "deleted": False,
            "needs_reread": False,
            "commit_lsn": p.high_watermark_lsn,
        }
        for p in pages
    ]
    schema = pa.schema(
        [
            ("source", pa.string()),
            ("table_schema", pa.string()),
            ("table_name", pa.string()),
            ("record_pk", pa.string()),
            ("record", pa.string()),
            ("deleted", pa.bool_()),
            ("needs_reread", pa.bool_()),
            ("commit_lsn", pa.int64()),
        ]
    )
    write_deltalake(silver_path(BronzeWriter(warehouse)), pa.Table.from_pylist(rows, schema=schema))


class Ingesting:
    """`run --once` over and over in a thread: bronze keeps passing the source's position."""

    def __init__(self, warehouse: Path, src: Any) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, args=(warehouse, src))

    def _loop(self, warehouse: Path, src: Any) -> None:
        while not self.stop.is_set():
            capture_once(warehouse, src)
            self.stop.wait(0.3)

    def __enter__(self) -> Ingesting:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_verify_says_why_it_could_not_compare(warehouse: Path, make_source: Any) -> None:
    s = make_source(
        "create table keyed (id int primary key, v text); create table loose (v text);"
        "alter table loose replica identity full",
        ["keyed", "loose"],
    )
    keyed, loose = s.tables
    s.execute(f"insert into {keyed} select g, 'v' || g from generate_series(1, 50) g")
    src = s.config(snapshot={"initial": False})
    prepare(src)
    only_keyed = s.config().model_copy(update={"selectors": [keyed]})
    capture_once(warehouse, only_keyed, snapshots=True)
    writer = BronzeWriter(warehouse)

    # No silver yet.
    (r,) = verify_tables(only_keyed, writer, [keyed], 1, 1000, 10, False, "run-1")
    assert r.status is Status.NOT_VERIFIED and "no silver consumer_records" in (r.reason or "")

    fold_snapshot(warehouse, s.name)
    # Nobody ingests: bronze never passes the snapshot's position.
    (r,) = verify_tables(only_keyed, writer, [keyed], 1, 1000, 10, False, "run-2")
    assert r.status is Status.NOT_VERIFIED and "bronze has not reached" in (r.reason or "")

    with Ingesting(warehouse, only_keyed):
        # A table without a primary key cannot be read by key; the other table is still compared.
        a, b = verify_tables(src, writer, [keyed, loose], 30, 1000, 10, False, "run-3")
        assert (a.status, a.source_rows, a.silver_rows) == (Status.EQUAL, 50, 50), a
        assert b.status is Status.NOT_VERIFIED and "no primary key" in (b.reason or ""), b

        # A truncate after silver's position: silver cannot say what the table held at the snapshot.
        s.execute(f"truncate {keyed}")
        (r,) = verify_tables(only_keyed, writer, [keyed], 30, 1000, 10, False, "run-4")
        assert r.status is Status.NOT_VERIFIED and "truncated after silver's position" in (r.reason or ""), r


def fold_toast_updates(warehouse: Path, source: str) -> None:
    """Silver after the table's updates, as dbt's fold writes a record carrying an unchanged TOAST value.

    The fold concatenates the change's record with the carried values (macro record_change_step:
    a map_concat), so a carried key comes last, after the columns the change sent.
    """
    path = silver_path(BronzeWriter(warehouse))
    records = {r.record_pk: r.asDict() for r in read(path)}
    for e in read(warehouse / "bronze" / "wal_events", f"source = '{source}' and action = 'update'", "commit_lsn"):
        before = json.loads(records[e.record_pk]["record"])
        carried = "".join(f",{json.dumps(c)}:{json.dumps(before[c])}" for c in e.unchanged_toast)
        records[e.record_pk] |= {"record": e.record[:-1] + carried + "}", "commit_lsn": e.commit_lsn}
    table = pa.Table.from_pylist(list(records.values()), schema=pa.schema(DeltaTable(path).schema().to_arrow()))
    write_deltalake(path, table, mode="overwrite")


def test_carried_toast_values_in_silver_do_not_mismatch_every_range(warehouse: Path, make_source: Any) -> None:
    """Silver's record moves a carried-forward TOAST value's key to the end; the source encodes in table order.

    Every range of such a table mismatched on its checksum and was read a second time to bisect
    (past the bisection budget it would have been reported `mismatch` naming no key).
    """
    s = make_source("create table docs (id int primary key, body text, v int)", ["docs"])
    (table,) = s.tables
    s.execute(f"alter table {table} alter column body set storage external")  # stored out of line
    s.execute(f"insert into {table} select g, repeat(chr(65 + g % 26), 5000), 0 from generate_series(1, 40) g")
    src = s.config()
    prepare(src)
    capture_once(warehouse, src, snapshots=True)
    fold_snapshot(warehouse, s.name)
    s.execute(f"update {table} set v = v + 1")
    capture_once(warehouse, src)
    updates = read(warehouse / "bronze" / "wal_events", f"source = '{s.name}' and action = 'update'")
    assert len(updates) == 40 and {tuple(e.unchanged_toast) for e in updates} == {("body",)}
    fold_toast_updates(warehouse, s.name)
    with Ingesting(warehouse, src):
        (r,) = verify_tables(src, BronzeWriter(warehouse), [table], 30, 10, 10, False, "run-toast")
    assert (r.status, r.source_rows, r.silver_rows, r.skipped_keys) == (Status.EQUAL, 40, 40, 0), r
    assert (r.ranges, r.mismatched_ranges) == (4, 0), r


def test_verify_takes_non_utf8_values_as_the_source_does(warehouse: Path, pg_dsn: str) -> None:
    """verify ignored the source's `non_utf8` policy: a value ingest had captured as Latin-1 failed verify (exit 2)."""
    name = f"cl_sql_ascii_{secrets.token_hex(3)}"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"create database {name} encoding 'SQL_ASCII' template template0 lc_collate 'C' lc_ctype 'C'")
    s = DbSource(
        make_conninfo(pg_dsn, dbname=name, client_encoding="UTF8"),
        make_conninfo(pg_dsn, dbname=name),
        "create table names (id int primary key, name text)",
        ["names"],
    )
    try:
        (table,) = s.tables
        s.execute(f"insert into {table} values (1, convert_from('\\x4ae972f46d65'::bytea, 'SQL_ASCII')), (2, 'Anna')")
        src = s.config(non_utf8="latin1")
        prepare(src)
        capture_once(warehouse, src, snapshots=True)
        fold_snapshot(warehouse, s.name)
        with Ingesting(warehouse, src):
            (r,) = verify_tables(src, BronzeWriter(warehouse), [table], 30, 1000, 10, False, "run-latin1")
        assert (r.status, r.source_rows, r.silver_rows) == (Status.EQUAL, 2, 2), r
        silver = read(Path(silver_path(BronzeWriter(warehouse))), "record_pk = '{\"id\":1}'")
        assert [row.record for row in silver] == ['{"id":1,"name":"Jérôme"}']
    finally:
        s.drop()
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute(f"drop database if exists {name} with (force)")
