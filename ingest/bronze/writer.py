"""Appends events, pages, relation shapes and writer positions to the bronze Delta tables (delta-rs)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import ColumnProperties, WriterProperties

from ingest.bronze.pending import RowSlice, stamp
from ingest.bronze.schemas import (
    ALL_TABLES,
    SNAPSHOT_CONTROL_TABLE,
    SNAPSHOT_PAGES_TABLE,
    SOURCE_RELATIONS_TABLE,
    STREAM_POSITIONS_TABLE,
    WAL_EVENTS_TABLE,
    BronzeTable,
)
from ingest.bronze.state import BronzeState, sql_str
from ingest.errors import BronzeWriteError
from ingest.events import ChangeEvent, RelationShape, SnapshotPage, WriterPosition

log = logging.getLogger(__name__)

# Delta txnVersion packs a batch's last position as (commit_lsn << INDEX_BITS) | commit_index
# within one txnAppId; positions that do not fit in 63 bits that way get an app id of their own
# (txn_identity). Old app ids expire after TXN_RETENTION (schemas.LOG_PROPERTIES).
TXN_INDEX_BITS = 20
TXN_LSN_BITS = 63 - TXN_INDEX_BITS
TXN_MAX_LSN = 1 << TXN_LSN_BITS

# Small-file upkeep (docs/bronze.md): after this many commits by this process to a table, its
# source's partition is compacted (delta-rs optimize, no data change) and files older than the
# table's retention are vacuumed. Checkpoints come from delta-rs after every
# `delta.checkpointInterval` commits.
COMPACT_EVERY_COMMITS = 100


def txn_identity(app_id: str, commit_lsn: int, commit_index: int) -> tuple[str, int]:
    """The Delta (txnAppId, txnVersion) of a batch of `app_id` ending at (commit_lsn, commit_index).

    Every position gets one, and two positions with the same txnAppId have versions in position
    order, so "recorded version >= this batch's version" means "this batch is committed":
    - commit_index < 2^20 and commit_lsn < 2^43 (Postgres below 8 TiB of WAL): `app_id` itself,
      version `(commit_lsn << 20) | commit_index` (the packing tables written before this had);
    - commit_index < 2^20, larger LSNs (a MongoDB clusterTime is ~2^62; Postgres past 8 TiB):
      `app_id@e<commit_lsn >> 43>`, version the low 43 bits packed the same way. For MongoDB an
      epoch is 2^11 s (~34 min); expired app ids leave the log after TXN_RETENTION;
    - commit_index >= 2^20 (a batch ending deep in a transaction of over a million events):
      `app_id@t<commit_lsn>`, version `commit_index`.
    """
    if commit_index >= 1 << TXN_INDEX_BITS:
        return f"{app_id}@t{commit_lsn}", commit_index
    epoch, low = divmod(commit_lsn, TXN_MAX_LSN)
    version = (low << TXN_INDEX_BITS) | commit_index
    return (app_id if epoch == 0 else f"{app_id}@e{epoch}"), version


def _now() -> datetime:
    return datetime.now(UTC)


# Each wal_events column that is a ChangeEvent field of the same name, with the field's index.
_FIELD_COLUMNS = tuple(
    (name, ChangeEvent._fields.index(name)) for name in WAL_EVENTS_TABLE.schema.names if name in ChangeEvent._fields
)


def _events_to_arrow(
    source: str, source_kind: str, writer_id: str, events: Sequence[ChangeEvent], end_lsns: Mapping[int, int]
) -> pa.Table:
    """The batch as wal_events rows: one pass per column straight from the event tuples.

    This runs on the commit thread and holds the GIL, which the decoder thread wants back: one
    `pa.array` over `map(itemgetter(i), events)` per column takes ~90 ms for 100k events, where
    transposing them (`zip(*events)`) first took ~240 ms (bench/ingest_throughput.py).
    """
    n = len(events)
    schema = WAL_EVENTS_TABLE.schema
    cols: dict[str, Any] = {
        name: pa.array(map(itemgetter(i), events), schema.field(name).type, size=n) for name, i in _FIELD_COLUMNS
    }
    cols["source"] = pa.array([source] * n, pa.string())
    cols["source_kind"] = pa.array([source_kind] * n, pa.string())
    cols["end_lsn"] = pa.array([end_lsns.get(e.commit_lsn) for e in events], pa.int64())
    commit_us = pa.array(map(itemgetter(_TS_INDEX), events), pa.int64(), size=n)
    cols["commit_timestamp"] = commit_us.cast(schema.field("commit_timestamp").type)
    cols["writer_id"] = pa.array([writer_id] * n, pa.string())
    cols["ingested_at"] = pa.array([_now()] * n, schema.field("ingested_at").type)
    return pa.table([cols[name] for name in schema.names], schema=schema)


_TS_INDEX = ChangeEvent._fields.index("commit_ts_us")


def wal_rows(
    source: str,
    source_kind: str,
    writer_id: str,
    events: Sequence[ChangeEvent],
    end_lsns: Mapping[int, int],
    rows: Sequence[RowSlice] = (),
) -> pa.Table:
    """A batch's wal_events rows: its events, and its decoded rows stamped with their positions."""
    data = _events_to_arrow(source, source_kind, writer_id, events, end_lsns)
    if not rows:
        return data
    now = pa.scalar(_now(), WAL_EVENTS_TABLE.schema.field("ingested_at").type)
    stamped = [stamp(r, source, source_kind, writer_id, end_lsns.get(r.commit_lsn), now) for r in rows]
    return pa.Table.from_batches(stamped + data.to_batches(), schema=WAL_EVENTS_TABLE.schema)


