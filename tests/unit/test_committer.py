"""The committer's order of durability: events, then the position row, then the acknowledgement.

A recording writer stands in for bronze (the Delta side is covered by the integration and crash
tests); what is pinned here is the order of calls and which position each acknowledgement follows.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from ingest.bronze.committer import Batch, Committer
from ingest.events import Action, ChangeEvent, WriterKind, WriterPosition
from ingest.progress import Progress


class RecordingWriter:
    """Logs every bronze call; `gate` lets a test hold the commit thread inside an events append."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def append_relations(self, source: str, shapes: Any) -> None:
        if shapes:
            self.calls.append(("relations", len(shapes)))

    def append_events(self, source: str, kind: str, writer_id: str, events: Any, end_lsns: Any, **rows: Any) -> None:
        self.gate.wait(10)
        with self.lock:
            self.calls.append(("events", events[-1].commit_lsn))

    def raise_position(self, pos: WriterPosition, started_at: datetime) -> None:
        with self.lock:
            self.calls.append(("position", pos.durable_lsn))


def event(lsn: int) -> ChangeEvent:
    return ChangeEvent(lsn, 0, 1, 0, Action.INSERT, "s", "t", 1, '{"id":1}', None, '{"id":1}')


def make(writer: RecordingWriter, max_batch_bytes: int | None = None) -> Committer:
    return Committer(
        writer,  # type: ignore[arg-type]
        "src",
        "postgres",
        "stream",
        WriterKind.STREAM,
        datetime.now(UTC),
        0,
        0,
        Progress("src", enabled=False),
        max_batch_bytes=max_batch_bytes,
    )


def check_order(calls: list[tuple[str, Any]]) -> None:
    """Every position row is raised to an LSN whose events are already appended, never lowered."""
    appended = 0
    raised = 0
    for kind, lsn in calls:
        if kind == "events":
            appended = max(appended, lsn)
        elif kind == "position":
            assert lsn <= appended, f"position {lsn} raised before its events (appended up to {appended}): {calls}"
            assert lsn > raised, f"position lowered or repeated: {calls}"
            raised = lsn


def test_idle_batches_raise_their_position_at_once() -> None:
    w = RecordingWriter()
    c = make(w)
    for lsn in (10, 20, 30):
        c.submit(Batch([event(lsn)], durable_lsn=lsn, ack_lsn=lsn + 1))
        c.drain()
        assert c.durable_lsn == lsn and c.ack_lsn == lsn + 1
    c.close()
    assert w.calls == [
        ("events", 10),
        ("position", 10),
        ("events", 20),
        ("position", 20),
        ("events", 30),
        ("position", 30),
    ]


def test_a_backlog_raises_every_durable_point_in_order() -> None:
    w = RecordingWriter()
    c = make(w)
    w.gate.clear()  # hold the first append so that the next batch queues behind it
    c.submit(Batch([event(10)], durable_lsn=10, ack_lsn=11))
    c.submit(Batch([event(20)], durable_lsn=20, ack_lsn=21))
    w.gate.set()
    c.submit(Batch([event(30)], durable_lsn=30, ack_lsn=31))
    c.drain()
    c.close()
    check_order(w.calls)
    assert [lsn for kind, lsn in w.calls if kind == "position"] == [10, 20, 30], w.calls
    assert (c.durable_lsn, c.ack_lsn) == (30, 31)


def test_a_position_is_raised_before_a_mid_transaction_page() -> None:
    """A batch ending inside a transaction carries no durable point: the one before it must still be raised."""
    w = RecordingWriter()
    c = make(w)
    w.gate.clear()
    c.submit(Batch([event(10)], durable_lsn=10, ack_lsn=11))
    c.submit(Batch([event(20)], mid_transaction=True))
    w.gate.set()
    c.drain()
    c.close()
    check_order(w.calls)
    assert ("position", 10) in w.calls and (c.durable_lsn, c.ack_lsn) == (10, 11)


def test_a_blocked_submit_keeps_calling_while_waiting() -> None:
    """C7: while a slow commit holds the queue, the source is given the chance to keep its connection alive."""
    w = RecordingWriter()
    c = make(w)
    calls: list[float] = []
    c.while_waiting = lambda: calls.append(0.0)
    w.gate.clear()  # the first append hangs: the second batch waits in the queue, the third submit blocks
    c.submit(Batch([event(10)], durable_lsn=10, ack_lsn=11))
    c.submit(Batch([event(20)], durable_lsn=20, ack_lsn=21))
    threading.Timer(1.6, w.gate.set).start()
    c.submit(Batch([event(30)], durable_lsn=30, ack_lsn=31))
    c.drain()
    c.close()
    assert len(calls) >= 2  # every WAIT_TICK_S (0.5 s) of the ~1.6 s wait
    assert [lsn for kind, lsn in w.calls if kind == "position"] == [10, 20, 30]


@pytest.mark.parametrize("seed", range(20))
def test_random_submissions_keep_the_order(seed: int) -> None:
    rnd = random.Random(seed)
    w = RecordingWriter()
    c = make(w)
    lsn = expected = 0
    for _ in range(rnd.randint(1, 30)):
        lsn += rnd.randint(1, 5)
        mid = rnd.random() < 0.2
        if not mid:
            expected = lsn
        if rnd.random() < 0.3:
            w.gate.clear()  # hold the commit thread a moment: the next batches queue behind it
            threading.Timer(rnd.random() / 100, w.gate.set).start()
        c.submit(
            Batch([event(lsn)], durable_lsn=None if mid else lsn, ack_lsn=None if mid else lsn, mid_transaction=mid)
        )
    w.gate.set()
    c.drain()
    c.close()
    check_order(w.calls)
    # after drain the newest durable point is raised and is what the source may be acknowledged with
    assert (c.durable_lsn, c.ack_lsn) == (expected, expected), f"seed {seed}: {w.calls}"
    positions = [p for kind, p in w.calls if kind == "position"]
    assert positions[-1:] == ([expected] if expected else []), f"seed {seed}"


def test_batches_in_flight_are_bounded_in_bytes() -> None:
    """Batches in flight were bounded in number only, whatever their width: now the committer takes
    batches up to two batch budgets of bytes (queued and committing), and one wider than that alone.
    """
    w = RecordingWriter()
    c = make(w, max_batch_bytes=100)
    w.gate.clear()  # the first batch stays in its commit, and the queue has room
    c.submit(Batch([event(10)], durable_lsn=10, ack_lsn=10, size_bytes=150))
    while c._queue.qsize():
        time.sleep(0.01)
    second = threading.Thread(target=c.submit, args=(Batch([event(20)], durable_lsn=20, ack_lsn=20, size_bytes=60),))
    second.start()
    second.join(1.2)
    assert second.is_alive(), "a batch was queued past the byte bound (150 + 60 of 200)"
    w.gate.set()
    second.join(10)
    assert not second.is_alive()
    c.submit(Batch([event(30)], durable_lsn=30, ack_lsn=30, size_bytes=1000))  # wider than the bound: alone
    c.drain()
    c.close()
    assert [lsn for kind, lsn in w.calls if kind == "position"] == [10, 20, 30]
