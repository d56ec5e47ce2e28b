"""Snapshots Postgres tables in keyset pages while the stream runs (DESIGN §5).

A page is read in its own REPEATABLE READ transaction whose MVCC snapshot (64-bit xmin, xmax,
in-progress xids) is stored with the page; right after the read a transactional logical message
(the high watermark) is committed, and its LSN is stored too. dbt places the page's rows against
the stream with those two facts (docs/snapshots.md): an event for the same key that the snapshot
could not see and that commits at or before the watermark supersedes the page row; every other
event is ordered by position against the page row's `(high_watermark_lsn, row_index)`.

Each table snapshot is a writer in bronze.stream_positions (`snapshot-<id>`). It is registered at
the source's current safe bound, raised to each page's watermark after the page is committed to
bronze, and removed when the snapshot completes. A crashed snapshot resumes after its last
durable page; the page rows in bronze, not the writer row, say where that is.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from psycopg import pq, sql

from ingest import faults
from ingest.bronze.writer import BronzeWriter
from ingest.config import PostgresSource
from ingest.errors import BronzeWriteError, SourceError
from ingest.events import SnapshotPage, SnapshotRow, WriterKind, WriterPosition, lsn_to_int
from ingest.positions import SnapshotProgress, SourcePositions, snapshot_writer_id
from ingest.progress import Progress
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.replication import safe_dsn, session_conninfo
from ingest.sources.postgres.values import (
    TYPE_CATALOG_SQL,
    Encoder,
    TypeCatalog,
    encode_key,
    encode_record,
    json_keys,
)

log = logging.getLogger(__name__)

WATERMARK_PREFIX = "changelake.watermark"
REQUEST_POLL_S = 5.0
REREAD_POLL_S = 60.0  # how often a continuous run looks in silver for keys to re-read
POSITION_INTERVAL_S = 2.0  # a running snapshot raises its writer row at most this often (and at its end)

# A test (or an operator's debugging session) may run statements at moments of a page:
# "before_read", "after_begin" (the page's snapshot is taken next) and "after_read".
Hook = Callable[[str, "SnapshotTask", int], None]


@dataclass(slots=True)
class SnapshotTask:
    """One table snapshot: its writer row's identity and progress (kept in `resume_token`)."""

    table: str
    snapshot_id: str
    started_at: datetime
    durable_lsn: int
    pages: int = 0
    rows: int = 0
    estimated_rows: int | None = None
    rows_per_s: float | None = None
    after: tuple[str, ...] | None = None
    until: tuple[str, ...] | None = None  # the largest key when the snapshot started: its last row
    bounded: bool = False  # `until` is known (None with bounded = the table was empty)
    keys: tuple[tuple[str, ...], ...] | None = None  # a re-read of these keys only (one page)

    @property
    def writer_id(self) -> str:
        """The writer row of this snapshot in bronze.stream_positions."""
        return snapshot_writer_id(self.snapshot_id)

    def position(self, source: str) -> WriterPosition:
        """The writer row as it stands."""
        progress = SnapshotProgress(
            self.table,
            self.snapshot_id,
            self.pages,
            self.rows,
            self.estimated_rows,
            self.rows_per_s,
            self.until,
            self.bounded,
            self.keys,
        )
        return WriterPosition(
            source, self.writer_id, WriterKind.SNAPSHOT, self.durable_lsn, self.durable_lsn, progress.to_json()
        )

    @classmethod
    def from_position(cls, pos: WriterPosition, started_at: datetime) -> SnapshotTask:
        """Rebuild a task from its writer row (after a restart, or a request by another process)."""
        p = SnapshotProgress.from_row(pos)
        return cls(
            p.table,
            p.snapshot_id,
            started_at,
            pos.durable_lsn,
            p.pages,
            p.rows,
            p.estimated_rows,
            p.rows_per_s,
            until=p.until,
            bounded=p.bounded,
            keys=p.keys,
        )


