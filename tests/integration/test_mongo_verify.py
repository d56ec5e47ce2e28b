# ruff: noqa: F811  (pytest fixtures imported from test_mongo_flow are parameters here)
"""`verify` on MongoDB (mongo-java-server; a live replica set with MONGODB_URI) and real delta-rs bronze.

Silver here is consumer_records as dbt folds the initial snapshot (one live record per page row,
at its position), written with delta-rs; tests/integration/test_mongo_flow.py runs the real dbt
and verifies its silver. mongo-java-server gives snapshot reads no `atClusterTime`, so on it
verify takes the compat path (a pass counts only if no write happened while it read); a live
replica set takes the snapshot path.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from ingest.bronze.writer import BronzeWriter
from ingest.config import MongoSource
from ingest.sources.mongodb.verify import verify_collections
from ingest.verify import Status, TableResult, exit_code, silver_path
from tests.helpers.delta_rows import read
from tests.integration.test_mongo_flow import capture_once, mongo_db, mongo_uri, product, source  # noqa: F401

pytestmark = pytest.mark.integration

SILVER_SCHEMA = pa.schema(
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


def fold_snapshot(warehouse: Path, name: str) -> list[dict[str, Any]]:
    """consumer_records of the snapshot's page rows, written with delta-rs; returns the rows."""
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{name}' and record_pk is not null")
    rows = [
        {
            "source": name,
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
    write_silver(warehouse, rows)
    return rows


def write_silver(warehouse: Path, rows: list[dict[str, Any]]) -> None:
    write_deltalake(
        silver_path(BronzeWriter(warehouse)), pa.Table.from_pylist(rows, schema=SILVER_SCHEMA), mode="overwrite"
    )


def verify(warehouse: Path, src: MongoSource, wait_s: float = 30.0) -> TableResult:
    (r,) = verify_collections(
        src, BronzeWriter(warehouse), [f"{src.database}.products"], wait_s, 10, 100, show_progress=False
    )
    return r


def snapshot_into_silver(warehouse: Path, uri: str, db: Any, n: int) -> tuple[MongoSource, list[dict[str, Any]]]:
    """n documents snapshotted into bronze and folded into silver, then one more streamed after them.

    The streamed one (product n + 1) moves the safe bound past the pages (on mongo-java-server they
    lie above the last write until another one comes, snapshot.py), as dbt needs to place them;
    it is changed after silver's position, so every verify skips its key.
    """
    db.products.insert_many([product(i) for i in range(1, n + 1)])
    src = source(uri, db)
    capture_once(warehouse, src)
    db.products.insert_one(product(n + 1))
    capture_once(warehouse, src)
    return src, fold_snapshot(warehouse, src.name)


def test_verify_is_equal_at_rest_and_skips_what_changed_after_silver(
    warehouse: Path, mongo_uri: str, mongo_db: Any
) -> None:
    src, rows = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 25)
    assert len(rows) == 25
    r = verify(warehouse, src)
    # Rows read per side (skipped keys included): the source also holds the streamed product 26.
    assert (r.status, r.source_rows, r.silver_rows, r.skipped_keys, r.mismatches) == (Status.EQUAL, 26, 25, 1, 0)
    assert r.ranges == 3 and r.attempts == 1

    # Changes after silver's position, in bronze: their keys are skipped, not reported.
    mongo_db.products.update_one({"qty": 3}, {"$set": {"qty": 300}})
    mongo_db.products.delete_one({"qty": 4})
    mongo_db.products.insert_one(product(27))
    capture_once(warehouse, src)
    r = verify(warehouse, src)
    assert (r.status, r.skipped_keys, r.mismatches) == (Status.EQUAL, 4, 0), r
    assert (r.source_rows, r.silver_rows) == (26, 25)  # one deleted, one more inserted at the source


def test_verify_bisects_a_corrupted_silver_to_exactly_those_keys(
    warehouse: Path, mongo_uri: str, mongo_db: Any
) -> None:
    src, rows = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 30)
    changed, deleted, extra = dict(rows[4]), dict(rows[11]), dict(rows[0])
    changed["record"] = changed["record"].replace('"name":"p5"', '"name":"tampered"')
    deleted["deleted"] = True
    extra["record_pk"] = '{"_id":{"$oid":"0000000000000000000003e7"}}'
    extra["record"] = '{"_id":{"$oid":"0000000000000000000003e7"},"name":"ghost"}'
    write_silver(warehouse, [changed if r is rows[4] else deleted if r is rows[11] else r for r in rows] + [extra])
    r = verify(warehouse, src)
    assert r.status is Status.MISMATCH and exit_code([r]) == 6
    assert r.missing_keys == [rows[11]["record_pk"]]
    assert r.extra_keys == [extra["record_pk"]]
    assert r.different_keys == [(rows[4]["record_pk"], ["name"])]
    assert (r.missing, r.extra, r.different, r.unresolved_ranges) == (1, 1, 1, 0)


def test_verify_under_writes_never_reports_a_mismatch(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest
) -> None:
    src, _ = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 29)
    stop = threading.Event()
    written = [0]

    def write() -> None:
        i = 1000
        while not stop.is_set():
            mongo_db.products.insert_one(product(i % 28 + 1) | {"_id": i})
            mongo_db.products.update_one({"qty": i % 29 + 1}, {"$inc": {"views": 1}})
            written[0] += 2
            i += 1

    def ingest() -> None:
        while not stop.is_set():
            capture_once(warehouse, src)

    threads = [threading.Thread(target=write), threading.Thread(target=ingest)]
    for t in threads:
        t.start()
    try:
        r = verify(warehouse, src, wait_s=60.0)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert written[0] > 0 and r.mismatches == 0 and r.status is not Status.MISMATCH, r
    if request.node.callspec.params["mongo_uri"] == "live":
        # One snapshot read at atClusterTime: exact, the keys written after silver's position skipped.
        assert r.status is Status.EQUAL and r.skipped_keys > 0, r
    else:
        # No snapshot reads: every pass raced a write, so nothing is claimed.
        assert r.status is Status.NOT_VERIFIED and r.attempts == 3 and "raced" in (r.reason or ""), r


def test_verify_before_silver_exists_says_why(warehouse: Path, mongo_uri: str, mongo_db: Any) -> None:
    mongo_db.products.insert_many([product(i) for i in range(1, 4)])
    src = source(mongo_uri, mongo_db)
    capture_once(warehouse, src)
    r = verify(warehouse, src)
    assert r.status is Status.NOT_VERIFIED and "run `dbt build` first" in (r.reason or "")
    assert exit_code([r]) == 7
