# ruff: noqa: F811  (pytest fixtures imported from test_mongo_flow are parameters here)
"""`verify` on MongoDB (mongo-java-server; a live replica set with MONGODB_URI) and real delta-rs bronze.

Silver here is consumer_records as dbt folds bronze up to its safe bound (snapshot page rows at
their cluster time, then the stream's events, the last change winning), written with delta-rs;
tests/integration/test_mongo_flow.py runs the real dbt and verifies its silver. mongo-java-server
gives snapshot reads no `atClusterTime`, so on it verify takes the compat path (a pass counts only
if no write happened while it read); a live replica set takes the snapshot path, which
test_snapshot_reads_name_the_first_reads_cluster_time drives on mongo-java-server by adding the
`atClusterTime` the fake leaves out.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from bson.timestamp import Timestamp
from deltalake import write_deltalake
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, OperationFailure
from pymongo.synchronous.database import Database

from ingest import cli
from ingest.bronze.writer import BronzeWriter
from ingest.config import MongoSource
from ingest.errors import SourceUnavailableError
from ingest.positions import SourcePositions
from ingest.sources.mongodb import verify as mongo_verify
from ingest.sources.mongodb.changes import pack_cluster_time, record_key
from ingest.sources.mongodb.snapshot import request_snapshot
from ingest.sources.mongodb.source import cluster_time
from ingest.sources.mongodb.verify import verify_collections
from ingest.verify import EXIT_EQUAL, EXIT_NOT_VERIFIED, Status, TableResult, exit_code, silver_path
from tests.helpers.delta_rows import read
from tests.integration.test_mongo_flow import capture_once, product, source

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


def fold(warehouse: Path, name: str) -> list[dict[str, Any]]:
    """consumer_records of bronze up to the safe bound, written with delta-rs; returns the rows.

    As dbt folds it (DESIGN §5, §6): a page row sits at its cluster time after the events at that
    time, and each key takes its last change; a delete leaves a tombstone.
    """
    bound = SourcePositions.read(BronzeWriter(warehouse), name).safe_bound
    assert bound is not None
    changes = [
        ((p.high_watermark_lsn, 1, p.row_index), p.table_schema, p.table_name, p.record_pk, "snapshot", p.record)
        for p in read(warehouse / "bronze" / "snapshot_pages", f"source = '{name}' and record_pk is not null")
        if p.high_watermark_lsn <= bound
    ] + [
        ((e.commit_lsn, 0, e.commit_index), e.table_schema, e.table_name, e.record_pk, e.action, e.record)
        for e in read(warehouse / "bronze" / "wal_events", f"source = '{name}' and action != 'message'")
        if e.commit_lsn <= bound
    ]
    assert all(c[4] in ("snapshot", "insert", "update", "delete") for c in changes)  # no drops in these tests
    records: dict[str, dict[str, Any]] = {}
    for (lsn, _, _), schema, table, pk, action, record in sorted(changes, key=lambda c: c[0]):
        before = records.get(pk)
        records[pk] = {
            "source": name,
            "table_schema": schema,
            "table_name": table,
            "record_pk": pk,
            "record": before["record"] if action == "delete" and before else record,
            "deleted": action == "delete",
            "needs_reread": False,
            "commit_lsn": lsn,
        }
    rows = list(records.values())
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
    """n documents snapshotted into bronze, one more streamed after them, all folded into silver.

    The streamed one (product n + 1) moves the safe bound past the pages (on mongo-java-server they
    lie above the last write until another one comes, snapshot.py), as dbt needs to place them.
    """
    db.products.insert_many([product(i) for i in range(1, n + 1)])
    src = source(uri, db)
    capture_once(warehouse, src)
    db.products.insert_one(product(n + 1))
    capture_once(warehouse, src)
    return src, fold(warehouse, src.name)


def config_file(tmp_path: Path, warehouse: Path, src: MongoSource) -> Path:
    cfg = tmp_path / "ingest.yml"
    cfg.write_text(
        json.dumps(
            {
                "warehouse": str(warehouse),
                "sources": [
                    {
                        "name": src.name,
                        "kind": "mongodb",
                        "uri": src.uri,
                        "database": src.database,
                        "collections": src.collections,
                    }
                ],
            }
        )
    )
    return cfg


def test_verify_after_streamed_changes_is_equal_through_the_cli(
    warehouse: Path, mongo_uri: str, mongo_db: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coll = mongo_db.products
    coll.insert_many([product(i) for i in range(1, 21)])
    src = source(mongo_uri, mongo_db)
    capture_once(warehouse, src)
    coll.insert_many([product(i) for i in range(21, 26)])
    coll.update_one({"qty": 3}, {"$set": {"qty": 300}, "$unset": {"blob": ""}})
    coll.replace_one({"qty": 4}, {"name": "replaced", "qty": 40})
    coll.delete_many({"qty": {"$in": [5, 22]}})
    capture_once(warehouse, src)
    silver = {r["record_pk"]: r for r in fold(warehouse, src.name)}
    assert sum(not r["deleted"] for r in silver.values()) == coll.count_documents({}) == 23
    assert silver[record_key(product(5)["_id"])]["deleted"] and silver[record_key(product(22)["_id"])]["deleted"]
    assert '"qty":{"$numberInt":"300"}' in silver[record_key(product(3)["_id"])]["record"]

    # No table named: every collection in scope, through the MongoDB adapter.
    code = cli.main(["-c", str(config_file(tmp_path, warehouse, src)), "verify", "--json", "--no-progress"])
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["result"], doc["exit_code"]) == (EXIT_EQUAL, "equal", EXIT_EQUAL), doc
    (t,) = doc["tables"]
    assert (t["source"], t["table"], t["status"]) == (src.name, f"{mongo_db.name}.products", "equal")
    assert (t["source_rows"], t["silver_rows"], t["skipped_keys"], t["missing"], t["extra"], t["different"]) == (
        23,
        23,
        0,
        0,
        0,
        0,
    )
    assert t["attempts"] == 1 and t["position_text"].startswith("clusterTime ")
    runs = read(warehouse / "bronze" / "verification_runs", f"source = '{src.name}'")
    assert [(r.table_schema, r.table_name, r.status) for r in runs] == [(mongo_db.name, "products", "equal")]


def test_verify_skips_what_changed_after_silver(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    src, rows = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 25)
    assert len(rows) == 26
    caplog.clear()
    r = verify(warehouse, src)
    # mongo-java-server: said once per run (compat.py)
    assert caplog.text.count("no atClusterTime for a snapshot read; verify") == (0 if is_live(request) else 1)
    assert (r.status, r.source_rows, r.silver_rows, r.skipped_keys, r.mismatches) == (Status.EQUAL, 26, 26, 0, 0), r
    assert r.ranges == 3 and r.attempts == 1

    # Changes after silver's position, in bronze: their keys are skipped, not reported.
    mongo_db.products.update_one({"qty": 3}, {"$set": {"qty": 300}})
    mongo_db.products.delete_one({"qty": 4})
    mongo_db.products.insert_one(product(27))
    capture_once(warehouse, src)
    r = verify(warehouse, src)
    assert (r.status, r.skipped_keys, r.mismatches) == (Status.EQUAL, 3, 0), r
    # Rows read per side, skipped keys included: one deleted and one inserted at the source.
    assert (r.source_rows, r.silver_rows) == (26, 26)


def test_verify_bisects_a_corrupted_silver_to_exactly_those_keys(
    warehouse: Path, mongo_uri: str, mongo_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mongo_verify, "FETCH_DOCS", 7)  # the source is read in several getMores
    src, rows = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 30)
    changed, deleted, extra = dict(rows[4]), dict(rows[11]), dict(rows[0])
    changed["record"] = changed["record"].replace('"name":"p5"', '"name":"tampered"')
    deleted["deleted"] = True
    extra["record_pk"] = '{"_id":{"$oid":"0000000000000000000003e7"}}'
    extra["record"] = '{"_id":{"$oid":"0000000000000000000003e7"},"name":"ghost"}'
    write_silver(warehouse, [changed if r is rows[4] else deleted if r is rows[11] else r for r in rows] + [extra])
    r = verify(warehouse, src)
    assert r.status is Status.MISMATCH and exit_code([r]) == 6, r.reason
    assert r.missing_keys == [rows[11]["record_pk"]]
    assert r.extra_keys == [extra["record_pk"]]
    assert r.different_keys == [(rows[4]["record_pk"], ["name"])]
    assert (r.missing, r.extra, r.different, r.unresolved_ranges, r.source_rows, r.attempts) == (1, 1, 1, 0, 31, 1)


class Writes:
    """Writes to the collection in a thread (an insert and an update at a time) until `stop` is set."""

    def __init__(self, db: Any, stop: threading.Event) -> None:
        self.db, self.stop, self.count = db, stop, 0
        self.thread = threading.Thread(target=self._loop)

    def _loop(self) -> None:
        i = 1000
        while not self.stop.is_set():
            self.db.products.insert_one(product(i % 28 + 1) | {"_id": i})
            if self.stop.is_set():
                break
            self.db.products.update_one({"qty": i % 29 + 1}, {"$inc": {"views": 1}})
            self.count += 2
            i += 1


def verify_while(warehouse: Path, src: MongoSource, writes: Writes) -> TableResult:
    """verify while `writes` runs and ingest captures in another thread (both stopped after it)."""
    done = threading.Event()

    def ingest() -> None:
        while not done.is_set():
            capture_once(warehouse, src)

    ingesting = threading.Thread(target=ingest)
    writes.thread.start()
    ingesting.start()
    try:
        return verify(warehouse, src, wait_s=60.0)
    finally:
        writes.stop.set()
        done.set()
        writes.thread.join()
        ingesting.join()


def is_live(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.callspec.params["mongo_uri"] == "live")


def test_verify_under_writes_never_reports_a_mismatch(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest
) -> None:
    src, _ = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 29)
    writes = Writes(mongo_db, threading.Event())
    r = verify_while(warehouse, src, writes)
    assert writes.count > 0 and r.mismatches == 0 and r.status is not Status.MISMATCH, r
    if is_live(request):
        # One snapshot read at atClusterTime: exact, the keys written after silver's position skipped.
        assert (r.status, r.attempts) == (Status.EQUAL, 1) and r.skipped_keys > 0, r
    else:
        # No snapshot reads: every pass raced a write, so nothing is claimed.
        assert (r.status, r.attempts) == (Status.NOT_VERIFIED, 3) and "writes raced each of 3 reads" in (r.reason or "")


def test_verify_reads_again_after_a_raced_pass(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest
) -> None:
    src, _ = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 29)
    raced = threading.Event()
    writes = Writes(mongo_db, raced)  # they stop when the first pass is found raced

    class Raced(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "writes raced the read" in record.getMessage():
                raced.set()

    logger = logging.getLogger(mongo_verify.__name__)
    handler, level = Raced(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        r = verify_while(warehouse, src, writes)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert writes.count > 0 and r.status is Status.EQUAL and r.skipped_keys > 0, r
    if is_live(request):
        assert r.attempts == 1 and not raced.is_set()
    else:
        # The first pass raced the writes; a later one, after they stopped, did not (the writer can
        # finish the write it was in and race the second).
        assert raced.is_set() and r.attempts in (2, 3), r


def test_verify_says_why_it_could_not_compare(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest
) -> None:
    mongo_db.products.insert_many([product(i) for i in range(1, 4)])
    src = source(mongo_uri, mongo_db)
    capture_once(warehouse, src)
    r = verify(warehouse, src)
    assert r.status is Status.NOT_VERIFIED and "run `dbt build` first" in (r.reason or "")
    assert exit_code([r]) == EXIT_NOT_VERIFIED

    mongo_db.products.insert_one(product(4))
    capture_once(warehouse, src)
    fold(warehouse, src.name)
    # A write ingest has not captured: bronze does not reach the read's position.
    mongo_db.products.insert_one(product(5))
    r = verify(warehouse, src, wait_s=1.0)
    assert r.status is Status.NOT_VERIFIED and "bronze has not reached the read's position" in (r.reason or ""), r
    capture_once(warehouse, src)

    # A snapshot of the collection requested (no run has taken it yet).
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    progress, _ = request_snapshot(src, client, BronzeWriter(warehouse), "products")
    client.close()
    r = verify(warehouse, src, wait_s=2.0)
    assert r.status is Status.NOT_VERIFIED, r
    # On a replica set the cluster time moves (no-op writes) past the row the snapshot holds still.
    held = is_live(request) and "a snapshot holding the bound back" in (r.reason or "")
    assert held or "a snapshot of the collection is running" in (r.reason or ""), r
    BronzeWriter(warehouse).remove_writer(src.name, progress.writer_id)

    # The collection dropped after silver's position.
    mongo_db.products.drop()
    capture_once(warehouse, src)
    r = verify(warehouse, src)
    assert r.status is Status.NOT_VERIFIED and "dropped" in (r.reason or ""), r


def with_snapshot_reads(monkeypatch: pytest.MonkeyPatch, db: str, at: Timestamp) -> list[dict[str, Any]]:
    """Make `db`'s reads those of a server with snapshot reads; returns the readConcern of each read.

    mongo-java-server ignores `readConcern` and returns no `atClusterTime`: the run's first read
    gets `at` added to its reply, as MongoDB answers it.
    """
    concerns: list[dict[str, Any]] = []
    command, cursor_command = Database.command, Database.cursor_command

    def recorded(self: Database[Any], name: str, *args: Any, **kwargs: Any) -> Any:
        reply = command(self, name, *args, **kwargs)
        if self.name == db and "readConcern" in kwargs:
            concerns.append(dict(kwargs["readConcern"]))
            if len(concerns) == 1:
                reply["cursor"]["atClusterTime"] = at
        return reply

    def recorded_cursor(self: Database[Any], name: str, *args: Any, **kwargs: Any) -> Any:
        concerns.append(dict(kwargs["readConcern"]))
        return cursor_command(self, name, *args, **kwargs)

    monkeypatch.setattr(Database, "command", recorded)
    monkeypatch.setattr(Database, "cursor_command", recorded_cursor)
    return concerns


def compat_only(request: pytest.FixtureRequest) -> None:
    if is_live(request):
        pytest.skip("a replica set gives snapshot reads itself (the other tests)")


def test_snapshot_reads_name_the_first_reads_cluster_time(
    warehouse: Path,
    mongo_uri: str,
    mongo_db: Any,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    compat_only(request)
    src, _ = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 12)
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    at = cluster_time(client)  # idle: the last write's time
    client.close()
    concerns = with_snapshot_reads(monkeypatch, mongo_db.name, at)
    caplog.clear()
    r = verify(warehouse, src)
    assert (r.status, r.position, r.attempts, r.source_rows, r.silver_rows) == (
        Status.EQUAL,
        pack_cluster_time(at),
        1,
        13,
        13,
    ), r
    assert "no atClusterTime" not in caplog.text  # no compat warning: the server gave the time
    # The first read asks for a snapshot; every later one (the count, the pass) names its time.
    assert concerns[0] == {"level": "snapshot"}
    assert len(concerns) == 3 and all(c == {"level": "snapshot", "atClusterTime": at} for c in concerns[1:])


def test_failed_snapshot_reads_say_why(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    compat_only(request)
    src, _ = snapshot_into_silver(warehouse, mongo_uri, mongo_db, 5)
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    at = cluster_time(client)
    client.close()
    with_snapshot_reads(monkeypatch, mongo_db.name, at)
    cursor_command = Database.cursor_command

    def failing(error: Exception) -> Callable[..., Any]:
        def read(self: Database[Any], *args: Any, **kwargs: Any) -> Any:
            cursor_command(self, *args, **kwargs)  # recorded, then refused
            raise error

        return read

    # The run outlived the server's snapshot history: the collection is not verified, saying so.
    too_old = OperationFailure("Read timestamp is older than the oldest available timestamp", code=239)
    monkeypatch.setattr(Database, "cursor_command", failing(too_old))
    r = verify(warehouse, src)
    assert r.status is Status.NOT_VERIFIED and "minSnapshotHistoryWindowInSeconds" in (r.reason or ""), r
    assert exit_code([r]) == EXIT_NOT_VERIFIED

    # A lost server is no verdict: the source is unavailable (exit 75), as for every command.
    monkeypatch.setattr(Database, "cursor_command", failing(AutoReconnect("connection reset")))
    with pytest.raises(SourceUnavailableError, match="connection reset"):
        verify(warehouse, src)
