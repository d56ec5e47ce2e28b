"""Per-writer durable positions and the safe bound (DESIGN §4): writer ids, snapshot progress, one read.

Every source keeps one stream writer and one writer per running snapshot in
bronze.stream_positions. This module is the one place that knows their ids, the shape of a
snapshot writer's progress record (stored in the row's `resume_token` column; dbt's
`snapshot_progress` model parses the same keys) and how the safe bound follows from the rows.
How a position is printed (an LSN, a cluster time) is the source's business.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ingest.errors import SourceError
from ingest.events import TableSnapshot, WriterKind, WriterPosition

if TYPE_CHECKING:
    from ingest.bronze.writer import BronzeWriter

STREAM_WRITER_ID = "stream"
SNAPSHOT_WRITER_PREFIX = "snapshot-"
# A filtered snapshot's id starts with this: its pages hold the rows its predicate selected, not
# every row of a key range, so no rule may read a key absent from them as deleted, and it does not
# count as the table's completed snapshot.
FILTERED_SNAPSHOT_PREFIX = "where-"


def snapshot_writer_id(snapshot_id: str) -> str:
    """The writer row of a snapshot in bronze.stream_positions."""
    return SNAPSHOT_WRITER_PREFIX + snapshot_id


def safe_bound(rows: Iterable[WriterPosition]) -> int | None:
    """The lowest durable position of a source's writers: silver is complete up to it (None: no writer)."""
    return min((p.durable_lsn for p in rows), default=None)


# A record key's column values as text, in key order; None is a NULL column (a keyless table's).
KeyValues = tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """A snapshot writer's progress record: which table, how far, and how it pages.

    `until` is the table's largest key when the snapshot started (its last row); `bounded` says it
    is known (`until` None with `bounded`: the table was empty). `keys` makes the snapshot a re-read
    of those keys only. Sources without keyset bounds leave the last four fields unset.

    `whole`: the snapshot reads the whole table (not a re-read by key, not filtered), so its pages
    carry `table_snapshot`, which is decided when it reads its bound. A row an older ingest wrote
    has neither, and its pages none.
    """

    table: str
    snapshot_id: str
    pages: int = 0
    rows: int = 0
    estimated_rows: int | None = None
    rows_per_s: float | None = None
    until: tuple[str, ...] | None = None
    bounded: bool = False
    keys: tuple[KeyValues, ...] | None = None
    start: tuple[str, ...] | None = None  # a key range's lower bound (exclusive): a large table split
    relfilenode: int | None = None  # set: a keyless table paged by CTID, in this file of the table
    paused: bool = False  # `snapshot pause`: no page is read until `snapshot resume`
    where: str | None = None  # a filtered snapshot: only rows this predicate (MongoDB: Extended JSON filter) selects
    whole: bool = False
    table_snapshot: TableSnapshot | None = None  # set (with `whole`) once the bound is read

    @property
    def writer_id(self) -> str:
        """The writer row of this snapshot."""
        return snapshot_writer_id(self.snapshot_id)

    def to_json(self) -> str:
        """The writer row's `resume_token` text."""
        d: dict[str, Any] = {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "pages": self.pages,
            "rows": self.rows,
            "estimated_rows": self.estimated_rows,
            "rows_per_s": self.rows_per_s,
        }
        if self.bounded:
            d["until"] = list(self.until) if self.until is not None else None
        if self.keys is not None:
            d["keys"] = [list(k) for k in self.keys]
        if self.start is not None:
            d["start"] = list(self.start)
        if self.relfilenode is not None:
            d["relfilenode"] = self.relfilenode
        if self.paused:
            d["paused"] = True
        if self.where is not None:
            d["where"] = self.where
        if self.whole:
            d["whole"] = True
        if self.table_snapshot is not None:
            d["table_snapshot"] = self.table_snapshot.to_struct()
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_row(cls, pos: WriterPosition) -> SnapshotProgress:
        """Parse a snapshot writer row; an unreadable one is an error that says how to clear it."""
        try:
            d = json.loads(pos.resume_token or "")
            until, keys, struct = d.get("until"), d.get("keys"), d.get("table_snapshot")
            return cls(
                table=str(d["table"]),
                snapshot_id=str(d["snapshot_id"]),
                pages=int(d.get("pages") or 0),
                rows=int(d.get("rows") or 0),
                estimated_rows=int(d["estimated_rows"]) if d.get("estimated_rows") is not None else None,
                rows_per_s=float(d["rows_per_s"]) if d.get("rows_per_s") is not None else None,
                until=tuple(str(k) for k in until) if until is not None else None,
                bounded="until" in d,
                keys=tuple(tuple(None if v is None else str(v) for v in k) for k in keys) if keys is not None else None,
                start=tuple(str(k) for k in d["start"]) if d.get("start") is not None else None,
                relfilenode=int(d["relfilenode"]) if d.get("relfilenode") is not None else None,
                paused=bool(d.get("paused")),
                where=str(d["where"]) if d.get("where") is not None else None,
                whole=bool(d.get("whole")),
                table_snapshot=TableSnapshot.from_struct(struct) if struct is not None else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SourceError(
                f"snapshot writer {pos.source}/{pos.writer_id} has an unreadable progress record ({e}); "
                "delete its row from bronze.stream_positions and request the snapshot again"
            ) from None

    def summary(self) -> str:
        """One human line: rows and pages read, rows left (estimate) and rate."""
        what = f"snapshot {self.snapshot_id} of {self.table}" + (f" where {self.where}" if self.where else "")
        if self.paused:
            return f"{what}: paused after {self.rows:,} rows in {self.pages} pages (`snapshot resume` goes on)"
        if not self.pages:
            return f"{what}: waiting to start"
        parts = [f"{what}: {self.rows:,} rows in {self.pages} pages"]
        left = max(0, self.estimated_rows - self.rows) if self.estimated_rows is not None else None
        if left is not None:
            parts.append(f"~{left:,} rows left (estimate)")
        if self.rows_per_s:
            parts.append(f"{self.rows_per_s:,.0f} rows/s")
            if left is not None:
                parts.append(f"~{left / self.rows_per_s:,.0f} s to go")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class SourcePositions:
    """Every writer row of one source as read at one moment (one read of bronze.stream_positions)."""

    source: str
    rows: tuple[tuple[WriterPosition, datetime], ...]

    @classmethod
    def read(cls, writer: BronzeWriter, source: str) -> SourcePositions:
        """Read the source's rows (none if bronze does not exist yet)."""
        return cls(source, tuple(writer.positions(source)))

    def writer(self, writer_id: str) -> WriterPosition | None:
        """The row of one writer, if registered."""
        return next((p for p, _ in self.rows if p.writer_id == writer_id), None)

    @property
    def stream(self) -> WriterPosition | None:
        """The stream writer's row."""
        return self.writer(STREAM_WRITER_ID)

    @property
    def snapshots(self) -> list[SnapshotProgress]:
        """The progress of every registered snapshot writer, in writer id order."""
        return [
            SnapshotProgress.from_row(p)
            for p, _ in sorted(self.rows, key=lambda r: r[0].writer_id)
            if p.writer_kind is WriterKind.SNAPSHOT
        ]

    @property
    def safe_bound(self) -> int | None:
        """The source's safe bound (DESIGN §4), or None when no writer is registered."""
        return safe_bound(p for p, _ in self.rows)
