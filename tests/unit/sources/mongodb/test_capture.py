"""The stream loop's batching and position logic over manual-shaped events (no server, no Spark).

mongo-java-server has no transactions, no post-batch resume tokens and no invalidate: these pin
what the capture does with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from ingest.bronze.committer import Batch
from ingest.bronze.writer import BronzeWriter
from ingest.capture.batcher import Resume
from ingest.config import BatchConfig, MongoSource
from ingest.errors import SourceError
from ingest.events import Action, ChangeEvent, WriterKind
from ingest.progress import Progress
from ingest.sources.mongodb import capture as capture_module
from ingest.sources.mongodb.capture import MongoCapture
from ingest.sources.mongodb.changes import from_ext_json
from ingest.sources.mongodb.source import StreamHistoryLostError, scope, translate
from ingest.sources.mongodb.stream import RESUME_AFTER, START_AFTER, parse_stored_token, stored_token
from tests.unit.sources.mongodb.documents import LSID, T0, event, in_txn, insert, token

LSN = T0 << 32


class FakeStream:
    """try_next() over scripted documents; None is an empty getMore (with an optional post-batch token)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.resume_token: Mapping[str, Any] | None = None
        self.closed = False

    def try_next(self) -> Any:
        if not self.script:
            return None
        item = self.script.pop(0)
        if isinstance(item, PostBatch):
            self.resume_token = item.token
            return None
        if item is None:
            return None
        self.resume_token = item["_id"]
        return item

    def close(self) -> None:
        self.closed = True


class PostBatch:
    def __init__(self, token: Mapping[str, Any]) -> None:
        self.token = token


class FakeCommitter:
    def __init__(self, durable: int = 0) -> None:
        self.batches: list[Batch] = []
        self.durable_lsn = self.ack_lsn = durable

    def submit(self, batch: Batch) -> None:
        self.batches.append(batch)
        if batch.durable_lsn is not None:
            self.durable_lsn = max(self.durable_lsn, batch.durable_lsn)
            self.ack_lsn = max(self.ack_lsn, batch.ack_lsn or 0)

    def drain(self) -> None:
        pass


def source(**extra: Any) -> MongoSource:
    base: dict[str, Any] = {"kind": "mongodb", "name": "m", "uri": "mongodb://h", "database": "shop"}
    base.setdefault("collections", ["orders", "customers"])
    return MongoSource(**{**base, **extra})


def run_loop(
    script: list[Any],
    max_events: int = 1000,
    durable: int = 0,
    skip_upto: tuple[int, int] | None = None,
    reopened: list[Any] | None = None,
    src: MongoSource | None = None,
) -> tuple[MongoCapture, FakeCommitter]:
    cap = MongoCapture(
        src or source(),
        BatchConfig(max_events=max_events, max_seconds=3600),
        None,  # type: ignore[arg-type]
        Progress("m", enabled=False),
    )
    cap.durable_lsn = durable
    committer = FakeCommitter(durable)
    later = reopened if reopened is not None else []

    def reopen(client: Any, stored: Any) -> FakeStream:
        later.append(stored)
        return FakeStream(script_after_invalidate)

    script_after_invalidate: list[Any] = []
    if "AFTER" in script:
        i = script.index("AFTER")
        script, script_after_invalidate = script[:i], script[i + 1 :]
    cap._open = reopen  # type: ignore[method-assign]
    resume = Resume(durable, skip_upto)
    cap._loop(None, FakeStream(script), committer, resume, once=True, should_stop=lambda: False)  # type: ignore[arg-type]
    return cap, committer


def positions(batches: list[Batch]) -> list[list[tuple[int, int]]]:
    return [[e.position for e in b.events] for b in batches]


