"""Decoded rows of a source transaction not yet committed: wal_events rows without their position.

A transaction the source sends while it runs (Postgres protocol 2) is decoded as it arrives, but
nothing of it may reach bronze before its commit, and a part of it (a rolled-back savepoint) may
still be dropped. Its rows wait here as Arrow record batches, each of one part, in memory and past
a size in an Arrow IPC file; at the commit the batcher stamps the position and appends them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import IO, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ingest.bronze.schemas import WAL_EVENTS
from ingest.errors import SourceError
from ingest.events import ChangeEvent

# The wal_events columns a decoded event gives; the position, commit time, end, xid and the
# writer's own columns are stamped at the commit (stamp()).
PENDING_COLUMNS: Final = (
    "action",
    "table_schema",
    "table_name",
    "relation_id",
    "record_pk",
    "old_record_pk",
    "record",
    "old_record",
    "unchanged_toast",
    "truncated_tables",
    "truncate_options",
    "message_prefix",
    "message_content",
    "message_transactional",
)
PENDING_SCHEMA: Final = pa.schema([WAL_EVENTS.field(name) for name in PENDING_COLUMNS])
_GETTERS: Final = tuple((WAL_EVENTS.field(n).type, itemgetter(ChangeEvent._fields.index(n))) for n in PENDING_COLUMNS)
# Decoded rows held in memory per transaction past which its batches go to its IPC file.
SPILL_BYTES: Final = 32 * 1024 * 1024
BATCH_ROWS: Final = 8192  # events per record batch (a batch also ends where the part changes)
# Or fewer: a batch also ends once its events' texts reach this many characters (event_bytes), so
# a transaction of wide rows (2,000 rows of 1 MiB) is never held as one list of decoded events and
# then copied whole into one record batch (4.3 GiB of peak RSS for those 2 GiB of values).
BATCH_CHARS: Final = 8 * 1024 * 1024


def to_batch(events: Sequence[ChangeEvent]) -> pa.RecordBatch:
    """The events' PENDING_COLUMNS as one record batch, a column at a time."""
    n = len(events)
    return pa.record_batch([pa.array(map(get, events), typ, size=n) for typ, get in _GETTERS], schema=PENDING_SCHEMA)


def event_bytes(event: ChangeEvent) -> int:
    """What an event weighs in a batch: the length of its record, old record and message texts.

    Characters, not encoded bytes (the texts are JSON, mostly ASCII, and `len` costs nothing on
    the hot path); keys are left out, being small beside the records they belong to.
    """
    return len(event.record or "") + len(event.old_record or "") + len(event.message_content or "")


