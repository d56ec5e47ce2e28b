"""Snapshots one MongoDB collection into bronze.snapshot_pages in `_id`-ordered pages (DESIGN §5).

Each page is its own short `find` with `readConcern: snapshot`: the server picks the page's
`atClusterTime` and returns it, and it becomes the page's position (`high_watermark_lsn`): stream
events at or before it are older than the page's rows, later ones newer. A page is one Delta
commit. A crashed snapshot resumes after its last durable page's `_id`.

The writer row `snapshot-<id>` keeps every page out of silver until it is durable (DESIGN §5: a
page may be used once the safe bound has passed its position; silver also takes a page above what
it has folded as not yet placed, models/silver/snapshot_rows_placed.sql). Unlike a Postgres
watermark, `atClusterTime` is the server's and does not move while the source is idle (W5), so:
- a page must lie above the row's position: a page read at or below it (the first page on an idle
  source, registered at the safe bound) is read again until the cluster time has moved (MongoDB's
  periodic no-op write moves it within ~10 s), at most TIE_WAIT_S;
- after a page the row stands one tick below the page's position, not at it: the next page, read
  at the same cluster time on an idle source, still lies above it; pages at one cluster time
  become usable together, once a later page or the snapshot's end moves the row past them;
- the row is removed when the last page is durable.

A filtered snapshot (`snapshot --where`, filters.py) adds its query filter to every page's `find`
beside the page's `_id` range; its id starts with `where-`, so it never counts as the
collection's completed snapshot. A filter the server refuses on a later page (an `$expr` dividing
by a field that became 0) drops the request, with an error in the log: retried, it would stop every
run of the source.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from bson import Decimal128, Regex
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from ingest.bronze.writer import BronzeWriter
from ingest.config import MongoSource
from ingest.errors import SourceError
from ingest.events import SnapshotPage, SnapshotRow, SourceKind, WriterKind, WriterPosition
from ingest.positions import FILTERED_SNAPSHOT_PREFIX, SnapshotProgress, SourcePositions
from ingest.sources.mongodb import compat
from ingest.sources.mongodb.changes import (
    Namespace,
    ext_json,
    from_ext_json,
    mask_document,
    pack_cluster_time,
    record_key,
    unpack_cluster_time,
)
from ingest.sources.mongodb.filters import (
    SNAPSHOT_READ_CONCERN,
    filter_problem,
    page_filter,
    parse_filter,
    server_message,
)
from ingest.sources.mongodb.source import cluster_time

log = logging.getLogger(__name__)

TIE_WAIT_S = 60.0  # how long a page read at or below the writer row's position is retried
TIE_POLL_S = 0.5
# Server errors of a read that say nothing about its filter (a snapshot too old, a shutdown or step
# down): a filtered snapshot failing with one of them fails the run and resumes, as any snapshot does.
TRANSIENT_READ_CODES = frozenset({50, 91, 189, 239, 246, 11600, 11601, 11602})


def comparison_bracket(value: Any) -> str:
    """The BSON comparison bracket of a value: numbers compare with each other, other types with their own."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float | Decimal128):
        return "number"
    if isinstance(value, str | Regex):
        return "string" if isinstance(value, str) else "regex"
    if isinstance(value, bytes):  # bson.Binary is a bytes
        return "binary"
    return type(value).__name__


class FilterFailedError(SourceError):
    """A filtered snapshot's page read was refused by the server: its filter failed on a document."""


def filter_failed(e: OperationFailure) -> bool:
    """Whether a filtered read's failure is the filter's (not a transient refusal of any read)."""
    return e.code not in TRANSIENT_READ_CODES and not e.has_error_label("TransientTransactionError")


def page_rows_within(rows: Iterable[SnapshotRow], max_bytes: int) -> tuple[SnapshotRow, ...]:
    """The leading rows whose records fit in `max_bytes` (the first row always: a page holds at least one).

    The rows after them are not encoded; the next page reads them again after the last kept `_id`.
    """
    kept: list[SnapshotRow] = []
    size = 0
    for row in rows:
        if kept and size + len(row.record) > max_bytes:
            break
        kept.append(row)
        size += len(row.record)
    return tuple(kept)


