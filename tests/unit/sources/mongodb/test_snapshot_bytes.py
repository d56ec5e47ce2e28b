"""MongoDB snapshot pages are bounded by bytes as well as by documents (`snapshot_page_bytes`).

The scripted server of test_snapshot_positions answers the reads; bronze is a real delta-rs table.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bson.timestamp import Timestamp

from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.config import MongoSource
from ingest.events import WriterKind, WriterPosition
from ingest.positions import STREAM_WRITER_ID
from ingest.sources.mongodb.changes import pack_cluster_time, record_key
from ingest.sources.mongodb.snapshot import MongoSnapshotter
from tests.unit.sources.mongodb.test_snapshot_positions import IDLE, T0, ScriptedServer

BUDGET = 300
WIDTHS = [50, 60, 70, 80, 90, 500, 40, 40, 250, 30, 30, 30, 30]


def test_pages_end_at_the_byte_budget_and_a_wider_document_is_a_page_alone(tmp_path: Path) -> None:
    """Pages were bounded by document count only (5,000 documents of any width, up to the server's
    16 MiB reply); a page now ends before the document that would take it past the budget.
    """
    src = MongoSource(
        kind="mongodb",
        name="m",
        uri="mongodb://h",
        database="shop",
        snapshot_page_size=100,
        snapshot_page_bytes=BUDGET,
    )
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    idle = pack_cluster_time(IDLE)
    writer.raise_position(WriterPosition("m", STREAM_WRITER_ID, WriterKind.STREAM, idle, idle), datetime.now(UTC))
    docs = [{"_id": i, "v": "x" * w} for i, w in enumerate(WIDTHS)]
    server = ScriptedServer(docs, [Timestamp(T0, 6)])
    assert MongoSnapshotter(src, server, writer, "orders").run(lambda: False) is True  # type: ignore[arg-type]

    rows = writer.tables.query(
        "select page_number, row_index, last_page, record_pk, record from t order by page_number, row_index",
        t=writer.path(SNAPSHOT_PAGES_TABLE),
    ).to_pylist()
    assert [r["record_pk"] for r in rows] == [record_key(i) for i in range(len(WIDTHS))]
    pages: dict[int, list[int]] = {}
    for r in rows:
        pages.setdefault(r["page_number"], []).append(len(r["record"]))
    assert len(pages) >= 5
    assert all(sum(sizes) <= BUDGET or len(sizes) == 1 for sizes in pages.values()), pages
    assert [r["last_page"] for r in rows] == [r["page_number"] == max(pages) for r in rows]
