"""Reassembles transactions the server streams while in progress (pgoutput protocol 2) into protocol 1 form.

Pure apart from its spill files: no connection. With `streaming 'on'` a transaction larger than
the server's `logical_decoding_work_mem` arrives in chunks long before its commit, where
protocol 1 would have the walsender spill it to the server's disk and send it whole at commit.
Nothing of it may reach bronze before the commit (it may still abort, wholly or a savepoint of
it), so the chunks are held here, per top-level xid, and on Stream Commit handed back framed as
protocol 1 frames a transaction: a Begin, the changes in stream order, a Commit, with the same
LSNs, xid and timestamp. The change builder and the batcher then treat it exactly as they treat
any transaction (a large one is paged behind the safe bound, DESIGN §4).

Given a decoder of in-flight transactions (inflight.py), each transaction's changes are also
decoded as they arrive; on its commit, if that decoding went through, the frame holds its
Relation messages and a DecodedTransaction (its rows) instead of its changes, and the held
messages are only the way back when it did not.
"""

from __future__ import annotations

import marshal
import struct
import tempfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import IO, Final

from ingest.bronze.pending import PendingRows
from ingest.errors import SourceError
from ingest.sources.postgres.inflight import InflightTransaction
from ingest.sources.postgres.pgoutput import (
    MSG_BEGIN,
    MSG_COMMIT,
    MSG_ORIGIN,
    MSG_RELATION,
    MSG_STREAM_ABORT,
    MSG_STREAM_COMMIT,
    MSG_STREAM_START,
    MSG_STREAM_STOP,
    StreamAbort,
    StreamCommit,
    StreamStart,
    decode,
    pg_to_unix_us,
    unstream,
)

# Held change bytes (all open transactions together) past which the transaction being appended to
# is written to a local temporary file instead: a 1M-row transaction must not grow the process
# without bound. Each held message costs about 100 bytes of Python objects beside its own bytes.
SPILL_BYTES: Final = 64 * 1024 * 1024
# The same for a transaction also decoded as it arrives: its held messages are only the way back.
INFLIGHT_SPILL_BYTES: Final = 8 * 1024 * 1024
STREAM_CONTROL: Final = frozenset(MSG_STREAM_START + MSG_STREAM_STOP + MSG_STREAM_COMMIT + MSG_STREAM_ABORT)
# A spilled transaction's changes are written in segments of this many changes or bytes at most.
SEGMENT_ITEMS: Final = 4096
SEGMENT_BYTES: Final = 1024 * 1024
_LENGTH = struct.Struct("!Q")  # a spill file segment's length, before its marshal record
_BEGIN = struct.Struct("!QqI")  # as pgoutput.py reads them
_COMMIT = struct.Struct("!BQQq")