def row_sizes(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """What each row weighs in a batch, as event_bytes counts it: characters of its texts."""
    total: pa.Array | None = None
    for name in ("record", "old_record", "message_content"):
        length = pc.fill_null(pc.utf8_length(batch.column(name)), 0)
        total = length if total is None else pc.add(total, length)
    assert total is not None
    return pc.cast(total, pa.int64())


@dataclass(slots=True)
class PendingRows:
    """One uncommitted transaction's decoded rows, in arrival order, each batch tagged with its part.

    Responsibilities: collect events into record batches (a batch never spans two parts), keep
    them in memory up to `spill_bytes` and then in a temporary Arrow IPC file (deleted on close),
    drop a part's rows (a rolled-back savepoint: held ones at once, spilled ones when read back)
    and hand back the kept batches in order. A damaged spill file is a SourceError.
    """

    spill_bytes: int = SPILL_BYTES
    _events: list[ChangeEvent] = field(default_factory=list)
    _events_chars: int = 0  # the texts of `_events`, as event_bytes weighs them
    _part: int = 0
    _held: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    _held_bytes: int = 0
    _file: IO[bytes] | None = None
    _writer: ipc.RecordBatchStreamWriter | None = None
    _spilled_parts: list[int] = field(default_factory=list)  # the part of each batch in the file
    _aborted: set[int] = field(default_factory=set)
    rows: int = 0  # events taken, aborted parts included

    @property
    def spilled(self) -> bool:
        """Whether some of the rows are in the spill file."""
        return self._file is not None

    def add(self, part: int, event: ChangeEvent) -> None:
        """Take the next event, of part `part` (a subtransaction's xid)."""
        if part != self._part or len(self._events) >= BATCH_ROWS or self._events_chars >= BATCH_CHARS:
            self._flush()
            self._part = part
        self._events.append(event)
        # event_bytes(event), inlined as the batcher does (once per change of a streamed transaction)
        record, old_record, content = event.record, event.old_record, event.message_content
        self._events_chars += (
            (len(record) if record else 0) + (len(old_record) if old_record else 0) + (len(content) if content else 0)
        )
        self.rows += 1

    @property
    def unbatched_chars(self) -> int:
        """Characters of the texts of the events taken but not yet in a record batch."""
        return self._events_chars

    def _flush(self) -> None:
        if not self._events:
            return
        batch = to_batch(self._events)
        self._events, self._events_chars = [], 0
        if self._file is None:
            self._held.append((self._part, batch))
            self._held_bytes += batch.nbytes
            if self._held_bytes > self.spill_bytes:
                self._spill()
            return
        self._write(self._part, batch)

    def _spill(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="changelake-pending-")  # noqa: SIM115 - closed in close()
        self._writer = ipc.new_stream(self._file, PENDING_SCHEMA)
        held, self._held, self._held_bytes = self._held, [], 0
        for part, batch in held:
            self._write(part, batch)

    def _write(self, part: int, batch: pa.RecordBatch) -> None:
        assert self._writer is not None
        self._writer.write_batch(batch)
        self._spilled_parts.append(part)

    def abort(self, part: int) -> None:
        """Drop the rows of part `part`."""
        self._aborted.add(part)
        if self._part == part:
            self._events, self._events_chars = [], 0
        self._held = [(p, b) for p, b in self._held if p != part]
        self._held_bytes = sum(b.nbytes for _, b in self._held)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The kept rows in arrival order, a record batch at a time (read back from the file lazily)."""
        self._flush()
        aborted = self._aborted
        if self._writer is not None:
            self._writer.close()  # ends the IPC stream; nothing more is written to the file
            self._writer = None
        if self._file is not None:
            self._file.seek(0)
            try:
                reader = ipc.open_stream(self._file)
                for part in self._spilled_parts:
                    batch = reader.read_next_batch()
                    if part not in aborted:
                        yield batch
            except (StopIteration, pa.ArrowInvalid, OSError) as e:
                raise SourceError(
                    f"an uncommitted transaction's decoded rows file ended early or is damaged ({e}): the local "
                    "disk lost it; run again (the source sends the transaction again from its start)"
                ) from e
        for part, batch in self._held:
            if part not in aborted:
                yield batch

    def close(self) -> None:
        """Forget the rows (the spill file is deleted)."""
        if self._file is not None:
            self._file.close()
        self._file = self._writer = None
        self._held, self._held_bytes, self._events, self._events_chars = [], 0, [], 0


@dataclass(frozen=True, slots=True)
class RowSlice:
    """Consecutive decoded rows of one committed transaction, with what stamps their position.

    Row i of `rows` is the event at `(commit_lsn, first_index + i)`.
    """

    rows: pa.RecordBatch
    commit_lsn: int
    first_index: int
    xid: int
    commit_ts_us: int

    @property
    def last_position(self) -> tuple[int, int]:
        """The position of the slice's last row."""
        return (self.commit_lsn, self.first_index + self.rows.num_rows - 1)


def stamp(
    piece: RowSlice, source: str, source_kind: str, writer_id: str, end_lsn: int | None, ingested_at: pa.Scalar
) -> pa.RecordBatch:
    """The slice as wal_events rows: its decoded columns and the stamped position, time, end and writer."""
    n = piece.rows.num_rows
    schema = WAL_EVENTS

    def same(name: str, value: object) -> pa.Array:
        return pa.repeat(pa.scalar(value, schema.field(name).type), n)

    ts = pa.scalar(piece.commit_ts_us, pa.int64()).cast(schema.field("commit_timestamp").type)
    cols: dict[str, pa.Array] = {
        "source": same("source", source),
        "source_kind": same("source_kind", source_kind),
        "commit_lsn": same("commit_lsn", piece.commit_lsn),
        "commit_index": pa.array(range(piece.first_index, piece.first_index + n), pa.int32()),
        "end_lsn": same("end_lsn", end_lsn),
        "xid": same("xid", piece.xid),
        "commit_timestamp": pa.repeat(ts, n),
        "writer_id": same("writer_id", writer_id),
        "ingested_at": pa.repeat(ingested_at, n),
    }
    for name in PENDING_COLUMNS:
        cols[name] = piece.rows.column(name)
    return pa.record_batch([cols[name] for name in schema.names], schema=schema)
