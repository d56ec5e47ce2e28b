"""Moves a slot's restart point past what bronze holds (at the start, at a --once drain): no decoding it again.

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

The advance needs such a record between the transaction's commit and the confirmed position. A
`run --once` started right after the commit (a scheduled job after a bulk load) drains before
the background writer logs one, so the next start would read the transaction again all the same.
`pass_restart_point` closes that gap at the drain: once the run has confirmed its drain marker
(every proposal made so far applies then), if `restart_lsn` still lags it by enough WAL to hold
a transaction the server would spill, the server logs its running transactions now
(`pg_log_standby_snapshot()`, 16+) and the run drains once more, to a second marker after that
record: the walsender proposes the record's own position, no older proposal is waiting, and the
run's confirmation of the second marker applies it. 14 and 15 have no such
function (a CHECKPOINT would do it, needs more privilege and is heavy): nothing is done there.
A continuous run needs none of it: it stays connected while the background writer logs the next
record (every 15 s while there is WAL activity, its heartbeats included) and confirms past it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import psycopg

from ingest.config import PostgresSource
from ingest.events import int_to_lsn, lsn_to_int
from ingest.sources.postgres.replication import OWN_STATEMENT_DEADLINE_S, abort_after

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
# How far the slot's restart_lsn lags a position, and the walsender's memory for decoding (the
# same DSN's options as the stream's); null when the slot is gone.
LAG_SQL: Final = (
    "select %s::pg_lsn - restart_lsn, pg_size_bytes(current_setting('logical_decoding_work_mem')) "
    "from pg_replication_slots where slot_name = %s and restart_lsn is not null"
)
# A change takes up to this many bytes of the walsender's memory per byte of its WAL record (a
# narrow row's change carries ~100 bytes of bookkeeping there): WAL this much smaller than
# `logical_decoding_work_mem` cannot hold a transaction the server would spill.
MEMORY_PER_WAL_BYTE: Final = 4
RUNNING_XACTS_VERSION: Final = 160000  # server_version_num of the first release with pg_log_standby_snapshot()
LOG_RUNNING_XACTS_SQL: Final = "select pg_log_standby_snapshot()::text"
# Why a server does not log its running transactions for ingest: EXECUTE is a superuser's unless
# granted (42501), a server in recovery or below wal_level replica (55000), no such function (42883).
LOG_REFUSALS: Final = frozenset({"42501", "55000", "42883"})
# Sources whose server refused in this process: one debug line per run, not one per drain or retry.
_refused: set[str] = set()


def _first_line(e: psycopg.Error) -> str:
    """The server's message's first line (its detail and hint follow on later lines), or the error's type."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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
        first = _first_line(e)
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


def pass_restart_point(
    conn: psycopg.Connection[tuple[object, ...]],
    writer: Callable[[], psycopg.Connection[tuple[object, ...]]],
    src: PostgresSource,
    confirmed: int,
) -> bool:
    """Have the server WAL-log its running transactions if `src`'s restart_lsn lags `confirmed` too far.

    `conn` is on the slot's server; `writer()` gives the connection to the server ingest writes to
    (a standby source's primary: the record replicates to the slot's server), asked only when the
    lag calls for the record. `confirmed` is the position the run has just confirmed to the
    stream (its drain marker's end), sent before this is called: the walsender applies every
    waiting proposal before it decodes the record. True when the record was logged: the caller
    then drains to a marker emitted after it, and confirms that. Costs one query, and a small WAL
    record when the lag (in bytes) is larger than the WAL a spilled transaction takes at least
    (`logical_decoding_work_mem` / MEMORY_PER_WAL_BYTE). A refusal (no privilege, no such
    function before 16, a server in recovery) is a debug line, once per process; a timeout or
    another server error a warning; a connection that fails is raised as it is.
    """
    if src.name in _refused:
        return False
    try:
        row = conn.execute(LAG_SQL, (int_to_lsn(confirmed), src.slot_name)).fetchone()
        if row is None or int(str(row[0])) <= int(str(row[1])) // MEMORY_PER_WAL_BYTE:
            return False
        lag = int(str(row[0]))
        on = writer()
        if on.info.server_version < RUNNING_XACTS_VERSION:
            _refused.add(src.name)
            log.debug(
                "running transactions not logged source=%s slot=%s lag_bytes=%d: PostgreSQL %d has no "
                "pg_log_standby_snapshot() (it needs PostgreSQL 16); the next start reads from restart_lsn",
                src.name,
                src.slot_name,
                lag,
                on.info.server_version // 10000,
            )
            return False
        with abort_after(on.pgconn.socket, OWN_STATEMENT_DEADLINE_S, f"source {src.name!r}: standby snapshot"):
            logged = on.execute(LOG_RUNNING_XACTS_SQL).fetchone()
    except psycopg.Error as e:
        if e.sqlstate is None:
            raise
        first = _first_line(e)
        refused = e.sqlstate in LOG_REFUSALS
        if refused:
            _refused.add(src.name)
        log.log(
            logging.DEBUG if refused else logging.WARNING,
            "running transactions not logged source=%s slot=%s sqlstate=%s: %s (the next start reads from restart_lsn)",
            src.name,
            src.slot_name,
            e.sqlstate,
            first,
        )
        return False
    log.debug(
        "running transactions logged source=%s slot=%s lag_bytes=%d at=%s: the run drains past them",
        src.name,
        src.slot_name,
        lag,
        logged[0] if logged is not None else None,
    )
    return True
