"""Streams one MongoDB source into bronze: change stream -> ChangeMapper -> BronzeWriter -> resume token.

The order of a batch is fixed (DESIGN §3): append events to Delta, then raise this writer's row in
bronze.stream_positions with the resume token in the same row: storing the token *is* the
acknowledgement. A crash anywhere resumes from the last stored token; events already in bronze
are skipped by position. Snapshots run on a thread next to the stream (DESIGN §5): the stream
never waits for them.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo import MongoClient
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure

from ingest.bronze.committer import Batch, Committer
from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.events import Action, ChangeEvent, WriterKind, WriterPosition
from ingest.progress import Progress
from ingest.sources.mongodb.changes import (
    ChangeMapper,
    Namespace,
    ext_json,
    from_ext_json,
    pack_cluster_time,
    resume_token_position,
    unpack_cluster_time,
)
from ingest.sources.mongodb.snapshot import WRITER_PREFIX, MongoSnapshotter, SnapshotState
from ingest.sources.mongodb.source import StreamHistoryLostError, cluster_time, collections, connect, scope, translate

log = logging.getLogger(__name__)

SOURCE_KIND = "mongodb"
STREAM_WRITER_ID = "stream"
RESUME_AFTER = "resumeAfter"
START_AFTER = "startAfter"
IDLE_POSITION_INTERVAL_S = 10.0  # how often an idle stream raises its row to the post-batch token
SNAPSHOT_POLL_S = 0.5


def stored_token(kind: str, token: Mapping[str, Any]) -> str:
    """The stream writer's `resume_token`: how to reopen, `{"resumeAfter"|"startAfter": <token>}`."""
    return ext_json({kind: token})


def parse_stored_token(text: str | None) -> tuple[str, Mapping[str, Any]] | None:
    """Inverse of `stored_token`; None for a writer row without one."""
    if not text:
        return None
    d = from_ext_json(text)
    for kind in (START_AFTER, RESUME_AFTER):
        if kind in d:
            return kind, d[kind]
    raise ValueError(f"not a stored resume token: {text[:200]}")