OFFSET_BYTES = 4  # an Arrow string or list column's int32 offset


def _strings(n: int, column: tuple[bytes, bytes]) -> pa.Array:
    """An Arrow string array of `n` values from (int32 offsets, UTF-8 data) buffers, checked for shape."""
    offsets, data = column
    array = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    array.validate()
    return array


@functools.cache
def _writer_properties(table: BronzeTable) -> WriterProperties | None:
    """Parquet settings of `table`'s appends: no statistics for its unindexed text columns."""
    columns = table.unindexed_columns()
    if not columns:
        return None
    off = ColumnProperties(statistics_enabled="NONE")
    # Snappy, as delta-rs writes without properties: given properties, an unset codec means none.
    return WriterProperties(compression="SNAPPY", column_properties=dict.fromkeys(columns, off))


def _page_to_arrow(source: str, source_kind: str, writer_id: str, page: SnapshotPage) -> pa.Table:
    """The page as snapshot_pages rows (an empty page is one row of no record), built column by column.

    The same table `pa.Table.from_pylist` makes from one dict per row, at a fraction of the cost:
    that took ~60 ms of a 10,000-row page, more than its read and its Delta commit together, and
    held the GIL the other snapshot threads and the stream's decoder wanted. A page of `columns`
    (the compiled encoder's) gives its buffers to Arrow as they are.
    """
    schema = SNAPSHOT_PAGES_TABLE.schema
    rows, columns = page.rows, page.columns
    n = max(1, page.row_count)

    def same(name: str, value: object) -> pa.Array:
        return pa.repeat(pa.scalar(value, schema.field(name).type), n)

    if columns is not None and columns.count:
        # The compiled encoder's buffers as they are: Arrow's own layout, not one object per row.
        row_index = pa.array(range(n), pa.int32())
        record_pk = _strings(n, columns.record_pk)
        record = _strings(n, columns.record)
        keys = _strings(len(columns.key_text[0]) // OFFSET_BYTES - 1, columns.key_text)
        key_text = pa.Array.from_buffers(
            schema.field("key_text").type, n, [None, pa.py_buffer(columns.key_lists)], children=[keys]
        )
        key_text.validate()
    elif rows:
        row_index = pa.array(range(n), pa.int32())
        record_pk = pa.array([r.record_pk for r in rows], pa.string())
        record = pa.array([r.record for r in rows], pa.string())
        key_text = pa.array([r.key_text for r in rows], schema.field("key_text").type)
    else:  # the marker row of a page that read nothing
        row_index = pa.array([-1], pa.int32())
        record_pk, record, key_text = (pa.nulls(1, schema.field(c).type) for c in ("record_pk", "record", "key_text"))
    table_snapshot = page.table_snapshot.to_struct() if page.table_snapshot is not None else None
    cols: dict[str, Any] = {
        "source": same("source", source),
        "source_kind": same("source_kind", source_kind),
        "snapshot_id": same("snapshot_id", page.snapshot_id),
        "table_schema": same("table_schema", page.table_schema),
        "table_name": same("table_name", page.table_name),
        "page_number": same("page_number", page.page_number),
        "row_index": row_index,
        "last_page": same("last_page", page.last_page),
        "record_pk": record_pk,
        "record": record,
        "key_text": key_text,
        "snapshot_xmin": same("snapshot_xmin", page.xmin),
        "snapshot_xmax": same("snapshot_xmax", page.xmax),
        "snapshot_xip": same("snapshot_xip", list(page.xip) if page.xip is not None else None),
        "table_snapshot": same("table_snapshot", table_snapshot),
        "high_watermark_lsn": same("high_watermark_lsn", page.high_watermark_lsn),
        "read_at": same("read_at", datetime.fromtimestamp(page.read_at_us / 1_000_000, UTC)),
        "writer_id": same("writer_id", writer_id),
        "ingested_at": same("ingested_at", _now()),
    }
    return pa.table([cols[name] for name in schema.names], schema=schema)


class BronzeWriter(BronzeState):
    """Owns the bronze tables of one warehouse (a local path or an object-store URI).

    Responsibilities: create the tables (by path, no metastore; only ingest creates bronze),
    append event batches and snapshot pages exactly once (Delta txnAppId/txnVersion, checked
    before each append), record relation shapes, raise and remove writer positions, keep the
    tables' files few (compaction on a commit count). What is durable is read back by the
    BronzeState it extends.
    """

    def __init__(self, warehouse: str | Path, storage_options: Mapping[str, str] | None = None) -> None:
        """Bind to `warehouse`; tables live in `<warehouse>/bronze/<name>` (see BronzeState)."""
        super().__init__(warehouse, storage_options)
        self._commits_since_upkeep: dict[str, int] = {}

    def ensure_tables(self) -> None:
        """Create each bronze table that does not exist yet (safe against a concurrent creator).

        Schema, partitioning and properties go in the table's first commit (protocol 1/2, which
        every Spark with Delta reads). A table made by an older ingest gets the properties and the
        columns it lacks (dbt's models name every column of the contract, docs/bronze.md).
        """
        for table in ALL_TABLES:
            props = dict(table.properties)
            if not self.tables.create(self.path(table), table.schema, table.partition_by, props):
                self.tables.set_missing_properties(self.path(table), props)
                self.tables.add_missing_columns(self.path(table), table.schema)

    def _append(self, table: BronzeTable, data: pa.Table, source: str, app_id: str | None, version: int | None) -> None:
        uri = self.path(table)
        try:
            self.tables.append(uri, data, app_id, version, _writer_properties(table))
        except BronzeWriteError:
            raise
        except Exception as e:
            raise BronzeWriteError(f"append to {uri} failed: {e}") from e
        self._after_commit(table, source)

    def _after_commit(self, table: BronzeTable, source: str) -> None:
        """Compact `source`'s partition of `table` every COMPACT_EVERY_COMMITS commits of this process."""
        n = self._commits_since_upkeep.get(table.name, 0) + 1
        if n < COMPACT_EVERY_COMMITS:
            self._commits_since_upkeep[table.name] = n
            return
        self._commits_since_upkeep[table.name] = 0
        self.compact(table, source)

    def compact(self, table: BronzeTable, source: str | None = None) -> None:
        """Compact small files (of `source`'s partition) and vacuum what the retention lets go.

        A failure is logged, not raised: upkeep never stops capture, and the next round retries.
        """
        uri = self.path(table)
        t0 = time.monotonic()
        try:
            m = self.tables.compact(uri, ("source", source) if source else None)
            removed = self.tables.vacuum(uri)
        except Exception as e:
            log.warning("bronze compaction failed table=%s error=%s", table.name, e)
            return
        log.info(
            "compacted table=%s source=%s files_removed=%s files_added=%s vacuumed=%d seconds=%.2f",
            table.name,
            source,
            m.get("numFilesRemoved"),
            m.get("numFilesAdded"),
            len(removed),
            time.monotonic() - t0,
        )

    def append_events(
        self,
        source: str,
        source_kind: str,
        writer_id: str,
        events: Sequence[ChangeEvent],
        end_lsns: Mapping[int, int] | None = None,
        rows: Sequence[RowSlice] = (),
        last_position: tuple[int, int] | None = None,
    ) -> None:
        """Commit `events` and `rows` as one Delta transaction; a retried batch is a no-op.

        `end_lsns` maps a commit LSN to its transaction's end LSN where known (not for a page of a
        transaction whose Commit has not arrived yet: those rows get NULL). `rows`: decoded rows
        of committed transactions, stamped here with their positions (pending.stamp).
        `last_position`: the batch's last position when it ends with `rows`; else its last event's.
        """
        if not events and not rows:
            return
        if last_position is None:
            last_position = events[-1].position if events else rows[-1].last_position
        data = wal_rows(source, source_kind, writer_id, events, end_lsns or {}, rows)
        app_id, version = txn_identity(f"{source}/{writer_id}", *last_position)
        self._append(WAL_EVENTS_TABLE, data, source, app_id, version)

    def append_relations(
        self,
        source: str,
        shapes: Sequence[RelationShape],
        memberships: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        """Record table shapes first seen in this batch.

        `memberships`: (schema, table) -> the publication membership token to record with the
        table's row (the source's own encoding); null for a table it leaves out.
        """
        if not shapes:
            return
        members = memberships or {}
        now = _now()
        rows = [
            {
                "source": source,
                "relation_id": s.relation_id,
                "table_schema": s.table_schema,
                "table_name": s.table_name,
                "replica_identity": s.replica_identity,
                "columns": [
                    {
                        "name": c.name,
                        "type_oid": c.type_oid,
                        "type_name": c.type_name,
                        "type_modifier": c.type_modifier,
                        "is_key": c.is_key,
                        "pk_position": c.pk_position,
                        "json_kind": c.json_kind,
                        "attnum": c.attnum,
                        "fields": None if c.fields is None else [{"name": n, "type_name": t} for n, t in c.fields],
                    }
                    for c in s.columns
                ],
                "shape_hash": s.shape_hash,
                "first_seen_lsn": s.first_seen_lsn,
                "ingested_at": now,
                "publication_membership": members.get((s.table_schema, s.table_name)),
            }
            for s in shapes
        ]
        data = pa.Table.from_pylist(rows, SOURCE_RELATIONS_TABLE.schema)
        self._append(SOURCE_RELATIONS_TABLE, data, source, None, None)

    def raise_position(self, pos: WriterPosition, started_at: datetime) -> None:
        """Replace this writer's row (its own partition) with `pos`; callers never lower it."""
        self.raise_positions([(pos, started_at)])

    def raise_positions(self, rows: Sequence[tuple[WriterPosition, datetime]]) -> None:
        """Replace the rows of these writers (all of one source) in one Delta commit."""
        if not rows:
            return
        source = rows[0][0].source
        if any(p.source != source for p, _ in rows):
            raise ValueError("raise_positions takes the writers of one source")
        now = _now()
        data = [
            {
                "source": pos.source,
                "writer_id": pos.writer_id,
                "writer_kind": pos.writer_kind.value,
                "durable_lsn": pos.durable_lsn,
                "ack_lsn": pos.ack_lsn,
                "resume_token": pos.resume_token,
                "started_at": started_at,
                "updated_at": now,
            }
            for pos, started_at in rows
        ]
        ids = ", ".join(sql_str(p.writer_id) for p, _ in rows)
        cond = f"source = {sql_str(source)} AND writer_id IN ({ids})"
        try:
            self.tables.replace(
                self.path(STREAM_POSITIONS_TABLE), pa.Table.from_pylist(data, STREAM_POSITIONS_TABLE.schema), cond
            )
        except BronzeWriteError:
            raise
        except Exception as e:
            names = ", ".join(p.writer_id for p, _ in rows)
            raise BronzeWriteError(f"raising positions of {source}/{names} failed: {e}") from e
        self._after_commit(STREAM_POSITIONS_TABLE, source)

    def append_page(self, source: str, source_kind: str, writer_id: str, page: SnapshotPage) -> None:
        """Commit one snapshot page as one Delta transaction; a retried page is a no-op."""
        table = _page_to_arrow(source, source_kind, writer_id, page)
        self._append(SNAPSHOT_PAGES_TABLE, table, source, f"{source}/{writer_id}", page.page_number)

    def append_snapshot_control(self, source: str, commands: Sequence[tuple[str, str, bool]]) -> None:
        """Record `snapshot pause|resume` of (snapshot id, table, paused) in one append; creates the table."""
        if not commands:
            return
        table = SNAPSHOT_CONTROL_TABLE
        self.tables.create(self.path(table), table.schema, table.partition_by, dict(table.properties))
        # A snapshot's latest record decides (snapshot_pauses orders by issued_at), so a command
        # issued after another is stamped after it even when this host's clock is behind the
        # other's, or in the same microsecond: after every record the table holds.
        (last,) = self.query("select max(issued_at) as last from t", t=table).column("last").to_pylist()
        now = _now() if last is None else max(_now(), last + timedelta(microseconds=1))
        rows = [
            {"source": source, "snapshot_id": sid, "table_name": name, "paused": paused, "issued_at": now}
            for sid, name, paused in commands
        ]
        self._append(table, pa.Table.from_pylist(rows, table.schema), source, None, None)

    def remove_writer(self, source: str, writer_id: str) -> None:
        """Delete a retired writer's row so it no longer holds back the safe bound."""
        cond = f"source = {sql_str(source)} AND writer_id = {sql_str(writer_id)}"
        try:
            self.tables.delete(self.path(STREAM_POSITIONS_TABLE), cond)
        except Exception as e:
            raise BronzeWriteError(f"removing writer {source}/{writer_id} failed: {e}") from e
