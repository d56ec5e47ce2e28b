"""What bronze holds, as ingest reads it back: positions, the last durable event and page, shapes.

Every read goes through delta-rs's DataFusion engine, which applies deletion vectors (its pyarrow
dataset reader refuses tables that have them). Writes are `writer.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from ingest.bronze.delta import DeltaTables
from ingest.bronze.schemas import (
    SNAPSHOT_CONTROL_TABLE,
    SNAPSHOT_PAGES_TABLE,
    SOURCE_RELATIONS_TABLE,
    STREAM_POSITIONS_TABLE,
    WAL_EVENTS_TABLE,
    BronzeTable,
)
from ingest.errors import BronzeWriteError
from ingest.events import ColumnShape, RelationShape, WriterKind, WriterPosition
from ingest.positions import FILTERED_SNAPSHOT_PREFIX, SnapshotProgress


@dataclass(frozen=True, slots=True)
class DurablePage:
    """The last page of a snapshot committed to bronze: a resumed snapshot starts after it."""

    page_number: int
    after_key: tuple[str, ...] | None  # key_text of its last row (None: no row read yet)
    rows: int  # rows committed by the snapshot so far
    complete: bool  # its last page is committed


class BronzeState:
    """Answers what is durable in the bronze tables of one warehouse (a local path or an object-store URI).

    Responsibilities: where each table lives, the writer rows, the last event of a writer (a
    restart skips what is already in bronze), the last page of a snapshot (a resumed snapshot
    starts after it), the completed snapshots and the recorded relation shapes.
    """

    def __init__(self, warehouse: str | Path, storage_options: Mapping[str, str] | None = None) -> None:
        """Bind to `warehouse`; tables live in `<warehouse>/bronze/<name>`.

        `storage_options` go to delta-rs as they are (object stores; credentials may also come
        from the store's standard environment variables).
        """
        self.warehouse = str(warehouse).rstrip("/")
        self.root = f"{self.warehouse}/bronze"
        self.tables = DeltaTables(storage_options)

    def path(self, table: BronzeTable) -> str:
        """The Delta table URI of `table`."""
        return f"{self.root}/{table.name}"

    def exists(self, table: BronzeTable) -> bool:
        """Whether `table` has been created."""
        return self.tables.exists(self.path(table))

    def known_shapes(self, source: str) -> dict[tuple[str, str], RelationShape]:
        """(table_schema, table_name) -> its latest recorded shape (silver.table_columns' pick).

        Latest by first_seen_lsn, then ingested_at: a table whose shape went back to an older one
        (ADD then DROP COLUMN) must be recorded again, or its latest row keeps the phantom column
        (review W12), so the stream compares a new shape with this one, not with every hash seen.
        """
        return {(sh.table_schema, sh.table_name): sh for sh, _ in self.shape_history(source)}

    def known_memberships(self, source: str) -> dict[tuple[str, str], str]:
        """(table_schema, table_name) -> the publication membership token last recorded for it.

        The latest row that carries one (by first_seen_lsn, then ingested_at): rows that do not
        (the stream's shapes, an older ingest's rows) say nothing of it. A table without any is
        left out (unknown).
        """
        t = self.query(
            "select table_schema, table_name, publication_membership from t "
            f"where source = {sql_str(source)} and publication_membership is not null "
            "order by first_seen_lsn, ingested_at",
            t=SOURCE_RELATIONS_TABLE,
        )
        return {(r["table_schema"], r["table_name"]): r["publication_membership"] for r in t.to_pylist()}

    def shape_history(self, source: str) -> list[tuple[RelationShape, datetime]]:
        """Every shape recorded for `source`'s tables and when it was written, by (first_seen_lsn, ingested_at)."""
        t = self.query(
            "select relation_id, table_schema, table_name, replica_identity, columns, first_seen_lsn, ingested_at "
            f"from t where source = {sql_str(source)} order by first_seen_lsn, ingested_at",
            t=SOURCE_RELATIONS_TABLE,
        )
        return [
            (
                RelationShape(
                    r["relation_id"],
                    r["table_schema"],
                    r["table_name"],
                    r["replica_identity"],
                    tuple(
                        ColumnShape(
                            c["name"],
                            c["type_oid"],
                            c["type_name"],
                            c["type_modifier"],
                            c["is_key"],
                            c["pk_position"],
                            c["json_kind"],
                            c.get("attnum"),  # absent in a table written before it was recorded
                            _fields(c.get("fields")),  # absent or null likewise
                        )
                        for c in r["columns"]
                    ),
                    r["first_seen_lsn"],
                ),
                r["ingested_at"],
            )
            for r in t.to_pylist()
        ]

    def completed_snapshots(self, source: str) -> dict[str, int]:
        """`schema.table` -> high watermark of its latest completed snapshot (its last page).

        A filtered snapshot (`snapshot --where`) read only some rows: it does not count.
        """
        t = self.query(
            "select table_schema, table_name, max(high_watermark_lsn) as hw from t "
            f"where source = {sql_str(source)} and last_page "
            f"and not starts_with(snapshot_id, {sql_str(FILTERED_SNAPSHOT_PREFIX)}) group by table_schema, table_name",
            t=SNAPSHOT_PAGES_TABLE,
        )
        return {f"{r['table_schema']}.{r['table_name']}": int(r["hw"]) for r in t.to_pylist()}

    def captured_tables(self, source: str) -> set[tuple[str, str]]:
        """Every (table_schema, table_name) bronze holds a change or a snapshot row of for `source`.

        A full read of the source's partitions (two columns): for recoveries, not for the hot path.
        """
        found: set[tuple[str, str]] = set()
        for table in (WAL_EVENTS_TABLE, SNAPSHOT_PAGES_TABLE):
            if not self.exists(table):
                continue
            t = self.query(
                "select distinct table_schema, table_name from t "
                f"where source = {sql_str(source)} and table_schema is not null and table_name is not null",
                t=table,
            )
            found.update((r["table_schema"], r["table_name"]) for r in t.to_pylist())
        return found

    def last_durable_page(self, source: str, snapshot_id: str) -> DurablePage | None:
        """Where a snapshot stands in bronze: its last committed page, cursor, rows and completion."""
        where = f"where source = {sql_str(source)} and snapshot_id = {sql_str(snapshot_id)}"
        agg = self.query(
            "select max(page_number) as last_page_number, count(record_pk) as n, "
            f"max(cast(last_page as int)) as done from t {where}",
            t=SNAPSHOT_PAGES_TABLE,
        ).to_pylist()[0]
        if agg["last_page_number"] is None:
            return None
        last = self.query(
            f"select key_text from t {where} and page_number = {int(agg['last_page_number'])} "
            "order by row_index desc limit 1",
            t=SNAPSHOT_PAGES_TABLE,
        ).to_pylist()[0]
        key = tuple(last["key_text"]) if last["key_text"] is not None else None
        return DurablePage(int(agg["last_page_number"]), key, int(agg["n"]), bool(agg["done"]))

    def positions(self, source: str | None = None) -> list[tuple[WriterPosition, datetime]]:
        """Every writer row (of `source`, if given) with its `updated_at`.

        A snapshot's row says `paused` as its latest `snapshot pause|resume` record says
        (snapshot_pauses); a snapshot with none keeps the flag its row has (rows written before
        the records existed, when the command wrote the flag into the row).
        """
        where = f" where source = {sql_str(source)}" if source is not None else ""
        rows = self.query(f"select * from t{where}", t=STREAM_POSITIONS_TABLE).to_pylist()
        pauses = (
            self.snapshot_pauses(source) if any(r["writer_kind"] == WriterKind.SNAPSHOT.value for r in rows) else {}
        )
        out = []
        for r in rows:
            pos = WriterPosition(
                r["source"],
                r["writer_id"],
                WriterKind(r["writer_kind"]),
                r["durable_lsn"],
                r["ack_lsn"],
                r["resume_token"],
            )
            if pos.writer_kind is WriterKind.SNAPSHOT and pauses:
                progress = SnapshotProgress.from_row(pos)
                paused = pauses.get((pos.source, progress.snapshot_id), progress.paused)
                if paused != progress.paused:
                    pos = replace(pos, resume_token=replace(progress, paused=paused).to_json())
            out.append((pos, r["updated_at"]))
        return out

    def snapshot_control_version(self) -> int | None:
        """The snapshot_control table's version (None before its first record): it moves with each command."""
        if not self.exists(SNAPSHOT_CONTROL_TABLE):
            return None
        return int(self.tables.table(self.path(SNAPSHOT_CONTROL_TABLE)).version())

    def snapshot_pauses(self, source: str | None = None) -> dict[tuple[str, str], bool]:
        """Whether each (source, snapshot id) with a `snapshot pause|resume` record is paused: its latest says."""
        if not self.exists(SNAPSHOT_CONTROL_TABLE):
            return {}
        where = f" where source = {sql_str(source)}" if source is not None else ""
        rows = self.query(
            f"select source, snapshot_id, paused from t{where} order by issued_at", t=SNAPSHOT_CONTROL_TABLE
        ).to_pylist()
        return {(r["source"], r["snapshot_id"]): bool(r["paused"]) for r in rows}

    def last_event_position(self, source: str, writer_id: str, from_lsn: int = 0) -> tuple[int, int] | None:
        """The highest (commit_lsn, commit_index) this writer has in bronze, or None.

        Bronze is the truth of what is durable: a restarted writer skips every re-delivered event at
        or below this position, so a crash between a Delta commit and the slot acknowledgement
        neither loses nor duplicates events. `from_lsn` (the writer's recorded durable position)
        lets the reader skip files by their statistics.
        """
        t = self.query(
            "select commit_lsn, commit_index from t "
            f"where source = {sql_str(source)} and writer_id = {sql_str(writer_id)} "
            f"and commit_lsn >= {int(from_lsn)} order by commit_lsn desc, commit_index desc limit 1",
            t=WAL_EVENTS_TABLE,
        ).to_pylist()
        if not t:
            return None
        return (int(t[0]["commit_lsn"]), int(t[0]["commit_index"]))

    def transactions(self, source: str, writer_id: str, from_lsn: int, to_lsn: int) -> list[tuple[int, int]]:
        """(commit_lsn, xid) of this writer's transactions with commit_lsn in [from_lsn, to_lsn], in order.

        A non-transactional logical message is not a transaction (a re-delivery does not begin one
        for it), and neither is a history-lost tombstone (ingest's own, xid 0, no transaction).
        """
        t = self.query(
            "select commit_lsn, min(xid) as xid from t "
            f"where source = {sql_str(source)} and writer_id = {sql_str(writer_id)} "
            f"and commit_lsn >= {int(from_lsn)} and commit_lsn <= {int(to_lsn)} "
            "and coalesce(message_transactional, true) and xid <> 0 "
            "group by commit_lsn order by commit_lsn",
            t=WAL_EVENTS_TABLE,
        ).to_pylist()
        return [(int(r["commit_lsn"]), int(r["xid"])) for r in t]

    def max_commit_time(self, source: str) -> datetime | None:
        """The newest commit timestamp of `source` in bronze (for status)."""
        t = self.query(f"select max(commit_timestamp) as m from t where source = {sql_str(source)}", t=WAL_EVENTS_TABLE)
        m = t.to_pylist()[0]["m"]
        return m if isinstance(m, datetime) else None

    def query(self, sql: str, t: BronzeTable) -> pa.Table:
        """`sql` over bronze table `t` (registered as `t`)."""
        try:
            return self.tables.query(sql, t=self.path(t))
        except BronzeWriteError:  # the storage failing past the retries: BronzeUnavailableError, exit 75
            raise
        except Exception as e:
            raise BronzeWriteError(f"reading {self.path(t)} failed: {e}") from e


def sql_str(s: str) -> str:
    """`s` as a SQL string literal (DataFusion: standard quoting, a quote doubled)."""
    return "'" + s.replace("'", "''") + "'"


def _fields(rows: list[dict[str, str]] | None) -> tuple[tuple[str, str], ...] | None:
    """A recorded column's composite fields as ColumnShape holds them (None: not a composite, or not recorded)."""
    return None if rows is None else tuple((r["name"], r["type_name"]) for r in rows)
