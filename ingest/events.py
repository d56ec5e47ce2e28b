"""The values that cross module boundaries: change events, relation shapes and writer positions."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


class Action(StrEnum):
    """What a change event did (bronze `action`)."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"
    MESSAGE = "message"


class SourceKind(StrEnum):
    """Which kind of source wrote a bronze row (bronze `source_kind`)."""

    POSTGRES = "postgres"
    MONGODB = "mongodb"


class WriterKind(StrEnum):
    """Which kind of writer appends to bronze for a source (DESIGN §4)."""

    STREAM = "stream"
    SNAPSHOT = "snapshot"


class ChangeEvent(NamedTuple):
    """One source change message, as bronze.wal_events stores it (docs/bronze.md).

    `record`, `old_record`, `record_pk` and `old_record_pk` are JSON object texts already encoded
    by the source's decoder; the bronze writer does not look inside them.

    A NamedTuple, not a frozen dataclass like the other values here: one is built per change on
    the decoder's hot path, and a tuple is built ~4x faster (0.4 us instead of 1.7 us with 18
    fields), and the writer turns a batch into Arrow columns by transposing the tuples in C
    (`zip(*events)`). It is as immutable; `_replace` stands in for `dataclasses.replace`.
    """

    commit_lsn: int
    commit_index: int
    xid: int
    commit_ts_us: int  # Unix epoch microseconds (UTC)
    action: Action
    table_schema: str | None = None
    table_name: str | None = None
    relation_id: int | None = None
    record_pk: str | None = None
    old_record_pk: str | None = None
    record: str | None = None
    old_record: str | None = None
    unchanged_toast: tuple[str, ...] | None = None
    truncated_tables: tuple[str, ...] | None = None
    truncate_options: int | None = None
    message_prefix: str | None = None
    message_content: str | None = None
    message_transactional: bool | None = None

    @property
    def position(self) -> tuple[int, int]:
        """The event's order within its source: `(commit_lsn, commit_index)`, compared as a pair."""
        return (self.commit_lsn, self.commit_index)


@dataclass(frozen=True, slots=True)
class ColumnShape:
    """One column of a source table as bronze.source_relations records it."""

    name: str
    type_oid: int
    type_name: str
    type_modifier: int
    is_key: bool
    pk_position: int | None
    json_kind: str
    # pg_attribute.attnum: the column's identity across renames (a dropped column's number is never
    # reused). None in shapes recorded before it was, and where the catalog no longer matched the
    # shape when it was met (schema_changes.with_attnums).
    attnum: int | None = None
    # A composite type's fields, (name, format_type()), in order: of the column's type, or of an
    # array's element type; a domain's base type. None for any other type, and in shapes recorded
    # before fields were (schema_changes.with_attnums looks them up).
    fields: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True, slots=True)
