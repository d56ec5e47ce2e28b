"""Reads one keyset page of a Postgres table under a stored MVCC snapshot, and commits its watermark.

The snapshot connection is plain libpq with the stream's value output settings (so a page's
text values are the stream's, byte for byte) and its own transactions: each page is one
REPEATABLE READ transaction, the watermark one logical message committed after it (DESIGN §5).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq, sql

from ingest.capture.retry import transient_libpq_message, transient_sqlstate
from ingest.config import PostgresSource
from ingest.errors import SourceError, SourceUnavailableError
from ingest.events import PageColumns, SnapshotRow, lsn_to_int
from ingest.positions import KeyValues
from ingest.sources.postgres import copy_text, native
from ingest.sources.postgres.admin import connect
from ingest.sources.postgres.catalog import TableShape
from ingest.sources.postgres.filters import filter_sql
from ingest.sources.postgres.replication import connect_value_session
from ingest.sources.postgres.rereads import key_values
from ingest.sources.postgres.rows import encode_key, encode_record, json_keys
from ingest.sources.postgres.standby import IN_RECOVERY_SQL, promoted_error, read_standby_snapshot
from ingest.sources.postgres.values import Encoder, TypeCatalog, non_utf8_tolerant

if TYPE_CHECKING:
    from ingest.masking import TableMask
    from ingest.sources.postgres.snapshot import SnapshotTask

WATERMARK_PREFIX = "changelake.watermark"
# undefined_column, datatype_mismatch, cannot_coerce: a column was dropped or changed its type
# between the snapshot's start (when it read the table's shape) and a page.
SHAPE_CHANGED_SQLSTATES = frozenset({"42703", "42804", "42846"})
PAGE_CURSOR = b"changelake_page"  # the page's rows are fetched through it (closed by the page's COMMIT)
FETCH_GROWTH = 8  # a fetch asks for at most this many times the rows read so far in the page
# A COPY page's lines go to the encoder in buffers of at most this many rows or bytes.
COPY_CHUNK_ROWS = 5_000
COPY_CHUNK_BYTES = 8 * 1024 * 1024
SPLIT_SAMPLE_ROWS = 2_000  # keys sampled to cut a large table into ranges
UNCUT = 1 << 62  # the row and byte limits of a page that is never cut
BOOL_TEXT = {"true": "t", "false": "f"}  # a boolean key's JSON value -> its output text
MAX_TID_OFFSET = 65535  # `(b,65535)` is after every row of block b: a CTID cursor past a whole block
FILTER_CHECK_TIMEOUT_MS = 2_000  # how long a filter's check runs it on the table's rows
QUERY_CANCELED = b"57014"  # the check's statement_timeout ended it
# A test (or an operator's debugging session) may run statements at moments of a page:
# "before_read", "after_begin" (the page's snapshot is taken next) and "after_read".
Hook = Callable[[str, "SnapshotTask", int], None]
BEGIN_SNAPSHOT = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
Xids = tuple[int, int, tuple[int, ...]]  # an MVCC snapshot: xmin, xmax, in-progress xids (64-bit)


def tid_block(tid: str) -> int:
    """The block number of a TID's text form `(block,offset)`."""
    return int(tid.strip("()").split(",", 1)[0])


def cursor_block(tid: str) -> int:
    """The first block that may hold rows after the TID `(block,offset)` (the next one after a whole block)."""
    block, offset = (int(x) for x in tid.strip("()").split(",", 1))
    return block + 1 if offset >= MAX_TID_OFFSET else block


def keyless_keys_sql(
    shape: TableShape, keys: Sequence[KeyValues], bind: Callable[[str], sql.Composable]
) -> sql.Composable:
    """The condition that selects a keyless table's rows by their record keys (every column).

    A column is compared by its output text (`format('%s', c)`, the text the stream and the pages
    encode under the same session settings) with the key's text: exact for every type, even one
    without an equality operator (json, point) or whose equality is looser than its text (numeric
    1.50 = 1.5, char padding). A NULL column is `is null`; a boolean's JSON true/false is its
    output 't'/'f'. An array's JSON does not give back its literal: that column is not compared,
    and the caller keeps the rows whose encoded key is one asked for. `bind` binds one text value.
    """
    alternatives = []
    for key in keys:
        parts: list[sql.Composable] = []
        for value, i, type_name in zip(key, shape.key_positions, shape.key_types, strict=True):
            column = sql.Identifier(shape.columns[i])
            if value is None:
                parts.append(sql.SQL("{} is null").format(column))
            elif not type_name.endswith("[]"):
                text = BOOL_TEXT.get(value, value) if type_name == "boolean" else value
                parts.append(sql.SQL("format('%s', {}) = {}").format(column, bind(text)))
        alternatives.append(sql.SQL("({})").format(sql.SQL(" and ").join(parts) if parts else sql.SQL("true")))
    return sql.SQL("({})").format(sql.SQL(" or ").join(alternatives))


