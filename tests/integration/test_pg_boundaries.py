"""Restart boundaries on a real server: a position ingest recorded from the stream is exclusive.

Regression tests for review finding D1 (../shared/reviews/reliability-2026-11-23.md): a stream
writer that raised its row to a keepalive's `sentPtr` (idle, or stopping) skipped, after a
restart, a transaction whose commit record starts exactly there. The server resends every
transaction whose commit record starts at or after the flushed LSN, so such a transaction is
new, not re-delivered.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

ATTEMPTS = 5  # of the stop-at-commit scenario, which other sessions' WAL can spoil


def _commit_lsn_of_next_commit(dsn: str) -> int:
    from ingest.events import lsn_to_int

    with psycopg.connect(dsn) as c:
        row = c.execute("select pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return lsn_to_int(str(row[0]))


def test_a_transaction_committing_exactly_at_the_stop_position_is_captured(
    warehouse: Any, make_source: Any, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D1: stop while a transaction is open and idle, commit it, restart: its change is in bronze.

    The scenario needs the held transaction's commit record to start exactly where the stop
    acknowledged, which another session writing WAL on the shared server in between (the other test
    worker) prevents: each attempt checks bronze, and the scenario must have happened in one of them.
    """
    from ingest.sources.postgres import capture

    monkeypatch.setattr(capture, "STATUS_INTERVAL_S", 1.0)  # a status round trip a second, not every 10 s
    for attempt in range(ATTEMPTS):
        ack_lsn, durable_lsn, held_commit = _attempt(warehouse / f"{attempt}", make_source, pg_dsn)
        if ack_lsn == held_commit:
            # The stop acknowledged exactly where the held transaction then committed, and the row
            # calls durable only what lies strictly before it.
            assert durable_lsn < held_commit
            return
    pytest.fail(f"other sessions wrote WAL between the stop and the held commit in all {ATTEMPTS} attempts")


def _attempt(warehouse: Any, make_source: Any, pg_dsn: str) -> tuple[int, int, int]:
    """One attempt: returns the stop's ack and durable LSNs and where the held transaction committed."""
    from ingest.bronze.writer import BronzeWriter
    from ingest.config import BatchConfig
    from ingest.progress import Progress
    from ingest.sources.postgres.capture import PostgresCapture

    s = make_source("create table items (id int primary key)", ["items"])
    src = s.config(heartbeat_seconds=3600)
    prepare(src)
    s.execute("insert into items values (1)")
    holder = psycopg.connect(pg_dsn)  # not autocommit: the insert below stays open
    try:
        holder.execute(f"insert into {s.schema}.items values (2)")
        # A committed transaction with no change flushes the WAL past the open insert (an open
        # transaction's records alone may wait for the WAL writer); the walsender decodes past both.
        s.execute("select txid_current()")
        writer = BronzeWriter(warehouse)
        cap = PostgresCapture(
            src, BatchConfig(max_events=1000, max_seconds=0.2), writer, Progress(s.name, enabled=False), snapshots=False
        )
        deadline = time.monotonic() + 4  # status round trips bring a keepalive past the open insert
        cap.run(once=False, should_stop=lambda: time.monotonic() > deadline)
        stream_row = next(p for p, _ in writer.positions(s.name) if p.writer_id == "stream")
        next_commit = _commit_lsn_of_next_commit(pg_dsn)
        holder.commit()
    finally:
        holder.close()
    capture_once(warehouse, src)
    assert [e.record for e in bronze_events(warehouse, s.name)] == ['{"id":1}', '{"id":2}']
    return stream_row.ack_lsn, stream_row.durable_lsn, next_commit