@dataclass(slots=True)
class _Open:
    """One streamed, not yet ended transaction: its changes as (xid, protocol 1 message), in order.

    In memory until it is spilled; from then on its changes go to the spill file in segments
    (one `marshal` record of up to SEGMENT_ITEMS changes or SEGMENT_BYTES bytes, whichever comes
    first), so that writing and reading them back costs one call per segment, not per change.
    """

    first_lsn: int
    held: list[tuple[int, bytes]] = field(default_factory=list)
    held_bytes: int = 0
    spill: IO[bytes] | None = None
    aborted: set[int] = field(default_factory=set)
    segment: list[tuple[int, bytes]] = field(default_factory=list)  # not yet written to `spill`
    segment_bytes: int = 0
    inflight: InflightTransaction | None = None  # its changes decoded as they arrive, while that goes through
    relations: list[tuple[int, bytes]] = field(default_factory=list)  # its Relation messages, for the commit

    def add(self, xid: int, payload: bytes) -> int:
        """Hold one change; the bytes it added to memory (a spilled transaction's segment counts none)."""
        if self.spill is not None:
            self.segment.append((xid, payload))
            self.segment_bytes += len(payload)
            if len(self.segment) >= SEGMENT_ITEMS or self.segment_bytes >= SEGMENT_BYTES:
                self._write_segment()
            return 0
        self.held.append((xid, payload))
        self.held_bytes += len(payload)
        return len(payload)

    def spill_to_disk(self) -> int:
        """Move the held changes to a temporary file (deleted when closed); the bytes freed."""
        self.spill = tempfile.TemporaryFile(prefix="changelake-streamed-")  # noqa: SIM115 - closed in changes()
        freed = self.held_bytes
        held, self.held, self.held_bytes = self.held, [], 0
        for xid, payload in held:
            self.add(xid, payload)
        return freed

    def _write_segment(self) -> None:
        assert self.spill is not None
        data = marshal.dumps(self.segment)
        self.spill.write(_LENGTH.pack(len(data)))
        self.spill.write(data)
        self.segment, self.segment_bytes = [], 0

    def abort(self, subxid: int) -> int:
        """Drop a subtransaction's changes (held ones now, spilled ones when read back); the bytes freed."""
        self.aborted.add(subxid)
        self.segment = [(x, p) for x, p in self.segment if x != subxid]
        self.segment_bytes = sum(len(p) for _, p in self.segment)
        kept = [(x, p) for x, p in self.held if x != subxid]
        freed = self.held_bytes - sum(len(p) for _, p in kept)
        self.held, self.held_bytes = kept, self.held_bytes - freed
        return freed

    def changes(self) -> Iterator[bytes]:
        """The changes of the transaction that were not aborted, in stream order; closes the spill file."""
        if self.spill is not None:
            if self.segment:
                self._write_segment()
            spill, self.spill = self.spill, None
            try:
                spill.seek(0)
                while head := spill.read(_LENGTH.size):
                    length = _LENGTH.unpack(head)[0] if len(head) == _LENGTH.size else -1
                    data = spill.read(length) if length >= 0 else b""
                    try:
                        if len(data) != length:
                            raise EOFError(f"{len(data)} of {length} bytes")
                        segment = marshal.loads(data)
                    except (EOFError, ValueError, TypeError) as e:
                        raise SourceError(
                            f"a streamed transaction's spill file ended early or is damaged ({e}): the local disk "
                            "lost it; run again (the server streams the transaction again from its start)"
                        ) from e
                    yield from self._kept(segment)
            finally:
                spill.close()
        yield from self._kept(self.held)

    def _kept(self, changes: list[tuple[int, bytes]]) -> Iterator[bytes]:
        """The messages of `changes` whose (sub)transaction was not aborted."""
        if self.aborted:
            aborted = self.aborted
            return (payload for xid, payload in changes if xid not in aborted)
        return (payload for _, payload in changes)

    def close(self) -> None:
        """Forget the transaction (its spill files are deleted)."""
        if self.inflight is not None:
            self.inflight.close()
            self.inflight = None
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        self.held, self.held_bytes = [], 0
        self.segment, self.segment_bytes = [], 0