def test_a_transaction_is_made_durable_only_when_complete() -> None:
    txn = in_txn(LSID, 1)
    script = [
        insert(T0, 10, {"_id": 1}, **txn),
        insert(T0, 10, {"_id": 2}, **txn),
        insert(T0, 10, {"_id": 3}, **txn),
        insert(T0, 11, {"_id": 4}),
    ]
    _, c = run_loop(script, max_events=2)
    # A page is cut when the transaction goes on past a full batch (at its third event).
    assert positions(c.batches) == [[(LSN | 10, 0), (LSN | 10, 1)], [(LSN | 10, 2), (LSN | 11, 0)]]
    # The page of the open transaction raises nothing; the position moves at transaction ends only.
    assert [b.durable_lsn for b in c.batches] == [None, LSN | 11]
    assert c.batches[0].mid_transaction
    assert parse_stored_token(c.batches[1].resume_token) == (RESUME_AFTER, token(T0, 11))
    assert c.batches[1].end_lsns == {LSN | 10: LSN | 10, LSN | 11: LSN | 11}


def test_re_delivered_events_at_or_below_bronze_are_skipped() -> None:
    script = [
        insert(T0, 5, {"_id": 1}),
        insert(T0, 6, {"_id": 2}),
        insert(T0, 7, {"_id": 3}),
        insert(T0, 8, {"_id": 4}),
    ]
    cap, c = run_loop(script, durable=LSN | 5, skip_upto=(LSN | 7, 0))
    assert [e.position for b in c.batches for e in b.events] == [(LSN | 8, 0)]
    assert cap.skipped == 3
    assert c.durable_lsn == LSN | 8


def test_idle_post_batch_token_raises_the_position_past_the_last_event() -> None:
    later = {"_data": f"82{T0 + 60:08X}{1:08X}2B0429296E1404"}
    _, c = run_loop([insert(T0, 5, {"_id": 1}), PostBatch(later)])
    # The post-batch token is a boundary: an event at exactly its time may still come (review D1).
    assert c.batches[-1].durable_lsn == (((T0 + 60) << 32) | 1) - 1
    assert c.batches[-1].ack_lsn == ((T0 + 60) << 32) | 1
    assert parse_stored_token(c.batches[-1].resume_token) == (RESUME_AFTER, later)


def test_a_post_batch_token_at_the_open_cluster_time_does_not_complete_it() -> None:
    """D4: a high-water-mark token at T sorts before events at T; another shard's event at T may still come."""
    hwm_at_t = {"_data": f"82{T0:08X}{5:08X}01"}  # clusterTime T0.5, no event fields: a high-water mark
    _, c = run_loop([insert(T0, 5, {"_id": 1}), PostBatch(hwm_at_t)])
    assert [e.position for b in c.batches for e in b.events] == [(LSN | 5, 0)]  # written, as a page
    assert all(b.durable_lsn is None for b in c.batches)  # but the position does not move past T
    assert c.batches[-1].mid_transaction


def test_invalidate_stores_a_start_after_token_and_reopens_with_it() -> None:
    reopened: list[Any] = []
    coll_src = source(collections=["orders"])
    script = [
        insert(T0, 5, {"_id": 1}),
        event("drop", T0, 6),
        event("invalidate", T0, 6, coll=None),
        "AFTER",
        insert(T0, 9, {"_id": 1}),
    ]
    _, c = run_loop(script, reopened=reopened, src=coll_src)
    inv_token = token(T0, 6)
    assert reopened == [(START_AFTER, inv_token)]
    durable_batch = next(b for b in c.batches if b.resume_token and START_AFTER in b.resume_token)
    assert durable_batch.durable_lsn == LSN | 6
    events = [e for b in c.batches for e in b.events]
    assert [(e.action, e.position) for e in events] == [
        (Action.INSERT, (LSN | 5, 0)),
        (Action.TRUNCATE, (LSN | 6, 0)),
        (Action.TRUNCATE, (LSN | 6, 1)),
        (Action.INSERT, (LSN | 9, 0)),
    ]
    assert parse_stored_token(c.batches[-1].resume_token) == (RESUME_AFTER, token(T0, 9))