def page_encoders(types: TypeCatalog, shape: TableShape, mask: TableMask | None, non_utf8: str) -> list[Encoder]:
    """The value encoders of a table's columns as a snapshot page encodes them, verify's source rows too.

    The source's `non_utf8` policy applies (a value that is not UTF-8 is an error naming its
    column, replaced or read as Latin-1), and masked columns are hashed. One helper for both: verify
    built its own without the policy, and failed on every value ingest had captured under it.
    """
    encoders = [non_utf8_tolerant(types.column_encoder(oid), non_utf8) for oid in shape.type_oids]
    if mask is not None and mask.mask:
        hashed = mask.encoder()
        encoders = [hashed if c in mask.mask else e for c, e in zip(shape.columns, encoders, strict=True)]
    return encoders


@dataclass(frozen=True, slots=True)
class PageRead:
    """The outcome of one page read, before it is written to bronze: its rows, or their columns (COPY pages)."""

    rows: list[SnapshotRow]
    xmin: int
    xmax: int
    xip: tuple[int, ...]
    read_at_us: int
    cut: bool = False  # the page's byte budget ended it: more rows follow, whatever their number
    after: tuple[str, ...] | None = None  # a CTID page's cursor: the next page reads the rows after this TID
    filenode: int | None = None  # the file a CTID page read (pg_relation_filenode)
    columns: PageColumns | None = None  # a COPY page's rows, as the compiled encoder built them (`rows` empty)

    @property
    def count(self) -> int:
        """How many rows the page read."""
        return self.columns.count if self.columns is not None else len(self.rows)

    @property
    def last_key(self) -> tuple[str, ...] | None:
        """The last row's key text (a keyset page's cursor), None if the page read no row."""
        if self.columns is not None:
            return self.columns.last_key if self.columns.count else None
        return self.rows[-1].key_text if self.rows else None


