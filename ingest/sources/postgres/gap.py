"""Whether a history-lost recovery can leave silver's records in place: bronze's transactions are the server's past.

A recovery without a truncate relies on the placement rules of snapshot pages (docs/snapshots.md):
a page row, and the search for keys a whole-table snapshot did not find, treat a stream event as
older than the snapshot when the snapshot's MVCC snapshot sees its transaction. That holds for
every event bronze holds when the server's history is the one bronze read: each of them
committed before the recovery. It does not when bronze holds transactions of a history the
server no longer has (restored from a copy, failed over to a standby that was behind): the server
may not have reached their xids yet, or run one of them now, and a page would then count them as
changes it could not see (a row it read dropped, a key it did not find left live).
"""

from __future__ import annotations

from ingest.bronze.schemas import WAL_EVENTS_TABLE
from ingest.bronze.state import sql_str
from ingest.bronze.writer import BronzeWriter
from ingest.positions import STREAM_WRITER_ID
from ingest.sources.postgres.admin import PostgresAdmin

XID_SPACE = 1 << 32  # pgoutput carries 32-bit xids; pg_current_snapshot() gives 64-bit ones
HALF_XID_SPACE = 1 << 31
SNAPSHOT_BOUNDS_SQL = "select pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text from pg_current_snapshot() s"
# pg_xact_status also lists a standby's running transactions, which its pg_current_snapshot() leaves out.
IN_PROGRESS_SQL = "select x from unnest(%s::bigint[]) x where pg_xact_status(x::text::xid8) = 'in progress' order by x"


def widen(xid: int, xmax: int) -> int:
    """The 64-bit xid nearest to `xmax` whose low 32 bits are `xid` (as the dbt macro pg_xid_visible widens it)."""
    distance = (xmax - xid) % XID_SPACE
    if distance > HALF_XID_SPACE:
        distance -= XID_SPACE
    return xmax - distance


def unseen_transactions(admin: PostgresAdmin, writer: BronzeWriter, source: str) -> list[int]:
    """The xids (64-bit, ascending) of bronze's stream transactions a snapshot the server takes now might not see.

    Empty when every one is committed (or aborted) in the server's own past: it is below the
    server's next xid and not running, so every later snapshot sees it too. One that is not comes
    from another history, or lies more than 2^31 transactions back (the 32-bit xid then widens to
    a future one, as the dbt placement widens it). Reads the xids bronze holds at or after the
    server's oldest running one (the only ones that can be unseen): a scan of the source's `xid`
    column in bronze.wal_events, once per recovery.
    """
    row = admin.conn.execute(SNAPSHOT_BOUNDS_SQL).fetchone()
    assert row is not None
    xmin, xmax = int(str(row[0])), int(str(row[1]))
    # The distance back from xmax as `widen` computes it: the xids it puts at or after xmin.
    distance = f"((({xmax % XID_SPACE} - xid) % {XID_SPACE} + {XID_SPACE}) % {XID_SPACE})"
    signed = f"(case when {distance} > {HALF_XID_SPACE} then {distance} - {XID_SPACE} else {distance} end)"
    found = writer.tables.query(
        "select distinct xid from t "
        f"where source = {sql_str(source)} and writer_id = {sql_str(STREAM_WRITER_ID)} and xid <> 0 "
        f"and {signed} <= {xmax - xmin}",
        t=writer.path(WAL_EVENTS_TABLE),
    ).column("xid")
    widened = sorted({widen(int(x), xmax) for x in found.to_pylist()})
    unseen = [x for x in widened if x >= xmax]
    running = [x for x in widened if x < xmax]
    if running:
        unseen += [int(str(r[0])) for r in admin.conn.execute(IN_PROGRESS_SQL, (running,)).fetchall()]
    return sorted(unseen)