def test_rename_into_scope_requests_a_snapshot_of_the_new_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request is a snapshot writer registered in bronze (request_snapshot), not a queue entry a stop would lose."""
    requested: list[str] = []
    monkeypatch.setattr(capture_module, "request_snapshot", lambda src, client, writer, coll: requested.append(coll))
    script = [event("rename", T0, 7, "orders_tmp", to={"db": "shop", "coll": "orders"})]
    cap, c = run_loop(script)
    assert requested == ["orders"]
    assert cap._snapshots.empty()
    assert c.batches[0].events[0].truncated_tables == ("shop.orders_tmp",)


def test_stored_token_round_trip() -> None:
    tok = token(T0, 3)
    assert parse_stored_token(stored_token(START_AFTER, tok)) == (START_AFTER, tok)
    assert from_ext_json(stored_token(RESUME_AFTER, tok)) == {"resumeAfter": tok}
    assert parse_stored_token(None) is None
    with pytest.raises(ValueError):
        parse_stored_token('{"other": 1}')


@pytest.mark.parametrize(("code", "name"), [(286, "ChangeStreamHistoryLost"), (280, "ChangeStreamFatalError")])
def test_lost_history_is_an_error_that_says_how_to_re_snapshot(code: int, name: str) -> None:
    err = translate(source(), OperationFailure("Resume of change stream was not possible", code, {"codeName": name}))
    assert isinstance(err, StreamHistoryLostError)
    assert "on_history_lost: resnapshot" in str(err) and "oplog window" in str(err) and name in str(err)


def test_standalone_server_error_names_the_prerequisite() -> None:
    err = translate(source(), OperationFailure("only supported on replica sets", 40573))
    assert isinstance(err, SourceError) and "replica set" in str(err)


def test_scope_is_one_collection_or_the_database() -> None:
    assert scope(source(collections=["orders"])).coll == "orders"
    assert scope(source()).coll is None
    assert scope(source(collections=None)).coll is None


def test_history_lost_resnapshot_tombstones_every_collection_at_the_current_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import ingest.sources.mongodb.capture as capture

    monkeypatch.setattr(capture, "cluster_time", lambda client: Timestamp(T0, 99))
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    cap = MongoCapture(source(on_history_lost="resnapshot"), BatchConfig(), writer, Progress("m", enabled=False))
    c = FakeCommitter()
    ev = cap._recover_history_lost(None, c)  # type: ignore[arg-type]
    assert ev.action == Action.TRUNCATE and ev.position == (LSN | 99, 0)
    assert ev.truncated_tables == ("shop.orders", "shop.customers")
    assert c.batches[0].durable_lsn == LSN | 99
    assert sorted(cap._snapshots.get_nowait()[0] for _ in range(2)) == ["customers", "orders"]
    # The snapshots are registered in bronze (at the tombstone's position), not only queued in memory.
    rows = [p for p, _ in writer.positions("m") if p.writer_kind is WriterKind.SNAPSHOT]
    assert len(rows) == 2 and {p.durable_lsn for p in rows} == {LSN | 99}


def test_history_lost_resnapshot_also_tombstones_collections_gone_from_the_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """W6: a collection dropped while the history was lost keeps no live rows: bronze names it."""
    import ingest.sources.mongodb.capture as capture

    monkeypatch.setattr(capture, "cluster_time", lambda client: Timestamp(T0, 99))
    monkeypatch.setattr(capture, "collections", lambda client, src: ["orders"])
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    old = [
        ChangeEvent(LSN, 0, LSN, T0 * 1_000_000, Action.INSERT, db, coll, record_pk='{"_id":1}', record="{}")
        for db, coll in (("shop", "orders"), ("shop", "dropped_meanwhile"), ("other_db", "elsewhere"))
    ]
    writer.append_events("m", "mongodb", "stream", old)
    src = source(on_history_lost="resnapshot", collections=None)
    cap = MongoCapture(src, BatchConfig(), writer, Progress("m", enabled=False))
    c = FakeCommitter()
    ev = cap._recover_history_lost(None, c)  # type: ignore[arg-type]
    assert ev.truncated_tables == ("shop.orders", "shop.dropped_meanwhile")
    assert cap._snapshots.get_nowait()[0] == "orders" and cap._snapshots.empty()  # nothing to read of a gone one