class PageReader:
    """Owns the snapshot connection of one source: reads keyset pages and commits watermarks."""

    def __init__(self, src: PostgresSource, hook: Hook | None = None) -> None:
        """Open a plain (non-replication) connection with the stream's value output settings."""
        self.src = src
        self.hook = hook
        self.conn = connect_value_session(src.name, src.dsn, "snapshot connection")
        # On a standby the pages are read there and their watermarks committed on the primary.
        self.standby = self._exec(IN_RECOVERY_SQL).get_value(0, 0) == b"t"
        self.primary = connect(src, primary=True) if self.standby else None

    def close(self) -> None:
        """Close the connections."""
        self.conn.finish()
        if self.primary is not None:
            self.primary.close()

    def _exec(self, query: bytes, params: Sequence[bytes | None] = ()) -> pq.abc.PGresult:
        return self._exec_result(self.conn.exec_params(query, list(params)) if params else self.conn.exec_(query))

    def _exec_result(self, res: pq.abc.PGresult) -> pq.abc.PGresult:
        """`res` if the statement succeeded; else the transaction rolled back and the error raised."""
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raw = res.error_message or self.conn.get_error_message()
            msg = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
            code = res.error_field(pq.DiagnosticField.SQLSTATE)
            lost = self.conn.status != pq.ConnStatus.OK
            if not lost and self.conn.transaction_status != pq.TransactionStatus.IDLE:
                self.conn.exec_(b"ROLLBACK")
            sqlstate = code.decode() if code else None
            if sqlstate in SHAPE_CHANGED_SQLSTATES:
                # The table changed shape between two pages (review finding W9): a retry resumes the
                # snapshot after its last durable page with the columns the table has now.
                raise SourceUnavailableError(
                    f"source {self.src.name!r}: the table changed shape during its snapshot ({msg}); the snapshot "
                    "resumes after its last durable page with the new columns"
                )
            transient = lost or transient_sqlstate(sqlstate) or transient_libpq_message(msg)
            error = SourceUnavailableError if transient else SourceError
            raise error(f"source {self.src.name!r}: snapshot query failed: {msg}")
        return res

    def _hook(self, point: str, task: SnapshotTask, page: int) -> None:
        if self.hook is not None:
            self.hook(point, task, page)

    def read_page(
        self,
        shape: TableShape,
        encoders: Sequence[Encoder],
        task: SnapshotTask,
        page: int,
        limit: int,
        max_bytes: int,
        compiled: Any = None,
    ) -> PageRead:
        """Read up to `limit` rows, and `max_bytes` of record JSON, after `task.after` in key order.

        In one REPEATABLE READ transaction. With `compiled` (native.row_encoder of these encoders)
        and the table's record width known from an earlier page, the rows come by COPY and are
        encoded by the compiled encoder (Python takes a buffer it refuses): same rows, same bytes.
        """
        keyless_keys = task.keys is not None and shape.keyless
        if keyless_keys:
            # One page holds every row of the keys asked for: a keyless key has no order to resume
            # a cut page after (a json column has no ordering operator, a NULL no place in one).
            limit = max_bytes = UNCUT
        # A keyless re-read keeps its rows by their encoded keys below: read as rows, through the cursor.
        copy = compiled is not None and task.record_chars is not None and not keyless_keys
        rows_limit = limit
        if copy and task.record_chars:
            # Sized so the page ends by its row count, not by a cut that reads rows to drop them.
            limit = min(limit, max(1, int(max_bytes / task.record_chars)))
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in shape.columns)
        keys = sql.SQL(", ").join(sql.Identifier(shape.columns[i]) for i in shape.key_positions)
        params: list[bytes | None] = []

        def bound(values: Sequence[str | None]) -> sql.Composable:
            # COPY takes no parameters: its key values are quoted literals. Otherwise libpq's own $n
            # markers, numbered as values are bound: psycopg's %s rendered and then replaced
            # textually also replaced a "%s" inside a quoted table or column name.
            marks = []
            for value, type_name in zip(values, shape.key_types, strict=True):
                if copy:
                    marks.append(sql.Literal(value) + sql.SQL("::") + sql.SQL(type_name))
                    continue
                params.append(None if value is None else value.encode())
                marks.append(sql.SQL(f"${len(params)}::") + sql.SQL(type_name))
            return sql.SQL(", ").join(marks)

        def text_bound(value: str) -> sql.Composable:
            if copy:
                return sql.Literal(value)
            params.append(value.encode())
            return sql.SQL(f"${len(params)}::text")

        conds: list[sql.Composable] = []
        if task.keys is not None and keyless_keys:
            conds.append(keyless_keys_sql(shape, task.keys, text_bound))
        elif task.keys is not None:  # a re-read of listed keys (DESIGN §6: unchanged TOAST with no image)
            tuples = sql.SQL(", ").join(sql.SQL("({})").format(bound(key)) for key in task.keys)
            conds.append(sql.SQL("({}) in ({})").format(keys, tuples))
        if task.after is not None:
            conds.append(sql.SQL("({}) > ({})").format(keys, bound(task.after)))
        if task.where is not None:
            conds.append(filter_sql(task.where))
        if task.bounded and task.until is None:
            conds.append(sql.SQL("false"))  # the table was empty when the snapshot started
        if task.until is not None:
            # Rows inserted above the starting maximum arrive by the stream: without this bound a
            # snapshot of a table under insert load could chase its tail forever.
            conds.append(sql.SQL("({}) <= ({})").format(keys, bound(task.until)))
        where: sql.Composable = sql.SQL(" where ") + sql.SQL(" and ").join(conds) if conds else sql.SQL("")
        query = sql.SQL("select {} from {}{} order by {} limit {}").format(
            cols, shape.scan, where, sql.SQL("ctid") if keyless_keys else keys, sql.Literal(limit)
        )
        text = query.as_string(None)
        xmin, xmax, xip, read_at_us = self._begin(task, page)
        rows: list[SnapshotRow] = []
        columns = None
        if copy:
            columns, cut = self._copy(text.encode(), shape, encoders, compiled, max_bytes)
            count, size = columns.count, columns.chars
            # A page its byte budget sized below the row limit has rows after it, as a cut one does.
            cut = cut or (limit < rows_limit and count == limit)
        else:
            rows, cut, size = self._fetch(text.encode(), params, shape, encoders, limit, max_bytes)
            if task.keys is not None and keyless_keys:
                # A key with an array matched its other columns only: keep the rows keyed exactly as asked.
                wanted = set(task.keys)
                rows = [r for r in rows if key_values(r.record_pk) in wanted]
                size = sum(len(r.record) for r in rows)
            count = len(rows)
        if count:
            task.record_chars = size / count
        self._check_types(shape)
        self._exec(b"COMMIT")
        self._hook("after_read", task, page)
        return PageRead(rows, xmin, xmax, xip, read_at_us, cut, columns=columns)

    def _begin(self, task: SnapshotTask, page: int) -> tuple[int, int, tuple[int, ...], int]:
        """Open the page's transaction and take its snapshot: (xmin, xmax, in-progress xids, read time in us)."""
        self._hook("before_read", task, page)

        def begin() -> None:
            self._exec(BEGIN_SNAPSHOT)
            self._hook("after_begin", task, page)

        xmin, xmax, xip = self._open_snapshot(begin)
        return xmin, xmax, xip, int(time.time() * 1_000_000)

    def _open_snapshot(self, begin: Callable[[], object]) -> Xids:
        """Open a REPEATABLE READ transaction with `begin` and take its snapshot: (xmin, xmax, in-progress xids)."""
        if self.standby:
            return read_standby_snapshot(self._exec, begin, lambda: self._exec(b"ROLLBACK"), self.src.name)
        begin()
        # The first statement takes the transaction's snapshot: what follows reads under exactly it.
        snap = self._exec(
            b"select pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, "
            b"array_to_string(array(select pg_snapshot_xip(s)), ',') from pg_current_snapshot() s"
        )
        xmin, xmax = int(snap.get_value(0, 0) or b"0"), int(snap.get_value(0, 1) or b"0")
        xip_text = (snap.get_value(0, 2) or b"").decode()
        return xmin, xmax, tuple(int(x) for x in xip_text.split(",") if x)

    def _read_bound(self, query: bytes, params: Sequence[bytes | None] = ()) -> tuple[pq.abc.PGresult, Xids]:
        """Run a snapshot's bound query in its own REPEATABLE READ READ ONLY transaction; its result and snapshot.

        The snapshot is taken before the query runs and before any page of the snapshot, so it is
        older than every page's: a whole-table snapshot's pages carry it (`table_snapshot`).
        """
        xids = self._open_snapshot(lambda: self._exec(BEGIN_SNAPSHOT))
        res = self._exec(query, params)
        self._exec(b"COMMIT")
        return res, xids

    def read_ctid_page(
        self, shape: TableShape, encoders: Sequence[Encoder], task: SnapshotTask, page: int, limit: int, max_bytes: int
    ) -> PageRead:
        """Read a keyless table's next rows in CTID order: up to `limit` rows and `max_bytes` of record JSON.

        In one REPEATABLE READ transaction, from the TID after `task.after` to the block bound the
        snapshot started with (`task.until`), one block range at a time (TID range scans, each
        range sorted alone) until the page is full or the bound is reached; an empty range doubles
        the next one, so holes left by deletes cost a few statements, not a page each. `filenode`
        is the table's file the rows were read from (a VACUUM FULL, CLUSTER or rewriting ALTER
        moves every row to new CTIDs: the caller restarts the snapshot). `cut` says rows follow.
        """
        end = int(task.until[0]) if task.until else 0
        span = max(1, task.span_blocks or 1)
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in shape.columns)
        after = task.after[0] if task.after else None
        xmin, xmax, xip, read_at_us = self._begin(task, page)
        rows: list[SnapshotRow] = []
        cut = False
        first = cursor_block(after) if after is not None else 0
        while first < end:
            hi = min(end, first + span)
            lower = sql.SQL("ctid > {}::tid and ").format(sql.Literal(after)) if after is not None else sql.SQL("")
            if task.where is not None:
                lower = lower + filter_sql(task.where) + sql.SQL(" and ")
            query = sql.SQL("select {}, ctid from {} where {}ctid < {}::tid order by ctid limit {}").format(
                cols, shape.scan, lower, sql.Literal(f"({hi},0)"), sql.Literal(limit - len(rows))
            )
            before = len(rows)
            text = query.as_string(None).encode()
            rows, cut, _ = self._fetch(text, (), shape, encoders, limit, max_bytes, rows, True)
            self._exec(b"CLOSE " + PAGE_CURSOR)
            if cut or len(rows) >= limit:
                after, cut = rows[-1].key_text[0], True
                # The next page's first range: as many blocks as `limit` rows took in this range.
                per_block = max(1, len(rows) - before) / (tid_block(after) - first + 1)
                task.span_blocks = max(1, int(limit / per_block))
                break
            after, first = f"({hi - 1},{MAX_TID_OFFSET})", hi  # the whole range is read
            span *= 2
        self._check_types(shape)
        filenode = self._filenode(shape)  # under the read's lock: no rewrite since the read
        self._exec(b"COMMIT")
        self._hook("after_read", task, page)
        cursor = (after,) if after is not None else task.after
        return PageRead(rows, xmin, xmax, xip, read_at_us, cut, cursor, filenode)

    def _filenode(self, shape: TableShape) -> int:
        ident = sql.Identifier(shape.schema, shape.name).as_string(None)
        res = self._exec(b"select pg_relation_filenode($1::regclass)::bigint", [ident.encode()])
        return int(res.get_value(0, 0) or b"0")

    def ctid_bounds(self, shape: TableShape) -> tuple[int, int, int, Xids]:
        """A keyless table's block count now (its rows' CTIDs are below it), file, rows per block, and snapshot.

        Rows appended past the block count arrive by the stream, as rows above a keyset
        snapshot's largest key do. Rows per block from the planner's statistics (1 if none). Read
        in a REPEATABLE READ transaction whose snapshot (`_read_bound`) is returned with them.
        """
        ident = sql.Identifier(shape.schema, shape.name).as_string(None)
        res, xids = self._read_bound(
            b"select pg_relation_size(c.oid) / current_setting('block_size')::bigint, "
            b"pg_relation_filenode(c.oid)::bigint, "
            b"case when c.relpages > 0 and c.reltuples > 0 then c.reltuples / c.relpages else 1 end "
            b"from pg_class c where c.oid = $1::regclass",
            [ident.encode()],
        )
        return (
            int(res.get_value(0, 0) or b"0"),
            int(res.get_value(0, 1) or b"0"),
            int(float(res.get_value(0, 2) or b"1")),
            xids,
        )

    def _fetch(
        self,
        query: bytes,
        params: Sequence[bytes | None],
        shape: TableShape,
        encoders: Sequence[Encoder],
        limit: int,
        max_bytes: int,
        rows: list[SnapshotRow] | None = None,
        tid: bool = False,
    ) -> tuple[list[SnapshotRow], bool, int]:
        """The page's rows, read through a cursor until `limit` rows or `max_bytes` of record JSON.

        One result of `limit` wide rows would hold them all at once (10k rows of 1 MB: 10 GB), so
        the rows come in fetches sized from the rows seen so far, and the page ends before the row
        that would take it past `max_bytes` (a first row wider than that is a page alone). Returns
        the rows, whether the byte budget ended the page (then more rows follow) and their record JSON length.

        `rows`: the page's rows so far, which the new ones follow (and count in both limits). With
        `tid`, the query selects `ctid` after the columns: it is the row's `key_text` (CTID pages).
        """
        self._exec(b"DECLARE " + PAGE_CURSOR + b" NO SCROLL CURSOR FOR " + query, params)
        table = f"{shape.schema}.{shape.name}"
        keys_json = json_keys(shape.columns)
        width = range(len(shape.columns))
        rows = [] if rows is None else rows
        size = sum(len(r.record) for r in rows)
        want = min(1, limit - len(rows))
        while want > 0:
            res = self._exec(b"FETCH FORWARD %d FROM %s" % (want, PAGE_CURSOR))
            for r in range(res.ntuples):
                values = [None if (v := res.get_value(r, c)) is None else bytes(v) for c in width]
                record, _ = encode_record(table, keys_json, encoders, shape.columns, values)
                if rows and size + len(record) > max_bytes:
                    return rows, True, size
                record_pk = encode_key(table, keys_json, encoders, shape.key_positions, values)
                if tid:
                    key_text: tuple[str, ...] = (bytes(res.get_value(r, len(width)) or b"").decode(),)
                else:
                    key_text = tuple((values[i] or b"").decode() for i in shape.key_positions)
                rows.append(SnapshotRow(record_pk, record, key_text))
                size += len(record)
            if res.ntuples < want:
                break
            # As many rows as the budget has room for at the average width so far, growing by at
            # most FETCH_GROWTH at a time (a narrow first row says little about the next ones).
            room = max(1, (max_bytes - size) * len(rows) // max(size, 1))
            want = min(limit - len(rows), room, FETCH_GROWTH * len(rows))
        return rows, False, size

    def _copy(
        self, query: bytes, shape: TableShape, encoders: Sequence[Encoder], compiled: Any, max_bytes: int
    ) -> tuple[PageColumns, bool]:
        """The page's rows by `COPY (query) TO STDOUT`, as columns.

        The compiled code receives the COPY from libpq and appends its rows to the page's Arrow
        buffers (native/, `_copy_native`); where libpq's functions are not found, Python receives
        the lines and hands them to the compiled encoder COPY_CHUNK_ROWS at a time
        (`_copy_lines`). Either way lines it refuses are encoded in Python (copy_text.py), which
        raises the error a user sees, and those rows are appended instead. The page ends before
        the row that would take it past `max_bytes`, as a cursor-read page does; the COPY's later
        lines are then read and dropped (the page's limit was sized from the table's width, so
        few are). Returns the page's columns and whether the byte budget ended it.
        """
        res = self.conn.exec_(b"COPY (" + query + b") TO STDOUT")
        if res.status != pq.ExecStatus.COPY_OUT:
            self._exec_result(res)
        page = compiled.page()
        functions = native.copy_functions()
        if functions is None:
            cut = self._copy_lines(shape, encoders, compiled, page, max_bytes)
        else:
            cut = self._copy_native(shape, encoders, compiled, page, functions, max_bytes)
        while (end := self.conn.get_result()) is not None:
            self._exec_result(end)
        count, chars, pk_offsets, pk, offsets, record, key_lists, key_offsets, keys, last = compiled.buffers(page)
        pk_column, record_column, key_column = (pk_offsets, pk), (offsets, record), (key_offsets, keys)
        return PageColumns(count, chars, pk_column, record_column, key_lists, key_column, tuple(last)), cut

    def _copy_native(
        self,
        shape: TableShape,
        encoders: Sequence[Encoder],
        compiled: Any,
        page: Any,
        functions: native.CopyFunctions,
        max_bytes: int,
    ) -> bool:
        """Receive the COPY in the compiled code (no Python per line) until its end; whether the budget cut the page.

        The compiled loop returns with lines it refused (at most COPY_CHUNK_ROWS or
        COPY_CHUNK_BYTES from the first): they are encoded here and the loop goes on after them.
        When libpq fails to read the COPY, psycopg's own error for it is raised.
        """
        table = f"{shape.schema}.{shape.name}"
        cut = False
        while True:
            try:
                status, cut, refused = native.read_copy(
                    page, self.conn, functions, max_bytes, cut, (COPY_CHUNK_ROWS, COPY_CHUNK_BYTES), table
                )
            except ValueError as e:
                # The COPY stopped at an unknown line: nothing of this page can be trusted.
                self._abandon_copy()
                raise SourceError(f"source {self.src.name!r}: snapshot page of {table} failed: {e}") from None
            if status == native.COPY_FAILED:  # psycopg's error, raised where get_copy_data raised it
                raise psycopg.OperationalError(f"receiving copy data failed: {self.conn.get_error_message()}")
            if refused is not None:
                cut = self._push_python(shape, encoders, compiled, page, refused, max_bytes)
            if status == native.COPY_END:
                return cut

    def _copy_lines(
        self, shape: TableShape, encoders: Sequence[Encoder], compiled: Any, page: Any, max_bytes: int
    ) -> bool:
        """Receive the COPY in Python, a line per call, encoded COPY_CHUNK_ROWS lines at a time; whether it was cut."""
        lines: list[memoryview | bytes] = []
        buffered = 0
        cut = False
        while True:
            n, data = self.conn.get_copy_data(0)
            if n >= 0 and not cut:
                lines.append(data)  # a view of libpq's buffer, freed with it: joined below, not copied first
                buffered += n
            if lines and (n < 0 or len(lines) >= COPY_CHUNK_ROWS or buffered >= COPY_CHUNK_BYTES):
                buf = b"".join(lines)
                lines, buffered = [], 0
                try:
                    cut = compiled.copy_into(page, buf, max_bytes)
                except ValueError:
                    cut = self._push_python(shape, encoders, compiled, page, buf, max_bytes)
            if n < 0:
                return cut

    @staticmethod
    def _push_python(
        shape: TableShape, encoders: Sequence[Encoder], compiled: Any, page: Any, buf: bytes, max_bytes: int
    ) -> bool:
        """Encode whole COPY lines the compiled encoder refused in Python, onto `page`; whether its budget cut it."""
        table = f"{shape.schema}.{shape.name}"
        got = copy_text.page_rows(table, json_keys(shape.columns), encoders, shape.columns, shape.key_positions, buf)
        return bool(compiled.push_rows(page, [(r.record_pk, r.record, r.key_text) for r in got], max_bytes))

    def _abandon_copy(self) -> None:
        """Read and drop the rest of a COPY, then its results, and roll the page's transaction back."""
        try:
            while self.conn.get_copy_data(0)[0] >= 0:
                pass
            while self.conn.get_result() is not None:
                pass
        finally:
            if self.conn.status == pq.ConnStatus.OK and self.conn.transaction_status != pq.TransactionStatus.IDLE:
                self.conn.exec_(b"ROLLBACK")

    def _check_types(self, shape: TableShape) -> None:
        """Fail the page (transiently) if a column's type is not the one its encoder was made for.

        Asked inside the page's transaction, after its read: the read's lock keeps the table's
        columns as they were read until COMMIT. A retyped column (ALTER COLUMN ... TYPE between
        two pages) still reads, but its values went through the old type's encoder: int -> text
        gave invalid JSON (review finding W9). The retry resumes after the last durable page with
        the table's new shape, as a dropped column does.
        """
        ident = sql.Identifier(shape.schema, shape.name).as_string(None)
        res = self._exec(
            b"select attname, atttypid::bigint::text from pg_attribute "
            b"where attrelid = $1::regclass and attnum > 0 and not attisdropped",
            [ident.encode()],
        )
        now = {bytes(res.get_value(r, 0) or b"").decode(): int(res.get_value(r, 1) or b"0") for r in range(res.ntuples)}
        changed = [c for c, oid in zip(shape.columns, shape.type_oids, strict=True) if now.get(c) != oid]
        if changed:
            self._exec(b"ROLLBACK")
            raise SourceUnavailableError(
                f"source {self.src.name!r}: the table changed shape during its snapshot (column "
                f"{', '.join(changed)} of {shape.schema}.{shape.name} changed type); the snapshot resumes after "
                "its last durable page with the new columns"
            )

    def max_key(self, shape: TableShape, where: str | None = None) -> tuple[tuple[str, ...] | None, Xids]:
        """The table's largest key now (as key text), of the rows `where` selects (None if there is none).

        Read in a REPEATABLE READ READ ONLY transaction (a filter's predicate never runs where it
        could write), whose snapshot (`_read_bound`) is returned with the key.
        """
        keys = [sql.Identifier(shape.columns[i]) for i in shape.key_positions]
        query = sql.SQL("select {} from {}{} order by {} limit 1").format(
            sql.SQL(", ").join(keys),
            shape.scan,
            sql.SQL(" where ") + filter_sql(where) if where is not None else sql.SQL(""),
            sql.SQL(", ").join(sql.SQL("{} desc").format(k) for k in keys),
        )
        res, xids = self._read_bound(query.as_string(None).encode())
        return self._first_key(res, len(keys)), xids

    @staticmethod
    def _first_key(res: pq.abc.PGresult, width: int) -> tuple[str, ...] | None:
        if res.ntuples == 0:
            return None
        return tuple(bytes(res.get_value(0, i) or b"").decode() for i in range(width))

    def filter_problem(self, shape: TableShape, where: str) -> str | None:
        """What the server says is wrong with `where` as a filter of the table, or None.

        `select 1 from <table> where (<predicate>) limit 1` in a READ ONLY transaction that is
        rolled back: the server parses and plans it (syntax, columns, types, a boolean result) and
        runs it on rows until one matches, so a function a page could not run (one that writes,
        in a read-only transaction) fails here. Still running after FILTER_CHECK_TIMEOUT_MS (a
        selective predicate on a large table) it is accepted: it ran without error so far.
        """
        query = sql.SQL("select 1 from {} where {} limit 1").format(shape.scan, filter_sql(where))
        self._exec(BEGIN_SNAPSHOT)
        self._exec(b"SET LOCAL statement_timeout = %d" % FILTER_CHECK_TIMEOUT_MS)
        res = self.conn.exec_(query.as_string(None).encode())
        code = res.error_field(pq.DiagnosticField.SQLSTATE)
        ok = res.status == pq.ExecStatus.TUPLES_OK or code == QUERY_CANCELED
        primary = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
        if self.conn.status != pq.ConnStatus.OK:
            self._exec_result(res)  # the connection was lost, not the predicate refused: raised as such
        self._exec(b"ROLLBACK")
        if ok:
            return None
        return (primary or b"the server refused it").decode(errors="replace")

    def split_keys(self, shape: TableShape, parts: int, estimated_rows: int) -> list[tuple[str, ...]]:
        """Up to `parts - 1` keys that cut the table into ranges of about equal rows, ascending.

        From a block sample of about SPLIT_SAMPLE_ROWS rows (`tablesample system`: reads only the
        sampled pages); a sample too small to cut gives fewer keys, or none.
        """
        keys = [sql.Identifier(shape.columns[i]) for i in shape.key_positions]
        pct = min(100.0, 100.0 * SPLIT_SAMPLE_ROWS / max(estimated_rows, 1))
        query = sql.SQL("select {} from {} tablesample system ({}) order by {}").format(
            sql.SQL(", ").join(keys), shape.scan, sql.Literal(pct), sql.SQL(", ").join(keys)
        )
        res = self._exec(query.as_string(None).encode())
        sample = [
            tuple(bytes(res.get_value(r, i) or b"").decode() for i in range(len(keys))) for r in range(res.ntuples)
        ]
        cuts = [sample[len(sample) * i // parts] for i in range(1, parts)] if len(sample) >= parts * 2 else []
        return list(dict.fromkeys(cuts))

    def watermark(self, task: SnapshotTask, page: int) -> int:
        """Commit the page's high watermark (a transactional logical message); returns its LSN."""
        content = f"{task.table}:{task.snapshot_id}:{page}".encode()
        if self.primary is not None:
            self._ensure_still_standby()
            # Committed after the page's snapshot was taken on the standby, so after every commit it
            # saw: the standby had replayed those from this same WAL (docs/postgres.md).
            row = self.primary.execute(
                "select pg_logical_emit_message(true, %s, %s)::text", (WATERMARK_PREFIX, content.decode())
            ).fetchone()
            return lsn_to_int(str(row[0]) if row else "")
        res = self._exec(b"select pg_logical_emit_message(true, $1, $2)::text", [WATERMARK_PREFIX.encode(), content])
        return lsn_to_int((res.get_value(0, 0) or b"").decode())

    def current_lsn(self) -> int:
        """The server's current WAL insert position (no later watermark can be at or below it).

        The primary's for a standby source: its watermarks are written there.
        """
        if self.primary is not None:
            self._ensure_still_standby()
            row = self.primary.execute("select pg_current_wal_insert_lsn()::text").fetchone()
            return lsn_to_int(str(row[0]) if row else "")
        res = self._exec(b"select pg_current_wal_insert_lsn()::text")
        return lsn_to_int((res.get_value(0, 0) or b"").decode())

    def _ensure_still_standby(self) -> None:
        """StandbyPromotedError once the standby has left recovery: no watermark goes to the old primary."""
        if self._exec(IN_RECOVERY_SQL).get_value(0, 0) != b"t":
            raise promoted_error(self.src)
