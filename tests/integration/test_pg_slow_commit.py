"""A slow bronze commit must not cost the replication connection (review finding C7).

While the stream's loop waits for the committer (a batch committing, the next one queued), it
neither reads nor answers the server; a commit slower than `wal_sender_timeout` (an object store
having a bad minute) made the walsender drop the connection and ingest exit.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from ingest.events import lsn_to_int
from tests.helpers.pg import bronze_events, prepare

pytestmark = pytest.mark.integration

SENDER_TIMEOUT_S = 2
SLOW_COMMIT_S = 3 * SENDER_TIMEOUT_S


def test_standby_status_keeps_flowing_while_a_commit_is_slower_than_wal_sender_timeout(
    warehouse: Any, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest.bronze.writer import BronzeWriter
    from ingest.config import BatchConfig
    from ingest.progress import Progress
    from ingest.sources.postgres import capture
    from ingest.sources.postgres.capture import PostgresCapture

    class SlowFirstCommit(BronzeWriter):
        """Bronze on a store whose first events commit takes SLOW_COMMIT_S."""

        slow = True

        def append_events(self, *args: Any, **kw: Any) -> None:
            if self.slow:
                self.slow = False
                time.sleep(SLOW_COMMIT_S)
            super().append_events(*args, **kw)

    monkeypatch.setattr(capture, "KEEPALIVE_WHILE_WAITING_S", SENDER_TIMEOUT_S / 4)
    s = make_source("create table items (id int primary key)", ["items"])
    # The walsender of this connection gives up on a silent client after SENDER_TIMEOUT_S.
    dsn = make_conninfo(s.dsn, options=f"-c wal_sender_timeout={SENDER_TIMEOUT_S}s")
    src = s.config().model_copy(update={"dsn": dsn})
    prepare(src)
    for i in range(30):  # 30 transactions: the batches of 5 queue up behind the slow first commit
        s.execute(f"insert into items values ({i})")
    cap = PostgresCapture(
        src,
        BatchConfig(max_events=5, max_seconds=0.1),
        SlowFirstCommit(warehouse),
        Progress(s.name, enabled=False),
        snapshots=False,
    )
    cap.run(once=True, should_stop=lambda: False)
    assert [e.record for e in bronze_events(warehouse, s.name)] == [f'{{"id":{i}}}' for i in range(30)]
    # The connection lived through the slow commit: the server heard the final acknowledgement.
    with psycopg.connect(s.dsn) as c:
        row = c.execute(
            "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s", (src.slot_name,)
        ).fetchone()
    assert row is not None and lsn_to_int(row[0]) == cap.ack_lsn
