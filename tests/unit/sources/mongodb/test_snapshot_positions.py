"""MongoDB snapshot pages never land at or below what silver may have folded (review finding W5).

A scripted server answers the snapshot's reads the way MongoDB does (`cursor.atClusterTime`); the
bronze tables are real delta-rs tables. On an idle replica set every page comes back at the same
cluster time, which is the safe bound the snapshot registered at: silver may already have folded
events at that position, and it takes a page at or below its folded maximum as placed before.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bson.timestamp import Timestamp

import ingest.sources.mongodb.snapshot as snapshot_module
from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.config import MongoSource
from ingest.events import SourceKind, WriterKind, WriterPosition
from ingest.positions import STREAM_WRITER_ID, SourcePositions
from ingest.sources.mongodb.changes import pack_cluster_time
from ingest.sources.mongodb.snapshot import MongoSnapshotter

T0 = 1_795_000_000
IDLE = Timestamp(T0, 5)  # the cluster time of the last write; the stream's position is there too


class ScriptedServer:
    """`client[db].command("find", ...)` answers from `times` (one atClusterTime per read)."""

    def __init__(self, docs: list[dict[str, Any]], times: list[Timestamp] | None) -> None:
        self.docs, self.times, self.reads = docs, times, 0

    def __getitem__(self, name: str) -> Any:
        return self

    def command(self, name: str, coll: str, **kw: Any) -> dict[str, Any]:
        assert name == "find"
        after = kw["filter"].get("_id", {}).get("$gt", -1)
        page = [d for d in self.docs if d["_id"] > after][: kw["limit"]]
        self.reads += 1
        if self.times is None:  # like mongo-java-server: `readConcern: snapshot` ignored, no atClusterTime
            return {"cursor": {"firstBatch": page, "id": 0}}
        at = self.times[min(self.reads - 1, len(self.times) - 1)]
        return {"cursor": {"firstBatch": page, "id": 0, "atClusterTime": at}}

    def find_one(self, query: Any, projection: Any, sort: list[tuple[str, int]]) -> dict[str, Any]:
        return min(self.docs, key=lambda d: d["_id"] * sort[0][1])


def _snapshot(tmp_path: Path, times: list[Timestamp] | None) -> tuple[BronzeWriter, MongoSnapshotter, list[int]]:
    src = MongoSource(kind="mongodb", name="m", uri="mongodb://h", database="shop", snapshot_page_size=2)
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    idle = pack_cluster_time(IDLE)
    # the stream writer: durable at the idle cluster time, so the safe bound is there
    writer.raise_position(WriterPosition("m", STREAM_WRITER_ID, WriterKind.STREAM, idle, idle), datetime.now(UTC))
    server = ScriptedServer([{"_id": i, "v": i} for i in range(5)], times)
    snap = MongoSnapshotter(src, server, writer, "orders")  # type: ignore[arg-type]
    bounds: list[int] = []
    append_page = writer.append_page

    def watch(source: str, kind: SourceKind, writer_id: str, page: Any) -> None:
        # Before the page is durable, the safe bound must lie below its position: else a dbt run
        # now could fold up to the page's position without it.
        bound = SourcePositions.read(writer, "m").safe_bound
        assert bound is not None and bound < page.high_watermark_lsn, (page.page_number, bound)
        bounds.append(bound)
        append_page(source, kind, writer_id, page)

    writer.append_page = watch  # type: ignore[method-assign]
    return writer, snap, bounds


def test_pages_on_an_idle_source_lie_above_the_safe_bound_until_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_module, "TIE_POLL_S", 0.0)
    # the first two reads come back at the idle time (= the registered position); then a periodic
    # no-op write moves the cluster time one tick, and it stays there for every later page
    moved = Timestamp(T0, 6)
    writer, snap, bounds = _snapshot(tmp_path, [IDLE, IDLE, moved])
    assert snap.run(lambda: False) is True
    pages = writer.tables.query(
        "select page_number, max(high_watermark_lsn) as w from t group by page_number order by page_number",
        t=writer.path(SNAPSHOT_PAGES_TABLE),
    ).to_pylist()
    assert [p["w"] for p in pages] == [pack_cluster_time(moved)] * 3  # 5 rows, 2 per page
    assert bounds == [pack_cluster_time(IDLE)] + [pack_cluster_time(moved) - 1] * 2
    assert SourcePositions.read(writer, "m").writer(snap.writer_id) is None  # removed at the end


def test_a_cluster_time_that_never_moves_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_module, "TIE_POLL_S", 0.0)
    monkeypatch.setattr(snapshot_module, "TIE_WAIT_S", 0.05)
    _, snap, bounds = _snapshot(tmp_path, [IDLE])
    with pytest.raises(snapshot_module.SourceError, match=r"cluster time stayed at .*periodicNoopIntervalSecs"):
        snap.run(lambda: False)
    assert bounds == []  # nothing was appended


class WallClock:
    """`time` for the snapshot module: a wall clock that moves only when slept or read."""

    def __init__(self, start: float, step: float) -> None:
        self.now, self.step, self.reads_at = start, step, list[float]()

    def time(self) -> float:
        self.reads_at.append(self.now)
        self.now += self.step
        return self.reads_at[-1]

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_server_without_snapshot_times_places_pages_between_earlier_and_later_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mongo-java-server returns no atClusterTime and never moves its cluster time while idle; it
    # stamps a write (wall-clock second, global counter). The last write was IDLE = (T0, 5) and the
    # reads begin in that same second, so the next write, whenever it comes after a read, is
    # stamped (that read's second, 6): each page must lie above the row and below that write.
    clock = WallClock(T0 + 0.3, 0.25)
    monkeypatch.setattr(snapshot_module, "time", clock)
    monkeypatch.setattr(snapshot_module, "cluster_time", lambda client: IDLE)
    writer, snap, bounds = _snapshot(tmp_path, None)
    assert snap.run(lambda: False) is True
    pages = writer.tables.query(
        "select page_number, max(high_watermark_lsn) as w from t group by page_number order by page_number",
        t=writer.path(SNAPSHOT_PAGES_TABLE),
    ).to_pylist()
    assert len(pages) == 3 and bounds[0] == pack_cluster_time(IDLE)
    last_read = clock.reads_at[-1]
    next_write = pack_cluster_time(Timestamp(int(last_read), IDLE.inc + 1))
    assert all(bound < p["w"] < next_write for bound, p in zip(bounds, pages, strict=True)), (bounds, pages)
    assert int(clock.reads_at[0]) == T0 < int(last_read)  # the first read, in the idle second, was read again
