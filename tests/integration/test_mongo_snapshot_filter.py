"""Filtered snapshots of a MongoDB collection (`snapshot <collection> --where '<Extended JSON filter>'`).

A filtered snapshot lands exactly the documents its filter selects, in pages carrying the facts dbt
places any page row by (its own watermark, `_id` order, no whole-table snapshot), and it never
counts as the collection's snapshot. A filter that is not one JSON object, or that the server
refuses, is refused with nothing queued; one the server refuses on a later page drops the request
and the run goes on.

Backends: mongo-java-server (always) and a real replica set when MONGODB_URI is set (skipped
otherwise). mongo-java-server does not know `$where`, `$text` or `$near` (it answers "unknown
operator"); the filters here use what it and MongoDB both run: equality, `$gte`/`$lt` on ObjectIds
and dates, `$expr`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId
from pymongo import MongoClient

from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.errors import ConfigError, SourceError
from ingest.events import WriterKind
from ingest.positions import FILTERED_SNAPSHOT_PREFIX, SourcePositions
from ingest.progress import Progress
from ingest.sources.mongodb.capture import MongoCapture
from ingest.sources.mongodb.changes import from_ext_json, record_key
from ingest.sources.mongodb.snapshot import request_snapshot
from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import ingest, write_config
from tests.helpers.pg import bronze_events

pytestmark = pytest.mark.integration


def oid(i: int) -> ObjectId:
    return ObjectId(f"{i:024x}")


def order(i: int) -> dict[str, Any]:
    """An order as the manual's examples shape them: an ObjectId, a status, a quantity, a date."""
    return {
        "_id": oid(i),
        "status": "closed" if i % 3 == 0 else "open",
        "qty": i,
        "placed_at": datetime(2024, 1, i, 9, 30, tzinfo=UTC),
    }


def source(uri: str, db: Any, **extra: Any) -> MongoSource:
    return MongoSource(
        kind="mongodb", name=f"m_{db.name[3:]}", uri=uri, database=db.name, collections=["orders"], **extra
    )


def config(tmp_path: Path, src: MongoSource) -> Path:
    return write_config(
        tmp_path,
        {
            "kind": "mongodb",
            "name": src.name,
            "uri": src.uri,
            "database": src.database,
            "collections": ["orders"],
            "snapshot_page_size": src.snapshot_page_size,
        },
    )


def capture_once(warehouse: Path, src: MongoSource) -> MongoCapture:
    cap = MongoCapture(
        src, BatchConfig(max_events=1000, max_seconds=5), BronzeWriter(warehouse), Progress(src.name, enabled=False)
    )
    cap.run(once=True, should_stop=lambda: False)
    return cap


def page_rows(warehouse: Path, source: str) -> list[Any]:
    return read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}'", "snapshot_id, page_number, row_index")


def filtered(rows: list[Any]) -> list[Any]:
    return [r for r in rows if r.snapshot_id.startswith(FILTERED_SNAPSHOT_PREFIX)]


def whole(rows: list[Any]) -> list[Any]:
    return [r for r in rows if not r.snapshot_id.startswith(FILTERED_SNAPSHOT_PREFIX)]


def writer_ids(warehouse: Path, name: str) -> list[str]:
    return [p.writer_id for p, _ in BronzeWriter(warehouse).positions(name)]


FILTER = json.dumps(
    {"status": "open", "_id": {"$gte": {"$oid": str(oid(4))}}, "placed_at": {"$lt": {"$date": "2024-01-15T00:00:00Z"}}}
)


