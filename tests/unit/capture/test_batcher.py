"""The shared batching rules (ingest/capture/batcher.py), driven with scripted transactions, no server.

Every source's stream goes through these rules, so delivery is proven here once: the property test
crashes the writer at every step of a random run (events committed, position raised, acknowledged)
and restarts it the way a server resends, and bronze must end with every event exactly once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.bronze.committer import Batch
from ingest.bronze.pending import event_bytes
from ingest.capture.batcher import IDLE_POSITION_INTERVAL_S, Resume, TransactionBatcher
from ingest.config import BatchConfig
from ingest.events import Action, ChangeEvent


def ev(lsn: int, index: int = 0, width: int = 2) -> ChangeEvent:
    """An insert whose record is `width` characters long."""
    return ChangeEvent(
        lsn, index, 1, 0, Action.INSERT, "s", "t", 1, f'{{"id":{lsn}}}', None, "{" + "x" * (width - 2) + "}"
    )


class Sink:
    """Records batches; positions move as the committer's would once a batch is durable."""

    def __init__(self, durable: int = 0, ack: int = 0) -> None:
        self.batches: list[Batch] = []
        self.durable_lsn, self.ack_lsn = durable, ack

    def submit(self, batch: Batch) -> None:
        self.batches.append(batch)
        if batch.durable_lsn is not None and batch.durable_lsn > self.durable_lsn:
            self.durable_lsn = batch.durable_lsn
            self.ack_lsn = max(self.ack_lsn, batch.ack_lsn or 0)

    def drain(self) -> None:
        pass


def batcher(
    sink: Sink, max_events: int = 100, resume: Resume | None = None, max_bytes: int = 1 << 30, **kw: int
) -> TransactionBatcher:
    config = BatchConfig(max_events=max_events, max_bytes=max_bytes, max_seconds=60)
    return TransactionBatcher(sink, config, resume or Resume(0), **kw)


def test_a_transaction_larger_than_a_batch_goes_in_pages_that_make_nothing_durable() -> None:
    sink = Sink()
    b = batcher(sink, max_events=2)
    for i in range(3):
        b.add(ev(100, i), now=0)
    b.end_transaction(100, 108, now=0)
    b.submit()
    assert [[e.position for e in x.events] for x in sink.batches] == [[(100, 0), (100, 1)], [(100, 2)]]
    assert [(x.durable_lsn, x.ack_lsn, x.mid_transaction) for x in sink.batches] == [
        (None, None, True),
        (100, 108, False),
    ]
    assert sink.batches[1].end_lsns == {100: 108}


def test_a_transaction_of_wide_rows_goes_in_pages_cut_by_bytes() -> None:
    """Batches were bounded by count only: 200 rows of 1 MB made one batch of 200 MB (1.2 GB of RSS).

    A page now ends before the event that would take it past `max_bytes`; an event wider than the
    budget goes alone; a batch full of bytes at a transaction's end is handed over with it.
    """
    sink = Sink()
    b = batcher(sink, max_bytes=100)
    for i, width in enumerate((40, 40, 40, 250, 10)):
        b.add(ev(100, i, width), now=0)
    b.end_transaction(100, 108, now=0)
    b.add(ev(200, 0, 60), now=0)
    b.add(ev(200, 1, 40), now=0)
    b.add(ev(200, 2, 60), now=0)
    b.end_transaction(200, 208, now=0)
    assert [[e.position for e in x.events] for x in sink.batches] == [
        [(100, 0), (100, 1)],
        [(100, 2)],
        [(100, 3)],
        [(100, 4), (200, 0)],
        [(200, 1), (200, 2)],
    ]
    assert [x.size_bytes for x in sink.batches] == [80, 40, 250, 70, 100]
    assert [(x.durable_lsn, x.mid_transaction) for x in sink.batches] == [
        (None, True),
        (None, True),
        (None, True),
        (100, True),  # cut inside the second transaction; the first is complete in it
        (200, False),  # 100 bytes: full at the transaction's end
    ]


def test_a_cut_by_bytes_between_transactions_is_not_a_page() -> None:
    sink = Sink()
    b = batcher(sink, max_bytes=100)
    b.add(ev(100, 0, 60), now=0)
    b.end_transaction(100, 108, now=0)
    b.add(ev(200, 0, 60), now=0)  # would overflow: the batch before it ends with transaction 100
    assert [(x.durable_lsn, x.ack_lsn, x.mid_transaction, len(x.events)) for x in sink.batches] == [
        (100, 108, False, 1)
    ]


