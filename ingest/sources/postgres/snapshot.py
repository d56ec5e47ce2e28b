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

Reading a page is `pages.py`'s, the table's shape `catalog.py`'s, the keys silver asks to
re-read `rereads.py`'s; this module registers, runs, resumes and retires the snapshots.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from psycopg import sql

from ingest import faults
from ingest.bronze.writer import BronzeWriter
from ingest.config import PostgresSource
from ingest.errors import SourceError, SourceUnavailableError
from ingest.events import SnapshotPage, SourceKind, TableSnapshot, WriterKind, WriterPosition
from ingest.positions import (
    FILTERED_SNAPSHOT_PREFIX,
    KeyValues,
    SnapshotProgress,
    SourcePositions,
    snapshot_writer_id,
)
from ingest.progress import Progress
from ingest.sources.postgres import native
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.catalog import TableShape, captured_shape, estimate_rows, table_shape
from ingest.sources.postgres.filters import predicate_problem
from ingest.sources.postgres.followed import bronze_recorded_columns, follow_renames
from ingest.sources.postgres.pages import MAX_TID_OFFSET, Hook, PageReader, Xids, page_encoders
from ingest.sources.postgres.rereads import RereadKeys
from ingest.sources.postgres.rows import json_keys
from ingest.sources.postgres.values import TYPE_CATALOG_SQL, TypeCatalog

log = logging.getLogger(__name__)

REQUEST_POLL_S = 5.0
REREAD_POLL_S = 60.0  # how often a continuous run looks in silver for keys to re-read
REPLICA_IDENTITY_FULL = "f"  # pg_class.relreplident
RELKIND_PARTITIONED = "p"  # pg_class.relkind
POSITION_INTERVAL_S = 2.0  # a running snapshot raises its writer row at most this often (and at its end)
CONTROL_POLL_S = 0.25  # how often a run with snapshots to do reads `snapshot pause|resume` (snapshot_control)


class SnapshotStopped(Exception):
    """Tells the snapshot threads of a `run` that is ending to stop after their current page."""


