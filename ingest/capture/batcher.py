"""Turns a source's decoded transactions into the committer's batches (DESIGN §3), for every source.

A source feeds it events in stream order, the end of each transaction, and what it has observed
of the stream between transactions (a Postgres keepalive, a MongoDB post-batch resume token). It
owns the rules every source shares: skip what a restart re-delivers, cut batches on transaction
boundaries (a transaction larger than a batch, by events or by bytes, goes in pages that make
nothing durable), and let an idle writer's position follow the stream.

Two kinds of position reach the committer, and they mean different things (review finding D1):
- a transaction's **commit position**: every event at or below it is in bronze (inclusive);
- a **boundary** the stream has passed (keepalive `sentPtr`, post-batch token, the slot's
  `confirmed_flush_lsn`): everything *before* it was sent. A transaction can still commit exactly
  at a boundary, so it is recorded as durable up to `boundary - 1` and acknowledged at `boundary`
  (Postgres resends every transaction whose commit record starts at or after the flushed LSN).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

from ingest.bronze.committer import Batch
from ingest.bronze.pending import PendingRows, RowSlice, row_sizes
from ingest.config import BatchConfig
from ingest.events import ChangeEvent, RelationShape

IDLE_POSITION_INTERVAL_S = 10.0  # how often an idle stream raises its row to what it observed


class CommitSink(Protocol):
    """What the batcher needs of the committer: submit a batch, and how far it got."""

    durable_lsn: int
    ack_lsn: int

    def submit(self, batch: Batch) -> None:
        """Queue a batch (blocks while the committer is full; raises an earlier failure)."""

    def drain(self) -> None:
        """Wait until every submitted batch is durable (raises a failure)."""


def boundary_position(boundary: int) -> int:
    """The inclusive durable position a stream boundary stands for: everything strictly before it."""
    return max(0, boundary - 1)


@dataclass(frozen=True, slots=True)
class Resume:
    """What a restarted stream writer finds in bronze: the events it must not append again.

    `durable_lsn`: every event with commit position at or below it is in bronze (the writer row).
    `last_in_bronze`: this writer's last event in bronze above that, if any (a page of a large
    transaction, or a batch whose position row was not raised before a crash).
    """

    durable_lsn: int
    last_in_bronze: tuple[int, int] | None = None

    def rows_in_bronze(self, commit_lsn: int, first_index: int, n: int) -> int:
        """How many of the `n` events from `(commit_lsn, first_index)` on are durable already (a prefix)."""
        last = self.last_in_bronze
        if commit_lsn <= self.durable_lsn or (last is not None and last[0] > commit_lsn):
            return n
        if last is not None and last[0] == commit_lsn:
            return max(0, min(n, last[1] + 1 - first_index))
        return 0

    @property
    def highest_commit_lsn(self) -> int:
        """The highest commit position an event durable already can have: no event above it is."""
        last = self.last_in_bronze
        return self.durable_lsn if last is None else max(self.durable_lsn, last[0])

    def already_in_bronze(self, event: ChangeEvent) -> bool:
        """Whether a re-delivered event is durable already."""
        return event.commit_lsn <= self.durable_lsn or (
            self.last_in_bronze is not None and event.position <= self.last_in_bronze
        )


@dataclass(frozen=True, slots=True)
class _Completed:
    durable_lsn: int
    ack_lsn: int
    resume_token: str | None


class TransactionBatcher:
    """Collects one writer's events into batches and hands them to the committer.

    Responsibilities: skip re-delivered events, start a batch's clock at its first event, cut a
    page when a transaction outgrows the batch (in events or in bytes), make a completed transaction (or an observed
    boundary) durable with the next batch, carry new relation shapes with it, and count what it
    skipped. It does no I/O itself; the committer writes, and the source acknowledges what the
    committer reports durable.
    """

    def __init__(
        self, sink: CommitSink, batch: BatchConfig, resume: Resume, first_batch_events: int | None = None
    ) -> None:
        """Batch for `sink` with `batch`'s limits; `first_batch_events` caps the first batch (a quick start)."""
        self.sink = sink
        self.resume = resume
        # Events above this commit position are not in bronze: `add` asks `resume` about the others only.
        self._resume_upto = resume.highest_commit_lsn
        self.max_seconds = batch.max_seconds
        self._max_events = batch.max_events
        self.max_events = min(batch.max_events, first_batch_events or batch.max_events)
        self.max_bytes = batch.max_bytes
        self.pending: list[ChangeEvent] = []
        self.pending_rows: list[RowSlice] = []  # decoded rows of streamed transactions (add_rows)
        self.pending_count = 0  # events and rows pending
        self.pending_bytes = 0  # event_bytes() summed over what is pending
        self._rows_last = False  # whether the last pending item is a slice of rows (else an event, if any)
        self.shapes: list[RelationShape] = []
        self.skipped = 0
        self._end_lsns: dict[int, int] = {}  # commit position -> end position, for completed transactions
        self._completed: _Completed | None = None  # durable with the next batch
        self._started = 0.0
        self._last_idle_raise = time.monotonic()

    @property
    def has_work(self) -> bool:
        """Whether a submit would write anything or move the position."""
        return bool(self.pending_count or self.shapes) or self._completed is not None

    def add(self, event: ChangeEvent, now: float) -> None:
        """Take the next event of the open transaction (skipped if a restart re-delivered it)."""
        if event.commit_lsn <= self._resume_upto and self.resume.already_in_bronze(event):
            self.skipped += 1
            return
        # event_bytes(event), inlined (this runs once per change: a call and three len() cost more
        # than the rest of it), and len() only of the texts the event has.
        record, old_record, content = event.record, event.old_record, event.message_content
        size = (
            (len(record) if record else 0) + (len(old_record) if old_record else 0) + (len(content) if content else 0)
        )
        count = self.pending_count
        if count and (count >= self.max_events or self.pending_bytes + size > self.max_bytes):
            # A transaction larger than a batch goes to bronze in pages. The page is cut when the
            # transaction goes on past a full batch, not when the batch fills: a batch that fills
            # with a transaction's last event ends with that transaction and makes it durable. By
            # bytes the cut comes before the event that would overflow the batch (one event larger
            # than the budget goes alone); that cut may fall between two transactions.
            self._cut()
            count = 0
        if not count:
            self._started = now
        self.pending.append(event)
        self.pending_count = count + 1
        self.pending_bytes += size
        if self._rows_last:
            self._rows_last = False

    def _last_position(self) -> tuple[int, int] | None:
        """The position of the last pending event or row (None when nothing is pending)."""
        if self._rows_last:
            return self.pending_rows[-1].last_position
        return self.pending[-1].position if self.pending else None

    def _cut(self) -> None:
        """Submit a page: what is pending, inside its last transaction unless that one has ended."""
        last = self._last_position()
        assert last is not None
        self.submit(mid_transaction=last[0] not in self._end_lsns)

    def add_rows(self, rows: PendingRows, commit_lsn: int, xid: int, commit_ts_us: int, now: float) -> None:
        """Take a committed transaction's decoded rows, at `commit_lsn` from index 0, paged as `add` pages.

        The cuts fall where `add` would cut the same events one at a time (by events, then by
        bytes); rows a restart re-delivered are skipped.
        """
        index = 0
        for batch in rows.batches():
            n = batch.num_rows
            first = index
            index += n
            start = self.resume.rows_in_bronze(commit_lsn, first, n)
            self.skipped += start
            if start == n:
                continue
            sizes = list(accumulate(row_sizes(batch).slice(start).to_pylist()))  # numpy is not a dependency
            taken = 0  # of sizes
            while start < n:
                if self.pending_count and self.pending_count >= self.max_events:
                    self._cut()
                room = self.max_events - self.pending_count
                base = sizes[taken - 1] if taken else 0
                limit = self.max_bytes - self.pending_bytes + base
                k = bisect_right(sizes, limit, taken, min(taken + room, len(sizes))) - taken
                if k == 0:
                    if self.pending_count:
                        self._cut()
                        continue
                    k = 1  # one row larger than the budget goes alone
                if not self.pending_count:
                    self._started = now
                piece = RowSlice(batch.slice(start, k), commit_lsn, first + start, xid, commit_ts_us)
                self.pending_rows.append(piece)
                self.pending_count += k
                self.pending_bytes += int(sizes[taken + k - 1] - base)
                self._rows_last = True
                start += k
                taken += k

    def end_transaction(self, commit_lsn: int, end_lsn: int, now: float, resume_token: str | None = None) -> None:
        """The transaction at `commit_lsn` is complete; the source may be acknowledged with `end_lsn`."""
        self._completed = _Completed(commit_lsn, end_lsn, resume_token)
        self._end_lsns[commit_lsn] = end_lsn
        if self.pending_count >= self.max_events or self.pending_bytes >= self.max_bytes or self.due(now):
            self.submit()

    def observe(self, boundary: int, now: float, resume_token: str | None = None, force: bool = False) -> None:
        """The stream has passed `boundary` with no transaction open: the position may follow it.

        Only between transactions. Raised at most every IDLE_POSITION_INTERVAL_S unless a batch is
        due anyway or `force` (stopping, draining); call `submit()` to make it durable.
        """
        ahead = boundary > max(self._completed.ack_lsn if self._completed else 0, self.sink.ack_lsn)
        due = force or self.has_work or now - self._last_idle_raise >= IDLE_POSITION_INTERVAL_S
        if ahead and due:
            self._completed = _Completed(boundary_position(boundary), boundary, resume_token)
            self._last_idle_raise = now

    def due(self, now: float) -> bool:
        """Whether the batch's time is up (its first event waited `max_seconds`)."""
        return bool(self.pending_count) and now - self._started >= self.max_seconds

    def submit(self, mid_transaction: bool = False) -> None:
        """Hand what is pending to the committer, with the last completed position."""
        self.max_events = self._max_events
        batch = Batch(
            list(self.pending),
            self.shapes,
            mid_transaction=mid_transaction,
            end_lsns=self._end_lsns,
            size_bytes=self.pending_bytes,
            rows=list(self.pending_rows),
            last_position=self._last_position() if self.pending_rows else None,
        )
        if self._completed is not None:  # every event at or below it is in this batch or an earlier one
            batch.durable_lsn, batch.ack_lsn = self._completed.durable_lsn, self._completed.ack_lsn
            batch.resume_token = self._completed.resume_token
            self._completed = None
        self.pending.clear()
        self.pending_rows.clear()
        self.pending_count = self.pending_bytes = 0
        self._rows_last = False
        self.shapes = []
        self._end_lsns = {}
        self.sink.submit(batch)
