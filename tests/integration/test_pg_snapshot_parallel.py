"""Snapshots side by side: tables in parallel and a large table cut into key ranges, each its own writer.

Every page is committed while every writer row still sits below its watermark (the safe bound
never passes a page not yet in bronze), each key is read exactly once, and the ranges of a split
table are contiguous.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.events import SnapshotPage
from ingest.positions import SourcePositions
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration


def test_tables_and_key_ranges_are_snapshotted_side_by_side(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_source(
        "create table big (k1 int, k2 text, v text, primary key (k1, k2));"
        "create table a (id int primary key, v text);"
        "create table b (id int primary key, v text)",
        ["big", "a", "b"],
    )
    s.execute("insert into big select g / 3, 'k' || (g % 3), 'v' || g from generate_series(0, 2999) g")
    s.execute("insert into a select g, 'a' || g from generate_series(1, 400) g")
    s.execute("insert into b select g, 'b' || g from generate_series(1, 400) g")
    s.execute("analyze big")
    prepare(s.config())

    late: list[str] = []
    active: set[int] = set()
    most = [0]
    lock = threading.Lock()
    real = BronzeWriter.append_page

    def checked(self: BronzeWriter, source: str, kind: str, writer_id: str, page: SnapshotPage) -> None:
        with lock:
            active.add(threading.get_ident())
            most[0] = max(most[0], len(active))
        bound = SourcePositions.read(self, source).safe_bound
        if bound is not None and bound >= page.high_watermark_lsn:
            late.append(f"{page.table_name} page {page.page_number}: safe bound {bound} >= {page.high_watermark_lsn}")
        try:
            real(self, source, kind, writer_id, page)
        finally:
            with lock:
                active.discard(threading.get_ident())

    monkeypatch.setattr(BronzeWriter, "append_page", checked)
    config = s.config(snapshot={"max_parallel": 3, "split_rows": 1000})
    capture_once(warehouse, config, snapshots=True, page_rows=100)

    assert late == []
    assert most[0] >= 2, "pages of different snapshots are committed side by side"
    rows = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and record_pk is not null")
    for table, n in [("a", 400), ("b", 400)]:
        assert sorted(json.loads(r.record_pk)["id"] for r in rows if r.table_name == table) == list(range(1, n + 1))
    big = [r for r in rows if r.table_name == "big"]
    keys = sorted((json.loads(r.record_pk)["k1"], json.loads(r.record_pk)["k2"]) for r in big)
    assert keys == sorted((g // 3, f"k{g % 3}") for g in range(3000))
    ranges: dict[str, list[tuple[int, str]]] = {}
    for r in big:
        ranges.setdefault(r.snapshot_id, []).append((json.loads(r.record_pk)["k1"], json.loads(r.record_pk)["k2"]))
    assert len(ranges) == 3, "the large table is cut into max_parallel key ranges"
    spans = sorted((min(v), max(v)) for v in ranges.values())
    assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:], strict=False))
    # Each range ends with its own last page; every snapshot writer retired.
    last = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and last_page and table_name = 'big'")
    assert len({r.snapshot_id for r in last}) == 3
    # Every range's pages carry the first range's whole-table snapshot, taken before any page of them.
    parent = min(ranges, key=lambda sid: min(ranges[sid]))
    every_page = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and table_name = 'big'")
    assert {json.dumps(r.table_snapshot, sort_keys=True) for r in every_page} == {
        json.dumps(every_page[0].table_snapshot, sort_keys=True)
    }
    whole = every_page[0].table_snapshot
    assert whole["id"] == parent and whole["parts"] == len({r.snapshot_id for r in every_page}) == 3
    assert all(whole["xmax"] <= r.snapshot_xmax for r in every_page)
    for r in rows:
        if r.table_name != "big":
            assert (r.table_snapshot["id"], r.table_snapshot["parts"]) == (r.snapshot_id, 1)
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]
