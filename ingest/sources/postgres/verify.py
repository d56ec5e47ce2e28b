"""`verify` for Postgres: read tables inside one REPEATABLE READ snapshot and place it (docs/verify.md).

The snapshot's position P: `pg_current_wal_insert_lsn()` read in the transaction's first
statement, after its snapshot is taken, is above the commit record of every transaction the
snapshot sees; a transaction committing above it is invisible. Below it, a transaction can still be
invisible (in progress when the snapshot was taken, i.e. in its xip or at/after its xmax, as the
snapshot pages of DESIGN §5 reason): bronze gives those transactions' commit positions (events
carry the xid), and P is lowered to just below the first of them. Every transaction at or below P
is then visible, and every one above the insert position is not; keys changed in between are
skipped by the comparison (their silver record is newer than P).

Rows are encoded exactly as a snapshot page encodes them (rows.py, the page's column list and
masking): the record JSON on both sides is ingest's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

from psycopg import pq, sql

from ingest.bronze.schemas import WAL_EVENTS_TABLE
from ingest.bronze.state import sql_str
from ingest.bronze.writer import BronzeWriter
from ingest.capture.retry import transient_libpq_message, transient_sqlstate
from ingest.config import PostgresSource
from ingest.errors import SourceError, SourceUnavailableError
from ingest.events import lsn_to_int
from ingest.positions import SourcePositions
from ingest.sources.postgres import native
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.catalog import captured_shape, table_shape
from ingest.sources.postgres.copy_text import copy_values
from ingest.sources.postgres.pages import page_encoders
from ingest.sources.postgres.replication import connect_value_session
from ingest.sources.postgres.rows import encode_key, encode_record, json_keys
from ingest.sources.postgres.standby import read_standby_snapshot
from ingest.sources.postgres.values import TYPE_CATALOG_SQL, Encoder, TypeCatalog
from ingest.verify import (
    Progress,
    Row,
    Rows,
    Silver,
    TableResult,
    changed_keys,
    compare,
    in_column_order,
    silver_path,
    wait_for_bronze,
)

log = logging.getLogger(__name__)

FETCH_ROWS = 5000
VERIFY_MESSAGE_PREFIX = "changelake.verify"


def xid_visible(xid32: int, xmin: int, xmax: int, xip: frozenset[int]) -> bool:
    """Whether pgoutput's 32-bit `xid` is visible to a snapshot given in 64-bit xids (macro pg_xid_visible)."""
    distance = (xmax - xid32) % (1 << 32)
    full = xmax - (distance - (1 << 32) if distance > (1 << 31) else distance)
    return full < xmin or (full < xmax and full not in xip)