def test_a_batch_is_cut_at_a_transaction_end_once_full_or_old() -> None:
    sink = Sink()
    b = batcher(sink, max_events=100)
    b.add(ev(100), now=0)
    b.end_transaction(100, 108, now=1)
    assert sink.batches == []  # neither full nor old: the next transaction joins it
    b.add(ev(200), now=30)
    b.end_transaction(200, 208, now=61)
    assert [(x.durable_lsn, x.ack_lsn, len(x.events)) for x in sink.batches] == [(200, 208, 2)]
    assert sink.batches[0].end_lsns == {100: 108, 200: 208}


def test_the_first_batch_is_capped() -> None:
    sink = Sink()
    b = batcher(sink, max_events=100, first_batch_events=2)
    for i in range(5):
        b.add(ev(100, i), now=0)
    assert [len(x.events) for x in sink.batches] == [2]  # then full-size batches
    for i in range(5, 200):
        b.add(ev(100, i), now=0)
    assert [len(x.events) for x in sink.batches] == [2, 100]


def test_re_delivered_events_are_skipped_by_durable_position_and_by_last_event_in_bronze() -> None:
    sink = Sink(100, 108)
    b = batcher(sink, resume=Resume(100, (200, 1)))
    for e in (ev(100), ev(200, 0), ev(200, 1), ev(200, 2), ev(300)):
        b.add(e, now=0)
    assert [e.position for e in b.pending] == [(200, 2), (300, 0)]
    assert b.skipped == 3


@given(
    durable=st.integers(0, 6),
    last=st.none() | st.tuples(st.integers(0, 6), st.integers(0, 3)),
    positions=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3)), max_size=20),
)
def test_add_skips_exactly_what_resume_says_is_in_bronze(
    durable: int, last: tuple[int, int] | None, positions: list[tuple[int, int]]
) -> None:
    # `add` asks `resume` only about events at or below its highest commit position (a fast path).
    resume = Resume(durable, last)
    sink = Sink()
    b = batcher(sink, resume=resume)
    for lsn, index in positions:
        b.add(ev(lsn, index), now=0)
    b.submit()
    kept = [e.position for x in sink.batches for e in x.events]
    assert kept == [p for p in positions if not resume.already_in_bronze(ev(*p))]
    assert b.skipped == len(positions) - len(kept)


def test_an_observed_boundary_is_exclusive() -> None:
    """D1: a boundary the stream passed (keepalive sentPtr) is durable up to, not including, itself.

    A transaction whose commit record starts exactly at the boundary is sent after a restart and
    must not be taken for a re-delivery.
    """
    sink = Sink(100, 108)
    b = batcher(sink)
    b.observe(500, now=time.monotonic() + IDLE_POSITION_INTERVAL_S + 1)
    b.submit()
    assert (sink.batches[-1].durable_lsn, sink.batches[-1].ack_lsn) == (499, 500)
    restarted = batcher(Sink(499, 500), resume=Resume(sink.durable_lsn, None))
    restarted.add(ev(500), now=0)
    assert [e.position for e in restarted.pending] == [(500, 0)] and restarted.skipped == 0


def test_an_idle_raise_waits_for_its_interval_unless_forced_and_never_moves_back() -> None:
    sink = Sink(100, 108)
    b = batcher(sink)
    now = time.monotonic()
    b.observe(500, now=now)
    assert not b.has_work  # too soon after the start
    b.observe(108, now=now + IDLE_POSITION_INTERVAL_S + 1, force=True)
    assert not b.has_work  # not past what is acknowledged already
    b.observe(500, now=now + IDLE_POSITION_INTERVAL_S + 1)
    assert b.has_work


# -- the delivery property ---------------------------------------------------------------------


@dataclass(frozen=True)
class Txn:
    commit: int
    end: int
    events: int
    boundary_after: int | None  # a keepalive's sentPtr seen after this transaction, if any


@st.composite
def runs(draw: st.DrawFn) -> list[Txn]:
    txns, lsn = [], 800
    for _ in range(draw(st.integers(1, 12))):
        end = lsn + 8
        # The next commit record starts at or after this transaction's end; a keepalive may
        # report any boundary up to it, that commit's own start included.
        nxt = end + draw(st.integers(0, 4)) * 8
        boundary = draw(st.one_of(st.none(), st.sampled_from([end, nxt]), st.integers(end, nxt)))
        txns.append(Txn(lsn, end, draw(st.integers(0, 7)), boundary))
        lsn = nxt
    return txns


