"""Pure decoder of pgoutput logical replication messages, protocol versions 1 and 2 (streaming).

Longer than our ~300-line norm on purpose: one frozen dataclass and one small decoder per message
type of the protocol, with the wire constants they use, so the whole wire format reads in one
place against the PostgreSQL docs ("Logical Replication Message Formats").
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from ingest.errors import IngestError

PROTO_VERSION: Final = 1
# Protocol 2 (PostgreSQL 14+) adds the streaming of in-progress transactions: Stream Start/Stop
# frame chunks of one transaction, Stream Commit/Abort end it, and inside a Stream Start..Stop
# block each change message carries its (sub)transaction's xid after the type byte.
PROTO_VERSION_STREAMING: Final = 2

# Message type bytes (PostgreSQL docs, "Logical Replication Message Formats").
MSG_BEGIN: Final = b"B"
MSG_COMMIT: Final = b"C"
MSG_ORIGIN: Final = b"O"
MSG_RELATION: Final = b"R"
MSG_TYPE: Final = b"Y"
MSG_INSERT: Final = b"I"
MSG_UPDATE: Final = b"U"
MSG_DELETE: Final = b"D"
MSG_TRUNCATE: Final = b"T"
MSG_MESSAGE: Final = b"M"
MSG_STREAM_START: Final = b"S"
MSG_STREAM_STOP: Final = b"E"
MSG_STREAM_COMMIT: Final = b"c"
MSG_STREAM_ABORT: Final = b"A"
# Message types that carry an xid after the type byte inside a stream block (Origin does not).
STREAMED_WITH_XID: Final = frozenset(b"IUDTRYM")
STREAM_FIRST_SEGMENT: Final = 1

# Tuple submessage markers inside Insert/Update/Delete.
TUPLE_NEW: Final = b"N"
TUPLE_KEY: Final = b"K"
TUPLE_OLD: Final = b"O"

# Column markers inside TupleData.
COL_NULL: Final = b"n"
COL_UNCHANGED_TOAST: Final = b"u"
COL_TEXT: Final = b"t"
COL_BINARY: Final = b"b"

RELATION_COLUMN_KEY_FLAG: Final = 1
MESSAGE_TRANSACTIONAL_FLAG: Final = 1
TRUNCATE_CASCADE: Final = 1
TRUNCATE_RESTART_IDENTITY: Final = 2

# Microseconds between the Unix epoch (1970-01-01) and the PostgreSQL epoch (2000-01-01), UTC.
PG_EPOCH_OFFSET_US: Final = 946_684_800 * 1_000_000

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_BEGIN = struct.Struct("!QqI")  # final LSN, commit timestamp, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit timestamp
_MESSAGE_HEAD = struct.Struct("!BQ")  # flags, LSN
_TRUNCATE_HEAD = struct.Struct("!iB")  # relation count, options
_COLUMN_TAIL = struct.Struct("!Ii")  # type OID, type modifier
_REL_TUPLE = struct.Struct("!Ic")  # relation OID, tuple kind byte
_STREAM_START = struct.Struct("!IB")  # xid, first-segment flag
_STREAM_COMMIT = struct.Struct("!IBQQq")  # xid, flags, commit LSN, end LSN, commit timestamp
_STREAM_ABORT = struct.Struct("!II")  # top-level xid, (sub)transaction xid

_NULL = COL_NULL[0]
_UNCHANGED = COL_UNCHANGED_TOAST[0]
_TEXT = COL_TEXT[0]
_BINARY = COL_BINARY[0]


class PgOutputError(IngestError):
    """A pgoutput message could not be decoded: unknown byte, truncated or trailing data.

    The decoder never skips what it cannot read; the stream must stop so no change is lost.
    """


class UnchangedToast(enum.Enum):
    """Sentinel type for a column sent with the 'u' marker (TOASTed value unchanged, not sent)."""

    UNCHANGED_TOAST = "u"

    def __repr__(self) -> str:
        """Show the sentinel by its public name."""
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast.UNCHANGED_TOAST

TupleValue = bytes | None | Literal[UnchangedToast.UNCHANGED_TOAST]
"""One column of a tuple: None (NULL), UNCHANGED_TOAST, or the value bytes (text format unless
the stream was opened with `binary 'true'`)."""
TupleData = tuple[TupleValue, ...]


def pg_to_unix_us(pg_ts_us: int) -> int:
    """Convert a pgoutput timestamp (microseconds since 2000-01-01 UTC) to Unix epoch microseconds."""
    return pg_ts_us + PG_EPOCH_OFFSET_US


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction; `final_lsn` is its commit LSN, `commit_ts_us` is PG-epoch µs."""

    final_lsn: int
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction; acknowledge the slot with `end_lsn`. `commit_ts_us` is PG-epoch µs."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    """The replication origin the transaction came from (sent after Begin when set)."""

    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a Relation message; `flags` bit 1 marks a replica identity column."""

    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        """Whether the column is part of the replica identity (every column under FULL)."""
        return bool(self.flags & RELATION_COLUMN_KEY_FLAG)


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape, sent before its first change in a session and after each DDL.

    `namespace` is the empty string for pg_catalog (as the server sends it).
    `replica_identity` is 'd' default, 'f' full, 'i' index or 'n' nothing.
    """

    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """A non-built-in type used by a following Relation (message 'Y')."""

    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    """A new row."""

    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """A changed row; `old_kind` is 'K' (key changed), 'O' (REPLICA IDENTITY FULL) or None."""

    relation_id: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """A deleted row; `old_kind` is 'K' (key columns, others NULL) or 'O' (full old row)."""

    relation_id: int
    old_kind: str
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    """One TRUNCATE of one or more tables; `options` bits: 1 CASCADE, 2 RESTART IDENTITY."""

    options: int
    relation_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A `pg_logical_emit_message` payload; `lsn` is where it was written."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A chunk of in-progress transaction `xid` (top-level) follows, up to the next StreamStop."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The end of a chunk of streamed changes."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """Streamed transaction `xid` committed: its fields are those of Begin + Commit in protocol 1."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Streamed `subxid` aborted: a subtransaction of `xid`, or the whole transaction when they are equal."""

    xid: int
    subxid: int


