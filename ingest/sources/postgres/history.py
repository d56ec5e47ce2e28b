"""Whether a Postgres slot re-delivers the history bronze holds, checked before the stream skips anything.

A restarted stream skips every re-delivered transaction that commits at or below bronze's durable
position. That is right only if the server's history is the one bronze read. A source restored
from a storage snapshot, or failed over to a standby that was behind, replays other transactions
at those positions: skipping them would lose them silently, and bronze's rows of the history
that no longer exists would stay live.

The slot itself tells which: Postgres re-delivers exactly the transactions whose commit starts
at or after the slot's confirmed position. In the same history, those up to the durable position
are the ones bronze holds, with the same commit positions and xids. So before streaming, the
slot is peeked (decoded without consuming) up to the durable position, and the transactions it
would send are compared with bronze's. Only a slot that starts at or below the durable position
has anything to compare (a crash before the last acknowledgement, or a restored slot); a clean
restart costs no peek.
"""

from __future__ import annotations

import struct
from typing import Final

import psycopg

from ingest.config import PostgresSource
from ingest.errors import SourceUnavailableError
from ingest.events import int_to_lsn
from ingest.sources.postgres.admin import connect
from ingest.sources.postgres.pgoutput import PROTO_VERSION
from ingest.sources.postgres.standby import WAL_POSITION_SQL

MSG_BEGIN: Final = ord("B")
MSG_INSERT, MSG_UPDATE, MSG_DELETE, MSG_TRUNCATE, MSG_MESSAGE = (ord(c) for c in "IUDTM")
# Begin: Byte1('B'), Int64 final (commit) LSN, Int64 commit timestamp, Int32 xid
BEGIN_LAYOUT: Final = struct.Struct(">qqI")
RELID: Final = struct.Struct(">I")  # a change's relation, right after its type byte
TRUNCATE_HEAD: Final = struct.Struct(">IB")  # Truncate: Int32 relation count, Int8 options, then the relations
MESSAGE_TRANSACTIONAL: Final = 1
# The stream's options, so that the same transactions are decoded; only what says which
# transaction touched which table leaves the server.
PEEK_SQL: Final = (
    "select data from pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, null, "
    "'proto_version', %s, 'publication_names', %s, 'messages', 'true') "
    "where get_byte(data, 0) = any(%s::int[])"
)
# The configured tables and, for a partitioned one, its partitions (whose changes the server may
# send under their own names); pg_partition_tree has no row for a plain table.
RELIDS_SQL: Final = (
    "select coalesce(p.relid, c.r)::oid::bigint from unnest(%s::text[], %s::text[]) t(nsp, rel) "
    "cross join lateral (select to_regclass(quote_ident(t.nsp) || '.' || quote_ident(t.rel)) as r) c "
    "left join lateral pg_partition_tree(c.r) p on true where c.r is not null"
)


def redelivered_transactions(src: PostgresSource, upto: int) -> list[tuple[int, int]]:
    """(commit LSN, xid) of each transaction the slot would send first, up to commit LSN `upto`, in order.

    Only transactions ingest writes to bronze: those changing a configured table, or carrying a
    transactional logical message. The slot is decoded from its restart position as far as `upto`
    (server work and temporary disk grow with the WAL in between, normally seconds' worth) and is
    not moved. A slot still held by a walsender that has not noticed a dead client yet is
    transient: the run retries.
    """
    names = [t.split(".", 1) for t in src.tables]
    kinds = [MSG_BEGIN, MSG_INSERT, MSG_UPDATE, MSG_DELETE, MSG_TRUNCATE, MSG_MESSAGE]
    conn = connect(src)
    try:
        relids = {int(str(r[0])) for r in conn.execute(RELIDS_SQL, ([n[0] for n in names], [n[1] for n in names]))}
        rows = conn.execute(
            PEEK_SQL, (src.slot_name, int_to_lsn(upto + 1), str(PROTO_VERSION), f'"{src.publication_name}"', kinds)
        ).fetchall()
    except psycopg.errors.ObjectInUse as e:
        raise SourceUnavailableError(f"source {src.name!r}: slot {src.slot_name!r} is still in use: {e}") from None
    finally:
        conn.close()
    out: list[tuple[int, int]] = []
    txn: tuple[int, int] | None = None
    for (raw,) in rows:
        data = bytes(raw)  # type: ignore[call-overload]
        if data[0] == MSG_BEGIN:
            commit_lsn, _ts, xid = BEGIN_LAYOUT.unpack_from(data, 1)
            txn = (commit_lsn, xid) if commit_lsn <= upto else None
        elif txn is not None and _captured(data, relids):
            out.append(txn)
            txn = None  # counted once
    return out


def _captured(data: bytes, relids: set[int]) -> bool:
    """Whether a message inside a transaction puts something of it into bronze."""
    kind = data[0]
    if kind == MSG_MESSAGE:
        return bool(data[1] & MESSAGE_TRANSACTIONAL)
    if kind == MSG_TRUNCATE:
        count, _options = TRUNCATE_HEAD.unpack_from(data, 1)
        return any(RELID.unpack_from(data, 1 + TRUNCATE_HEAD.size + 4 * i)[0] in relids for i in range(count))
    return RELID.unpack_from(data, 1)[0] in relids


def first_difference(bronze: list[tuple[int, int]], slot: list[tuple[int, int]]) -> str | None:
    """Where the slot's transactions part from bronze's (both (commit LSN, xid) in order), or None."""
    for i in range(max(len(bronze), len(slot))):
        b = bronze[i] if i < len(bronze) else None
        s = slot[i] if i < len(slot) else None
        if b == s:
            continue
        if b is not None and (s is None or b[0] < s[0]):
            return f"bronze's transaction {b[1]} at {int_to_lsn(b[0])} is not in the server's history"
        if s is not None and (b is None or s[0] < b[0]):
            return f"the server sends transaction {s[1]} at {int_to_lsn(s[0])}, which bronze does not hold"
        assert b is not None and s is not None
        return f"at {int_to_lsn(s[0])} the server has transaction {s[1]} where bronze holds transaction {b[1]}"
    return None


def advance_slot(src: PostgresSource) -> None:
    """Move the slot to the server's current WAL position (what it would send until then is skipped).

    A standby's is its replay position.
    """
    conn = connect(src)
    try:
        conn.execute(f"select pg_replication_slot_advance(%s, {WAL_POSITION_SQL})", (src.slot_name,))
    except psycopg.errors.ObjectInUse as e:
        raise SourceUnavailableError(f"source {src.name!r}: slot {src.slot_name!r} is still in use: {e}") from None
    finally:
        conn.close()