class VerifySnapshot:
    """Owns the verify connection: one REPEATABLE READ READ ONLY transaction and its cursors."""

    def __init__(self, src: PostgresSource) -> None:
        """Connect with the stream's value output settings (values byte for byte as ingest's)."""
        self.src = src
        self.conn = connect_value_session(src.name, src.dsn, "verify connection")
        self.before = self.insert_lsn = self.xmin = self.xmax = 0
        self.xip: frozenset[int] = frozenset()
        self._cursors = 0

    def close(self) -> None:
        """End the transaction and close the connection."""
        self.conn.finish()

    def _exec(self, query: bytes, copy: bool = False) -> pq.abc.PGresult:
        res = self.conn.exec_(query)
        ok = (pq.ExecStatus.COPY_OUT,) if copy else (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
        if res.status not in ok:
            raw = res.error_message or self.conn.get_error_message()
            msg = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
            code = res.error_field(pq.DiagnosticField.SQLSTATE)
            lost = self.conn.status != pq.ConnStatus.OK
            transient = lost or transient_sqlstate(code.decode() if code else None) or transient_libpq_message(msg)
            error = SourceUnavailableError if transient else SourceError
            raise error(f"source {self.src.name!r}: verify query failed: {msg}")
        return res

    def _end_copy(self) -> None:
        """Take the COPY's closing result (an error if the server stopped it)."""
        while (res := self.conn.get_result()) is not None:
            if res.status != pq.ExecStatus.COMMAND_OK:
                raw = res.error_message or self.conn.get_error_message()
                msg = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
                error = SourceUnavailableError if self.conn.status != pq.ConnStatus.OK else SourceError
                raise error(f"source {self.src.name!r}: verify query failed: {msg}")

    def begin(self) -> None:
        """Start the transaction and take its snapshot: xmin, xmax, xip and the insert position after it.

        On a standby the positions are its replay positions (every commit the snapshot sees was
        replayed before it, every later one after) and the in-progress list is the standby's own
        (read_standby_snapshot: pg_current_snapshot() there lists none).
        """
        if self._exec(b"select pg_is_in_recovery()").get_value(0, 0) == b"t":
            replayed = b"select pg_last_wal_replay_lsn()::text"
            self.before = lsn_to_int((self._exec(replayed).get_value(0, 0) or b"").decode())
            self.xmin, self.xmax, xip = read_standby_snapshot(
                self._exec,
                lambda: self._exec(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
                lambda: self._exec(b"ROLLBACK"),
                self.src.name,
            )
            self.xip = frozenset(xip)
            self.insert_lsn = lsn_to_int((self._exec(replayed).get_value(0, 0) or b"").decode())
            return
        self.before = lsn_to_int(
            (self._exec(b"select pg_current_wal_insert_lsn()::text").get_value(0, 0) or b"").decode()
        )
        self._exec(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        snap = self._exec(
            b"select pg_current_wal_insert_lsn()::text, pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text, "
            b"array_to_string(array(select pg_snapshot_xip(s)), ',') from pg_current_snapshot() s"
        )
        self.insert_lsn = lsn_to_int((snap.get_value(0, 0) or b"").decode())
        self.xmin, self.xmax = int(snap.get_value(0, 1) or b"0"), int(snap.get_value(0, 2) or b"0")
        self.xip = frozenset(int(x) for x in (snap.get_value(0, 3) or b"").decode().split(",") if x)

    def count(self, scan: sql.Composable) -> int:
        """The table's rows in the snapshot (sizes the checksum ranges)."""
        res = self._exec(sql.SQL("select count(*) from {}").format(scan).as_string(None).encode())
        return int(res.get_value(0, 0) or b"0")

    def rows(
        self,
        table: str,
        columns: Sequence[str],
        key_positions: Sequence[int],
        scan: sql.Composable,
        encoders: Sequence[Encoder],
    ) -> Rows:
        """A pass over the table in the snapshot (a cursor, FETCH_ROWS at a time), rows as (record_pk, record)."""
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        select = sql.SQL("select {} from {}").format(cols, scan).as_string(None).encode()
        keys_json = json_keys(columns)
        width = range(len(columns))

        compiled = native.row_encoder(encoders, keys_json, columns, key_positions, table)

        def python_row(values: list[bytes | None]) -> Row:
            record, _ = encode_record(table, keys_json, encoders, columns, values)
            return encode_key(table, keys_json, encoders, key_positions, values), record

        def python_rows(lines: bytes) -> list[Row]:
            # The path that names a value that does not map (encode_record raises, as for a page).
            return [python_row(values) for values in copy_values(lines)]

        def copy_rows() -> Iterator[list[Row]]:
            # COPY's text rows, encoded by the compiled decoder FETCH_ROWS at a time: a fifth of
            # the per-cell reads and Python encoding the cursor path spends (bench/verify.py).
            self._exec(b"copy (" + select + b") to stdout", copy=True)
            lines: list[bytes] = []
            while True:
                n, data = self.conn.get_copy_data(0)
                if n >= 0:
                    lines.append(bytes(data))
                if lines and (n < 0 or len(lines) == FETCH_ROWS):
                    buf = b"".join(lines)
                    lines = []
                    try:
                        yield compiled.copy_rows_of(buf)
                    except ValueError:
                        yield python_rows(buf)
                if n < 0:
                    break
            self._end_copy()

        def scan_rows() -> Iterator[list[Row]]:
            self._cursors += 1
            name = f"changelake_verify_{self._cursors}".encode()
            self._exec(b"declare " + name + b" no scroll cursor for " + select)
            fetch = b"fetch forward " + str(FETCH_ROWS).encode() + b" from " + name
            while True:
                res = self._exec(fetch)
                if res.ntuples == 0:
                    break
                batch = []
                for r in range(res.ntuples):
                    values = [None if (v := res.get_value(r, c)) is None else bytes(v) for c in width]
                    batch.append(python_row(values))
                yield batch
            self._exec(b"close " + name)

        return copy_rows if compiled is not None else scan_rows


def invisible_commits(writer: BronzeWriter, source: str, snap: VerifySnapshot) -> list[int]:
    """Commit positions at or below the snapshot's insert position of transactions it does not see.

    Such a transaction was in progress when the snapshot was taken: its xid is in xip (it may have
    written its commit record before, even long before if it waited for a synchronous standby) or
    at/after xmax (it began after the snapshot, so committed after `snap.before`).
    """
    xip32 = ", ".join(str(x % (1 << 32)) for x in sorted(snap.xip))
    candidates = f"commit_lsn > {snap.before}" + (f" or xid in ({xip32})" if xip32 else "")
    rows = writer.tables.query(
        f"select distinct commit_lsn, xid from t where source = {sql_str(source)} and action != 'message' "
        f"and commit_lsn <= {snap.insert_lsn} and ({candidates})",
        t=writer.path(WAL_EVENTS_TABLE),
    ).to_pylist()
    return sorted(int(r["commit_lsn"]) for r in rows if not xid_visible(int(r["xid"]), snap.xmin, snap.xmax, snap.xip))


def verify_tables(
    src: PostgresSource,
    writer: BronzeWriter,
    tables: Sequence[str],
    wait_s: float,
    range_rows: int,
    max_keys: int,
    show_progress: bool,
    run_id: str,
) -> list[TableResult]:
    """Compare each of `tables` with silver at one snapshot of the source; one result per table."""
    results = [TableResult(src.name, t) for t in tables]
    path = silver_path(writer, src.snapshot.reread_from)
    if not writer.exists(WAL_EVENTS_TABLE):
        return [r.not_verified("bronze does not exist yet: run `changelake-ingest run` first") for r in results]
    if not writer.tables.exists(path):
        return [r.not_verified(f"no silver consumer_records at {path}: run `dbt build` first") for r in results]
    masks = src.masks()
    admin = PostgresAdmin(src)
    snap = VerifySnapshot(src)
    try:
        types = TypeCatalog.from_rows(admin.type_catalog_rows(TYPE_CATALOG_SQL))
        snap.begin()
        # A committed message after the snapshot: the stream's position passes it promptly even
        # when the source is otherwise idle (an idle stream raises its position every 10 s).
        admin.emit_message(VERIFY_MESSAGE_PREFIX, run_id)
        bound = wait_for_bronze(writer, src.name, snap.insert_lsn, wait_s)
        if bound is None or bound < snap.insert_lsn:
            at = "no writer position" if bound is None else f"its safe bound {bound}"
            reason = (
                f"bronze has not reached the snapshot's position {snap.insert_lsn} within {wait_s:g} s ({at}): "
                "is `changelake-ingest run` running, or a snapshot holding the bound back?"
            )
            return [r.not_verified(reason) for r in results]
        silver = Silver(path, writer.tables.storage_options)
        silver_pos = silver.position(src.name)
        if silver_pos is None:
            return [
                r.not_verified(f"silver holds no records of source {src.name} yet: run `dbt build`") for r in results
            ]
        invisible = invisible_commits(writer, src.name, snap)
        position = invisible[0] - 1 if invisible else snap.insert_lsn
        running = {s.table for s in SourcePositions.read(writer, src.name).snapshots}
        for r in results:
            r.position, r.silver_position = position, silver_pos
            if r.table in running:
                r.not_verified("a snapshot of the table is running: verify after it completes")
                continue
            t0 = time.monotonic()
            changed = changed_keys(writer, src.name, r.table, silver_pos, snap.insert_lsn)
            if changed.truncated:
                r.not_verified("the table was truncated after silver's position: verify after the next dbt run")
                continue
            schema, name = r.table.split(".", 1)
            mask = masks.table(r.table)
            try:
                shape = captured_shape(table_shape(admin, r.table), mask, src.name)
            except SourceError as e:  # no primary key to read it by, or gone: the other tables go on
                r.not_verified(str(e))
                continue
            skip = changed.keys | silver.unusable_keys(src.name, schema, name, position)
            r.skipped_keys = len(skip)
            r.reread_keys = len(silver.reread_keys(src.name, schema, name))
            encoders = page_encoders(types, shape, mask, src.non_utf8)
            source_rows = snap.rows(r.table, shape.columns, shape.key_positions, shape.scan, encoders)
            compare(
                r,
                source_rows,
                in_column_order(silver.rows(src.name, schema, name), shape.columns),
                snap.count(shape.scan),
                skip,
                range_rows=range_rows,
                max_keys=max_keys,
                progress=Progress(f"{src.name}: {r.table}", enabled=show_progress),
            )
            r.seconds = time.monotonic() - t0
            log.info("verified source=%s table=%s status=%s seconds=%.1f", src.name, r.table, r.status, r.seconds)
        return results
    finally:
        snap.close()
        admin.close()