class Bronze:
    """The committer's effects step by step: events appended, then the position row raised."""

    def __init__(self, crash_at: int | None) -> None:
        self.events: list[tuple[int, int]] = []
        self.durable, self.ack = 0, 0
        self.acked = 0  # what the server was told (the slot's confirmed position)
        self.steps = 0
        self.crash_at = crash_at
        self.batches: list[Batch] = []  # every batch handed over, in both runs

    def step(self) -> None:
        self.steps += 1
        if self.crash_at is not None and self.steps > self.crash_at:
            raise Crash


class Crash(Exception):
    pass


class CrashingSink(Sink):
    def __init__(self, bronze: Bronze) -> None:
        super().__init__(bronze.durable, bronze.ack)
        self.bronze = bronze

    def submit(self, batch: Batch) -> None:
        br = self.bronze
        br.batches.append(batch)
        if batch.events:
            br.step()
            br.events += [e.position for e in batch.events]
        if batch.durable_lsn is not None and batch.durable_lsn > br.durable:
            br.step()
            br.durable, br.ack = batch.durable_lsn, max(br.ack, batch.ack_lsn or 0)
            self.durable_lsn, self.ack_lsn = br.durable, br.ack
            br.step()
            br.acked = br.ack


def width(commit: int, index: int) -> int:
    """A record width in 2..41 characters that a replay sees again for the same event."""
    return 2 + (commit * 7 + index * 13) % 40


def replay(txns: list[Txn], bronze: Bronze, max_events: int, max_bytes: int = 1 << 30) -> None:
    """One run: the server sends every transaction whose commit starts at or after the slot's position."""
    last = max((p for p in bronze.events if p[0] > bronze.durable), default=None)
    sink = CrashingSink(bronze)
    config = BatchConfig(max_events=max_events, max_bytes=max_bytes, max_seconds=60)
    b = TransactionBatcher(sink, config, Resume(bronze.durable, last))
    for t in txns:
        if t.commit < bronze.acked:
            continue
        for i in range(t.events):
            b.add(ev(t.commit, i, width(t.commit, i)), now=0)
        b.end_transaction(t.commit, t.end, now=0)
        if t.boundary_after is not None:
            b.submit()
            b.observe(t.boundary_after, now=0, force=True)
            if b.has_work:
                b.submit()
    if b.has_work:
        b.submit()


@settings(max_examples=300, deadline=None)
@given(runs(), st.integers(1, 5), st.data())
def test_a_crash_at_any_step_and_a_restart_lose_and_duplicate_nothing(
    txns: list[Txn], max_events: int, data: st.DataObject
) -> None:
    expected = [(t.commit, i) for t in txns for i in range(t.events)]
    bronze = Bronze(crash_at=data.draw(st.integers(0, 3 * len(expected) + 3 * len(txns) + 2)))
    try:
        replay(txns, bronze, max_events)
    except Crash:
        bronze.crash_at = None
        replay(txns, bronze, max_events)
    assert bronze.events == expected


@settings(max_examples=300, deadline=None)
@given(runs(), st.integers(1, 8), st.integers(1, 120), st.data())
def test_no_batch_outweighs_the_byte_budget_and_a_crash_anywhere_loses_nothing(
    txns: list[Txn], max_events: int, max_bytes: int, data: st.DataObject
) -> None:
    """Batches were bounded by count only; now by bytes as well, with the delivery property intact.

    A batch weighs at most `max_bytes` unless it is a single event wider than that (which still
    goes through, alone), and a crash at any step with a restart loses and duplicates nothing.
    """
    expected = [(t.commit, i) for t in txns for i in range(t.events)]
    bronze = Bronze(crash_at=data.draw(st.integers(0, 3 * len(expected) + 3 * len(txns) + 2)))
    try:
        replay(txns, bronze, max_events, max_bytes)
    except Crash:
        bronze.crash_at = None
        replay(txns, bronze, max_events, max_bytes)
    assert bronze.events == expected
    for batch in bronze.batches:
        weight = sum(event_bytes(e) for e in batch.events)
        assert batch.size_bytes == weight
        assert weight <= max_bytes or len(batch.events) == 1, (max_bytes, [event_bytes(e) for e in batch.events])
        assert len(batch.events) <= max_events