class MongoSnapshotter:
    """Owns one snapshot of one collection.

    Responsibilities: register (or resume) its writer row at the source's safe bound, read pages
    in `_id` order each under its own snapshot read, append each page, raise the row to the
    page's position, and remove the row when the last page is durable.
    """

    def __init__(
        self,
        src: MongoSource,
        client: MongoClient[dict[str, Any]],
        writer: BronzeWriter,
        collection: str,
        state: SnapshotProgress | None = None,
    ) -> None:
        """Snapshot `collection` of `src`; with `state` (a writer row), resume that snapshot."""
        self.src, self.client, self.writer = src, client, writer
        self.ns = Namespace(src.database, collection)
        self.masks = src.masks()
        self.state = state or SnapshotProgress(self.ns.qualified, str(uuid.uuid4()))
        self.writer_id = self.state.writer_id
        self.filter = parse_filter(self.state.where) if self.state.where is not None else None
        self.started_at = datetime.now(UTC)
        self.durable_lsn = 0
        self._warned_no_cluster_time = False

    def run(self, should_stop: Callable[[], bool]) -> bool:
        """Read pages until the collection ends (True) or `should_stop()` (False, resumable).

        False also when a filtered snapshot's filter failed on a page: the request is dropped.
        """
        start = self._register()
        if start is None:  # the last page is durable already; only the writer row was left
            self.writer.remove_writer(self.src.name, self.writer_id)
            return True
        page_number, after = start
        try:
            self._check_key_types()
        except FilterFailedError as e:
            self._drop(str(e))
            return False
        while not should_stop():
            try:
                page = self._read_page_above_position(page_number, after)
            except FilterFailedError as e:
                self._drop(str(e))
                return False
            self.writer.append_page(self.src.name, SourceKind.MONGODB, self.writer_id, page)
            self.state = replace(self.state, pages=page_number + 1, rows=self.state.rows + len(page.rows))
            if page.last_page:
                self.writer.remove_writer(self.src.name, self.writer_id)
                log.info("snapshot done source=%s table=%s rows=%d", self.src.name, self.ns.qualified, self.state.rows)
                return True
            self._raise(page.high_watermark_lsn - 1)  # one tick below: see the module's docstring
            after = from_ext_json(page.rows[-1].key_text[0])
            page_number += 1
        return False

    def _register(self) -> tuple[int, Any] | None:
        """Write (or find) the writer row; returns the next page number and the `_id` to read after.

        None: the snapshot's last page is durable already (a crash left only its writer row).
        """
        positions = SourcePositions.read(self.writer, self.src.name)
        mine = positions.writer(self.writer_id)
        if mine is not None:
            self.durable_lsn = mine.durable_lsn
        else:
            bound = positions.safe_bound  # DESIGN §4: a new writer starts at the safe bound
            self.durable_lsn = bound if bound is not None else pack_cluster_time(cluster_time(self.client))
            self._raise(self.durable_lsn)
        last = self.writer.last_durable_page(self.src.name, self.state.snapshot_id)
        if last is None:
            return 0, None
        if last.after_key is None or last.complete:
            return None
        return last.page_number + 1, from_ext_json(last.after_key[0])

    def _drop(self, why: str) -> None:
        """Remove a filtered snapshot whose filter the server refused: a `run` goes on without it."""
        self.writer.remove_writer(self.src.name, self.writer_id)
        log.error(
            "source=%s: snapshot of %s where %s cannot be performed and is dropped (snapshot_id=%s): %s",
            self.src.name,
            self.ns.qualified,
            self.state.where,
            self.state.snapshot_id,
            why,
        )

    def _raise(self, lsn: int) -> None:
        self.durable_lsn = max(self.durable_lsn, lsn)
        pos = WriterPosition(
            self.src.name, self.writer_id, WriterKind.SNAPSHOT, self.durable_lsn, self.durable_lsn, self.state.to_json()
        )
        self.writer.raise_position(pos, self.started_at)

    def _check_key_types(self) -> None:
        """Refuse a collection whose `_id`s span several BSON comparison brackets.

        Paging by `_id > last` compares within one bracket only (numbers together, strings, ObjectIds,
        ...), so such a collection would be read only in part. Index order groups brackets, so the
        first and last `_id` tell (of the documents a filtered snapshot's filter selects).
        """
        coll = self.client[self.ns.db][self.ns.coll or ""]
        types = []
        for direction in (1, -1):
            try:
                doc = coll.find_one(self.filter or {}, projection={"_id": 1}, sort=[("_id", direction)])
            except OperationFailure as e:
                if self.filter is None or not filter_failed(e):
                    raise
                raise FilterFailedError(f"the server refused its filter: {server_message(e)}") from e
            if doc is not None:
                types.append(comparison_bracket(doc["_id"]))
        if len(set(types)) > 1:
            raise SourceError(
                f"sources.{self.src.name}: {self.ns.qualified} has _id values of several BSON types "
                f"({' and '.join(types)}); snapshot pages are read by `_id > last`, which MongoDB compares "
                "within one type only: not supported"
            )

    def _read_page_above_position(self, page_number: int, after: Any) -> SnapshotPage:
        """The page, read at a cluster time above the writer row's position (W5; module docstring)."""
        deadline = time.monotonic() + TIE_WAIT_S
        while True:
            page = self._read_page(page_number, after)
            if page.high_watermark_lsn > self.durable_lsn:
                return page
            if time.monotonic() >= deadline:
                raise SourceError(
                    f"sources.{self.src.name}: snapshot of {self.ns.qualified}: the cluster time stayed at "
                    f"{unpack_cluster_time(self.durable_lsn)} for {TIE_WAIT_S:.0f} s, so a page cannot be placed "
                    "after what silver may have folded; a replica set moves it every 10 s with a no-op write "
                    "(periodicNoopIntervalSecs): check that the set has a primary and majority-commits writes"
                )
            time.sleep(TIE_POLL_S)

    def _read_page(self, page_number: int, after: Any) -> SnapshotPage:
        db = self.client[self.ns.db]
        size = self.src.snapshot_page_size
        query = page_filter(self.filter, after)
        read_at = time.time()
        try:
            reply = db.command(
                "find",
                self.ns.coll,
                filter=query,
                sort={"_id": 1},
                limit=size,
                batchSize=size,
                readConcern=SNAPSHOT_READ_CONCERN,
            )
        except OperationFailure as e:
            if self.filter is not None and filter_failed(e):
                raise FilterFailedError(
                    f"the server refused its filter on page {page_number}: {server_message(e)}"
                ) from e
            raise SourceError(f"sources.{self.src.name}: snapshot read of {self.ns.qualified} failed: {e}") from e
        cursor = reply["cursor"]
        docs = cursor["firstBatch"]
        if cursor.get("id"):  # the batch hit the 16 MB reply limit: the page ends early, the next goes on
            db.command("killCursors", self.ns.coll, cursors=[cursor["id"]])
        at = cursor.get("atClusterTime")
        if not isinstance(at, Timestamp):
            at = self._fallback_cluster_time(read_at)
        mask = self.masks.table(self.ns.coll or "")  # excluded fields dropped, masked ones masked (masking.py)
        where = self.ns.qualified
        rows = page_rows_within(
            (
                SnapshotRow(record_key(d["_id"]), ext_json(mask_document(d, mask, where)), (ext_json(d["_id"]),))
                for d in docs
            ),
            self.src.snapshot_page_bytes,
        )
        cut = len(rows) < len(docs)
        return SnapshotPage(
            snapshot_id=self.state.snapshot_id,
            table_schema=self.ns.db,
            table_name=self.ns.coll or "",
            page_number=page_number,
            last_page=len(docs) < size and not cursor.get("id") and not cut,
            rows=rows,
            high_watermark_lsn=pack_cluster_time(at),
            read_at_us=int(read_at * 1_000_000),
        )

    def _fallback_cluster_time(self, read_at: float) -> Timestamp:
        """A server that ignores `readConcern: snapshot` (compat.py): its cluster time after the read.

        When that has not moved past the writer row's position (an idle server; mongo-java-server
        has no periodic no-op write), the page takes the start of the wall-clock second the read
        began in, if that lies above the row, else it is read again (TIE_POLL_S) until it does.
        mongo-java-server stamps a write with its wall-clock second and a global counter that
        starts at 1, so every write after the read lies above that position, and every write
        before it at or below the row. Inventing the tick after the row's position instead would
        give the page the very time the next write in the same second gets, and order that write
        before the page. This assumes the server's clock is this host's (true for the test server).
        """
        if not self._warned_no_cluster_time:
            compat.warn_no_snapshot_time(self.src.name)
            self._warned_no_cluster_time = True
        now = cluster_time(self.client)
        if pack_cluster_time(now) > self.durable_lsn:
            return now
        return Timestamp(int(read_at), 0)


