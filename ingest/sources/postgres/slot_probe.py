"""Reads a Postgres slot's health for metrics, alerts and `status --json`, over its own connection.

Used by the watcher thread of a running ingest (every few seconds, never per message) and by
`status`. It opens a plain connection of its own, so it never waits behind the stream's admin
connection, and reconnects after a failure.
"""

from __future__ import annotations

from typing import Final

import psycopg

from ingest.config import PostgresSource
from ingest.errors import SourceError
from ingest.events import lsn_to_int
from ingest.ops.health import SlotState
from ingest.sources.postgres.admin import connect
from ingest.sources.postgres.standby import WAL_POSITION_SQL

# safe_wal_size and max_slot_wal_keep_size exist from PostgreSQL 13 on.
# On a standby source the WAL position is the replayed one (WAL_POSITION_SQL).
SLOT_STATE_SQL: Final = (
    f"select s.slot_name is not null, s.confirmed_flush_lsn::text, ({WAL_POSITION_SQL})::text, s.wal_status, "
    "s.safe_wal_size, s.active_pid, pg_size_bytes(current_setting('max_slot_wal_keep_size')), "
    # greatest() skips a null: without the case, a missing slot would show lag 0
    "case when s.confirmed_flush_lsn is not null "
    f"then greatest(0, pg_wal_lsn_diff({WAL_POSITION_SQL}, s.confirmed_flush_lsn))::bigint end "
    "from (select 1) one left join pg_replication_slots s on s.slot_name = %s"
)


class SlotProbe:
    """Owns one monitoring connection to a Postgres source; `read()` is one query."""

    def __init__(self, src: PostgresSource) -> None:
        """Probe `src`'s slot; nothing is opened until the first `read()`."""
        self.src = src
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def read(self) -> SlotState:
        """The slot's state now; SourceError (SourceUnavailableError if transient) when the server does not answer."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.src)
            row = self._conn.execute(SLOT_STATE_SQL, (self.src.slot_name,)).fetchone()
        except psycopg.Error as e:
            self.close()
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SourceError(f"source {self.src.name!r}: slot probe failed: {first}") from None
        except SourceError:
            self.close()
            raise
        assert row is not None
        exists, flush, cur, wal_status, safe_wal, pid, keep, lag = row
        keep_bytes = int(str(keep)) if keep is not None else -1
        return SlotState(
            self.src.slot_name,
            bool(exists),
            lsn_to_int(str(flush)) if flush else None,
            lsn_to_int(str(cur)),
            str(wal_status) if wal_status else None,
            int(str(safe_wal)) if safe_wal is not None else None,
            keep_bytes if keep_bytes >= 0 else None,
            int(str(pid)) if pid is not None else None,
            int(str(lag)) if lag is not None else None,
        )

    def close(self) -> None:
        """Close the connection (the next `read()` opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
