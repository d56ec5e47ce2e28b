"""Capture from a physical standby (PostgreSQL 16+): the primary connection and exact page snapshots.

A standby cannot write WAL, so the few statements ingest must write (logical messages, publication
changes, the standby snapshot a new slot waits for) go to the primary named by `primary_dsn`;
the slot, the stream and snapshot reads stay on the standby. The messages replicate to the
standby at the same LSNs, where the standby's slot decodes them as it would on the primary.

A page's MVCC snapshot on a standby is exact only with its in-progress transactions listed:
`pg_current_snapshot()` there leaves them out (a hot standby keeps them in the snapshot's subxip,
which pg_snapshot does not carry), so ingest lists them itself (`read_standby_snapshot`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import pq

from ingest.config import PostgresSource
from ingest.errors import SourceError, SourceUnavailableError
from ingest.events import lsn_to_int
from ingest.sources.postgres.replication import safe_dsn

STANDBY_DECODING_VERSION = 160000  # server_version_num of the first release that decodes on a standby
# While a slot is created on a standby, the primary logs a standby snapshot this often: the slot
# waits for one (a running-transactions record) after its start, which an idle primary logs only
# every 15 s, or never.
STANDBY_SNAPSHOT_INTERVAL_S = 0.5
# A page's snapshot on a standby is retried until the standby was idle across it (no WAL received
# and not yet replayed); this long at most, then the page fails transiently.
QUIET_SNAPSHOT_TIMEOUT_S = 60.0
QUIET_SNAPSHOT_BACKOFF_S = (0.001, 0.05)  # first and largest pause between tries
# The WAL position a source has reached: its replay position on a standby (pg_current_wal_lsn()
# fails there), its current write position on a primary.
WAL_POSITION_SQL = "case when pg_is_in_recovery() then pg_last_wal_replay_lsn() else pg_current_wal_lsn() end"
# The page's first statement takes its snapshot; the in-progress transactions below its xmax are
# those the standby has neither committed nor aborted (pg_xact_status: its clog and known xids).
STANDBY_SNAPSHOT_SQL = (
    b"select pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, "
    b"array_to_string(array(select x from generate_series(pg_snapshot_xmin(s)::text::bigint, "
    b"pg_snapshot_xmax(s)::text::bigint - 1) x where pg_xact_status(x::text::xid8) = 'in progress'), ',') "
    b"from pg_current_snapshot() s"
)
REPLAYED_SQL = b"select pg_last_wal_replay_lsn()::text"
IN_RECOVERY_SQL = b"select pg_is_in_recovery()"
RECEIVED_SQL = b"select pg_last_wal_receive_lsn()::text"


@dataclass(frozen=True, slots=True)
class StandbyRole:
    """What a source's server is: a standby (in recovery) or a primary, its version and its system."""

    in_recovery: bool
    version_num: int
    system_identifier: int


def server_role(conn: psycopg.Connection[tuple[object, ...]]) -> StandbyRole:
    """The role of the server behind `conn` (pg_is_in_recovery, server_version_num, pg_control_system)."""
    row = conn.execute(
        "select pg_is_in_recovery(), current_setting('server_version_num')::int, "
        "(select system_identifier from pg_control_system())"
    ).fetchone()
    assert row is not None
    return StandbyRole(bool(row[0]), int(str(row[1])), int(str(row[2])))


def primary_dsn(src: PostgresSource) -> str:
    """The source's `primary_dsn`; SourceError naming the option if there is none."""
    if src.primary_dsn is None:
        raise SourceError(
            f"source {src.name!r}: {safe_dsn(src.dsn)} is a standby (pg_is_in_recovery() is true), which cannot "
            "write the logical messages ingest places heartbeats, snapshot pages and the --once drain with; set "
            "`primary_dsn` on the source to a connection to its primary (used for those messages only; the slot, "
            "stream and snapshots stay on the standby)"
        )
    return src.primary_dsn


def check_standby(src: PostgresSource, standby: StandbyRole, primary: StandbyRole) -> None:
    """A standby source must be 16+, and `primary_dsn` must name a primary of the same cluster.

    A primary_dsn pointing at another cluster would put the messages in a WAL the slot never
    decodes: every page would wait for a watermark forever, and `--once` for its drain marker.
    """
    if standby.version_num < STANDBY_DECODING_VERSION:
        raise SourceError(
            f"source {src.name!r}: {safe_dsn(src.dsn)} is a standby of PostgreSQL {standby.version_num // 10000}; "
            "logical decoding on a standby needs PostgreSQL 16 or newer: point `dsn` at the primary"
        )
    if primary.in_recovery:
        raise SourceError(f"source {src.name!r}: primary_dsn {safe_dsn(src.primary_dsn or '')} is a standby too")
    if primary.system_identifier != standby.system_identifier:
        raise SourceError(
            f"source {src.name!r}: primary_dsn {safe_dsn(src.primary_dsn or '')} is not the primary of "
            f"{safe_dsn(src.dsn)} (system identifiers {primary.system_identifier} and {standby.system_identifier})"
        )