def request_snapshot(
    src: MongoSource,
    client: MongoClient[dict[str, Any]],
    writer: BronzeWriter,
    collection: str,
    where: str | None = None,
) -> tuple[SnapshotProgress, int]:
    """Register a snapshot writer for `collection` at the safe bound; returns it and its start position.

    With `where` (a query filter as Extended JSON), a filtered snapshot: only the documents it
    selects. ConfigError if it is not one JSON object, SourceError if the server refuses it as a
    page's filter (`filter_problem`); nothing is registered then.
    A running `run` picks it up within seconds (its snapshot worker polls the writer rows), else the
    next run does.
    """
    table = f"{src.database}.{collection}"
    if where is not None:
        problem = filter_problem(client, src.database, collection, parse_filter(where))
        if problem is not None:
            raise SourceError(f"cannot snapshot {table} where {where!r}: {problem}; nothing was queued")
    writer.ensure_tables()
    bound = SourcePositions.read(writer, src.name).safe_bound
    start = bound if bound is not None else pack_cluster_time(cluster_time(client))
    prefix = FILTERED_SNAPSHOT_PREFIX if where is not None else ""
    progress = SnapshotProgress(table, prefix + str(uuid.uuid4()), where=where)
    pos = WriterPosition(src.name, progress.writer_id, WriterKind.SNAPSHOT, start, start, progress.to_json())
    writer.raise_position(pos, datetime.now(UTC))
    return progress, start