class StreamedTransactions:
    """Holds streamed in-progress transactions until they end; hands a committed one back as protocol 1.

    Responsibilities: follow Stream Start/Stop blocks, hold each top-level transaction's changes
    tagged with their (sub)transaction's xid (in memory, spilled to a temporary file past
    `spill_bytes` held in all), drop a subtransaction's changes on its Stream Abort and the whole
    transaction on its own, and say where the oldest open one started (nothing past it is
    durable: the slot must not be confirmed past it on its account).
    """

    def __init__(
        self, spill_bytes: int = SPILL_BYTES, inflight: Callable[[int], InflightTransaction] | None = None
    ) -> None:
        """Start outside any stream block, holding nothing; `spill_bytes` in bytes of messages.

        `inflight(xid)`: a decoder for the changes of transaction `xid` as they arrive (None:
        every transaction is decoded at its commit, from the held messages).
        """
        self.spill_bytes = spill_bytes
        self._inflight = inflight
        self._open: dict[int, _Open] = {}
        self._block: _Open | None = None
        # Whether a Stream Start was met and its Stream Stop not yet (`_block is not None`), kept as a
        # plain attribute: the stream reads it for every message it receives.
        self.in_block = False
        self._held_bytes = 0

    def takes(self, payload: bytes) -> bool:
        """Whether `payload` is this class's to take: a stream control message, or any inside a block."""
        return self._block is not None or payload[0] in STREAM_CONTROL

    def oldest_start(self) -> int | None:
        """The WAL position of the oldest open streamed transaction's first chunk; None if none is open."""
        return min((t.first_lsn for t in self._open.values()), default=None)

    @property
    def spilled(self) -> int:
        """How many open transactions are held in spill files."""
        return sum(1 for t in self._open.values() if t.spill is not None)

    def take(self, wal_start: int, payload: bytes) -> Generator[bytes | DecodedTransaction, None, None] | None:
        """Take one message of the stream (`takes` said so); a committed transaction's messages, or None.

        The messages handed back are protocol 1 ones: Begin, the changes (or the Relation messages
        and a DecodedTransaction), Commit. SourceError when
        the server's stream does not follow the protocol (a chunk of a transaction not begun, a
        commit of one never streamed): nothing is guessed.
        """
        kind = payload[0]
        if self._block is not None:
            if kind == MSG_STREAM_STOP[0]:
                decode(payload)
                self._block, self.in_block = None, False
            elif kind == MSG_ORIGIN[0]:
                pass  # protocol 1 sends it after Begin and bronze keeps none: nothing to hold
            else:
                xid, message = unstream(payload)
                block = self._block
                self._held_bytes += block.add(xid, message)
                limit = self.spill_bytes
                if block.inflight is not None:
                    if message[0] == MSG_RELATION[0]:
                        block.relations.append((xid, message))
                    block.inflight.feed(xid, message)
                    if block.inflight.failed:
                        block.inflight, block.relations = None, []
                    else:
                        limit = min(limit, INFLIGHT_SPILL_BYTES)
                if self._held_bytes > limit and block.spill is None:
                    self._held_bytes -= block.spill_to_disk()
            return None
        msg = decode(payload)
        if isinstance(msg, StreamStart):
            txn = self._open.get(msg.xid)
            if txn is None:
                if not msg.first_segment:
                    raise SourceError(
                        f"the server streamed a later chunk of transaction {msg.xid} whose first chunk this "
                        "stream never received; restart the stream (it resends the transaction whole)"
                    )
                inflight = self._inflight(msg.xid) if self._inflight is not None else None
                txn = self._open[msg.xid] = _Open(wal_start, inflight=inflight)
            self._block, self.in_block = txn, True
            return None
        if isinstance(msg, StreamAbort):
            txn = self._open.get(msg.xid)
            if txn is None:
                return None  # nothing of it was held
            if msg.subxid == msg.xid:
                self._held_bytes -= txn.held_bytes
                txn.close()
                del self._open[msg.xid]
            else:
                self._held_bytes -= txn.abort(msg.subxid)
                if txn.inflight is not None:
                    txn.inflight.abort(msg.subxid)
                    txn.relations = [(x, m) for x, m in txn.relations if x != msg.subxid]
            return None
        if isinstance(msg, StreamCommit):
            txn = self._open.pop(msg.xid, None)
            if txn is None:
                raise SourceError(
                    f"the server committed streamed transaction {msg.xid} but streamed none of it on this "
                    "connection; restart the stream (it resends the transaction whole)"
                )
            self._held_bytes -= txn.held_bytes
            rows = txn.inflight.rows if txn.inflight is not None else None
            if rows is not None:
                assert txn.inflight is not None
                txn.inflight.rows = None  # handed on: closed once read (_decoded)
                relations = txn.relations
                txn.close()  # the held messages are not needed
                return _decoded(msg, relations, rows)
            return _as_protocol_1(msg, txn)
        raise SourceError(f"pgoutput sent {msg!r} outside a stream block")  # StreamStop without a start

    def close(self) -> None:
        """Forget every open transaction (a reconnect: the server streams them again from their start)."""
        for txn in self._open.values():
            txn.close()
        self._open.clear()
        self._block, self.in_block = None, False
        self._held_bytes = 0


@dataclass(frozen=True, slots=True)
class DecodedTransaction:
    """A committed streamed transaction's rows, decoded while it ran: handed on in place of its changes.

    The rows carry no position yet: the i-th kept row is the event at `(commit_lsn, i)`.
    `commit_ts_us` in Unix epoch microseconds, as ChangeEvent has it.
    """

    rows: PendingRows
    xid: int
    commit_lsn: int
    commit_ts_us: int


def _decoded(
    msg: StreamCommit, relations: list[tuple[int, bytes]], rows: PendingRows
) -> Generator[bytes | DecodedTransaction, None, None]:
    """Begin, the transaction's kept Relation messages (for the relation cache and shapes), its rows, Commit."""
    try:
        yield MSG_BEGIN + _BEGIN.pack(msg.commit_lsn, msg.commit_ts_us, msg.xid)
        yield from (message for _, message in relations)
        yield DecodedTransaction(rows, msg.xid, msg.commit_lsn, pg_to_unix_us(msg.commit_ts_us))
    finally:
        rows.close()
    yield MSG_COMMIT + _COMMIT.pack(msg.flags, msg.commit_lsn, msg.end_lsn, msg.commit_ts_us)


def _as_protocol_1(msg: StreamCommit, txn: _Open) -> Generator[bytes, None, None]:
    """The transaction as protocol 1 sends it: Begin (final LSN, timestamp, xid), its changes, Commit."""
    yield MSG_BEGIN + _BEGIN.pack(msg.commit_lsn, msg.commit_ts_us, msg.xid)
    yield from txn.changes()
    yield MSG_COMMIT + _COMMIT.pack(msg.flags, msg.commit_lsn, msg.end_lsn, msg.commit_ts_us)
