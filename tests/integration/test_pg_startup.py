"""A run's start and a `run --once` on a quiet source: no bronze read or wait it does not need.

The start read the positions table three times (the stream writer's registration, the snapshot
writers, the initial-snapshot check), a DataFusion query each. A snapshot requested
at the start takes its position from a read made then (the stream writer's row may have just
been written): that read stays. `--once` emits its drain marker once the snapshot thread has
finished, which the loop saw only after a whole read timeout (0.2 s of every short run).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.state import BronzeState
from ingest.events import WriterKind, WriterPosition
from ingest.sources.postgres.admin import DRAIN_PREFIX, PostgresAdmin
from ingest.sources.postgres.capture import DRAIN_PENDING_READ_TIMEOUT_S, PostgresCapture
from ingest.sources.postgres.replication import Keepalive, ReplicationStream, XLogData
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration


def start_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the main thread's reads of the writer rows until the stream loop starts (one entry per run)."""
    counts: list[int] = []
    reads = 0
    positions, loop = BronzeState.positions, PostgresCapture._loop

    def counted(self: BronzeState, source: str | None = None) -> list[tuple[WriterPosition, Any]]:
        nonlocal reads
        if threading.current_thread() is threading.main_thread():
            reads += 1
        return positions(self, source)

    def looping(self: PostgresCapture, *args: Any, **kw: Any) -> None:
        nonlocal reads
        counts.append(reads)
        reads = 0
        loop(self, *args, **kw)

    monkeypatch.setattr(BronzeState, "positions", counted)
    monkeypatch.setattr(PostgresCapture, "_loop", looping)
    return counts


def test_a_start_reads_the_writer_rows_once(warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_source("create table a (id int primary key, v text)", ["a"])
    s.execute("insert into a select g, 'v' || g from generate_series(1, 50) g")
    src = s.config()
    prepare(src)
    counts = start_reads(monkeypatch)

    capture_once(warehouse, src, snapshots=True)  # registers the stream writer, requests the initial snapshot
    s.execute("insert into a values (51, 'after')")
    capture_once(warehouse, src, snapshots=True)  # a plain restart: nothing to request

    # The first start also reads the rows it registers the snapshot at (its safe bound, now).
    assert counts == [2, 1]
    rows = read(warehouse / "bronze" / "stream_positions", f"source = '{src.name}'")
    assert [r["writer_kind"] for r in rows] == [WriterKind.STREAM.value], "the initial snapshot completed"
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{src.name}'")
    assert len(pages) == 50


def test_once_reads_with_a_short_timeout_until_its_drain_marker_is_out(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_source("create table a (id int primary key)", ["a"])
    src = s.config()
    prepare(src)
    capture_once(warehouse, src, snapshots=True)
    s.execute("insert into a values (1)")
    timeouts: list[float] = []
    read, emit = ReplicationStream.read, PostgresAdmin.emit_message

    def reading(self: ReplicationStream, timeout_s: float) -> XLogData | Keepalive | None:
        timeouts.append(timeout_s)
        return read(self, timeout_s)

    def emitting(self: PostgresAdmin, prefix: str, content: str) -> int:
        if prefix == DRAIN_PREFIX:
            timeouts.append(-1.0)  # the marker is out
        return emit(self, prefix, content)

    monkeypatch.setattr(ReplicationStream, "read", reading)
    monkeypatch.setattr(PostgresAdmin, "emit_message", emitting)
    capture_once(warehouse, src, snapshots=True)

    assert -1.0 in timeouts, "the run drained to its marker"
    before = timeouts[: timeouts.index(-1.0)]
    assert set(before) <= {DRAIN_PENDING_READ_TIMEOUT_S}, "a read before the marker waited a whole READ_TIMEOUT_S"
