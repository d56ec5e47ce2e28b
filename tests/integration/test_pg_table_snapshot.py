"""`snapshot_pages.table_snapshot` is NULL wherever the pages do not read the whole table as one snapshot.

dbt tombstones a key live in silver that a completed whole-table snapshot did not find: a page
that carries the struct says "my snapshot read every row of the table below its bound". A re-read
by key, a snapshot resumed from a writer row of an older ingest (whose earlier pages carry
nothing) and a snapshot that restarted its reading in another order (its key changed) must not
say so; a keyless table read by CTID does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.errors import SourceUnavailableError
from ingest.events import WriterKind, WriterPosition
from ingest.positions import snapshot_writer_id
from ingest.sources.postgres.pages import PageReader
from ingest.sources.postgres.snapshot import Snapshotter
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration


def page_rows(warehouse: Path, source: str) -> list[Any]:
    return read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}'", "high_watermark_lsn, row_index")


def thirty_rows(warehouse: Path, make_source: Any) -> tuple[Any, Any, BronzeWriter]:
    """A keyed table of 30 rows with no initial snapshot, its source config and bronze."""
    s = make_source("create table t (id int primary key, v text)", ["t"])
    s.execute("insert into t select g, 'v' || g from generate_series(1, 30) g")
    src = s.config(snapshot={"initial": False})
    prepare(src)
    writer = BronzeWriter(warehouse)
    writer.ensure_tables()
    return s, src, writer


def test_a_reread_by_key_carries_no_table_snapshot(warehouse: Path, make_source: Any) -> None:
    s, src, writer = thirty_rows(warehouse, make_source)
    reader = PageReader(src)
    try:
        Snapshotter(src, writer).request([s.tables[0]], reader.current_lsn, keys=[(("3",), ("7",))])
    finally:
        reader.close()
    capture_once(warehouse, src, snapshots=True)

    rows = [r for r in page_rows(warehouse, s.name) if r.record_pk is not None]
    assert sorted(json.loads(r.record_pk)["id"] for r in rows) == [3, 7]
    assert all(r.table_snapshot is None and r.snapshot_xmax is not None for r in rows)


def test_a_snapshot_resumed_from_an_older_ingests_writer_row_carries_none(warehouse: Path, make_source: Any) -> None:
    s, src, writer = thirty_rows(warehouse, make_source)
    lsn = s.current_wal()
    # The progress record an older ingest wrote: no `whole`, no `table_snapshot`.
    token = {"table": s.tables[0], "snapshot_id": "old", "pages": 0, "rows": 0, "estimated_rows": None}
    old = WriterPosition(s.name, snapshot_writer_id("old"), WriterKind.SNAPSHOT, lsn, lsn, json.dumps(token))
    writer.raise_positions([(old, datetime.now(UTC))])
    capture_once(warehouse, src, snapshots=True, page_rows=10)

    rows = page_rows(warehouse, s.name)
    assert {r.snapshot_id for r in rows} == {"old"} and len([r for r in rows if r.record_pk]) == 30
    assert all(r.table_snapshot is None for r in rows)


def test_a_snapshot_that_restarts_because_its_table_gained_a_key_carries_none_after(
    warehouse: Path, make_source: Any
) -> None:
    s = make_source("create table t (a int not null, b text); alter table t replica identity full", ["t"])
    s.execute("insert into t select g, 'v' || g from generate_series(1, 300) g")
    src = s.config(snapshot={"max_parallel": 1})
    prepare(src)

    def crash(point: str, task: Any, page: int) -> None:
        if point == "before_read" and page == 2:
            raise SourceUnavailableError("stopped before page 2")

    with pytest.raises(SourceUnavailableError, match="stopped before page 2"):
        capture_once(warehouse, src, snapshots=True, page_rows=50, snapshot_hook=crash)
    before = page_rows(warehouse, s.name)
    assert {r.page_number for r in before} == {0, 1}
    assert all(r.table_snapshot is not None and r.table_snapshot["id"] == r.snapshot_id for r in before), "by CTID"

    s.execute("alter table t add primary key (a)")
    capture_once(warehouse, src, snapshots=True, page_rows=50)

    after = [r for r in page_rows(warehouse, s.name) if r.page_number >= 2]
    assert {r.snapshot_id for r in after} == {before[0].snapshot_id}, "the same snapshot, read again by key"
    assert sorted(json.loads(r.record_pk)["a"] for r in after if r.record_pk) == list(range(1, 301))
    assert any(r.last_page for r in after) and all(r.table_snapshot is None for r in after)
