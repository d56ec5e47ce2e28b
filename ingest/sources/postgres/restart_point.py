"""Moves a slot's restart point up to its confirmed position before streaming, so the server does not decode again.

A logical slot has two positions: `confirmed_flush_lsn`, what the client confirmed (the stream
resumes there), and `restart_lsn`, where the server starts reading WAL to rebuild the
transactions open at the resume point. The server moves `restart_lsn` only at a
running-transactions record (a checkpoint's, or the background writer's every 15 s or so) that
it decodes while the client is connected, once the client has confirmed past that record, and
it keeps one such proposal at a time: records decoded while one waits are dropped. Ingest
confirms no further than an open streamed transaction's start, so a proposal made while a large
transaction streams waits until its commit is confirmed, the records after the commit are
dropped meanwhile, and `restart_lsn` stays just before that transaction. A `run --once` ends
right after; the next start reads the transaction again from there, before the confirmed
position, where PostgreSQL does not stream, so it holds it in memory and spills what exceeds
`logical_decoding_work_mem` to its disk, then skips it (134 MB and seconds for a 160 MB insert).

`pg_replication_slot_advance(slot, confirmed_flush_lsn)` reads the same WAL in fast-forward
mode: it queues no change (nothing to spill) and takes each running-transactions record below
the confirmed position at once, so `restart_lsn` reaches the last of them (with none logged
after the transaction's commit it stays, and the stream reads the transaction again). The
target is the confirmed position read in the same statement, so the confirmed position does not
move and nothing the stream would send is skipped. It is an optimisation: when the server
refuses it, the start goes on as before.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import psycopg

from ingest.config import PostgresSource
from ingest.events import lsn_to_int

log = logging.getLogger(__name__)

# The target is the slot's own confirmed position, read in the statement that advances: never past it.
ADVANCE_SQL: Final = (
    "select restart_lsn::text, (pg_replication_slot_advance(slot_name, confirmed_flush_lsn)).end_lsn::text "
    "from pg_replication_slots where slot_name = %s and confirmed_flush_lsn is not null and restart_lsn is not null"
)
# A slot a standby synchronizes from its primary (17+) cannot be decoded there, not even to advance
# it; once the standby is promoted it is an ordinary slot.
NOT_SYNCED_SQL: Final = " and not (synced and pg_is_in_recovery())"
SYNCED_SLOTS_VERSION: Final = 170000  # server_version_num of the first release with `synced`
RESTART_SQL: Final = "select restart_lsn::text from pg_replication_slots where slot_name = %s"
# The server's refusals that say only "not now": the slot still held by the previous run's exiting
# walsender (55006), a slot being synchronized, invalidated or moved meanwhile (55000), a slot gone
# (42704). START_REPLICATION meets each of them again and handles it (a retry, or the slot-loss error).
REFUSALS: Final = frozenset({"55006", "55000", "42704"})


def advance_restart_point(conn: psycopg.Connection[tuple[object, ...]], src: PostgresSource) -> None:
    """Advance `src`'s slot to its own confirmed position over `conn` (only `restart_lsn` moves); refusals are logged.

    Costs a read of the WAL between the slot's restart and confirmed positions (normally what the
    last run read; bounded by the connection's statement_timeout, after which the stream starts
    without it). A refusal is a debug line; a timeout or an unexpected server error a warning.
    A connection that fails is raised as it is: the run's retry handles it as any outage.
    """
    synced = NOT_SYNCED_SQL if conn.info.server_version >= SYNCED_SLOTS_VERSION else ""
    t0 = time.monotonic()
    try:
        row = conn.execute(ADVANCE_SQL + synced, (src.slot_name,)).fetchone()
        after = conn.execute(RESTART_SQL, (src.slot_name,)).fetchone() if row is not None else None
    except psycopg.Error as e:
        if e.sqlstate is None:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        level = logging.DEBUG if e.sqlstate in REFUSALS else logging.WARNING
        log.log(
            level,
            "restart point not advanced source=%s slot=%s sqlstate=%s: %s (the stream starts from restart_lsn)",
            src.name,
            src.slot_name,
            e.sqlstate,
            first,
        )
        return
    if row is None or after is None or after[0] is None:
        why = "no such slot, or one synchronized from the primary"
        log.debug("restart point not advanced source=%s slot=%s: %s", src.name, src.slot_name, why)
        return
    before, now = lsn_to_int(str(row[0])), lsn_to_int(str(after[0]))
    log.debug(
        "restart point advanced source=%s slot=%s restart_lsn=%s moved_bytes=%d confirmed_flush_lsn=%s seconds=%.2f",
        src.name,
        src.slot_name,
        after[0],
        now - before,
        row[1],
        time.monotonic() - t0,
    )