@dataclass(frozen=True, slots=True)
class TableShape:
    """What a page read needs of a table: its columns (pgoutput's order) and primary key."""

    schema: str
    name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key_positions: tuple[int, ...]
    key_types: tuple[str, ...]  # format_type() with modifier, for the keyset cursor's casts
    partitioned: bool = False  # a partitioned table: read with its partitions (captured as its root)

    @property
    def scan(self) -> sql.Composable:
        """What a page reads: the table alone, or a partitioned table with every partition.

        `only` for a plain table: inheritance children publish their own changes. A partitioned
        table's partitions publish theirs as the root's (publish_via_partition_root).
        """
        ident = sql.Identifier(self.schema, self.name)
        return ident if self.partitioned else sql.SQL("only {}").format(ident)


def table_shape(admin: PostgresAdmin, table: str) -> TableShape:
    """Columns as pgoutput sends them (not dropped, not generated, by attnum) and the primary key."""
    schema, name = table.split(".", 1)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select a.attname, a.atttypid::bigint, format_type(a.atttypid, a.atttypmod) "
            "from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace "
            "where n.nspname = %s and c.relname = %s and a.attnum > 0 and not a.attisdropped "
            "and a.attgenerated = '' order by a.attnum",
            (schema, name),
        )
        cols = cur.fetchall()
        cur.execute(
            "select c.oid::bigint, c.relkind::text from pg_class c where c.oid = %s::regclass",
            (sql.Identifier(schema, name).as_string(admin.conn),),
        )
        row = cur.fetchone()
    if not cols or row is None:
        raise SourceError(f"source {admin.src.name!r}: table {table} does not exist")
    pk = admin.primary_key(int(str(row[0])))
    names = tuple(str(c[0]) for c in cols)
    if not pk:
        raise SourceError(
            f"source {admin.src.name!r}: table {table} has no primary key; a snapshot pages by primary key "
            "(add one, or leave the table out of the snapshot)"
        )
    pos = tuple(names.index(k) for k in pk)
    oids = tuple(int(str(c[1])) for c in cols)
    key_types = tuple(str(cols[i][2]) for i in pos)
    return TableShape(schema, name, names, oids, pos, key_types, partitioned=str(row[1]) == "p")


@dataclass(frozen=True, slots=True)
class PageRead:
    """The outcome of one page read, before it is written to bronze."""

    rows: list[SnapshotRow]
    xmin: int
    xmax: int
    xip: tuple[int, ...]
    read_at_us: int


