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
from dataclasses import replace
from datetime import UTC, datetime

from ingest import faults
from ingest.bronze.committer import Committer
from ingest.bronze.writer import BronzeWriter
from ingest.capture.batcher import Resume, TransactionBatcher, boundary_position
from ingest.capture.retry import reached_source
from ingest.capture.snapshots import SnapshotThread
from ingest.config import BatchConfig, PostgresSource
from ingest.errors import SlotGapError, SourceError, SourceUnavailableError
from ingest.events import Action, ChangeEvent, RelationShape, SourceKind, WriterKind, WriterPosition, int_to_lsn
from ingest.positions import STREAM_WRITER_ID, SourcePositions
from ingest.progress import Progress
from ingest.sources.postgres.admin import DRAIN_PREFIX, HEARTBEAT_PREFIX, PostgresAdmin, SlotHealth, prepare_source
from ingest.sources.postgres.catalog import PgCatalog
from ingest.sources.postgres.changes import Catalog, ChangeBuilder, TxnEnd, table_gone_prefix
from ingest.sources.postgres.gap import unseen_transactions
from ingest.sources.postgres.history import advance_slot, first_difference, redelivered_transactions
from ingest.sources.postgres.inflight import inflight_decoders
from ingest.sources.postgres.membership import MembershipWatch, decode, encode
from ingest.sources.postgres.pages import Hook
from ingest.sources.postgres.published import publish_again
from ingest.sources.postgres.replication import Keepalive, ReplicationStream, XLogData, application_name
from ingest.sources.postgres.restart_point import advance_restart_point, pass_restart_point
from ingest.sources.postgres.schema_changes import relation_now, report_shape_change, resnapshot_reason, with_attnums
from ingest.sources.postgres.scope import ScopeWatch
from ingest.sources.postgres.snapshot import Snapshotter, cannot_snapshot
from ingest.sources.postgres.streamed import DecodedTransaction

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 0.2
# `--once` emits its drain marker when the snapshot thread has finished, which the loop sees only
# between reads: until then it reads with this shorter timeout, so that a quiet source's run does
# not wait out a whole READ_TIMEOUT_S after the thread ended (0.2 s of every short `run --once`).
DRAIN_PENDING_READ_TIMEOUT_S = 0.02
HISTORY_LOST_PREFIX = "changelake.historyLost"  # message_prefix of the tombstone a gap recovery writes
UNSEEN_SHOWN = 5  # xids a recovery's warning names
STATUS_INTERVAL_S = 10.0  # standby status updates even when the server does not ask
# ... and while a submit waits for a slow commit: well inside wal_sender_timeout (60 s default)
KEEPALIVE_WHILE_WAITING_S = 5.0
# How long the start waits for the walsender of an earlier run to let the slot go, so that the
# slot's confirmed position it reads is final (see PostgresCapture._released_slot_health).
SLOT_RELEASE_WAIT_S = 10.0
# A server asked for a reply every STATUS_INTERVAL_S that stays silent this long is unreachable.
SERVER_SILENCE_S = 3 * STATUS_INTERVAL_S
# While change data keeps arriving, the loop's bookkeeping (stop flag, snapshot worker, drain,
# status, heartbeat, progress) runs once per this many messages instead of once per message: it
# cost ~1.5 us a message, a sixth of the decoder's time. Its clock is at most one burst stale.
BURST_MESSAGES = 256
# The first batch of a run is small, so that the commit thread starts writing while the next
# (full) batch decodes instead of after it.
WARMUP_BATCH_EVENTS = 10_000
# A continuous run compares the configured tables' catalog shapes and relations with the recorded
# ones this often: a change that alters rows without WAL (ADD COLUMN ... DEFAULT), or a table
# replaced under its name (never in the publication), sends nothing the stream could meet.
SHAPE_CHECK_INTERVAL_S = 60.0


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
        self.snapshotter = Snapshotter(src, writer, page_rows, snapshot_hook, progress)
        self.batch = batch
        self.writer = writer
        self.progress = progress
        self.durable_lsn = 0
        self.ack_lsn = 0
        self.started_at = datetime.now(UTC)
        self.batcher: TransactionBatcher | None = None
        self.membership = MembershipWatch({})  # what bronze recorded, read at start (run)

    @property
    def skipped(self) -> int:
        """Events a restart re-delivered that were durable already (not appended again)."""
        return self.batcher.skipped if self.batcher is not None else 0

    def _register(self, admin: PostgresAdmin, positions: SourcePositions) -> None:
        mine = positions.stream
        if mine is not None:
            self.durable_lsn, self.ack_lsn = mine.durable_lsn, mine.ack_lsn
            self._check_continuity(admin, mine)
            return
        # A new writer starts where the slot starts: nothing before it will ever be sent. The slot's
        # position is a boundary: a transaction committing exactly there is still to come.
        self.ack_lsn = self._released_slot_health(admin).confirmed_flush_lsn or 0
        self.durable_lsn = boundary_position(self.ack_lsn)
        self.writer.raise_position(
            WriterPosition(self.src.name, STREAM_WRITER_ID, WriterKind.STREAM, self.durable_lsn, self.ack_lsn),
            self.started_at,
        )

    def _released_slot_health(self, admin: PostgresAdmin) -> SlotHealth:
        """The slot's health once no walsender holds it (or after SLOT_RELEASE_WAIT_S, as it is then).

        The walsender of the run before this one can outlive its client for a moment: it reads the
        client's last status update (raising the confirmed position up to what bronze holds) and
        only then lets the slot go. A confirmed position read before that is stale, and the history
        check would peek a slot that has moved on since: bronze's transactions in between would be
        missing from what it re-delivers, a false "restored source" (seen once on PostgreSQL 16 in
        the matrix's keyless snapshot test). Read once the slot is free, the position is final; a
        slot still held after the wait is another reader's, which the peek or START_REPLICATION
        then reports as in use (transient: the run retries).
        """
        deadline = time.monotonic() + SLOT_RELEASE_WAIT_S
        h = admin.slot_health()
        while h.active_pid is not None and time.monotonic() < deadline:
            time.sleep(0.05)
            h = admin.slot_health()
        return h

    def _check_continuity(self, admin: PostgresAdmin, mine: WriterPosition) -> None:
        """The slot must continue where bronze left off (review finding D2); else fail, or recover.

        Two ways it does not: the server's WAL is behind what bronze holds (the source was restored,
        or failed over to a replica that was behind: its LSNs will repeat, so nothing can be ordered
        after bronze), or the slot's confirmed position is past what ingest ever acknowledged (the slot
        was dropped and recreated, invalidated and recreated, or advanced by someone else: the changes
        in between are gone). Ingest only ever acknowledges what its row records, so neither happens
        in its own operation.
        """
        h = self._released_slot_health(admin)
        name, slot = self.src.name, self.src.slot_name
        if h.current_wal_lsn < mine.durable_lsn:
            raise SlotGapError(
                f"source {name!r}: the server's WAL position {int_to_lsn(h.current_wal_lsn)} is behind what bronze "
                f"already holds ({int_to_lsn(mine.durable_lsn)}): the database was restored or failed over to a "
                "replica that was behind, and its new changes would reuse positions bronze has. Capture it as a new "
                "source (a new `name`: a fresh slot, publication and snapshot), and retire the old source's rows."
            )
        if h.confirmed_flush_lsn is not None and h.confirmed_flush_lsn <= mine.durable_lsn:
            if self._same_history(admin, h.confirmed_flush_lsn, mine.durable_lsn):
                return
            h = admin.slot_health()  # moved to the server's present: a gap now, recovered below
        if h.confirmed_flush_lsn is None or h.confirmed_flush_lsn <= mine.ack_lsn:
            return
        gap = (
            f"source {name!r}: slot {slot!r} starts at {int_to_lsn(h.confirmed_flush_lsn)}, past what bronze "
            f"acknowledged ({int_to_lsn(mine.ack_lsn)}): the slot was dropped and recreated, advanced by another "
            "client, or this is a promoted standby that had not synchronized it (a failover slot needs "
            "PostgreSQL 17 and sync_replication_slots on the standby: docs/postgres.md, Failover), and the changes "
            "in between are not in bronze"
        )
        if self.src.on_history_lost != "resnapshot":
            raise SlotGapError(
                gap + ". Recover: set `on_history_lost: resnapshot` on the source and run again (it snapshots every "
                "table afresh, and silver tombstones the rows the tables no longer have)."
            )
        log.warning("%s; re-snapshotting every table", gap)
        self._recover_gap(admin, h.confirmed_flush_lsn)

    def _same_history(self, admin: PostgresAdmin, slot_start: int, durable_lsn: int) -> bool:
        """Whether the slot re-delivers bronze's transactions from `slot_start` to `durable_lsn` (history.py).

        If not, the server's history is not the one bronze read (restored from a storage snapshot,
        or failed over to a standby that was behind), and skipping its transactions as re-delivered
        would lose them: an error, or with `on_history_lost: resnapshot` the slot is moved to the
        server's present, which the caller then recovers as a gap (returns False). A crash in
        between leaves just that gap for the next start.
        """
        bronze = self.writer.transactions(self.src.name, STREAM_WRITER_ID, slot_start, durable_lsn)
        diff = first_difference(bronze, redelivered_transactions(self.src, durable_lsn))
        if diff is None:
            return True
        lost = (
            f"source {self.src.name!r}: slot {self.src.slot_name!r} does not re-deliver what bronze holds from "
            f"{int_to_lsn(slot_start)} to {int_to_lsn(durable_lsn)} ({diff}): the database was restored from a "
            "storage snapshot or failed over to a standby that was behind, and its transactions at positions "
            "bronze already holds would be skipped as re-delivered"
        )
        if self.src.on_history_lost != "resnapshot":
            raise SlotGapError(
                lost + ". Recover: set `on_history_lost: resnapshot` on the source and run again (it moves the slot "
                "to the server's current position and snapshots every table afresh), or "
                "capture the database as a new source (a new `name`)."
            )
        log.warning("%s; moving the slot to the server's current position", lost)
        advance_slot(self.src)
        return False

    def _recover_gap(self, admin: PostgresAdmin, slot_start: int) -> None:
        """Re-snapshot every table whole and move the stream row to the slot's start.

        A whole-table snapshot mends silver without emptying it (docs/snapshots.md, "Re-snapshots
        find deletes"): a key the gap changed or inserted comes back with its page row, a key it
        deleted gets an absent tombstone, an unchanged key a snapshot version of the same record.
        A truncate just below the slot's start (after everything bronze holds, before anything the
        slot will send) is written only for what snapshots cannot mend (`_tables_to_tombstone`).

        The order makes an interruption harmless. The snapshot writers are registered first, so
        a tombstone is never durable without them; the stream row moves last, and until it does
        the slot still starts past what bronze acknowledged, so the next start meets the gap again
        and finishes the recovery: writers that have read nothing yet are reused, and the
        tombstone's append is a no-op once it is in bronze (its Delta transaction identity).
        """
        at = boundary_position(slot_start)
        pending = self._unread_snapshots()
        self.snapshotter.request(
            [t for t in self.src.tables if t not in pending], lambda: admin.slot_health().current_wal_lsn
        )
        faults.hit("recovery_after_snapshot_requests")
        truncated = self._tables_to_tombstone(admin)
        if truncated:
            first_schema, first_table = truncated[0].split(".", 1)
            tombstone = ChangeEvent(
                commit_lsn=at,
                commit_index=0,
                xid=0,
                commit_ts_us=int(time.time() * 1_000_000),
                action=Action.TRUNCATE,
                table_schema=first_schema,
                table_name=first_table,
                truncated_tables=tuple(truncated),
                message_prefix=HISTORY_LOST_PREFIX,
            )
            self.writer.append_events(
                self.src.name, SourceKind.POSTGRES, STREAM_WRITER_ID, [tombstone], {at: slot_start}
            )
        faults.hit("recovery_after_tombstone")
        self.durable_lsn, self.ack_lsn = at, slot_start
        self.writer.raise_position(
            WriterPosition(self.src.name, STREAM_WRITER_ID, WriterKind.STREAM, at, slot_start), self.started_at
        )
        faults.hit("recovery_after_position")

    def _tables_to_tombstone(self, admin: PostgresAdmin) -> list[str]:
        """The configured tables a gap recovery truncates: those its snapshots cannot mend.

        Every table when bronze holds a transaction the server's snapshots may not see (gap.py: a
        history the server no longer has, or one more than 2^31 transactions back): the pages would
        count its events as changes they could not see. Otherwise only the tables that cannot be
        snapshotted (`cannot_snapshot`): their records end deleted and come back as their rows change,
        as before whole-table snapshots found deletes. Decided again at each attempt, from what is
        durable: either answer leaves silver right, and the rows a snapshot reads lie after a
        truncate an earlier attempt wrote.
        """
        unseen = unseen_transactions(admin, self.writer, self.src.name)
        if unseen:
            log.warning(
                "source=%s bronze holds %d transaction(s) the server's snapshots may not see (xids %s%s: a history "
                "the server no longer has, or more than 2^31 transactions old): tombstoning every table before "
                "its re-snapshot",
                self.src.name,
                len(unseen),
                ", ".join(map(str, unseen[:UNSEEN_SHOWN])),
                ", ..." if len(unseen) > UNSEEN_SHOWN else "",
            )
            return list(self.src.tables)
        refused = [(t, r) for t in self.src.tables if (r := cannot_snapshot(admin, t)) is not None]
        for table, reason in refused:
            log.warning("table %s cannot be snapshotted (%s): tombstoning its records", table, reason)
        return [t for t, _ in refused]

    def _unread_snapshots(self) -> set[str]:
        """Tables with a whole-table snapshot registered that has no page in bronze yet.

        Every page such a snapshot reads lies after the slot's start (and after a tombstone written
        now), so it can serve the recovery (an interrupted one registered it). A snapshot with pages
        may have read some before the gap: they miss the gap's changes (a tombstone would delete
        their rows, and a key the gap deleted in their range would not be found absent), so its
        table gets a new one.
        """
        return {
            t.table
            for t in self.snapshotter.load()
            if t.keys is None
            and t.where is None
            and self.writer.last_durable_page(self.src.name, t.snapshot_id) is None
        }

    def _resnapshot_if_rows_changed(self, admin: PostgresAdmin, before: RelationShape, after: RelationShape) -> None:
        """Re-snapshot a configured table whose shape change altered existing rows (W9, DESIGN §7.7).

        `ADD COLUMN ... DEFAULT`, DROP, RENAME or retype of a column (schema_changes.py). The
        snapshot's pages replace every record's value (DESIGN §5 places them). Always a new request:
        a queued snapshot of the table may have read pages already (its writer row's progress lags
        its durable pages), and a spare snapshot costs a read, not correctness. With `run --once` a request made
        after the run's snapshots finished is performed by the next run.
        """
        table = f"{after.table_schema}.{after.table_name}"
        report_shape_change(admin, before, after)
        if not self.snapshots or table not in self.src.tables:
            return
        if before.relation_id != after.relation_id:
            self._table_replaced(admin, table, before, after)
            return
        reason = resnapshot_reason(admin, before, after)
        if reason is None:
            return
        refusal = cannot_snapshot(admin, table)
        if refusal is not None:  # queued, it would only be dropped by the snapshotter
            log.warning("table %s changed shape (%s), and cannot be re-snapshotted: %s", table, reason, refusal)
            return
        log.warning("table %s changed shape (%s): re-snapshotting it", table, reason)
        self.snapshotter.request([table], lambda: admin.slot_health().current_wal_lsn)

    def _table_replaced(self, admin: PostgresAdmin, table: str, before: RelationShape, after: RelationShape) -> None:
        """A configured table is another relation now (dropped and recreated, or another one renamed to it).

        Silver holds the old table's records and none of the new one's rows (a new relation is not in
        a publication that names tables, and its rows were never sent). Publish it, have the stream
        truncate the name's records where it meets the message emitted here (after every change of
        the old table in WAL order, before the snapshot's pages), then snapshot it. The new shape
        is recorded after these, so an interruption meets the replacement again at the next start.
        """
        log.warning(
            "table %s was replaced (relation %d, now %d: dropped and recreated, or another table renamed to it): "
            "tombstoning its records and re-snapshotting it",
            table,
            before.relation_id,
            after.relation_id,
        )
        publish_again(admin, table)
        self.membership.settle(table)  # a new relation: its publication row is new, and it is snapshotted
        admin.emit_message(table_gone_prefix(self.src.slot_name), table)
        refusal = cannot_snapshot(admin, table)
        if refusal is not None:
            log.warning(
                "table %s cannot be snapshotted (%s): its rows reach silver only as they change", table, refusal
            )
            return
        self.snapshotter.request([table], lambda: admin.slot_health().current_wal_lsn)

    def _record_shapes_now(
        self, admin: PostgresAdmin, catalog: Catalog, known: dict[tuple[str, str], RelationShape]
    ) -> None:
        """Record each captured table's shape and publication membership where they differ from the recorded ones.

        Called at start and every SHAPE_CHECK_INTERVAL_S of a continuous run (with snapshots on).
        An `ADD COLUMN ... DEFAULT` (or a drop or retype) sends nothing until the table's next row
        change, and a table nobody writes to after it would never be brought in; a table replaced
        under its name (another relation) is not even published; a table dropped from the
        publication and added back was sent nothing in between (membership.py). Such a change is
        met here instead, answered like one the stream meets (a re-snapshot, or a tombstone and a
        snapshot, requested first), and `known` updated; the shapes are recorded at the server's
        current position, so the next check does not meet them again (older Relation messages the
        stream still has to send sort below it, `take_shapes`). A table without a recorded shape
        gets one, so that its later changes are met too; a table whose membership alone changed
        gets its shape again, with the new membership. A named table a user's publication no
        longer publishes is a SourceError, raised once that is recorded.
        """
        builder = ChangeBuilder(catalog, use_native=False, slot=self.src.slot_name)
        at = admin.slot_health().current_wal_lsn
        shapes: dict[tuple[str, str], RelationShape] = {}
        for table in self.src.tables:
            schema, name = table.split(".", 1)
            before = known.get((schema, name))
            msg = relation_now(admin, table)
            if msg is None:
                continue  # gone: refused at start (a run meets it at its next start)
            builder.feed(msg)
            now = with_attnums(admin, replace(builder.new_shapes.pop(), first_seen_lsn=at))
            if before is None or now.shape_hash != before.shape_hash or now.relation_id != before.relation_id:
                if before is not None:
                    self._resnapshot_if_rows_changed(admin, before, now)
                known[(schema, name)] = now
                shapes[(schema, name)] = now
        check = self.membership.check(admin)
        for table in check.lost:
            self._resnapshot_rejoined(admin, table)
        tokens: dict[tuple[str, str], str] = {}
        for table, rows in check.changed.items():
            schema, name = table.split(".", 1)
            sh = known.get((schema, name))
            if sh is None:
                continue  # gone: no shape to record it with
            shapes.setdefault((schema, name), replace(sh, first_seen_lsn=at))
            tokens[(schema, name)] = encode(rows)
        self.writer.append_relations(self.src.name, list(shapes.values()), tokens)
        for (schema, name), token in tokens.items():
            self.membership.recorded[f"{schema}.{name}"] = decode(token)
        if check.refusals:
            raise SourceError("; ".join(check.refusals))

    def _resnapshot_rejoined(self, admin: PostgresAdmin, table: str) -> None:
        """Re-snapshot a table whose changes were not sent while it was out of the publication.

        The whole-table snapshot places the rows that changed meanwhile, and silver tombstones the
        keys it no longer finds (docs/snapshots.md, "Re-snapshots find deletes"). Requested before
        the new membership is recorded: a crash in between meets the change again at the next start.
        """
        if not self.snapshots:
            return
        refusal = cannot_snapshot(admin, table)
        if refusal is not None:
            log.warning("table %s cannot be re-snapshotted (%s): its changes while out stay lost", table, refusal)
            return
        self.snapshotter.request([table], lambda: admin.slot_health().current_wal_lsn)

    def _follow_scope(self, admin: PostgresAdmin, watch: ScopeWatch, builder: ChangeBuilder) -> bool:
        """Capture the tables that came into the selection's scope; stop capturing those that left (scope.py).

        A new table is published before anything else, so its changes from then on are streamed;
        its snapshot (requested after) reads every row committed before, placed as any snapshot
        is. A table the publication sent already (a schema-wide or all-tables publication) has its
        cached relation replaced by the catalog's, so its next change is written, not skipped.
        Whether any table came in.
        """
        came, _left = watch.check()
        for table in came:
            self.membership.settle(table)  # published (or found published) now, and snapshotted
            if table in builder.uncaptured:
                builder.uncaptured.pop(table)
                msg = relation_now(admin, table)
                if msg is not None:
                    builder.feed(msg)
        wanted = [t for t in came if cannot_snapshot(admin, t) is None]
        if self.snapshots and self.src.snapshot.initial and wanted:
            self.snapshotter.request(wanted, lambda: admin.slot_health().current_wal_lsn)
        return bool(came)

    def run(self, once: bool, should_stop: Callable[[], bool]) -> None:
        """Capture until `should_stop()` (or, with `once`, until the source's current position)."""
        admin = prepare_source(self.src, self.writer)
        try:
            # Before anything reads the slot (the history check's peek, the stream): else the server may
            # decode a large transaction bronze already holds again, and spill it (restart_point.py).
            advance_restart_point(admin.conn, self.src)
            t0 = time.monotonic()
            self.writer.ensure_tables()
            positions = SourcePositions.read(self.writer, self.src.name)  # the start's one read of the rows
            self._register(admin, positions)
            resume = Resume(
                self.durable_lsn, self.writer.last_event_position(self.src.name, STREAM_WRITER_ID, self.durable_lsn)
            )
            known = self.writer.known_shapes(self.src.name)
            self.membership = MembershipWatch(
                {f"{s}.{t}": decode(token) for (s, t), token in self.writer.known_memberships(self.src.name).items()}
            )
            log.info(
                "registered source=%s writer=%s durable_lsn=%d last_in_bronze=%s seconds=%.1f",
                self.src.name,
                STREAM_WRITER_ID,
                self.durable_lsn,
                resume.last_in_bronze,
                time.monotonic() - t0,
            )
            committer = Committer(
                self.writer,
                self.src.name,
                SourceKind.POSTGRES,
                STREAM_WRITER_ID,
                WriterKind.STREAM,
                self.started_at,
                self.durable_lsn,
                self.ack_lsn,
                self.progress,
                max_batch_bytes=self.batch.max_bytes,
            )
            catalog = PgCatalog(admin, known)
            stream = ReplicationStream(
                self.src.dsn,
                self.src.slot_name,
                self.src.publication_name,
                app_name=application_name(self.src.name),
                streaming=self.src.streaming,
                inflight=inflight_decoders(catalog, lambda table: table in self.src.tables, self.src.slot_name),
            )
            snapshots: SnapshotThread | None = None
            try:
                stream.open()
                reached_source()  # the server took START_REPLICATION: a later failure is a new outage
                if self.snapshots:
                    # Registered after the stream writer: each snapshot writer starts at the safe bound.
                    self.snapshotter.load(positions)
                    if self.src.snapshot.initial:
                        self.snapshotter.request_initial(lambda: admin.slot_health().current_wal_lsn, positions)
                    self._record_shapes_now(admin, catalog, known)
                    snapshotter = self.snapshotter
                    snapshots = SnapshotThread(
                        self.src.name, lambda stop: snapshotter.run(stop, poll_requests=not once), should_stop
                    )
                self._loop(
                    admin,
                    stream,
                    committer,
                    ChangeBuilder(catalog, slot=self.src.slot_name),
                    known,
                    resume,
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
        last_shapes: dict[tuple[str, str], RelationShape],
        resume: Resume,
        once: bool,
        should_stop: Callable[[], bool],
        snapshots: SnapshotThread | None = None,
    ) -> None:
        """The protocol side of the stream: read, decode, status replies, heartbeats, the drain marker.

        Batching, re-delivery skips and position raises are the shared TransactionBatcher's.
        """
        batcher = TransactionBatcher(committer, self.batch, resume, first_batch_events=WARMUP_BATCH_EVENTS)
        self.batcher = batcher
        # --once drains to a marker emitted once the snapshots are done, so that the stream passes
        # every page's watermark before the run ends (a page is usable only below the safe bound).
        drain_token = uuid.uuid4().hex if once else None
        drain_emitted = False
        drained = False
        restart_checked = False  # at the first drain: whether the slot's restart point lags (restart_point.py)
        last_activity = last_status = last_heard = time.monotonic()
        sent_ack = self.ack_lsn
        wal_end = observed = self.ack_lsn

        def keep_alive() -> None:
            # A submit waits for a slow commit: the server hears from us anyway (review C7).
            nonlocal last_status, sent_ack
            if time.monotonic() - last_status >= KEEPALIVE_WHILE_WAITING_S:
                sent_ack = committer.ack_lsn
                stream.send_status(sent_ack)
                last_status = time.monotonic()

        committer.while_waiting = keep_alive

        def take_shapes() -> None:
            # Recorded whenever a table's shape differs from its last recorded one (W12: a shape
            # that returns to an earlier hash is the latest again). A change that alters existing
            # rows without WAL requests a re-snapshot first, so the request is durable before the
            # shape: a crash in between meets the change again on replay.
            for sh in builder.new_shapes:
                table = (sh.table_schema, sh.table_name)
                before = last_shapes.get(table)
                if before is not None and sh.first_seen_lsn < before.first_seen_lsn:
                    # Older than the latest recorded shape (the start's, from the catalog, or a replay):
                    # history, not a change, and recorded already or superseded.
                    continue
                sh = with_attnums(admin, sh)
                if before is None or before.shape_hash != sh.shape_hash or before.relation_id != sh.relation_id:
                    if before is not None:
                        self._resnapshot_if_rows_changed(admin, before, sh)
                    last_shapes[table] = sh
                    batcher.shapes.append(sh)
            builder.new_shapes.clear()

        burst = 0  # XLogData messages handled since the last bookkeeping
        read_timeout = READ_TIMEOUT_S  # set with the bookkeeping (burst == 0), before the first read
        now = time.monotonic()
        next_shape_check = now + SHAPE_CHECK_INTERVAL_S
        watch = ScopeWatch(admin) if self.src.selection.has_patterns and not once else None
        next_scope_check = now + self.src.new_tables_check_seconds
        while True:
            if burst == 0:
                if should_stop():
                    break
                now = time.monotonic()
                if snapshots is not None:
                    snapshots.check()
                    if not once and now >= next_shape_check:
                        self._record_shapes_now(admin, builder.catalog, last_shapes)
                        next_shape_check = now + SHAPE_CHECK_INTERVAL_S
                if watch is not None and now >= next_scope_check and not builder.in_txn:
                    if self._follow_scope(admin, watch, builder):
                        next_shape_check = now  # record the new tables' shapes at the next turn
                    next_scope_check = now + self.src.new_tables_check_seconds
                if drain_token and not drain_emitted and (snapshots is None or snapshots.done):
                    admin.emit_message(DRAIN_PREFIX, drain_token)
                    drain_emitted = True
                # Decided here, where the marker is emitted, rather than for every message.
                drain_pending = drain_token is not None and not drain_emitted
                read_timeout = DRAIN_PENDING_READ_TIMEOUT_S if drain_pending else READ_TIMEOUT_S
            msg = stream.read(read_timeout)
            if isinstance(msg, XLogData):
                last_activity = last_heard = now
                wal_end = max(wal_end, msg.wal_end)
                out = builder.feed_payload(msg.payload)
                if out is None:
                    if builder.new_shapes:
                        take_shapes()
                elif isinstance(out, TxnEnd):
                    batcher.end_transaction(out.commit_lsn, out.end_lsn, now)
                    if drained:
                        if batcher.has_work:
                            batcher.submit()
                        if not restart_checked:
                            restart_checked = True
                            # Confirmed before the server logs its running transactions: the walsender
                            # then has no older restart proposal waiting, and proposes that record.
                            committer.drain()
                            sent_ack, last_status = committer.ack_lsn, now
                            stream.send_status(sent_ack)
                            faults.hit("after_ack")
                            if pass_restart_point(admin.conn, admin.writer, self.src, sent_ack):
                                drain_token = uuid.uuid4().hex
                                admin.emit_message(DRAIN_PREFIX, drain_token)
                                drained = False
                                burst = 0
                                continue
                        break
                elif builder.in_txn:
                    if drain_token and out.message_prefix == DRAIN_PREFIX and out.message_content == drain_token:
                        drained = True
                    batcher.add(out, now)
                else:
                    # A non-transactional logical message: a unit of its own. Its LSN is where its
                    # record ends, where a transaction's commit may start: it takes the position
                    # just before, inside its own record, which no commit can share.
                    end = out.commit_lsn
                    out = out._replace(commit_lsn=boundary_position(end), commit_ts_us=int(time.time() * 1_000_000))
                    batcher.add(out, now)
                    batcher.end_transaction(out.commit_lsn, end, now)
                burst = (burst + 1) % BURST_MESSAGES
                if burst:
                    continue
            elif isinstance(msg, DecodedTransaction):
                # A streamed transaction decoded while it ran, between its Begin and its Commit.
                burst = 0
                last_activity = last_heard = now
                batcher.add_rows(msg.rows, msg.commit_lsn, msg.xid, msg.commit_ts_us, now)
            elif isinstance(msg, Keepalive):
                burst = 0
                last_heard = now
                wal_end = max(wal_end, msg.wal_end)
                # A keepalive's LSN is how far the server has decoded (sentPtr): every transaction that
                # committed before it has been sent. (XLogData's wal_end is the server's WAL end: not that.)
                observed = max(observed, msg.wal_end)
                if not builder.in_txn and not batcher.has_work and committer.idle:
                    # A server that asks for a reply (a shutting-down server waits for every logical
                    # client to confirm all it sent before it exits) gets the position at once.
                    batcher.observe(observed, now, force=msg.reply_requested)
                    if batcher.has_work:
                        batcher.submit()
                if msg.reply_requested:
                    last_status = 0.0  # answer below
            else:
                burst = 0
                if not builder.in_txn and batcher.has_work and (batcher.due(now) or not batcher.pending):
                    batcher.submit()
                if now - last_heard > SERVER_SILENCE_S:
                    # Asked for a reply every STATUS_INTERVAL_S and heard nothing: the path to the
                    # server is broken (a blackhole sends no reset), not an idle source.
                    raise SourceUnavailableError(
                        f"source {self.src.name!r}: no word from the server for {now - last_heard:.0f} s although "
                        f"asked every {STATUS_INTERVAL_S:.0f} s: the replication connection is gone"
                    )
            if committer.ack_lsn > sent_ack or now - last_status >= STATUS_INTERVAL_S:
                periodic = now - last_status >= STATUS_INTERVAL_S
                sent_ack = committer.ack_lsn
                stream.send_status(sent_ack, reply=periodic)  # a periodic status asks for an answer
                faults.hit("after_ack")
                last_status = now
            if not once and now - last_activity >= self.src.heartbeat_seconds:
                admin.emit_message(HEARTBEAT_PREFIX, datetime.now(UTC).isoformat())
                last_activity = now
            self.progress.tick(max(0, wal_end - committer.durable_lsn))
        # Stopping: make what we have durable (a partial transaction is re-read next time), then ack.
        if batcher.has_work:
            batcher.submit(mid_transaction=builder.in_txn)
        committer.drain()
        if not builder.in_txn and not drained:
            batcher.observe(observed, now, force=True)
            if batcher.has_work:
                batcher.submit()
                committer.drain()
        if committer.ack_lsn > sent_ack:
            stream.send_status(committer.ack_lsn)
            faults.hit("after_ack")