def block_cuts(blocks: int, parts: int) -> list[int]:
    """The first blocks of ranges 2..n when `blocks` blocks are cut into up to `parts` equal spans.

    Ascending, without 0 or repeats: a table of fewer blocks than `parts` gets fewer ranges, one
    of a single block (or none) is not cut.
    """
    return sorted({blocks * i // parts for i in range(1, parts)} - {0})


def range_start(block: int) -> tuple[str, ...]:
    """A CTID range's lower bound (exclusive) that starts it at `block`: after every row of the block before."""
    return (f"({block - 1},{MAX_TID_OFFSET})",)


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
    keys: tuple[KeyValues, ...] | None = None  # a re-read of these keys only (one page)
    record_chars: float | None = None  # the last page's mean record JSON length (sizes COPY pages)
    start: tuple[str, ...] | None = None  # a key range's lower bound (exclusive): a part of a split table
    claimed: bool = False  # a thread of this process runs (or ran) it: it may have a page not yet durable
    # A keyless table paged by CTID: `after` is a TID, `until` the block count at the start, and
    # this the table's file then (a rewrite moves every row: the snapshot starts over).
    relfilenode: int | None = None
    span_blocks: int | None = None  # blocks a CTID page reads first (from the rows per block seen)
    paused: bool = False  # `snapshot pause`, as last read from its writer row: no page is started
    where: str | None = None  # a filtered snapshot: only the rows this predicate selects
    # Reads the whole table (no `keys`, no `where`): its pages carry `table_snapshot`, decided when
    # the bound is read (SnapshotProgress). Cleared for good when the table gains or loses its key.
    whole: bool = False
    table_snapshot: TableSnapshot | None = None

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
            self.start,
            self.relfilenode,
            self.paused,
            self.where,
            self.whole,
            self.table_snapshot,
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
            after=p.start,
            until=p.until,
            bounded=p.bounded,
            keys=p.keys,
            start=p.start,
            relfilenode=p.relfilenode,
            paused=p.paused,
            where=p.where,
            whole=p.whole,
            table_snapshot=p.table_snapshot,
        )


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
        self._rereads = RereadKeys(src, writer)
        self.masks = src.masks()  # excluded columns are never read, masked ones masked before a page is built
        self.max_parallel = src.snapshot.max_parallel
        self._lock = threading.Lock()  # the task list and writer rows, shared by the snapshot threads
        self._control_version: int | None = None  # the snapshot_control version the pauses were read at
        # Writers a start-over replaced: a `load` that read their rows before they were removed
        # must not take them up again (each would start the table over once more).
        self._replaced: set[str] = set()

    # -- registration ----------------------------------------------------------------------
    def load(self, positions: SourcePositions | None = None) -> list[SnapshotTask]:
        """Pick up the source's snapshot writers from bronze (unfinished or requested ones).

        `positions`: the writer rows as the caller read them (a run reads them once at its start);
        None reads them now. Rows from the start are as good as fresh ones until the snapshot
        threads run: nothing else changes them meanwhile (this process adds its own writers to
        `tasks` as it registers them; a `snapshot` command's later request is found by the next
        load, a pause by the thread's check before each page).
        """
        read = positions.rows if positions is not None else self.writer.positions(self.src.name)
        rows = [pos for pos, _ in read if pos.writer_kind is WriterKind.SNAPSHOT]
        with self._lock:  # a snapshot thread may have retired one of these rows since they were read
            known = {t.writer_id for t in [*self.tasks, *self.completed]} | self._replaced
            self.tasks.extend(
                SnapshotTask.from_position(p, datetime.now(UTC)) for p in rows if p.writer_id not in known
            )
        return self.tasks

    def _start_lsn(self, current_lsn: Callable[[], int]) -> int:
        bound = SourcePositions.read(self.writer, self.src.name).safe_bound
        # DESIGN §4: a new writer starts at the safe bound (the server's position for the first writer)
        return bound if bound is not None else current_lsn()

    def request(
        self,
        tables: Sequence[str],
        current_lsn: Callable[[], int],
        keys: Sequence[tuple[KeyValues, ...] | None] | None = None,
        where: str | None = None,
    ) -> list[SnapshotTask]:
        """Register one snapshot writer per table (one Delta commit); they run in request order.

        With `keys`, the i-th task re-reads only those keys of the i-th table. With `where` (a
        predicate `check_filter` accepted), each reads only the rows it selects.
        """
        if not tables:
            return []
        start = self._start_lsn(current_lsn)
        now = datetime.now(UTC)
        prefix = FILTERED_SNAPSHOT_PREFIX if where is not None else ""
        new = []
        for i, table in enumerate(tables):
            listed = keys[i] if keys is not None else None
            whole = listed is None and where is None  # its pages carry the table snapshot (`table_snapshot`)
            sid = prefix + uuid.uuid4().hex
            new.append(SnapshotTask(table, sid, now, start, keys=listed, where=where, whole=whole))
        self.writer.raise_positions([(t.position(self.src.name), t.started_at) for t in new])
        with self._lock:
            self.tasks.extend(new)
        for t in new:
            log.info("snapshot requested source=%s table=%s snapshot_id=%s", self.src.name, t.table, t.snapshot_id)
        return new

    def request_initial(
        self, current_lsn: Callable[[], int], positions: SourcePositions | None = None
    ) -> list[SnapshotTask]:
        """Request a snapshot of every configured table that never completed one and has none running.

        `positions` as for `load`; a new writer's start is read afresh (the safe bound must be now's).
        """
        done = self.writer.completed_snapshots(self.src.name)
        running = {t.table for t in self.load(positions) if t.where is None}  # a filtered one reads only some rows
        return self.request([t for t in self.src.tables if t not in done and t not in running], current_lsn)

    def request_rereads(self, current_lsn: Callable[[], int]) -> list[SnapshotTask]:
        """Re-read by key the records silver marks `needs_reread` (DESIGN §6: unchanged TOAST, no image).

        Each key is requested once per state of its record in this process (rereads.py).
        """
        tables, keys = [], []
        for table, ks in self._rereads.keys_to_reread().items():
            for i in range(0, len(ks), self.page_rows):
                tables.append(table)
                keys.append(tuple(ks[i : i + self.page_rows]))
        if tables:
            log.info("re-reading keys source=%s keys=%d", self.src.name, sum(len(k) for k in keys))
        return self.request(tables, current_lsn, keys)

    # -- running ---------------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool], poll_requests: bool = False) -> None:
        """Run the registered snapshots to completion (and, with `poll_requests`, new ones as they come).

        Up to `snapshot.max_parallel` run side by side, each on a thread with its own connection;
        the first failure stops the others after their current page and is raised here.
        """
        reader = PageReader(self.src, self.hook)
        admin = PostgresAdmin(self.src)
        running: dict[str, threading.Thread] = {}
        failures: list[BaseException] = []

        def stop() -> bool:
            return bool(failures) or should_stop()

        try:
            types = TypeCatalog.from_rows(admin.type_catalog_rows(TYPE_CATALOG_SQL))
            self.request_rereads(reader.current_lsn)
            last_poll = last_reread = last_control = time.monotonic()
            last_paused_raise = 0.0
            while not stop():
                for writer_id in [w for w, t in running.items() if not t.is_alive()]:
                    del running[writer_id]
                if self.tasks and time.monotonic() - last_control >= CONTROL_POLL_S:
                    self._read_control()
                    last_control = time.monotonic()
                with self._lock:
                    waiting = [t for t in self.tasks if t.writer_id not in running and not t.paused]
                    paused = [t for t in self.tasks if t.writer_id not in running and t.paused]
                if paused and (
                    not (waiting or running or poll_requests)
                    or time.monotonic() - last_paused_raise >= POSITION_INTERVAL_S
                ):
                    self._raise_paused(paused, reader.current_lsn())
                    last_paused_raise = time.monotonic()
                for task in waiting[: max(0, self.max_parallel - len(running))]:
                    thread = threading.Thread(
                        target=self._work,
                        args=(task, types, stop, failures),
                        name=f"snapshot-{task.table}",
                        daemon=True,
                    )
                    running[task.writer_id] = thread
                    thread.start()
                if waiting or running:
                    time.sleep(0.05)
                    continue
                if not poll_requests:  # a paused snapshot waits for `snapshot resume` and a later run
                    return
                if time.monotonic() - last_poll >= REQUEST_POLL_S:
                    self.load()
                    last_poll = time.monotonic()
                if time.monotonic() - last_reread >= REREAD_POLL_S:
                    self.request_rereads(reader.current_lsn)
                    last_reread = time.monotonic()
                else:
                    time.sleep(0.2)
        finally:
            failures.append(SnapshotStopped())  # the running snapshots stop after their current page
            for thread in running.values():
                thread.join()
            reader.close()
            admin.close()
        real = [f for f in failures if not isinstance(f, SnapshotStopped)]
        if real:
            raise real[0]

    def _work(
        self, task: SnapshotTask, types: TypeCatalog, stop: Callable[[], bool], failures: list[BaseException]
    ) -> None:
        """Run one snapshot on this thread with its own connections; a failure goes to `failures`."""
        with self._lock:
            task.claimed = True
        reader = PageReader(self.src, self.hook)
        admin = PostgresAdmin(self.src)
        try:
            refusal = cannot_snapshot(admin, task.table)
            if refusal is not None:
                self._drop(task, refusal)
                done = False
            else:
                done = self._run_task(task, reader, admin, types, stop)
            if done or refusal is not None:
                with self._lock:
                    if task in self.tasks:  # not if a range beside it started its table over meanwhile
                        self.tasks.remove(task)
                    if done:
                        self.completed.append(task)
        except SourceError as e:
            if task.where is None or isinstance(e, SourceUnavailableError):
                log.error("snapshot failed source=%s table=%s error=%s", self.src.name, task.table, e)
                failures.append(e)
            else:  # its predicate failed on a row the check did not reach: retried, it would stop every run
                self._drop(task, f"its predicate failed: {e}")
                with self._lock:
                    self.tasks.remove(task)
        except BaseException as e:  # raised by `run` in the caller's thread
            log.error("snapshot failed source=%s table=%s error=%s", self.src.name, task.table, e)
            failures.append(e)
        finally:
            reader.close()
            admin.close()

    def _split(self, task: SnapshotTask, reader: PageReader, shape: TableShape) -> None:
        """Cut a large table into key ranges, each its own snapshot writer; `task` keeps the first.

        The ranges and `task`'s new bound are registered in one commit: a crash leaves either the
        whole table to `task` or every range registered (a resumed `task` is bounded, not split again).
        """
        est = task.estimated_rows or 0
        cuts: list[tuple[str, ...]] = []
        # Not for a snapshot that resumes after pages: its ranges below its last key are read.
        if self._splits(task, shape) and task.until and task.after is None:
            cuts = reader.split_keys(shape, self.max_parallel, est)
        if not cuts:
            return
        bounds = [*cuts, task.until]
        # Every range's pages belong to the one whole-table snapshot `task` took the bound of.
        whole = replace(task.table_snapshot, parts=len(bounds)) if task.table_snapshot is not None else None
        parts = [
            SnapshotTask(
                task.table,
                uuid.uuid4().hex,
                task.started_at,
                task.durable_lsn,
                estimated_rows=est // len(bounds),
                after=lo,
                until=hi,
                bounded=True,
                start=lo,
                whole=task.whole,
                table_snapshot=whole,
            )
            for lo, hi in zip(cuts, bounds[1:], strict=True)
        ]
        task.until, task.estimated_rows, task.table_snapshot = cuts[0], est // len(bounds), whole
        with self._lock:
            self.writer.raise_positions(self._rows_of([task, *parts]))
            self.tasks.extend(parts)
        log.info("snapshot split source=%s table=%s ranges=%d", self.src.name, task.table, len(bounds))

    def _splits(self, task: SnapshotTask, shape: TableShape) -> bool:
        """Whether `task` is cut into ranges: a whole-table snapshot of more than `split_rows` estimated rows.

        A filtered snapshot is not (its rows may sit anywhere), nor one that stopped reading the
        whole table (the table gained or lost its key under it: each of its ranges reads the table
        again, and cutting each again would multiply them), nor a partitioned table.
        """
        est = task.estimated_rows or 0
        return (
            self.max_parallel > 1
            and est > self.src.snapshot.split_rows
            and task.whole
            and not task.where
            and not shape.partitioned
        )

    def _split_blocks(self, task: SnapshotTask, shape: TableShape, blocks: int) -> list[SnapshotTask]:
        """Cut a large keyless table's `blocks` into ranges, each its own snapshot writer; `task` keeps the first.

        The CTID counterpart of `_split`: `max_parallel` equal block spans of the block count the
        bound read, range i paging from its first block (`start`, the TID after the block before
        it) up to the next range's (`until`), every range in the same file and carrying the one
        whole-table snapshot `task` took the bound of. The caller registers them with `task`'s new
        bound in one commit.
        """
        cuts = block_cuts(blocks, self.max_parallel) if self._splits(task, shape) and task.after is None else []
        if not cuts:
            return []
        bounds = [*cuts, blocks]
        est = (task.estimated_rows or 0) // len(bounds)
        whole = replace(task.table_snapshot, parts=len(bounds)) if task.table_snapshot is not None else None
        parts = [
            SnapshotTask(
                task.table,
                uuid.uuid4().hex,
                task.started_at,
                task.durable_lsn,
                estimated_rows=est,
                after=range_start(lo),
                until=(str(hi),),
                bounded=True,
                start=range_start(lo),
                relfilenode=task.relfilenode,
                span_blocks=task.span_blocks,
                whole=task.whole,
                table_snapshot=whole,
            )
            for lo, hi in zip(cuts, bounds[1:], strict=True)
        ]
        task.until, task.estimated_rows, task.table_snapshot = (str(cuts[0]),), est, whole
        return parts

    def _abandoned(self, task: SnapshotTask) -> bool:
        """Whether a range beside `task` started their table over (a rewrite): `task` writes nothing more."""
        with self._lock:
            return task not in self.tasks

    def _run_task(
        self,
        task: SnapshotTask,
        reader: PageReader,
        admin: PostgresAdmin,
        types: TypeCatalog,
        should_stop: Callable[[], bool],
    ) -> bool:
        mask = self.masks.table(task.table)
        if mask is not None and mask.mask:  # a masked column renamed since stays masked (followed.py)
            mask = follow_renames(admin, task.table, mask, bronze_recorded_columns(self.writer, self.src.name))
        shape = captured_shape(table_shape(admin, task.table, keyless=True), mask, self.src.name)
        by_ctid = shape.keyless and task.keys is None
        encoders = page_encoders(types, shape, mask, self.src.non_utf8)
        compiled = None
        if not by_ctid:  # CTID pages read the TID beside the columns: through the cursor, in Python
            compiled = native.row_encoder(encoders, json_keys(shape.columns), shape.columns, shape.key_positions)
        last = self.writer.last_durable_page(self.src.name, task.snapshot_id)
        page = 0
        if last is not None:
            page, task.rows, task.pages = last.page_number + 1, last.rows, last.page_number + 1
            task.after = last.after_key if last.after_key is not None else task.after
            if last.complete:  # crashed after its last page, before retiring
                self._retire(task)
                return True
            log.info("snapshot resumed source=%s table=%s page=%d rows=%d", self.src.name, task.table, page, task.rows)
        if by_ctid != (task.relfilenode is not None):
            # The table lost or gained its key since the snapshot started (or a CTID snapshot's file
            # was never recorded): its cursor means nothing in the other order; read it all again.
            if task.bounded or task.after is not None or task.relfilenode is not None:
                # It had begun reading in the other order (a keyless table's keys are its every
                # column): no page of it, from here on either, says it read the whole table.
                task.whole, task.table_snapshot = False, None
            task.after, task.until, task.bounded, task.relfilenode, task.start = None, None, False, None, None
        if task.estimated_rows is None:
            task.estimated_rows = estimate_rows(admin, task.table)
        if by_ctid and not task.bounded:
            self._bound_by_ctid(task, reader, shape)
        elif not task.bounded and task.keys is None:
            task.until, xids = reader.max_key(shape, task.where)
            task.bounded = True
            self._take_table_snapshot(task, xids)
            self._split(task, reader, shape)
        t0, rows0 = time.monotonic(), task.rows
        last_raise = 0.0
        while not should_stop():
            if by_ctid and self._abandoned(task):
                return False
            if self.writer.snapshot_control_version() != self._control_version:
                self._read_control()  # a command since the last read: a pause stops before the next page
            if task.paused:  # the run's scheduler raises its row while it waits (`_raise_paused`)
                log.info(
                    "snapshot paused source=%s table=%s page=%d rows=%d", self.src.name, task.table, page, task.rows
                )
                return False
            if by_ctid:
                read = reader.read_ctid_page(shape, encoders, task, page, self.page_rows, self.src.snapshot.page_bytes)
                if read.filenode != task.relfilenode:
                    self._start_over(task, read.filenode)
                    return False
                more = read.cut
            else:
                read = reader.read_page(
                    shape, encoders, task, page, self.page_rows, self.src.snapshot.page_bytes, compiled
                )
                # A page cut by its byte budget has rows after it, a re-read of listed keys too: the
                # next page reads on after its last key.
                more = read.cut or (task.keys is None and task.until is not None and read.count >= self.page_rows)
            is_last = not more or (not by_ctid and read.last_key == task.until)
            hw = reader.watermark(task, page)
            self.writer.append_page(
                self.src.name,
                SourceKind.POSTGRES,
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
                    task.table_snapshot,
                    read.columns,
                ),
            )
            faults.hit("snapshot_after_page_commit")
            if by_ctid and self._abandoned(task):
                # Its page was read before the rewrite (each row true at its watermark); its writer
                # row is gone and must stay gone: no raise, no retire.
                return False
            task.pages, task.rows = page + 1, task.rows + read.count
            if by_ctid:
                task.after = read.after
            elif read.last_key is not None:
                task.after = read.last_key
            elapsed = time.monotonic() - t0
            task.rows_per_s = (task.rows - rows0) / elapsed if elapsed > 0 else None
            if not is_last and time.monotonic() - last_raise >= POSITION_INTERVAL_S:
                # Pages are durable already (a resume asks bronze); the row only lets the safe bound pass.
                self._raise(task, hw)
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
                read.count,
                task.rows,
                task.estimated_rows,
                task.rows_per_s or 0,
            )
            if is_last:
                self._retire(task, hw)
                return True
            page += 1
        return False

    def _bound_by_ctid(self, task: SnapshotTask, reader: PageReader, shape: TableShape) -> None:
        """Bound a keyless table's snapshot by its block count now, record the file it reads, and cut it.

        Recorded in the writer row before the first page: a snapshot resumed after a rewrite of
        the table (its CTIDs all new) must know, or it would go on at a TID that means other rows.
        A large table is cut into block ranges (`_split_blocks`), registered in the same commit:
        a crash leaves either the whole table unbounded or every range registered.
        """
        end, task.relfilenode, per_block, xids = reader.ctid_bounds(shape)
        task.until, task.bounded = (str(end),), True
        self._take_table_snapshot(task, xids)
        task.span_blocks = max(1, self.page_rows // max(1, per_block))
        parts = self._split_blocks(task, shape, end)
        with self._lock:
            self.writer.raise_positions(self._rows_of([task, *parts]))
            self.tasks.extend(parts)
        if parts:
            log.info(
                "snapshot split source=%s table=%s ranges=%d blocks=%d", self.src.name, task.table, len(parts) + 1, end
            )

    @staticmethod
    def _take_table_snapshot(task: SnapshotTask, xids: Xids) -> None:
        """A whole-table snapshot read its bound under `xids`: its pages carry that (one part so far).

        Kept in the writer row with the bound (`_split`, `_bound_by_ctid`, the first raise); a
        crash before that reads the bound again, and the later pages carry the new one.
        """
        if task.whole:
            task.table_snapshot = TableSnapshot(task.snapshot_id, 1, *xids)

    def _start_over(self, task: SnapshotTask, filenode: int | None) -> None:
        """A keyless table was rewritten under its CTID snapshot: replace the snapshot by a new one.

        VACUUM FULL, CLUSTER or a rewriting ALTER TABLE gives every row a new CTID, so rows not read
        yet may now sit below the cursor. The pages written stay (each row was the table's at its
        watermark); the new snapshot reads the new file from its first block, bounds it again and
        is cut again if large. A table cut into block ranges starts over once, as one snapshot:
        the first range to meet the new file removes every range of its whole-table snapshot, and
        the others, which may be reading a page meanwhile, write no more after it (`_abandoned`).
        The range that met the file never writes its last page, so the old whole-table snapshot
        never completes (its absent keys are never looked for). The new one is registered before
        the old writers are removed: a crash between leaves both, and an old one starts over
        again when it meets the new file.
        """
        with self._lock:
            if task not in self.tasks:
                return  # a range beside it met the new file first and started the table over
            whole = task.table_snapshot
            old = [
                t
                for t in self.tasks
                if t is task
                or (
                    whole is not None
                    and t.table == task.table
                    and t.table_snapshot is not None
                    and t.table_snapshot.snapshot_id == whole.snapshot_id
                )
            ]
            prefix = FILTERED_SNAPSHOT_PREFIX if task.where is not None else ""
            new = SnapshotTask(
                task.table,
                prefix + uuid.uuid4().hex,
                task.started_at,
                min(t.durable_lsn for t in old),
                where=task.where,
                whole=task.where is None,
            )
            self.writer.raise_positions([(new.position(self.src.name), new.started_at)])
            for t in old:
                self.writer.remove_writer(self.src.name, t.writer_id)
                self.tasks.remove(t)
                self._replaced.add(t.writer_id)
            self.tasks.append(new)
        log.warning(
            "snapshot source=%s table=%s snapshot_id=%s: the table was rewritten (file %s, now %s), so its rows "
            "have new CTIDs; its snapshot starts over as snapshot_id=%s (replacing %d unfinished writer%s)",
            self.src.name,
            task.table,
            task.snapshot_id,
            task.relfilenode,
            filenode,
            new.snapshot_id,
            len(old),
            "" if len(old) == 1 else "s",
        )

    def _raise(self, task: SnapshotTask, hw: int) -> None:
        """`task`'s page at `hw` is durable: raise it, and the snapshots not started yet, to `hw`.

        A snapshot running beside it is not raised: it may have a page at a lower watermark that
        is not in bronze yet. One not started emits every watermark after this one.
        """
        with self._lock:
            task.durable_lsn = max(task.durable_lsn, hw)
            queued = [t for t in self.tasks if not t.claimed]
            for t in queued:
                t.durable_lsn = max(t.durable_lsn, hw)
            self.writer.raise_positions(self._rows_of([task, *queued]))

    def _rows_of(self, tasks: Sequence[SnapshotTask]) -> list[tuple[WriterPosition, datetime]]:
        """The writer rows of `tasks` to write.

        The `paused` they carry is only what the run last read: `snapshot pause|resume` is decided
        by its records in bronze's snapshot_control, which no row written here overrides.
        """
        return [(t.position(self.src.name), t.started_at) for t in tasks]

    def _read_control(self) -> None:
        """Take `snapshot pause|resume` (the writer rows as bronze reads them): a paused snapshot starts no page."""
        version = self.writer.snapshot_control_version()  # before the read: a later command is read again
        rows = {p.writer_id: p for p, _ in self.writer.positions(self.src.name)}
        with self._lock:
            self._control_version = version
            for t in self.tasks:
                row = rows.get(t.writer_id)
                paused = SnapshotProgress.from_row(row).paused if row is not None else t.paused
                if paused != t.paused:
                    log.info(
                        "snapshot %s source=%s table=%s snapshot_id=%s",
                        "paused" if paused else "resumed",
                        self.src.name,
                        t.table,
                        t.snapshot_id,
                    )
                t.paused = paused

    def _raise_paused(self, tasks: Sequence[SnapshotTask], lsn: int) -> None:
        """Raise paused snapshots, none of which has a page being read, to the server's position `lsn`.

        A paused snapshot reads nothing, and a page it reads after its resume emits its
        watermark after `lsn`; so the stream goes on and the safe bound with it while it waits.
        """
        with self._lock:
            # Not one a start-over removed since the caller listed it: its row must stay gone.
            tasks = [t for t in tasks if t in self.tasks]
            for t in tasks:
                t.durable_lsn = max(t.durable_lsn, lsn)
            self.writer.raise_positions(self._rows_of(tasks))

    def _drop(self, task: SnapshotTask, refusal: str) -> None:
        """Remove a request that cannot be performed: a `run` goes on without it, the log says why.

        Retried, it would stop every run of the source the same way, and nothing else removes it.
        """
        self.writer.remove_writer(self.src.name, task.writer_id)
        log.error(
            "source=%s: snapshot of %s cannot be performed and is dropped (snapshot_id=%s): %s",
            self.src.name,
            task.table,
            task.snapshot_id,
            refusal,
        )

    def _retire(self, task: SnapshotTask, hw: int = 0) -> None:
        with self._lock:
            queued = [t for t in self.tasks if not t.claimed]
            for t in queued:
                t.durable_lsn = max(t.durable_lsn, hw)
            if queued:  # they wait behind this one: they must not hold the safe bound back meanwhile
                self.writer.raise_positions(self._rows_of(queued))
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


def cannot_snapshot(admin: PostgresAdmin, table: str) -> str | None:
    """Why `table` cannot be snapshotted now, or None: not configured, gone, or keyed by nothing.

    A table with a key is read in keyset pages. One without is keyed by every column, as the
    stream keys it under REPLICA IDENTITY FULL, and read in CTID ranges; without FULL its changes
    cannot be keyed at all, and a partitioned one has no CTIDs of its own (each partition has its
    own, which repeat across partitions).
    """
    src = admin.src
    if table not in src.tables:
        return f"source {src.name!r} does not capture {table}; configured tables: {', '.join(src.tables)}"
    with admin.conn.cursor() as cur:
        cur.execute(
            "select c.oid::bigint, c.relreplident::text, c.relkind::text from pg_class c where c.oid = to_regclass(%s)",
            (sql.Identifier(*table.split(".", 1)).as_string(admin.conn),),
        )
        row = cur.fetchone()
    if row is None or row[0] is None:
        return f"table {table} does not exist"
    if admin.record_key(int(str(row[0]))):
        return None
    if str(row[1]) != REPLICA_IDENTITY_FULL:
        return (
            f"table {table} has no primary key and no REPLICA IDENTITY FULL, so its rows cannot be keyed; add a "
            f"primary key or run ALTER TABLE {table} REPLICA IDENTITY FULL"
        )
    if str(row[2]) == RELKIND_PARTITIONED:
        return (
            f"table {table} is partitioned and has no primary key: a keyless table is read by CTID, and the "
            "CTIDs of its partitions repeat; add a primary key to snapshot it"
        )
    return None


def request_snapshot(src: PostgresSource, writer: BronzeWriter, table: str, where: str | None = None) -> SnapshotTask:
    """Register an on-demand snapshot of `table`; a running (or the next) `run` performs it.

    With `where`, a filtered snapshot: only the rows that SQL predicate selects. SourceError, and
    nothing registered, if the table cannot be snapshotted (`cannot_snapshot`) or the predicate is
    not one expression the server accepts as a filter of the table (`check_filter`).
    """
    admin = PostgresAdmin(src)
    try:
        refusal = cannot_snapshot(admin, table)
        shape = table_shape(admin, table, keyless=True) if refusal is None and where is not None else None
    finally:
        admin.close()
    if refusal is not None:
        raise SourceError(f"cannot snapshot {table}: {refusal}")
    reader = PageReader(src)
    try:
        if shape is not None and where is not None:
            check_filter(reader, shape, table, where)
        writer.ensure_tables()
        return Snapshotter(src, writer).request([table], reader.current_lsn, where=where)[0]
    finally:
        reader.close()


def check_filter(reader: PageReader, shape: TableShape, table: str, where: str) -> None:
    """SourceError if `where` is not one predicate the server accepts as a filter of the table.

    Its shape first (one expression: filters.py), then the server's parse and plan of it in a READ
    ONLY transaction rolled back (`PageReader.filter_problem`): an unknown column, a syntax error
    or a result that is not boolean is refused before anything is queued.
    """
    problem = predicate_problem(where) or reader.filter_problem(shape, where)
    if problem is not None:
        raise SourceError(f"cannot snapshot {table} where {where!r}: {problem}; nothing was queued")