class PageReader:
    """Owns the snapshot connection of one source: reads keyset pages and commits watermarks."""

    def __init__(self, src: PostgresSource, hook: Hook | None = None) -> None:
        """Open a plain (non-replication) connection with the stream's value output settings."""
        self.src = src
        self.hook = hook
        conn = pq.PGconn.connect(session_conninfo(src.dsn).encode())
        if conn.status != pq.ConnStatus.OK:
            msg = conn.get_error_message().strip()
            conn.finish()
            raise SourceError(f"source {src.name!r}: snapshot connection to {safe_dsn(src.dsn)} failed: {msg}")
        self.conn = conn

    def close(self) -> None:
        """Close the connection."""
        self.conn.finish()

    def _exec(self, query: bytes, params: Sequence[bytes | None] = ()) -> pq.abc.PGresult:
        res = self.conn.exec_params(query, list(params)) if params else self.conn.exec_(query)
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raw = res.error_message or self.conn.get_error_message()
            msg = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
            if self.conn.transaction_status != pq.TransactionStatus.IDLE:
                self.conn.exec_(b"ROLLBACK")
            raise SourceError(f"source {self.src.name!r}: snapshot query failed: {msg}")
        return res

    def _hook(self, point: str, task: SnapshotTask, page: int) -> None:
        if self.hook is not None:
            self.hook(point, task, page)

    def read_page(
        self, shape: TableShape, encoders: Sequence[Encoder], task: SnapshotTask, page: int, limit: int
    ) -> PageRead:
        """Read up to `limit` rows after `task.after` in key order, in one REPEATABLE READ transaction."""
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in shape.columns)
        keys = sql.SQL(", ").join(sql.Identifier(shape.columns[i]) for i in shape.key_positions)
        params: list[bytes | None] = []
        conds: list[sql.Composable] = []
        casts = sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Placeholder(), sql.SQL(t)) for t in shape.key_types)
        if task.keys is not None:  # a re-read of listed keys (DESIGN §6: unchanged TOAST with no image)
            tuples = sql.SQL(", ").join(sql.SQL("({})").format(casts) for _ in task.keys)
            conds.append(sql.SQL("({}) in ({})").format(keys, tuples))
            params += [k.encode() for key in task.keys for k in key]
        if task.after is not None:
            conds.append(sql.SQL("({}) > ({})").format(keys, casts))
            params += [k.encode() for k in task.after]
        if task.bounded and task.until is None:
            conds.append(sql.SQL("false"))  # the table was empty when the snapshot started
        if task.until is not None:
            # Rows inserted above the starting maximum arrive by the stream: without this bound a
            # snapshot of a table under insert load could chase its tail forever.
            conds.append(sql.SQL("({}) <= ({})").format(keys, casts))
            params += [k.encode() for k in task.until]
        where: sql.Composable = sql.SQL(" where ") + sql.SQL(" and ").join(conds) if conds else sql.SQL("")
        query = sql.SQL("select {} from {}{} order by {} limit {}").format(
            cols, shape.scan, where, keys, sql.Literal(limit)
        )
        # psycopg's placeholders are %s; the libpq protocol's are $n.
        text = query.as_string(None)
        for n in range(1, len(params) + 1):
            text = text.replace("%s", f"${n}", 1)
        self._hook("before_read", task, page)
        self._exec(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        self._hook("after_begin", task, page)
        # The first statement takes the transaction's snapshot: the page reads under exactly it.
        snap = self._exec(
            b"select pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, "
            b"array_to_string(array(select pg_snapshot_xip(s)), ',') from pg_current_snapshot() s"
        )
        xmin, xmax = int(snap.get_value(0, 0) or b"0"), int(snap.get_value(0, 1) or b"0")
        xip_text = (snap.get_value(0, 2) or b"").decode()
        xip = tuple(int(x) for x in xip_text.split(",") if x)
        read_at_us = int(time.time() * 1_000_000)
        res = self._exec(text.encode(), params)
        self._exec(b"COMMIT")
        table = f"{shape.schema}.{shape.name}"
        keys_json = json_keys(shape.columns)
        width = range(len(shape.columns))
        rows = []
        for r in range(res.ntuples):
            values = [None if (v := res.get_value(r, c)) is None else bytes(v) for c in width]
            record, _ = encode_record(table, keys_json, encoders, shape.columns, values)
            record_pk = encode_key(table, keys_json, encoders, shape.key_positions, values)
            key_text = tuple((values[i] or b"").decode() for i in shape.key_positions)
            rows.append(SnapshotRow(record_pk, record, key_text))
        self._hook("after_read", task, page)
        return PageRead(rows, xmin, xmax, xip, read_at_us)

    def max_key(self, shape: TableShape) -> tuple[str, ...] | None:
        """The table's largest key now (as key text), or None if it is empty."""
        keys = [sql.Identifier(shape.columns[i]) for i in shape.key_positions]
        query = sql.SQL("select {} from {} order by {} limit 1").format(
            sql.SQL(", ").join(keys),
            shape.scan,
            sql.SQL(", ").join(sql.SQL("{} desc").format(k) for k in keys),
        )
        res = self._exec(query.as_string(None).encode())
        if res.ntuples == 0:
            return None
        return tuple(bytes(res.get_value(0, i) or b"").decode() for i in range(len(keys)))

    def watermark(self, task: SnapshotTask, page: int) -> int:
        """Commit the page's high watermark (a transactional logical message); returns its LSN."""
        content = f"{task.table}:{task.snapshot_id}:{page}".encode()
        res = self._exec(b"select pg_logical_emit_message(true, $1, $2)::text", [WATERMARK_PREFIX.encode(), content])
        return lsn_to_int((res.get_value(0, 0) or b"").decode())

    def current_lsn(self) -> int:
        """The server's current WAL insert position (no later watermark can be at or below it)."""
        res = self._exec(b"select pg_current_wal_insert_lsn()::text")
        return lsn_to_int((res.get_value(0, 0) or b"").decode())


class Snapshotter:
    """Owns the snapshots of one Postgres source.

    Responsibilities: register snapshot writers (initial snapshots of configured tables that never
    completed one, and on-demand requests), run them one at a time in keyset pages beside the
    stream, commit each page and then raise the writers' positions, resume after a crash from the
    last durable page, retire each writer when its table is done, and report progress.
    """

    def __init__(
        self,
        src: PostgresSource,
        writer: BronzeWriter,
        page_rows: int | None = None,
        hook: Hook | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Snapshot `src` into `writer`'s bronze; `page_rows` overrides the configured page size.

        `progress`: the stream's progress line, which then shows the running snapshot.
        """
        self.src = src
        self.writer = writer
        self.page_rows = page_rows or src.snapshot.page_rows
        self.hook = hook
        self.tasks: list[SnapshotTask] = []
        self.completed: list[SnapshotTask] = []
        self.progress = progress
        self._reread_seen: set[tuple[object, ...]] = set()

    # -- registration ----------------------------------------------------------------------
    def load(self) -> list[SnapshotTask]:
        """Pick up the source's snapshot writers from bronze (unfinished or requested ones)."""
        known = {t.writer_id for t in self.tasks}
        for pos, _updated in self.writer.positions(self.src.name):
            if pos.writer_kind is WriterKind.SNAPSHOT and pos.writer_id not in known:
                self.tasks.append(SnapshotTask.from_position(pos, datetime.now(UTC)))
        return self.tasks

    def _start_lsn(self, current_lsn: Callable[[], int]) -> int:
        bound = SourcePositions.read(self.writer, self.src.name).safe_bound
        # DESIGN §4: a new writer starts at the safe bound (the server's position for the first writer)
        return bound if bound is not None else current_lsn()

    def request(
        self,
        tables: Sequence[str],
        current_lsn: Callable[[], int],
        keys: Sequence[tuple[tuple[str, ...], ...] | None] | None = None,
    ) -> list[SnapshotTask]:
        """Register one snapshot writer per table (one Delta commit); they run in request order.

        With `keys`, the i-th task re-reads only those keys of the i-th table.
        """
        if not tables:
            return []
        start = self._start_lsn(current_lsn)
        now = datetime.now(UTC)
        new = [
            SnapshotTask(t, uuid.uuid4().hex, now, start, keys=keys[i] if keys is not None else None)
            for i, t in enumerate(tables)
        ]
        self.writer.raise_positions([(t.position(self.src.name), t.started_at) for t in new])
        self.tasks.extend(new)
        for t in new:
            log.info("snapshot requested source=%s table=%s snapshot_id=%s", self.src.name, t.table, t.snapshot_id)
        return new

    def request_initial(self, current_lsn: Callable[[], int]) -> list[SnapshotTask]:
        """Request a snapshot of every configured table that never completed one and has none running."""
        done = self.writer.completed_snapshots(self.src.name)
        running = {t.table for t in self.load()}
        return self.request([t for t in self.src.tables if t not in done and t not in running], current_lsn)

    def request_rereads(self, admin: PostgresAdmin, current_lsn: Callable[[], int]) -> list[SnapshotTask]:
        """Re-read by key the records silver marks `needs_reread` (DESIGN §6: unchanged TOAST, no image).

        Reads dbt's consumer_records by path (`<warehouse>/dbt/silver.db/consumer_records` unless
        `snapshot.reread_from` says otherwise); nothing to do if dbt has not built it yet. Each key
        is requested once per state of its record in this process.
        """
        path = self.src.snapshot.reread_from or f"{self.writer.warehouse}/dbt/silver.db/consumer_records"
        if not self.writer.tables.exists(path):
            return []
        # delta-rs's query engine applies consumer_records' deletion vectors; its pyarrow dataset
        # reader refuses such a table (DeltaProtocolError) rather than return deleted rows. Any
        # other failure to read it is an error: re-reading the wrong keys is not an option.
        try:
            rows = self.writer.tables.query(
                "select table_schema, table_name, record_pk, commit_lsn, commit_index from t "
                f"where source = '{self.src.name}' and needs_reread and not deleted",
                t=path,
            ).to_pylist()
        except Exception as e:
            raise BronzeWriteError(f"cannot read needs_reread keys from {path}: {e}") from e
        by_table: dict[str, list[tuple[str, ...]]] = {}
        for r in rows:
            seen = (r["table_schema"], r["table_name"], r["record_pk"], r["commit_lsn"], r["commit_index"])
            table = f"{r['table_schema']}.{r['table_name']}"
            if seen in self._reread_seen or table not in self.src.tables:
                continue
            self._reread_seen.add(seen)
            values = json.loads(r["record_pk"]).values()
            by_table.setdefault(table, []).append(tuple(v if isinstance(v, str) else json.dumps(v) for v in values))
        tables, keys = [], []
        for table, ks in by_table.items():
            for i in range(0, len(ks), self.page_rows):
                tables.append(table)
                keys.append(tuple(ks[i : i + self.page_rows]))
        if tables:
            log.info("re-reading keys source=%s keys=%d", self.src.name, sum(len(k) for k in keys))
        return self.request(tables, current_lsn, keys)

    # -- running ---------------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool], poll_requests: bool = False) -> None:
        """Run the registered snapshots to completion (and, with `poll_requests`, new ones as they come)."""
        reader = PageReader(self.src, self.hook)
        admin = PostgresAdmin(self.src)
        try:
            types = TypeCatalog.from_rows(admin.type_catalog_rows(TYPE_CATALOG_SQL))
            self.request_rereads(admin, reader.current_lsn)
            last_poll = last_reread = time.monotonic()
            while not should_stop():
                if not self.tasks:
                    if not poll_requests:
                        return
                    if time.monotonic() - last_poll >= REQUEST_POLL_S:
                        self.load()
                        last_poll = time.monotonic()
                    if time.monotonic() - last_reread >= REREAD_POLL_S:
                        self.request_rereads(admin, reader.current_lsn)
                        last_reread = time.monotonic()
                    else:
                        time.sleep(0.2)
                    continue
                task = self.tasks[0]
                if self._run_task(task, reader, admin, types, should_stop):
                    self.tasks.pop(0)
                    self.completed.append(task)
        finally:
            reader.close()
            admin.close()

    def _run_task(
        self,
        task: SnapshotTask,
        reader: PageReader,
        admin: PostgresAdmin,
        types: TypeCatalog,
        should_stop: Callable[[], bool],
    ) -> bool:
        shape = table_shape(admin, task.table)
        encoders = [types.column_encoder(oid) for oid in shape.type_oids]
        last = self.writer.last_durable_page(self.src.name, task.snapshot_id)
        page = 0
        if last is not None:
            page, task.rows, task.pages = last.page_number + 1, last.rows, last.page_number + 1
            task.after = last.after_key if last.after_key is not None else task.after
            if last.complete:  # crashed after its last page, before retiring
                self._retire(task)
                return True
            log.info("snapshot resumed source=%s table=%s page=%d rows=%d", self.src.name, task.table, page, task.rows)
        if task.estimated_rows is None:
            task.estimated_rows = self._estimate(admin, task.table)
        if not task.bounded and task.keys is None:
            task.until, task.bounded = reader.max_key(shape), True
        t0, rows0 = time.monotonic(), task.rows
        last_raise = 0.0
        while not should_stop():
            read = reader.read_page(shape, encoders, task, page, self.page_rows)
            is_last = (
                task.keys is not None
                or task.until is None
                or len(read.rows) < self.page_rows
                or read.rows[-1].key_text == task.until
            )
            hw = reader.watermark(task, page)
            self.writer.append_page(
                self.src.name,
                "postgres",
                task.writer_id,
                SnapshotPage(
                    task.snapshot_id,
                    shape.schema,
                    shape.name,
                    page,
                    is_last,
                    tuple(read.rows),
                    hw,
                    read.read_at_us,
                    read.xmin,
                    read.xmax,
                    read.xip,
                ),
            )
            faults.hit("snapshot_after_page_commit")
            task.pages, task.rows = page + 1, task.rows + len(read.rows)
            if read.rows:
                task.after = read.rows[-1].key_text
            elapsed = time.monotonic() - t0
            task.rows_per_s = (task.rows - rows0) / elapsed if elapsed > 0 else None
            if not is_last and time.monotonic() - last_raise >= POSITION_INTERVAL_S:
                # Pages are durable already (a resume asks bronze); the row only lets the safe bound pass.
                self._raise_all(hw)
                last_raise = time.monotonic()
            if self.progress is not None:
                left = f", ~{max(0, task.estimated_rows - task.rows):,} left" if task.estimated_rows is not None else ""
                self.progress.note = (
                    f"snapshot {task.table}: {task.rows:,} rows, {task.pages} pages, "
                    f"{task.rows_per_s or 0:,.0f} rows/s{left}"
                )
            log.info(
                "snapshot page source=%s table=%s page=%d rows=%d total_rows=%d estimated_rows=%s rate_per_s=%.0f",
                self.src.name,
                task.table,
                page,
                len(read.rows),
                task.rows,
                task.estimated_rows,
                task.rows_per_s or 0,
            )
            if is_last:
                self._retire(task, hw)
                return True
            page += 1
        return False

    def _estimate(self, admin: PostgresAdmin, table: str) -> int | None:
        with admin.conn.cursor() as cur:
            cur.execute("select reltuples::bigint from pg_class where oid = %s::regclass", (table,))
            row = cur.fetchone()
        n = int(str(row[0])) if row is not None and row[0] is not None else -1
        return n if n >= 0 else None

    def _raise_all(self, hw: int) -> None:
        """Every snapshot writer of this source is at or past `hw`: its next page's watermark is later."""
        for t in self.tasks:
            t.durable_lsn = max(t.durable_lsn, hw)
        if self.tasks:
            self.writer.raise_positions([(t.position(self.src.name), t.started_at) for t in self.tasks])

    def _retire(self, task: SnapshotTask, hw: int = 0) -> None:
        queued = [t for t in self.tasks if t is not task]
        for t in queued:
            t.durable_lsn = max(t.durable_lsn, hw)
        if queued:  # they wait behind this one: they must not hold the safe bound back meanwhile
            self.writer.raise_positions([(t.position(self.src.name), t.started_at) for t in queued])
        self.writer.remove_writer(self.src.name, task.writer_id)
        if self.progress is not None:
            self.progress.note = ""
        faults.hit("snapshot_after_retire")
        log.info(
            "snapshot completed source=%s table=%s snapshot_id=%s pages=%d rows=%d",
            self.src.name,
            task.table,
            task.snapshot_id,
            task.pages,
            task.rows,
        )


def request_snapshot(src: PostgresSource, writer: BronzeWriter, table: str) -> SnapshotTask:
    """Register an on-demand snapshot of `table`; a running (or the next) `run` performs it."""
    if table not in src.tables:
        raise SourceError(f"source {src.name!r} does not capture {table}; configured tables: {', '.join(src.tables)}")
    reader = PageReader(src)
    try:
        writer.ensure_tables()
        return Snapshotter(src, writer).request([table], reader.current_lsn)[0]
    finally:
        reader.close()
