"""Streams one Postgres source into bronze: slot -> ChangeBuilder -> BronzeWriter -> acknowledge.

The order of a batch is fixed (DESIGN §3): append events to Delta, raise this writer's row in
bronze.stream_positions, and only then send the slot the flush LSN. A crash anywhere re-reads
from the slot; events already in bronze are skipped by position, so none is lost or doubled.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from ingest import faults
from ingest.bronze.committer import Batch, Committer
from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, PostgresSource
from ingest.events import ChangeEvent, WriterKind, WriterPosition
from ingest.progress import Progress
from ingest.sources.postgres.admin import DRAIN_PREFIX, HEARTBEAT_PREFIX, PostgresAdmin
from ingest.sources.postgres.changes import ChangeBuilder, TxnEnd
from ingest.sources.postgres.replication import Keepalive, ReplicationStream, XLogData
from ingest.sources.postgres.snapshot import Hook, Snapshotter, SnapshotThread
from ingest.sources.postgres.values import TYPE_CATALOG_SQL, Encoder, TypeCatalog

log = logging.getLogger(__name__)

STREAM_WRITER_ID = "stream"
READ_TIMEOUT_S = 0.2
IDLE_POSITION_INTERVAL_S = 10.0  # how often an idle stream raises its row to the observed WAL end
STATUS_INTERVAL_S = 10.0  # standby status updates even when the server does not ask
# While change data keeps arriving, the loop's bookkeeping (stop flag, snapshot worker, drain,
# status, heartbeat, progress) runs once per this many messages instead of once per message: it
# cost ~1.5 us a message, a sixth of the decoder's time. Its clock is at most one burst stale.
BURST_MESSAGES = 256
# The first batch of a run is small: a fresh JVM spends seconds warming its Parquet/Delta write
# path on whatever comes first, and it does so while the next (full) batch decodes, not after it.
WARMUP_BATCH_EVENTS = 10_000


def prepare_source(src: PostgresSource) -> PostgresAdmin:
    """Check the source and create what is missing (publication, slot); returns the admin connection."""
    admin = PostgresAdmin(src)
    try:
        admin.check_server()
        admin.check_tables()
        admin.ensure_publication()
        if admin.ensure_slot():
            log.info("created slot source=%s slot=%s", src.name, src.slot_name)
    except BaseException:
        admin.close()
        raise
    return admin


class PgCatalog:
    """The ChangeBuilder's view of the source catalog: keys, type names and value encoders."""

    def __init__(self, admin: PostgresAdmin) -> None:
        """Load pg_type once; reloaded when a type created later shows up."""
        self.admin = admin
        self.types = TypeCatalog.from_rows(admin.type_catalog_rows(TYPE_CATALOG_SQL))
        self._names: dict[int, str] = {}

    def primary_key(self, relation_id: int) -> list[str]:
        """Primary-key columns of the relation, in key order."""
        return self.admin.primary_key(relation_id)

    def _known(self, type_oid: int) -> None:
        if type_oid not in self._names:
            self.types = TypeCatalog.from_rows(self.admin.type_catalog_rows(TYPE_CATALOG_SQL))
            self._names.update(self.admin.type_names([type_oid]))

    def encoder(self, type_oid: int) -> Encoder:
        """Encoder of the type's text output to JSON."""
        self._known(type_oid)
        return self.types.column_encoder(type_oid)

    def json_kind(self, type_oid: int) -> str:
        """The JSON mapping name of the type."""
        self._known(type_oid)
        return self.types.json_kind(type_oid)

    def type_name(self, type_oid: int) -> str:
        """format_type() of the type."""
        self._known(type_oid)
        return self._names.get(type_oid, str(type_oid))


