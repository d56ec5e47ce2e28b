"""Streams one MongoDB source into bronze: change stream -> ChangeMapper -> BronzeWriter -> resume token.

The order of a batch is fixed (DESIGN §3): append events to Delta, then raise this writer's row in
bronze.stream_positions with the resume token in the same row: storing the token *is* the
acknowledgement. A crash anywhere resumes from the last stored token; events already in bronze
are skipped by position. Snapshots run on a thread next to the stream (DESIGN §5): the stream
never waits for them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo import MongoClient
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure

from ingest import faults
from ingest.bronze.committer import Batch, Committer
from ingest.bronze.writer import BronzeWriter
from ingest.capture.batcher import CommitSink, Resume, TransactionBatcher
from ingest.capture.retry import reached_source
from ingest.capture.snapshots import SnapshotThread
from ingest.config import BatchConfig, MongoSource
from ingest.events import Action, ChangeEvent, SourceKind, WriterKind, WriterPosition
from ingest.positions import STREAM_WRITER_ID, SnapshotProgress, SourcePositions
from ingest.progress import Progress
from ingest.sources.mongodb import compat
from ingest.sources.mongodb.changes import (
    ChangeMapper,
    Namespace,
    pack_cluster_time,
    resume_token_position,
    unpack_cluster_time,
)
from ingest.sources.mongodb.rules import newly_ruled, record_rules, recorded_rules, rules_now
from ingest.sources.mongodb.snapshot import MongoSnapshotter, request_snapshot
from ingest.sources.mongodb.source import (
    SYSTEM_PREFIX,
    StreamHistoryLostError,
    cluster_time,
    collections,
    connect,
    log_selection,
    scope,
    translate,
    user_collections,
)
from ingest.sources.mongodb.stream import RESUME_AFTER, START_AFTER, open_stream, parse_stored_token, stored_token

log = logging.getLogger(__name__)

SNAPSHOT_POLL_S = 0.5
REQUEST_POLL_S = 5.0  # how often an idle snapshot worker looks for `snapshot` requests in bronze


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
        self.selection = src.selection
        self.durable_lsn = 0
        self.snapshots_done: list[str] = []
        self.started_at = datetime.now(UTC)
        self._snapshots: queue.Queue[tuple[str, SnapshotProgress | None]] = queue.Queue()
        self._queued: set[str] = set()  # snapshot writers taken from bronze into the queue
        self._stream_done = threading.Event()  # the stream ended: the snapshot worker ends when its queue is empty
        self.batcher: TransactionBatcher | None = None
        self.mapper: ChangeMapper | None = None

    @property
    def skipped(self) -> int:
        """Events a restart re-delivered that were durable already (not appended again)."""
        return self.batcher.skipped if self.batcher is not None else 0

    @property
    def out_of_scope(self) -> int:
        """Events of collections outside the selection the stream carried and skipped (a database-wide stream)."""
        return sum(self.mapper.skipped.values()) if self.mapper is not None else 0

    # -- registration -------------------------------------------------------------------------

    def _register(
        self, client: MongoClient[dict[str, Any]], positions: SourcePositions
    ) -> tuple[str, Mapping[str, Any]] | None:
        mine = positions.stream
        if mine is not None:
            self.durable_lsn = mine.durable_lsn
            return parse_stored_token(mine.resume_token)
        # A new writer starts at the server's current cluster time: the time of the newest write it
        # has applied, so an event at exactly that time happened before (the snapshots cover it).
        self.durable_lsn = pack_cluster_time(cluster_time(client))
        self._raise_row(None)
        return None

    def _raise_row(self, token: str | None) -> None:
        pos = WriterPosition(
            self.src.name, STREAM_WRITER_ID, WriterKind.STREAM, self.durable_lsn, self.durable_lsn, token
        )
        self.writer.raise_position(pos, self.started_at)

    def _plan_snapshots(self, client: MongoClient[dict[str, Any]]) -> None:
        """Queue resumed snapshots (their writer rows) and collections never snapshotted.

        A filtered snapshot reads only some documents: it is neither a completed snapshot nor one
        that stands in for the collection's first.
        """
        running = {p.table for p in self._poll_requests() if p.where is None}
        done = self.writer.completed_snapshots(self.src.name)
        names = collections(client, self.src)
        if self.selection.has_patterns:
            log_selection(self.src, user_collections(client, self.src))
            log.info("source=%s: the selection matches %s", self.src.name, ", ".join(names) or "no collection yet")
        for coll in names:
            table = f"{self.src.database}.{coll}"
            if table not in done and table not in running:
                self._snapshots.put((coll, None))

    def _follow_rules(self, client: MongoClient[dict[str, Any]]) -> None:
        """Re-snapshot each collection a rule began to exclude or mask a field of since the last run (rules.py).

        The request is durable before the new rules are recorded: an interruption between them asks
        again at the next start (a spare snapshot), never leaves plain values without one.
        """
        now = rules_now(self.src.masks(), self.src.columns)
        last = recorded_rules(self.writer, self.src.name)
        if last is not None and last.rules == now:
            return
        # No record yet (a new source, or bronze from before rules were recorded): nothing to compare with.
        for coll, fields in newly_ruled(last.rules, now).items() if last is not None else ():
            log.warning(
                "source=%s collection %s.%s: field %s became masked or excluded: re-snapshotting it (the snapshot "
                "rewrites every record with the rule applied; bronze and silver history from before holds the values "
                "as they were: docs/masking.md)",
                self.src.name,
                self.src.database,
                coll,
                ", ".join(fields),
            )
            request_snapshot(self.src, client, self.writer, coll)
        record_rules(self.writer, self.src.name, now, self.durable_lsn, last)

    def _poll_requests(self) -> list[SnapshotProgress]:
        """Queue snapshot writers registered in bronze and not yet queued (resumed, or `snapshot` requests)."""
        new = [p for p in SourcePositions.read(self.writer, self.src.name).snapshots if p.writer_id not in self._queued]
        for progress in new:
            self._queued.add(progress.writer_id)
            self._snapshots.put((progress.table.split(".", 1)[1], progress))
        return new

    # -- the run ------------------------------------------------------------------------------

    def run(self, once: bool, should_stop: Callable[[], bool]) -> None:
        """Capture until `should_stop()`, or with `once` until the stream is drained and snapshots are done."""
        client = connect(self.src)
        try:
            self.writer.ensure_tables()
            stored = self._register(client, SourcePositions.read(self.writer, self.src.name))
            resume = Resume(
                self.durable_lsn, self.writer.last_event_position(self.src.name, STREAM_WRITER_ID, self.durable_lsn)
            )
            self._follow_rules(client)
            self._plan_snapshots(client)
            self._stream_done.clear()
            snapshots = SnapshotThread(self.src.name, lambda stop: self._snapshot_worker(client, stop), should_stop)
            try:
                self._stream(client, stored, resume, once, should_stop, snapshots)
            except BaseException:
                snapshots.stop()
                raise
            self._stream_done.set()
            snapshots.join()
            snapshots.check()
        finally:
            client.close()

    def _snapshot_worker(self, client: MongoClient[dict[str, Any]], should_stop: Callable[[], bool]) -> None:
        """Run queued snapshots one at a time until stopped, or (after the stream ended) none is left."""
        last_poll = time.monotonic()
        while not should_stop():
            try:
                coll, state = self._snapshots.get(timeout=SNAPSHOT_POLL_S)
            except queue.Empty:
                if self._stream_done.is_set() and self._snapshots.empty():
                    # A last look at the writer rows: a request registered while the stream ran (a
                    # collection renamed into the selection) is taken by this run, not the next.
                    if self._poll_requests():
                        continue
                    return
                if time.monotonic() - last_poll >= REQUEST_POLL_S:
                    self._poll_requests()
                    last_poll = time.monotonic()
                continue
            snapshotter = MongoSnapshotter(self.src, client, self.writer, coll, state)
            if snapshotter.run(should_stop):
                self.snapshots_done.append(snapshotter.ns.qualified)

    def _open(
        self, client: MongoClient[dict[str, Any]], stored: tuple[str, Mapping[str, Any]] | None
    ) -> ChangeStream[Any]:
        return open_stream(client, self.src, self.scope, stored, self.durable_lsn)

    def _recover_history_lost(self, client: MongoClient[dict[str, Any]], committer: Committer) -> ChangeEvent:
        """`on_history_lost: resnapshot`: tombstone every collection now; the stream restarts here.

        With patterns in the selection (or the whole database), "every collection" includes those
        bronze holds that the selection matches and are gone now: one dropped during the lost
        window, whose drop event fell off the oplog, would otherwise keep its rows live in silver
        forever.
        """
        now = pack_cluster_time(cluster_time(client))
        names = collections(client, self.src)
        self._request_snapshots(names, now)
        faults.hit("recovery_after_snapshot_requests")
        gone: set[str] = set()
        if self.selection.has_patterns:
            gone = {
                table
                for db, table in self.writer.captured_tables(self.src.name)
                if db == self.src.database and table not in names and self._selected(table)
            }
        tables = tuple(f"{self.src.database}.{c}" for c in [*names, *sorted(gone)]) or (self.scope.qualified,)
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
        faults.hit("recovery_after_position")
        return event

    def _request_snapshots(self, names: list[str], at: int) -> None:
        """Register a snapshot writer per collection at `at` (one commit), then queue them.

        Durable before the tombstone, so that no interruption leaves a tombstone without its
        snapshots: the stream row, once raised past the lost history, no longer says anything
        was lost. At `at`, the tombstone's position, every page lies after the tombstone (a page
        is read above its writer's row). A writer from an interrupted recovery is not reused:
        the snapshot thread may be reading it already, below this tombstone.
        """
        progress = [SnapshotProgress(f"{self.src.database}.{c}", str(uuid.uuid4())) for c in names]
        now = datetime.now(UTC)
        rows = [WriterPosition(self.src.name, p.writer_id, WriterKind.SNAPSHOT, at, at, p.to_json()) for p in progress]
        self.writer.raise_positions([(row, now) for row in rows])
        self._poll_requests()

    def _stream(
        self,
        client: MongoClient[dict[str, Any]],
        stored: tuple[str, Mapping[str, Any]] | None,
        resume: Resume,
        once: bool,
        should_stop: Callable[[], bool],
        snapshots: SnapshotThread | None = None,
    ) -> None:
        committer = Committer(
            self.writer,
            self.src.name,
            SourceKind.MONGODB,
            STREAM_WRITER_ID,
            WriterKind.STREAM,
            self.started_at,
            self.durable_lsn,
            self.durable_lsn,
            self.progress,
            max_batch_bytes=self.batch.max_bytes,
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
                resume = Resume(self.durable_lsn, resume.last_in_bronze)
                stored = None
                stream = self._open(client, stored)
            reached_source()  # the change stream is open: a later failure is a new outage
            try:
                self._loop(client, stream, committer, resume, once, should_stop, snapshots)
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
        committer: CommitSink,
        resume: Resume,
        once: bool,
        should_stop: Callable[[], bool],
        snapshots: SnapshotThread | None = None,
    ) -> None:
        """The protocol side of the stream: read, map, reopen after an invalidate, the post-batch token.

        Batching, re-delivery skips and position raises are the shared TransactionBatcher's. A
        transaction here is the events sharing one clusterTime.
        """
        known = collections(client, self.src) if self.scope.coll is None else ()
        mapper = self.mapper = ChangeMapper(self.scope, known, self.src.masks(), self._selected)
        batcher = TransactionBatcher(committer, self.batch, resume)
        self.batcher = batcher
        open_lsn: int | None = None  # the transaction whose events are still arriving
        open_token: Mapping[str, Any] | None = None

        def complete_open(now: float, kind: str = RESUME_AFTER) -> None:
            nonlocal open_lsn, open_token
            if open_lsn is not None and open_token is not None:
                batcher.end_transaction(open_lsn, open_lsn, now, stored_token(kind, open_token))
            open_lsn = open_token = None

        while not should_stop():
            now = time.monotonic()
            if snapshots is not None:
                snapshots.check()
            try:
                doc = stream.try_next()
            except OperationFailure as e:
                raise translate(self.src, e) from e
            if doc is None:
                token = stream.resume_token
                observed = resume_token_position(token)
                # The open clusterTime is complete once the server's post-batch token has passed it.
                # A token at that same time is a high-water mark that sorts before events at it: on a
                # sharded cluster another shard's event at that time may still come (review D4).
                passed = open_lsn is None or (observed is not None and observed > open_lsn)
                if passed or (token == open_token and compat.no_post_batch_token(self.src.name)):
                    complete_open(now)
                if open_lsn is None and token is not None and observed is not None:
                    batcher.observe(observed, now, stored_token(RESUME_AFTER, token), force=once)
                if batcher.has_work:
                    batcher.submit(mid_transaction=open_lsn is not None)
                if once:
                    break
                self.progress.tick(None)
                continue
            mapped = mapper.feed(doc)
            lsn = pack_cluster_time(doc["clusterTime"])
            if open_lsn is not None and lsn != open_lsn:
                complete_open(now)
            open_lsn, open_token = lsn, mapped.token
            if mapped.event is not None:
                batcher.add(mapped.event, now)
            if mapped.renamed_to is not None and self._in_scope(mapped.renamed_to):
                self._snapshot_renamed(client, mapped.renamed_to, lsn)
            if mapped.invalidated:
                # The stream is closed: make everything durable with a startAfter token, then reopen.
                complete_open(now, START_AFTER)
                batcher.submit()
                committer.drain()
                stream.close()
                log.warning("source=%s stream invalidated; reopening with startAfter", self.src.name)
                stream = self._open(client, (START_AFTER, mapped.token))
                skipped = mapper.skipped
                mapper = self.mapper = ChangeMapper(self.scope, sorted(mapper.known), mapper.masks, self._selected)
                mapper.skipped = skipped
            self.progress.tick(None)
        # Stopping: what was read goes to bronze, but a clusterTime still open is not taken as
        # complete (the next run re-reads it from the last stored token and skips what is here).
        if batcher.has_work:
            batcher.submit(mid_transaction=open_lsn is not None)
        committer.drain()

    def _selected(self, coll: str) -> bool:
        """Whether collection `coll` of the database is captured (matched by the selection, not a system one)."""
        return not coll.startswith(SYSTEM_PREFIX) and self.selection.matches((coll,))

    def _in_scope(self, ns: Namespace) -> bool:
        return ns.db == self.src.database and ns.coll is not None and self._selected(ns.coll)

    def _snapshot_renamed(self, client: MongoClient[dict[str, Any]], target: Namespace, lsn: int) -> None:
        """Request a snapshot of a collection renamed into the selection: the stream never carried its documents.

        Its old name's rows (if it was captured) were tombstoned by the rename event; under the new
        name every document arrives with the snapshot, and its later changes with the stream. The
        request is a snapshot writer registered in bronze (request_snapshot, as the `snapshot`
        command does), so a run that stops before the snapshot completes leaves it to the next one;
        the snapshot worker picks it up when it polls the writer rows.
        """
        ts = unpack_cluster_time(lsn)
        log.warning(
            "source=%s: collection %s was renamed into the selection at clusterTime %d.%d: snapshotting it",
            self.src.name,
            target.qualified,
            ts.time,
            ts.inc,
        )
        request_snapshot(self.src, client, self.writer, target.coll or "")