class StandbyPromotedError(SourceUnavailableError):
    """The standby a source captures from was promoted: its primary-side work now belongs to it.

    Transient on purpose: the retry restarts the capture from bronze's durable position, and the
    restarted capture finds `dsn` a primary and writes everything there (`primary_dsn` unused).
    """


def promoted_error(src: PostgresSource) -> StandbyPromotedError:
    """The error for a standby source whose server has left recovery (pg_is_in_recovery() false)."""
    return StandbyPromotedError(
        f"source {src.name!r}: the standby {safe_dsn(src.dsn)} was promoted (pg_is_in_recovery() is false): ingest "
        f"writes nothing more to primary_dsn {safe_dsn(src.primary_dsn or '')} and restarts its capture on the "
        "promoted server, its own primary from now on; remove `primary_dsn` from the source, and fence the old "
        "primary if it is still up (docs/postgres.md, Capture from a standby)"
    )


def ensure_still_standby(conn: psycopg.Connection[tuple[object, ...]], src: PostgresSource) -> None:
    """StandbyPromotedError when the server behind `conn` (the source's standby) has left recovery.

    Asked before each write through `primary_dsn`: a message written to the old primary after a
    promotion never reaches the promoted server's slot (a page would wait for its watermark, the
    drain for its marker), and an old primary still up would diverge with ingest's writes in it.
    """
    row = conn.execute(IN_RECOVERY_SQL).fetchone()
    if row is None or row[0] is not True:
        raise promoted_error(src)


@contextmanager
def standby_snapshots_logged(source: str, primary: psycopg.Connection[tuple[object, ...]]) -> Iterator[None]:
    """While the body runs, have the primary log a standby snapshot every STANDBY_SNAPSHOT_INTERVAL_S.

    Creating a slot on a standby waits for a running-transactions record after the slot's start;
    without one (an idle primary logs none) the creation would hang. `primary` is used by a
    thread of its own until the body ends: nothing else may use it meanwhile.
    """
    done = threading.Event()

    def log_snapshots() -> None:
        while not done.wait(STANDBY_SNAPSHOT_INTERVAL_S):
            primary.execute("select pg_log_standby_snapshot()")

    primary.execute("select pg_log_standby_snapshot()")
    thread = threading.Thread(target=log_snapshots, name=f"standby-snapshots-{source}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def read_standby_snapshot(
    exec_: Callable[[bytes], pq.abc.PGresult], begin: Callable[[], object], rollback: Callable[[], object], source: str
) -> tuple[int, int, tuple[int, ...]]:
    """Open the page's transaction on a standby and take its snapshot: (xmin, xmax, in-progress xids).

    The in-progress list comes from pg_xact_status, read after the snapshot: it is the snapshot's
    own only if no transaction ended in between. On a standby a transaction ends only when its
    commit or abort record is replayed, and a record is replayed only once received, so the list
    is exact when nothing was received past what had been replayed before the snapshot (the
    received position read after the list is not past the replayed position read before the
    BEGIN: in streaming replication the standby replays only WAL its receiver has flushed).
    Otherwise the transaction is rolled back and tried again after a short pause; a standby that
    never stays idle that long (a primary writing without pause) fails the page transiently.
    """
    deadline = time.monotonic() + QUIET_SNAPSHOT_TIMEOUT_S
    pause, most = QUIET_SNAPSHOT_BACKOFF_S
    while True:
        replayed = (exec_(REPLAYED_SQL).get_value(0, 0) or b"").decode()
        begin()
        snap = exec_(STANDBY_SNAPSHOT_SQL)
        received = (exec_(RECEIVED_SQL).get_value(0, 0) or b"").decode()
        if replayed and received and lsn_to_int(received) <= lsn_to_int(replayed):
            xmin, xmax = int(snap.get_value(0, 0) or b"0"), int(snap.get_value(0, 1) or b"0")
            xip_text = (snap.get_value(0, 2) or b"").decode()
            return xmin, xmax, tuple(int(x) for x in xip_text.split(",") if x)
        rollback()
        if time.monotonic() > deadline:
            raise SourceUnavailableError(
                f"source {source!r}: the standby kept receiving WAL for {QUIET_SNAPSHOT_TIMEOUT_S:.0f} s without a "
                "pause to take a snapshot page in (or streams none: pg_last_wal_receive_lsn() is null); trying again"
            )
        time.sleep(pause)
        pause = min(most, pause * 2)