class PostgresCapture:
    """Owns the stream writer of one Postgres source.

    Responsibilities: set the source up (checks, publication, slot), register the writer, stream
    and batch on transaction boundaries (a transaction larger than a batch is written in pages),
    make each batch durable before acknowledging it, heartbeat an idle source, and drain to the
    source's current position for `--once`.
    """

    def __init__(
        self,
        src: PostgresSource,
        batch: BatchConfig,
        writer: BronzeWriter,
        progress: Progress,
        snapshots: bool = True,
        snapshot_hook: Hook | None = None,
        page_rows: int | None = None,
    ) -> None:
        """Prepare to capture `src` into `writer`'s bronze tables (and run its snapshots beside it)."""
        self.src = src
        self.snapshots = snapshots
        self.snapshotter = Snapshotter(src, writer, page_rows, snapshot_hook)
        self.snapshotter.progress = progress
        self.batch = batch
        self.writer = writer
        self.progress = progress
        self.durable_lsn = 0
        self.ack_lsn = 0
        self.started_at = datetime.now(UTC)
        self.skipped = 0

    def _register(self, admin: PostgresAdmin) -> None:
        self.writer.ensure_tables()
        mine = [(p, t) for p, t in self.writer.positions(self.src.name) if p.writer_id == STREAM_WRITER_ID]
        if mine:
            self.durable_lsn, self.ack_lsn = mine[0][0].durable_lsn, mine[0][0].ack_lsn
            return
        # A new writer starts where the slot starts: nothing before it will ever be sent.
        self.durable_lsn = self.ack_lsn = admin.slot_health().confirmed_flush_lsn or 0
        self.writer.raise_position(
            WriterPosition(self.src.name, STREAM_WRITER_ID, WriterKind.STREAM, self.durable_lsn, self.ack_lsn),
            self.started_at,
        )

    def run(self, once: bool, should_stop: Callable[[], bool]) -> None:
        """Capture until `should_stop()` (or, with `once`, until the source's current position)."""
        admin = prepare_source(self.src)
        try:
            t0 = time.monotonic()
            self._register(admin)
            skip_upto = self.writer.last_event_position(self.src.name, STREAM_WRITER_ID, self.durable_lsn)
            known = self.writer.known_shapes(self.src.name)
            log.info(
                "registered source=%s writer=%s durable_lsn=%d skip_upto=%s seconds=%.1f",
                self.src.name,
                STREAM_WRITER_ID,
                self.durable_lsn,
                skip_upto,
                time.monotonic() - t0,
            )
            committer = Committer(
                self.writer,
                self.src.name,
                "postgres",
                STREAM_WRITER_ID,
                WriterKind.STREAM,
                self.started_at,
                self.durable_lsn,
                self.ack_lsn,
                self.progress,
            )
            stream = ReplicationStream(self.src.dsn, self.src.slot_name, self.src.publication_name)
            snapshots: SnapshotThread | None = None
            try:
                stream.open()
                if self.snapshots:
                    # Registered after the stream writer: each snapshot writer starts at the safe bound.
                    self.snapshotter.load()
                    if self.src.snapshot.initial:
                        self.snapshotter.request_initial(lambda: admin.slot_health().current_wal_lsn)
                    snapshots = SnapshotThread(self.snapshotter, should_stop, poll_requests=not once)
                self._loop(
                    admin,
                    stream,
                    committer,
                    ChangeBuilder(PgCatalog(admin)),
                    known,
                    skip_upto,
                    once,
                    should_stop,
                    snapshots,
                )
            finally:
                if snapshots is not None:
                    snapshots.stop()
                committer.close()
                stream.close()
                self.durable_lsn, self.ack_lsn = committer.durable_lsn, committer.ack_lsn
        finally:
            admin.close()

    def _loop(
        self,
        admin: PostgresAdmin,
        stream: ReplicationStream,
        committer: Committer,
        builder: ChangeBuilder,
        known: set[str],
        skip_upto: tuple[int, int] | None,
        once: bool,
        should_stop: Callable[[], bool],
        snapshots: SnapshotThread | None = None,
    ) -> None:
        # --once drains to a marker emitted once the snapshots are done, so that the stream passes
        # every page's watermark before the run ends (a page is usable only below the safe bound).
        drain_token = uuid.uuid4().hex if once else None
        drain_emitted = False
        drained = False
        pending: list[ChangeEvent] = []
        end_lsns: dict[int, int] = {}  # commit LSN -> end LSN for the transactions in `pending`
        completed: TxnEnd | None = None  # the last transaction end not yet handed to the committer
        batch_started = 0.0
        last_activity = last_status = last_idle_raise = time.monotonic()
        sent_ack = self.ack_lsn
        wal_end = observed = self.ack_lsn
        skip_below = self.durable_lsn  # re-delivered: committed at or below our durable position
        max_seconds = self.batch.max_seconds
        max_events = min(self.batch.max_events, WARMUP_BATCH_EVENTS)

        def submit() -> None:
            nonlocal completed, max_events
            max_events = self.batch.max_events
            shapes = [sh for sh in builder.new_shapes if sh.shape_hash not in known]
            builder.new_shapes.clear()
            known.update(sh.shape_hash for sh in shapes)
            batch = Batch(list(pending), shapes, mid_transaction=builder.in_txn, end_lsns=dict(end_lsns))
            if completed is not None:
                batch.durable_lsn, batch.ack_lsn = completed.commit_lsn, completed.end_lsn
                completed = None
            pending.clear()
            end_lsns.clear()
            committer.submit(batch)

        burst = 0  # XLogData messages handled since the last bookkeeping
        now = time.monotonic()
        while True:
            if burst == 0:
                if should_stop():
                    break
                now = time.monotonic()
                if snapshots is not None:
                    snapshots.check()
                if drain_token and not drain_emitted and (snapshots is None or snapshots.done):
                    admin.emit_message(DRAIN_PREFIX, drain_token)
                    drain_emitted = True
            msg = stream.read(READ_TIMEOUT_S)
            if isinstance(msg, XLogData):
                last_activity = now
                wal_end = max(wal_end, msg.wal_end)
                out = builder.feed_payload(msg.payload)
                if out is None:
                    pass
                elif isinstance(out, TxnEnd):
                    completed = out
                    end_lsns[out.commit_lsn] = out.end_lsn
                    if drained or len(pending) >= max_events or (pending and now - batch_started >= max_seconds):
                        submit()
                    if drained:
                        break
                else:
                    if not builder.in_txn:  # a non-transactional logical message: a unit of its own
                        out = out._replace(commit_ts_us=int(time.time() * 1_000_000))
                        completed = TxnEnd(out.commit_lsn, out.commit_lsn, out.commit_ts_us)
                        end_lsns[out.commit_lsn] = out.commit_lsn
                    if drain_token and out.message_prefix == DRAIN_PREFIX and out.message_content == drain_token:
                        drained = True
                    if out.commit_lsn <= skip_below or (skip_upto is not None and out.position <= skip_upto):
                        self.skipped += 1  # re-delivered after a restart; already durable in bronze
                    else:
                        if not pending:
                            batch_started = now
                        pending.append(out)
                        if len(pending) >= max_events and builder.in_txn:
                            submit()  # a transaction larger than a batch goes to bronze in pages
                burst = (burst + 1) % BURST_MESSAGES
                if burst:
                    continue
            elif isinstance(msg, Keepalive):
                burst = 0
                wal_end = max(wal_end, msg.wal_end)
                # A keepalive's LSN is how far the server has decoded (sentPtr): every transaction that
                # committed before it has been sent. (XLogData's wal_end is the server's WAL end: not that.)
                observed = max(observed, msg.wal_end)
                idle = not builder.in_txn and not pending and completed is None and committer.idle
                if idle and observed > committer.ack_lsn and now - last_idle_raise >= IDLE_POSITION_INTERVAL_S:
                    # Everything up to `observed` is durable: an idle writer reports what it observed.
                    committer.submit(Batch([], durable_lsn=observed, ack_lsn=observed))
                    last_idle_raise = now
                if msg.reply_requested:
                    last_status = 0.0  # answer below
            else:
                burst = 0
                if (pending or completed is not None) and not builder.in_txn and now - batch_started >= max_seconds:
                    submit()
            if committer.ack_lsn > sent_ack or now - last_status >= STATUS_INTERVAL_S:
                sent_ack = committer.ack_lsn
                stream.send_status(sent_ack)
                faults.hit("after_ack")
                last_status = now
            if not once and now - last_activity >= self.src.heartbeat_seconds:
                admin.emit_message(HEARTBEAT_PREFIX, datetime.now(UTC).isoformat())
                last_activity = now
            self.progress.tick(max(0, wal_end - committer.durable_lsn))
        # Stopping: make what we have durable (a partial transaction is re-read next time), then ack.
        if pending or completed is not None:
            submit()
        committer.drain()
        if not builder.in_txn and observed > committer.durable_lsn and not drained:
            committer.submit(Batch([], durable_lsn=observed, ack_lsn=observed))
            committer.drain()
        if committer.ack_lsn > sent_ack:
            stream.send_status(committer.ack_lsn)
            faults.hit("after_ack")
