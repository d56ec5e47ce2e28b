"""Makes batches durable in order on a background thread while the source keeps decoding.

Decoding is Python work and a Delta commit is delta-rs (Rust) work that releases the GIL:
overlapping them is most of ingest's throughput on two cores. Order and safety: batches commit
one at a time, in the order they were submitted; a batch's events commit before its position row is raised; and the
caller acknowledges the source only with `ack_lsn`, which moves after both are durable.
Memory: the batches handed over (queued and committing) are bounded in number and in bytes, so
that what ingest holds of change data stays a few batch budgets however wide the rows are.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from ingest import faults
from ingest.bronze.pending import RowSlice
from ingest.bronze.writer import BronzeWriter
from ingest.errors import BronzeWriteError, IngestError
from ingest.events import ChangeEvent, RelationShape, WriterKind, WriterPosition
from ingest.ops.metrics import WriterMetrics
from ingest.progress import Progress

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 1  # batches queued behind the one being committed (bounds memory to ~3 batches)
# Batches handed over (queued and committing) weigh at most this many batch byte budgets together;
# a batch heavier than that (one event wider than the budget) waits until the committer is empty.
IN_FLIGHT_BATCHES = 2
WAIT_TICK_S = 0.5  # how often a blocked submit checks for a failure and calls `while_waiting`


@dataclass(slots=True)
class Batch:
    """Events to append (position order) and the position that becomes durable with them.

    `durable_lsn`/`ack_lsn` are None when the batch ends inside a transaction (a page of a large
    transaction): its events are written but nothing new is durable yet.
    """

    events: list[ChangeEvent]
    shapes: list[RelationShape] = field(default_factory=list)
    durable_lsn: int | None = None
    ack_lsn: int | None = None
    mid_transaction: bool = False
    end_lsns: dict[int, int] = field(default_factory=dict)  # commit LSN -> end LSN of its transaction
    resume_token: str | None = None  # stored with the raised position (MongoDB: how to reopen the stream)
    size_bytes: int = 0  # what its events weigh (pending.event_bytes), for the committer's byte bound
    rows: list[RowSlice] = field(default_factory=list)  # decoded rows of streamed transactions, stamped on write
    last_position: tuple[int, int] | None = None  # the batch's last position, when it ends with `rows`

    @property
    def count(self) -> int:
        """How many events and decoded rows the batch appends."""
        return len(self.events) + sum(int(r.rows.num_rows) for r in self.rows)


_STOP = object()


class Committer:
    """Owns the commit thread of one writer.

    Responsibilities: append each batch's shapes and events to bronze, raise the writer's position,
    publish the new `ack_lsn` for the caller to acknowledge, and surface a failure on the next call
    (after which nothing further commits and nothing further is acknowledged).
    """

    def __init__(
        self,
        writer: BronzeWriter,
        source: str,
        source_kind: str,
        writer_id: str,
        writer_kind: WriterKind,
        started_at: datetime,
        durable_lsn: int,
        ack_lsn: int,
        progress: Progress,
        max_batch_bytes: int | None = None,
    ) -> None:
        """Start the thread; positions start at the writer's registered `durable_lsn`/`ack_lsn`.

        `max_batch_bytes`: the batches' byte budget (`batch.max_bytes`); the batches handed over
        weigh at most IN_FLIGHT_BATCHES of it together (None: bounded in number only).
        """
        self.writer = writer
        self.source, self.source_kind = source, source_kind
        self.writer_id, self.writer_kind, self.started_at = writer_id, writer_kind, started_at
        self.durable_lsn = durable_lsn
        self.ack_lsn = ack_lsn
        self.progress = progress
        self.metrics = WriterMetrics(source, source_kind, writer_id)  # once per batch, never per event
        self.metrics.raised(0, durable_lsn)
        self.while_waiting: Callable[[], None] | None = None
        self._queue: queue.Queue[Batch | object] = queue.Queue(maxsize=MAX_IN_FLIGHT)
        self._max_held_bytes = None if max_batch_bytes is None else IN_FLIGHT_BATCHES * max_batch_bytes
        self._held_bytes = 0  # size_bytes of the batches queued and committing
        self._released = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name=f"committer-{source}", daemon=True)
        self._thread.start()

    def _check(self) -> None:
        if self._error is not None:
            if isinstance(self._error, IngestError):
                raise self._error
            raise BronzeWriteError(f"bronze commit failed: {self._error}") from self._error

    def submit(self, batch: Batch) -> None:
        """Queue `batch` (blocks while MAX_IN_FLIGHT batches wait or the byte bound is reached).

        Raises an earlier failure. While it blocks, `while_waiting` (if set) is called every
        WAIT_TICK_S: a source keeps its connection alive there (Postgres sends standby status, so a
        slow commit never trips the server's `wal_sender_timeout`).
        """
        self._check()
        while not self._hold(batch.size_bytes):
            self._waited()
        try:
            while True:
                try:
                    self._queue.put(batch, timeout=WAIT_TICK_S)
                    return
                except queue.Full:
                    self._waited()
        except BaseException:
            self._release(batch.size_bytes)
            raise

    def _hold(self, size: int) -> bool:
        """Count `size` bytes as handed over if they fit the bound (or nothing else is held)."""
        with self._released:
            fits = self._max_held_bytes is None or self._held_bytes + size <= self._max_held_bytes
            if not (fits or self._held_bytes == 0):
                self._released.wait(WAIT_TICK_S)
                return False
            self._held_bytes += size
            return True

    def _release(self, size: int) -> None:
        with self._released:
            self._held_bytes -= size
            self._released.notify_all()

    def _waited(self) -> None:
        self._check()
        if self.while_waiting is not None:
            self.while_waiting()

    @property
    def idle(self) -> bool:
        """Whether every submitted batch is durable."""
        return self._queue.unfinished_tasks == 0

    def drain(self) -> None:
        """Wait until every submitted batch is durable; raises a failure."""
        while not self.idle:
            self._check()
            time.sleep(0.01)
        self._check()

    def close(self) -> None:
        """Stop the thread after the queued batches (call drain() first to see failures)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:
                    assert isinstance(item, Batch)
                    self._commit(item)
            except BaseException as e:  # kept and re-raised in the caller's thread by _check()
                log.error("commit failed source=%s error=%s", self.source, e)
                self._error = e
            finally:
                if isinstance(item, Batch):
                    self._release(item.size_bytes)
                self._queue.task_done()

    def _commit(self, batch: Batch) -> None:
        t0 = time.monotonic()
        self.writer.append_relations(self.source, batch.shapes)
        if batch.events or batch.rows:
            faults.hit("before_events_commit")
            self.writer.append_events(
                self.source,
                self.source_kind,
                self.writer_id,
                batch.events,
                batch.end_lsns,
                rows=batch.rows,
                last_position=batch.last_position,
            )
            faults.hit("mid_transaction_flush" if batch.mid_transaction else "after_events_commit")
            self.progress.add(batch.count)
            if batch.rows:
                self.metrics.events.inc(batch.count - len(batch.events))
        # Every durable point is raised at once: a position row is one Delta commit of a few
        # milliseconds (delta-rs), so there is nothing to win by letting it ride on a later batch.
        if batch.durable_lsn is not None and batch.durable_lsn > self.durable_lsn:
            self._raise(batch)
        self.metrics.committed(batch.events, time.monotonic() - t0)
        log.info(
            "committed source=%s events=%d durable_lsn=%d seconds=%.2f",
            self.source,
            batch.count,
            self.durable_lsn,
            time.monotonic() - t0,
        )

    def _raise(self, batch: Batch) -> None:
        """Raise this writer's row to `batch`'s durable point; the caller may then acknowledge it."""
        assert batch.durable_lsn is not None
        pos = WriterPosition(
            self.source,
            self.writer_id,
            self.writer_kind,
            batch.durable_lsn,
            max(self.ack_lsn, batch.ack_lsn or 0),
            batch.resume_token,
        )
        self.writer.raise_position(pos, self.started_at)
        faults.hit("after_position_commit")
        self.metrics.raised(self.durable_lsn, pos.durable_lsn)
        self.durable_lsn = pos.durable_lsn
        self.ack_lsn = pos.ack_lsn  # the caller acknowledges this to the source