PgOutputMessage = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeInfo
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """Read a NUL-terminated UTF-8 string at `pos`; return it and the offset after the NUL."""
    end = buf.find(b"\0", pos)
    if end < 0:
        raise PgOutputError(
            f"truncated pgoutput message: string at offset {pos} has no NUL terminator (message is {len(buf)} bytes)"
        )
    return buf[pos:end].decode("utf-8"), end + 1


def _tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    """Read TupleData at `pos`; return the values and the offset after them."""
    (count,) = _I16.unpack_from(buf, pos)
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    unpack_len = _I32.unpack_from
    for _ in range(count):
        marker = buf[pos]
        if marker in (_TEXT, _BINARY):
            (length,) = unpack_len(buf, pos + 1)
            start = pos + 5
            pos = start + length
            append(buf[start:pos])
        elif marker == _NULL:
            pos += 1
            append(None)
        elif marker == _UNCHANGED:
            pos += 1
            append(UNCHANGED_TOAST)
        else:
            raise PgOutputError(
                f"unknown pgoutput tuple column marker {bytes([marker])!r} (0x{marker:02X}) at "
                f"offset {pos}; expected one of b'n', b'u', b't', b'b'"
            )
    if pos > len(buf):
        raise PgOutputError(f"truncated pgoutput message: tuple data needs {pos} bytes, message has {len(buf)}")
    return tuple(values), pos


def _tuple_kind(kind: bytes, pos: int, allowed: tuple[bytes, ...], msg: str) -> None:
    """Raise unless the tuple kind byte read at `pos` is one of `allowed`."""
    if kind not in allowed:
        raise PgOutputError(
            f"unexpected tuple kind {kind!r} at offset {pos} in pgoutput {msg} message; "
            f"expected one of {', '.join(repr(a) for a in allowed)}"
        )


def _begin(buf: bytes) -> tuple[PgOutputMessage, int]:
    final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(final_lsn, ts, xid), 1 + _BEGIN.size