class MongoCapture:
    """Owns the stream writer and the snapshot thread of one MongoDB source.

    Responsibilities: register the stream writer (starting at the current cluster time), open the
    change stream (resumeAfter / startAfter the stored token), map and batch events on
    transaction boundaries, make each batch durable with its token, reopen after an invalidate,
    snapshot collections with no completed snapshot (and a renamed collection under its new name),
    and drain for `--once`.
    """

    def __init__(self, src: MongoSource, batch: BatchConfig, writer: BronzeWriter, progress: Progress) -> None:
        """Prepare to capture `src` into `writer`'s bronze tables."""
        self.src, self.batch, self.writer, self.progress = src, batch, writer, progress
        self.scope = scope(src)
        self.durable_lsn = 0
        self.skipped = 0
        self.snapshots_done: list[str] = []
        self.started_at = datetime.now(UTC)
        self._snapshots: queue.Queue[tuple[str, SnapshotState | None]] = queue.Queue()
        self._snapshot_error: BaseException | None = None

    # -- registration -------------------------------------------------------------------------

    def _register(self, client: MongoClient[dict[str, Any]]) -> tuple[str, Mapping[str, Any]] | None:
        self.writer.ensure_tables()
        mine = [p for p, _ in self.writer.positions(self.src.name) if p.writer_id == STREAM_WRITER_ID]
        if mine:
            self.durable_lsn = mine[0].durable_lsn
            return parse_stored_token(mine[0].resume_token)
        # A new writer starts at the server's current cluster time: the stream begins there.
        self.durable_lsn = pack_cluster_time(cluster_time(client))
        self._raise_row(None)
        return None

    def _raise_row(self, token: str | None) -> None:
        pos = WriterPosition(
            self.src.name, STREAM_WRITER_ID, WriterKind.STREAM, self.durable_lsn, self.durable_lsn, token
        )
        self.writer.raise_position(pos, self.started_at)

    def _plan_snapshots(self, client: MongoClient[dict[str, Any]]) -> None:
        """Queue resumed snapshots (their writer rows) and collections never snapshotted."""
        rows = [p for p, _ in self.writer.positions(self.src.name) if p.writer_kind == WriterKind.SNAPSHOT]
        running: set[str] = set()
        for p in rows:
            if p.writer_id.startswith(WRITER_PREFIX) and p.resume_token:
                state = SnapshotState.from_json(p.resume_token)
                running.add(state.table)
                self._snapshots.put((state.table.split(".", 1)[1], state))
        done = self.writer.completed_snapshots(self.src.name)
        for coll in collections(client, self.src):
            table = f"{self.src.database}.{coll}"
            if table not in done and table not in running:
                self._snapshots.put((coll, None))

    # -- the run ------------------------------------------------------------------------------

    def run(self, once: bool, should_stop: Callable[[], bool]) -> None:
        """Capture until `should_stop()`, or with `once` until the stream is drained and snapshots are done."""
        client = connect(self.src)
        try:
            stored = self._register(client)
            skip_upto = self.writer.last_event_position(self.src.name, STREAM_WRITER_ID, self.durable_lsn)
            self._plan_snapshots(client)
            stream_done, stream_failed = threading.Event(), threading.Event()
            snap = threading.Thread(
                target=self._snapshot_worker,
                args=(client, lambda: should_stop() or stream_failed.is_set(), stream_done),
                name=f"snapshot-{self.src.name}",
                daemon=True,
            )
            snap.start()
            try:
                self._stream(client, stored, skip_upto, once, should_stop)
            except BaseException:
                stream_failed.set()
                raise
            finally:
                stream_done.set()
                snap.join()
            if self._snapshot_error is not None:
                raise self._snapshot_error
        finally:
            client.close()

    def _snapshot_worker(
        self, client: MongoClient[dict[str, Any]], should_stop: Callable[[], bool], stream_done: threading.Event
    ) -> None:
        """Run queued snapshots one at a time until stopped, or (after the stream ended) none is left."""
        try:
            while not should_stop():
                try:
                    coll, state = self._snapshots.get(timeout=SNAPSHOT_POLL_S)
                except queue.Empty:
                    if stream_done.is_set() and self._snapshots.empty():
                        return
                    continue
                snapshotter = MongoSnapshotter(self.src, client, self.writer, coll, state)
                if snapshotter.run(should_stop):
                    self.snapshots_done.append(snapshotter.ns.qualified)
        except BaseException as e:  # surfaced by run() in the caller's thread
            log.error("snapshot failed source=%s error=%s", self.src.name, e)
            self._snapshot_error = e

    def _open(
        self, client: MongoClient[dict[str, Any]], stored: tuple[str, Mapping[str, Any]] | None
    ) -> ChangeStream[Any]:
        kwargs: dict[str, Any] = {"max_await_time_ms": int(self.src.max_await_seconds * 1000)}
        if self.src.pre_post_images:
            kwargs.update(full_document="required", full_document_before_change="whenAvailable")
        else:
            kwargs["full_document"] = "updateLookup"
        if stored is None:
            kwargs["start_at_operation_time"] = unpack_cluster_time(self.durable_lsn)
        elif stored[0] == START_AFTER:
            kwargs["start_after"] = stored[1]
        else:
            kwargs["resume_after"] = stored[1]
        db = client[self.scope.db]
        pipeline: list[dict[str, Any]] = []
        if self.scope.coll is None and self.src.collections is not None:
            colls = list(self.src.collections)
            pipeline = [
                {
                    "$match": {
                        "$or": [
                            {"ns.coll": {"$in": colls}},
                            {"to.coll": {"$in": colls}},
                            {"operationType": {"$in": ["dropDatabase", "invalidate"]}},
                        ]
                    }
                }
            ]
        try:
            if self.scope.coll is not None:
                return db[self.scope.coll].watch(pipeline, **kwargs)
            return db.watch(pipeline, **kwargs)
        except OperationFailure as e:
            raise translate(self.src, e) from e

    def _recover_history_lost(self, client: MongoClient[dict[str, Any]], committer: Committer) -> ChangeEvent:
        """`on_history_lost: resnapshot`: tombstone every collection now; the stream restarts here."""
        now = pack_cluster_time(cluster_time(client))
        names = collections(client, self.src)
        for coll in names:
            self._snapshots.put((coll, None))
        tables = tuple(f"{self.src.database}.{c}" for c in names) or (self.scope.qualified,)
        event = ChangeEvent(
            commit_lsn=now,
            commit_index=0,
            xid=now,
            commit_ts_us=(now >> 32) * 1_000_000,
            action=Action.TRUNCATE,
            table_schema=self.src.database,
            table_name=tables[0].split(".", 1)[1],
            truncated_tables=tables,
            message_prefix="mongodb.historyLost",
        )
        committer.submit(Batch([event], durable_lsn=now, ack_lsn=now, end_lsns={now: now}))
        committer.drain()
        return event

    def _stream(
        self,
        client: MongoClient[dict[str, Any]],
        stored: tuple[str, Mapping[str, Any]] | None,
        skip_upto: tuple[int, int] | None,
        once: bool,
        should_stop: Callable[[], bool],
    ) -> None:
        committer = Committer(
            self.writer,
            self.src.name,
            SOURCE_KIND,
            STREAM_WRITER_ID,
            WriterKind.STREAM,
            self.started_at,
            self.durable_lsn,
            self.durable_lsn,
            self.progress,
        )
        try:
            try:
                stream = self._open(client, stored)
            except StreamHistoryLostError:
                if self.src.on_history_lost != "resnapshot":
                    raise
                log.warning("source=%s resume point lost: tombstoning and re-snapshotting", self.src.name)
                self._recover_history_lost(client, committer)
                self.durable_lsn = committer.durable_lsn
                stored = None
                stream = self._open(client, stored)
            try:
                self._loop(client, stream, committer, skip_upto, once, should_stop)
            finally:
                stream.close()
            committer.drain()
        finally:
            committer.close()
            self.durable_lsn = committer.durable_lsn

    def _loop(
        self,
        client: MongoClient[dict[str, Any]],
        stream: ChangeStream[Any],
        committer: Committer,
        skip_upto: tuple[int, int] | None,
        once: bool,
        should_stop: Callable[[], bool],
    ) -> None:
        mapper = ChangeMapper(self.scope, collections(client, self.src) if self.scope.coll is None else ())
        pending: list[ChangeEvent] = []
        open_lsn: int | None = None  # the transaction whose events are still arriving
        open_token: Mapping[str, Any] | None = None
        done_lsn: int | None = None  # the last complete transaction not yet made durable
        done_token: str | None = None
        batch_started = last_idle_raise = time.monotonic()
        skip_below = self.durable_lsn
        max_events, max_seconds = self.batch.max_events, self.batch.max_seconds

        def submit(mid_transaction: bool = False) -> None:
            nonlocal done_lsn, done_token
            end_lsns = {e.commit_lsn: e.commit_lsn for e in pending if e.commit_lsn != open_lsn}
            batch = Batch(list(pending), mid_transaction=mid_transaction, end_lsns=end_lsns)
            if done_lsn is not None:  # every event at or below it is in this batch or an earlier one
                batch.durable_lsn = batch.ack_lsn = done_lsn
                batch.resume_token = done_token
                done_lsn = done_token = None
            pending.clear()
            committer.submit(batch)

        def complete_open(kind: str = RESUME_AFTER) -> None:
            nonlocal open_lsn, open_token, done_lsn, done_token
            if open_lsn is not None and open_token is not None:
                done_lsn, done_token = open_lsn, stored_token(kind, open_token)
            open_lsn = open_token = None

        while not should_stop():
            now = time.monotonic()
            try:
                doc = stream.try_next()
            except OperationFailure as e:
                raise translate(self.src, e) from e
            if doc is None:
                # The server has nothing more: the open transaction is complete.
                complete_open()
                token = stream.resume_token
                observed = resume_token_position(token)
                ahead = (
                    token is not None and observed is not None and observed > max(done_lsn or 0, committer.durable_lsn)
                )
                due = pending or done_lsn is not None or now - last_idle_raise >= IDLE_POSITION_INTERVAL_S or once
                if ahead and due and token is not None and observed is not None:
                    done_lsn, done_token = observed, stored_token(RESUME_AFTER, token)
                    last_idle_raise = now
                if pending or done_lsn is not None:
                    submit()
                if once:
                    break
                self.progress.tick(None)
                continue
            mapped = mapper.feed(doc)
            event = mapped.event
            lsn = pack_cluster_time(doc["clusterTime"])
            if open_lsn is not None and lsn != open_lsn:
                complete_open()
                if len(pending) >= max_events or (pending and now - batch_started >= max_seconds):
                    submit()
            open_lsn, open_token = lsn, mapped.token
            if event is not None:
                if event.commit_lsn <= skip_below or (skip_upto is not None and event.position <= skip_upto):
                    self.skipped += 1  # re-delivered after a restart; already durable in bronze
                else:
                    if not pending:
                        batch_started = now
                    pending.append(event)
                    if len(pending) >= max_events:
                        submit(mid_transaction=True)  # a transaction larger than a batch goes in pages
            if mapped.renamed_to is not None and self._in_scope(mapped.renamed_to):
                self._snapshots.put((mapped.renamed_to.coll or "", None))
            if mapped.invalidated:
                # The stream is closed: make everything durable with a startAfter token, then reopen.
                complete_open(START_AFTER)
                submit()
                committer.drain()
                stream.close()
                log.warning("source=%s stream invalidated; reopening with startAfter", self.src.name)
                stream = self._open(client, (START_AFTER, mapped.token))
                mapper = ChangeMapper(self.scope, sorted(mapper.known))
            self.progress.tick(None)
        if pending or done_lsn is not None:
            complete_open()
            submit()
        committer.drain()

    def _in_scope(self, ns: Namespace) -> bool:
        if ns.db != self.src.database or ns.coll is None:
            return False
        return self.src.collections is None or ns.coll in self.src.collections


def positions_summary(writer: BronzeWriter, source: str) -> list[str]:
    """Status lines of a MongoDB source's writer rows (cluster times, snapshot progress)."""
    lines = []
    rows = writer.positions(source)
    for pos, updated in sorted(rows, key=lambda r: r[0].writer_id):
        ts = unpack_cluster_time(pos.durable_lsn)
        extra = ""
        if pos.writer_kind == WriterKind.SNAPSHOT and pos.resume_token:
            st = json.loads(pos.resume_token)
            extra = f", snapshot of {st.get('table')}: {st.get('pages')} pages, {st.get('rows')} rows"
        lines.append(
            f"writer {pos.writer_id} ({pos.writer_kind.value}): durable clusterTime {ts.time}.{ts.inc} "
            f"({datetime.fromtimestamp(ts.time, UTC):%Y-%m-%d %H:%M:%S} UTC){extra}, "
            f"updated {updated:%Y-%m-%d %H:%M:%S}"
        )
    if rows:
        low = unpack_cluster_time(min(p.durable_lsn for p, _ in rows))
        lines.append(f"safe bound: clusterTime {low.time}.{low.inc}")
    return lines
