"""`verify` on real PostgreSQL and bronze when it cannot compare (docs/verify.md), without dbt.

Silver here is consumer_records as dbt would fold the initial snapshot (one live record per page
row, at its watermark), written with delta-rs: enough for the refusals, which never reach a
comparison of changed rows. tests/integration/test_verify.py runs the real dbt.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from ingest.bronze.writer import BronzeWriter
from ingest.sources.postgres.verify import verify_tables
from ingest.verify import Status, silver_path
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

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
    only_keyed = s.config().model_copy(update={"tables": [keyed]})
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