def _commit(buf: bytes) -> tuple[PgOutputMessage, int]:
    flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, commit_lsn, end_lsn, ts), 1 + _COMMIT.size


def _origin(buf: bytes) -> tuple[PgOutputMessage, int]:
    (lsn,) = struct.unpack_from("!Q", buf, 1)
    name, pos = _cstring(buf, 9)
    return Origin(lsn, name), pos


def _relation(buf: bytes) -> tuple[PgOutputMessage, int]:
    (relation_id,) = _U32.unpack_from(buf, 1)
    namespace, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    identity = chr(buf[pos])
    (ncols,) = _I16.unpack_from(buf, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        (flags,) = _U8.unpack_from(buf, pos)
        col_name, pos = _cstring(buf, pos + 1)
        type_oid, typmod = _COLUMN_TAIL.unpack_from(buf, pos)
        pos += _COLUMN_TAIL.size
        columns.append(RelationColumn(flags, col_name, type_oid, typmod))
    return Relation(relation_id, namespace, name, identity, tuple(columns)), pos


def _type(buf: bytes) -> tuple[PgOutputMessage, int]:
    (type_oid,) = _U32.unpack_from(buf, 1)
    namespace, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    return TypeInfo(type_oid, namespace, name), pos


def _insert(buf: bytes) -> tuple[PgOutputMessage, int]:
    relation_id, kind = _REL_TUPLE.unpack_from(buf, 1)
    if kind != TUPLE_NEW:
        _tuple_kind(kind, 5, (TUPLE_NEW,), "Insert")
    new, pos = _tuple(buf, 6)
    return Insert(relation_id, new), pos


def _update(buf: bytes) -> tuple[PgOutputMessage, int]:
    relation_id, kind = _REL_TUPLE.unpack_from(buf, 1)
    old_kind: str | None = None
    old: TupleData | None = None
    pos = 6
    if kind in (TUPLE_KEY, TUPLE_OLD):
        old_kind = kind.decode("ascii")
        old, pos = _tuple(buf, pos)
        kind = buf[pos : pos + 1]
        pos += 1
    _tuple_kind(kind, pos - 1, (TUPLE_NEW,), "Update")
    new, pos = _tuple(buf, pos)
    return Update(relation_id, old_kind, old, new), pos


def _delete(buf: bytes) -> tuple[PgOutputMessage, int]:
    relation_id, kind = _REL_TUPLE.unpack_from(buf, 1)
    _tuple_kind(kind, 5, (TUPLE_KEY, TUPLE_OLD), "Delete")
    old, pos = _tuple(buf, 6)
    return Delete(relation_id, kind.decode("ascii"), old), pos


def _truncate(buf: bytes) -> tuple[PgOutputMessage, int]:
    count, options = _TRUNCATE_HEAD.unpack_from(buf, 1)
    pos = 1 + _TRUNCATE_HEAD.size
    ids = struct.unpack_from(f"!{count}I", buf, pos)
    return Truncate(options, ids), pos + 4 * count


def _message(buf: bytes) -> tuple[PgOutputMessage, int]:
    flags, lsn = _MESSAGE_HEAD.unpack_from(buf, 1)
    prefix, pos = _cstring(buf, 1 + _MESSAGE_HEAD.size)
    (length,) = _I32.unpack_from(buf, pos)
    start = pos + 4
    end = start + length
    if end > len(buf):
        raise PgOutputError(f"truncated pgoutput Message: content needs {end} bytes, message has {len(buf)}")
    transactional = bool(flags & MESSAGE_TRANSACTIONAL_FLAG)
    return LogicalMessage(transactional, lsn, prefix, buf[start:end]), end


def _stream_start(buf: bytes) -> tuple[PgOutputMessage, int]:
    xid, first = _STREAM_START.unpack_from(buf, 1)
    return StreamStart(xid, first == STREAM_FIRST_SEGMENT), 1 + _STREAM_START.size


def _stream_stop(buf: bytes) -> tuple[PgOutputMessage, int]:
    return StreamStop(), 1


def _stream_commit(buf: bytes) -> tuple[PgOutputMessage, int]:
    xid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(buf, 1)
    return StreamCommit(xid, flags, commit_lsn, end_lsn, ts), 1 + _STREAM_COMMIT.size


def _stream_abort(buf: bytes) -> tuple[PgOutputMessage, int]:
    xid, subxid = _STREAM_ABORT.unpack_from(buf, 1)
    return StreamAbort(xid, subxid), 1 + _STREAM_ABORT.size


_DECODERS: dict[int, Callable[[bytes], tuple[PgOutputMessage, int]]] = {
    MSG_BEGIN[0]: _begin,
    MSG_COMMIT[0]: _commit,
    MSG_ORIGIN[0]: _origin,
    MSG_RELATION[0]: _relation,
    MSG_TYPE[0]: _type,
    MSG_INSERT[0]: _insert,
    MSG_UPDATE[0]: _update,
    MSG_DELETE[0]: _delete,
    MSG_TRUNCATE[0]: _truncate,
    MSG_MESSAGE[0]: _message,
    MSG_STREAM_START[0]: _stream_start,
    MSG_STREAM_STOP[0]: _stream_stop,
    MSG_STREAM_COMMIT[0]: _stream_commit,
    MSG_STREAM_ABORT[0]: _stream_abort,
}


def decode(buf: bytes | memoryview) -> PgOutputMessage:
    """Decode one pgoutput message (the payload of an XLogData frame, or one `data` row).

    Raises PgOutputError for an empty buffer, an unknown message type or column marker, a
    truncated message or bytes left over after it; it never skips what it cannot read.
    """
    data = bytes(buf) if type(buf) is not bytes else buf
    if not data:
        raise PgOutputError("empty pgoutput message: expected at least the message type byte")
    decoder = _DECODERS.get(data[0])
    if decoder is None:
        raise PgOutputError(
            f"unknown pgoutput message type {data[:1]!r} (0x{data[0]:02X}) at offset 0; this "
            f"decoder speaks protocol versions {PROTO_VERSION} and {PROTO_VERSION_STREAMING} (B C O R Y I "
            "U D T M, S E c A); start the stream with proto_version '1' or '2' and without 'two_phase'"
        )
    try:
        message, end = decoder(data)
    except (struct.error, IndexError) as exc:
        raise PgOutputError(f"truncated pgoutput {data[:1]!r} message of {len(data)} bytes: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise PgOutputError(
            f"pgoutput {data[:1]!r} message has a name that is not UTF-8 ({exc}); "
            "the decoder expects server_encoding UTF8"
        ) from exc
    if end != len(data):
        raise PgOutputError(
            f"pgoutput {data[:1]!r} message has {len(data) - end} unread trailing bytes at "
            f"offset {end}; the message does not match protocol version {PROTO_VERSION} or "
            f"{PROTO_VERSION_STREAMING}"
        )
    return message


def unstream(buf: bytes) -> tuple[int, bytes]:
    """A change message of a stream block as (its (sub)transaction's xid, the message as protocol 1 sends it).

    Only for the types in STREAMED_WITH_XID; PgOutputError if `buf` is not one, or too short to
    hold the xid.
    """
    if not buf or buf[0] not in STREAMED_WITH_XID:
        raise PgOutputError(
            f"pgoutput message type {buf[:1]!r} carries no xid inside a stream block; expected one of "
            f"{bytes(sorted(STREAMED_WITH_XID))!r}"
        )
    if len(buf) < 1 + _U32.size:
        raise PgOutputError(f"truncated streamed pgoutput {buf[:1]!r} message of {len(buf)} bytes: no xid")
    (xid,) = _U32.unpack_from(buf, 1)
    return xid, buf[:1] + buf[1 + _U32.size :]


def decode_streamed(buf: bytes | memoryview) -> tuple[int, PgOutputMessage]:
    """Decode one change message sent inside a stream block: its (sub)transaction's xid and the message.

    Raises PgOutputError as `decode` does.
    """
    xid, payload = unstream(bytes(buf))
    return xid, decode(payload)