class RelationShape:
    """The shape (columns and key) of one source table at some point of the stream."""

    relation_id: int
    table_schema: str
    table_name: str
    replica_identity: str
    columns: tuple[ColumnShape, ...]
    first_seen_lsn: int

    @property
    def shape_hash(self) -> str:
        """A stable id of (schema, table, columns): a new hash means the table changed shape."""
        import hashlib

        parts = [self.table_schema, self.table_name, self.replica_identity]
        # type_name too: a table recorded before W8 (type_name without its modifier) is recorded
        # again, as the catalog names it now, by the next start (its rows are the same: no re-snapshot).
        parts += [f"{c.name}:{c.type_oid}:{c.type_modifier}:{c.pk_position}:{c.type_name}" for c in self.columns]
        # attnums only where known: a shape recorded without them keeps its hash.
        parts += [f"attnum:{c.name}:{c.attnum}" for c in self.columns if c.attnum is not None]
        # a composite's fields only where known: a shape without composites keeps its hash, and one
        # whose composite type gained, lost or retyped a field (ALTER TYPE) is another shape.
        parts += [f"fields:{c.name}:" + "\x1e".join(f"{n}:{t}" for n, t in c.fields) for c in self.columns if c.fields]
        # A masked column (masking.py) is another shape; the hashes of every other shape stay as they were.
        parts += [f"masked:{c.name}" for c in self.columns if c.json_kind == "masked"]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class WriterPosition:
    """A writer's durable position in bronze.stream_positions (DESIGN §4).

    `durable_lsn`: every event of this writer with commit_lsn <= it is committed to bronze.
    `ack_lsn`: what the source was (or may now be) acknowledged with.
    """

    source: str
    writer_id: str
    writer_kind: WriterKind
    durable_lsn: int
    ack_lsn: int
    resume_token: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """One record read by a snapshot page: its key and row as JSON, and its key as source text."""

    record_pk: str
    record: str
    key_text: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PageColumns:
    """A snapshot page's rows as Arrow string columns, as the compiled encoder builds them: no object per row.

    Each column is a pair (offsets, data): `count + 1` int32 little-endian offsets into UTF-8
    bytes, the layout of an Arrow `string` array. `key_text` is a list column: `key_lists` holds
    its int32 offsets into the `key_text` strings (every row has the key's width of them).
    `last_key` is the last row's key text (the next page's keyset cursor), `chars` the record
    JSON's length in characters (the page byte budget's measure, as `len(row.record)` counts).
    """

    count: int
    chars: int
    record_pk: tuple[bytes, bytes]
    record: tuple[bytes, bytes]
    key_lists: bytes
    key_text: tuple[bytes, bytes]
    last_key: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TableSnapshot:
    """The whole-table snapshot a page belongs to, as bronze.snapshot_pages' `table_snapshot` stores it.

    `snapshot_id` is the snapshot that read the table's bound (the first of a table cut into key
    ranges), `parts` how many snapshots read the table between them (1 when it was not cut), and
    `xmin`, `xmax`, `xip` the `pg_current_snapshot()` (64-bit xids) the bound was read under:
    older than every page's, so a row it cannot see was committed after the bound was taken.
    """

    snapshot_id: str
    parts: int
    xmin: int
    xmax: int
    xip: tuple[int, ...]

    def to_struct(self) -> dict[str, Any]:
        """The struct as bronze and the snapshot writer's progress record spell it."""
        xids = {"xmin": self.xmin, "xmax": self.xmax, "xip": list(self.xip)}
        return {"id": self.snapshot_id, "parts": self.parts, **xids}

    @classmethod
    def from_struct(cls, d: dict[str, Any]) -> TableSnapshot:
        """Parse `to_struct`'s form (KeyError, TypeError or ValueError if it is not that)."""
        return cls(str(d["id"]), int(d["parts"]), int(d["xmin"]), int(d["xmax"]), tuple(int(x) for x in d["xip"]))


@dataclass(frozen=True, slots=True)
class SnapshotPage:
    """One keyset page of a table snapshot, as bronze.snapshot_pages stores it (DESIGN §5).

    Postgres pages carry the MVCC snapshot they were read under (64-bit xids) and the LSN of the
    high watermark committed after the read; a MongoDB page carries its `atClusterTime` packed as
    a position in `high_watermark_lsn` and no xids. A page with no rows (an empty table, or the end
    of one) is still written, as one marker row, so every page and the snapshot's end are durable.

    Its rows are either `rows` or, for a page the compiled encoder read, `columns` (`rows` then empty).
    """

    snapshot_id: str
    table_schema: str
    table_name: str
    page_number: int
    last_page: bool
    rows: tuple[SnapshotRow, ...]
    high_watermark_lsn: int
    read_at_us: int
    xmin: int | None = None
    xmax: int | None = None
    xip: tuple[int, ...] | None = None
    table_snapshot: TableSnapshot | None = None  # a page of a whole-table Postgres snapshot
    columns: PageColumns | None = None  # the rows as columns, instead of `rows`

    @property
    def row_count(self) -> int:
        """How many rows the page read (0 for a page that read none)."""
        return self.columns.count if self.columns is not None else len(self.rows)


def lsn_to_int(text: str) -> int:
    """Parse a Postgres LSN `'16/B374D848'` to its 64-bit integer."""
    hi, _, lo = text.partition("/")
    if not lo:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)


def int_to_lsn(value: int) -> str:
    """Format a 64-bit integer LSN as Postgres prints it (`'16/B374D848'`)."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