def test_a_filtered_snapshot_lands_only_its_documents_placed_like_any_page(
    tmp_path: Path, warehouse: Path, mongo_uri: str, mongo_db: Any
) -> None:
    mongo_db.orders.insert_many([order(i) for i in range(1, 21)])
    src = source(mongo_uri, mongo_db, snapshot_page_size=3, max_await_seconds=0.3)
    table = f"{mongo_db.name}.orders"
    capture_once(warehouse, src)  # the collection's own (whole) snapshot, then the stream
    (whole_done,) = {r.snapshot_id for r in page_rows(warehouse, src.name)}
    before = BronzeWriter(warehouse).completed_snapshots(src.name)[table]
    assert before > 0

    p = ingest(config(tmp_path, src), "snapshot", table, "--where", FILTER)
    assert p.returncode == 0 and f"{table} where {FILTER}" in p.stdout, p.stderr
    (progress,) = SourcePositions.read(BronzeWriter(warehouse), src.name).snapshots
    assert progress.where == FILTER and progress.snapshot_id.startswith(FILTERED_SNAPSHOT_PREFIX)

    # Changes after the request and before its pages are read: a selected document updated, one
    # updated out of the filter, one outside it updated. The pages read the documents as they are.
    mongo_db.orders.update_one({"_id": oid(5)}, {"$set": {"qty": 50}})
    mongo_db.orders.update_one({"_id": oid(7)}, {"$set": {"status": "closed"}})
    mongo_db.orders.update_one({"_id": oid(2)}, {"$set": {"qty": 20}})
    cap = capture_once(warehouse, src)
    assert cap.snapshots_done == [table]

    rows = filtered(page_rows(warehouse, src.name))
    selected = [4, 5, 8, 10, 11, 13, 14]  # open, _id >= 4, placed before Jan 15; 7 was closed meanwhile
    assert [r.record_pk for r in rows] == [record_key(oid(i)) for i in selected], "exactly its documents, in _id order"
    assert [from_ext_json(r.key_text[0]) for r in rows] == [oid(i) for i in selected]
    assert {r.snapshot_id for r in rows} == {progress.snapshot_id}
    assert [(r.page_number, r.row_index, r.last_page) for r in rows] == [
        (0, 0, False),
        (0, 1, False),
        (0, 2, False),
        (1, 0, False),
        (1, 1, False),
        (1, 2, False),
        (2, 0, True),
    ]
    assert all(r.source_kind == "mongodb" and r.table_name == "orders" and r.table_snapshot is None for r in rows)
    assert all(r.snapshot_xmin is None and r.snapshot_xip is None for r in rows)
    pages = {r.page_number: r.high_watermark_lsn for r in rows}
    assert all(hw > before for hw in pages.values()), "each page its own watermark, above the whole snapshot's"
    assert list(pages.values()) == sorted(pages.values())
    assert from_ext_json(rows[1].record)["qty"] == 50
    updates = {e.record_pk: e for e in bronze_events(warehouse, src.name) if e.action == "update"}
    assert set(updates) == {record_key(oid(i)) for i in (5, 7, 2)}
    # The update the page read is at or below the page's watermark: dbt orders the page row after it.
    assert updates[record_key(oid(5))].commit_lsn <= pages[0]
    assert writer_ids(warehouse, src.name) == ["stream"], "its writer row is removed when its last page is durable"

    # The collection's completed snapshot is still the whole one: the filtered one does not count.
    assert BronzeWriter(warehouse).completed_snapshots(src.name) == {table: before}
    assert len(whole(page_rows(warehouse, src.name))) == 20
    assert {r.snapshot_id for r in whole(page_rows(warehouse, src.name))} == {whole_done}


def test_a_bad_filter_is_refused_and_nothing_is_queued(
    tmp_path: Path, warehouse: Path, mongo_uri: str, mongo_db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    mongo_db.orders.insert_many([order(i) for i in range(1, 7)])
    src = source(mongo_uri, mongo_db, max_await_seconds=0.3)
    table = f"{mongo_db.name}.orders"
    writer = BronzeWriter(warehouse)
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    refused = {
        '{"status": "open"': "is not Extended JSON",
        '{"_id": {"$oid": "not-an-object-id"}}': "is not Extended JSON",
        '["open"]': "is a JSON array, not a query filter",
        '"open"': "is a JSON string, not a query filter",
        "": "is not Extended JSON",
        '{"qty": {"$bogus": 1}}': "unknown operator: $bogus",
        '{"$bogus": 1}': "unknown top level operator: $bogus",
    }
    try:
        for where, why in refused.items():
            with pytest.raises((ConfigError, SourceError)) as e:
                request_snapshot(src, client, writer, "orders", where)
            assert why in str(e.value) and "nothing was queued" in str(e.value), (where, str(e.value))
        cfg = config(tmp_path, src)
        for where, why in [('{"qty": {"$bogus": 1}}', "unknown operator: $bogus"), ("{status: open}", "Extended")]:
            p = ingest(cfg, "snapshot", table, "--where", where)
            assert p.returncode == 2 and why in p.stderr and "nothing was queued" in p.stderr, p.stderr
        rows = writer.positions(src.name) if (warehouse / "bronze" / "stream_positions").exists() else []
        assert [pos for pos, _ in rows if pos.writer_kind is WriterKind.SNAPSHOT] == []

        # Two filters the server takes, queued before any run: one holds, one fails on a document
        # written after the check (a division by its zero quantity).
        kept, _ = request_snapshot(src, client, writer, "orders", '{"status": "open"}')
        dividing = '{"$expr": {"$gt": [{"$divide": [100, "$qty"]}, 10]}}'
        dropped, _ = request_snapshot(src, client, writer, "orders", dividing)
        assert {p.where for p in SourcePositions.read(writer, src.name).snapshots} == {'{"status": "open"}', dividing}
    finally:
        client.close()
    mongo_db.orders.insert_one({"_id": oid(7), "status": "open", "qty": 0})

    # One run: the failing request is dropped and the run goes on; the filtered snapshot that holds
    # does not stand in for the collection's first snapshot, which runs too.
    with caplog.at_level(logging.ERROR, logger="ingest.sources.mongodb.snapshot"):
        cap = capture_once(warehouse, src)
    assert sorted(cap.snapshots_done) == [table, table]
    assert f"snapshot_id={dropped.snapshot_id}" in caplog.text and "cannot be performed and is dropped" in caplog.text
    rows = page_rows(warehouse, src.name)
    assert {r.snapshot_id for r in filtered(rows)} == {kept.snapshot_id}
    assert [r.record_pk for r in filtered(rows)] == [record_key(oid(i)) for i in (1, 2, 4, 5, 7)]
    assert [r.record_pk for r in whole(rows)] == [record_key(oid(i)) for i in range(1, 8)]
    assert writer_ids(warehouse, src.name) == ["stream"]
    assert BronzeWriter(warehouse).completed_snapshots(src.name) == {table: whole(rows)[-1].high_watermark_lsn}
