"""`verify` for MongoDB: read collections at one cluster time and compare them with silver (docs/verify.md).

The position P: the run's first `find` with `readConcern: {level: "snapshot"}` returns the
snapshot's `atClusterTime` T, and every later read of the run (each collection, its count, the
re-read that bisects a mismatch) names it (`atClusterTime: T`). A read at T sees every write at
or before T and none after, so P = T exactly: unlike a Postgres snapshot, no in-progress
transaction has to be placed below it. Keys changed after silver's position are skipped as for
Postgres (ingest/verify.py). A read at T works while the server keeps T's history
(`minSnapshotHistoryWindowInSeconds`, 300 s by default): a read after that fails and its
collection is reported not verified, saying so.

A server that returns no `atClusterTime` (compat.py: the test server) reads without isolation.
There, a collection's pass counts only if the cluster time after it (the comparison and its
bisection included) is the one before it: no write happened while it read, so every document it
saw was its state from that cluster time up to bronze's bound, where it is compared. Otherwise
the collection is read again, up to COMPAT_ATTEMPTS times, then reported not verified: a raced
read never reports a mismatch. (mongo-java-server shows an inserted document a moment before it
writes the insert's oplog entry: a pass misses that insert only if the moment outlasts the pass.)

Documents are encoded exactly as a snapshot page encodes them (snapshot.py: record_key of the
`_id`, canonical Extended JSON of the masked document), so both sides compare ingest's JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from ingest.bronze.schemas import WAL_EVENTS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.capture.retry import is_transient
from ingest.config import MongoSource
from ingest.errors import SourceError, SourceUnavailableError
from ingest.masking import TableMask
from ingest.positions import SourcePositions
from ingest.sources.mongodb import compat
from ingest.sources.mongodb.changes import ext_json, mask_document, pack_cluster_time, record_key
from ingest.sources.mongodb.source import cluster_time, connect
from ingest.verify import (
    Progress,
    Row,
    Rows,
    Silver,
    Status,
    TableResult,
    changed_keys,
    compare,
    silver_path,
    wait_for_bronze,
)

log = logging.getLogger(__name__)

FETCH_DOCS = 5000  # documents per getMore, and per batch handed to the comparison
COMPAT_ATTEMPTS = 3  # passes over a collection on a server without snapshot reads
# Server error codes (src/mongo/base/error_codes.yml)
SNAPSHOT_TOO_OLD = 239  # the read outlived the server's snapshot history window
SNAPSHOT_UNAVAILABLE = 246  # no snapshot at that time (e.g. the collection was created or dropped after it)


class SnapshotReadError(SourceError):
    """The server cannot read at the run's cluster time (SnapshotTooOld, SnapshotUnavailable)."""


class SnapshotReads:
    """The run's reads of one database, all at the cluster time the first one was given.

    Responsibilities: take the run's time (`begin`), count and scan collections at it, and turn
    driver errors into errors a user can act on (a lost server: SourceUnavailableError).
    """

    def __init__(self, src: MongoSource, client: MongoClient[dict[str, Any]]) -> None:
        """Read `src`'s database with `client`; nothing is read until `begin`."""
        self.src, self.db = src, client[src.database]
        self.at: Timestamp | None = None

    def _failed(self, e: PyMongoError, what: str) -> SourceError:
        where = f"sources.{self.src.name}: {what}"
        if is_transient(e):
            return SourceUnavailableError(f"{where} failed: {type(e).__name__}: {e}")
        code = e.code if isinstance(e, OperationFailure) else None
        if code == SNAPSHOT_TOO_OLD:
            return SnapshotReadError(
                f"{where} at the run's cluster time failed (code {code}: {e}): the run outlived the server's "
                "snapshot history (minSnapshotHistoryWindowInSeconds, 300 s by default); verify fewer collections "
                "per run, or raise minSnapshotHistoryWindowInSeconds"
            )
        if code == SNAPSHOT_UNAVAILABLE:
            return SnapshotReadError(
                f"{where} at the run's cluster time failed (code {code}: {e}): the server has no snapshot of the "
                "collection at that time (created, dropped or renamed after it?); verify again"
            )
        return SourceError(f"{where} failed (code {code}): {e}")

    def _read_concern(self) -> dict[str, Any]:
        return {"level": "snapshot", **({"atClusterTime": self.at} if self.at is not None else {})}

    def begin(self, collection: str) -> Timestamp | None:
        """The run's first snapshot read (a document of `collection`): its `atClusterTime` (None: none given)."""
        try:
            reply = self.db.command(
                "find", collection, filter={}, limit=1, singleBatch=True, readConcern=self._read_concern()
            )
        except PyMongoError as e:
            raise self._failed(e, "the first snapshot read") from e
        at = reply["cursor"].get("atClusterTime")
        self.at = at if isinstance(at, Timestamp) else None
        return self.at

    def count(self, collection: str) -> int:
        """The collection's documents at the run's time (sizes the checksum ranges; 0 if it does not exist)."""
        try:
            reply = self.db.command(
                "aggregate", collection, pipeline=[{"$count": "n"}], cursor={}, readConcern=self._read_concern()
            )
        except PyMongoError as e:
            raise self._failed(e, f"count of {collection}") from e
        batch = reply["cursor"]["firstBatch"]
        return int(batch[0]["n"]) if batch else 0

    def rows(self, collection: str, mask: TableMask | None) -> Rows:
        """A pass over the collection at the run's time, documents as (record_pk, record).

        A command cursor (not `command` + `getMore`): its getMores go out in the session the find
        was sent in, as the server requires of a cursor.
        """
        where = f"{self.src.database}.{collection}"

        def scan() -> Iterator[list[Row]]:
            batch: list[Row] = []
            try:
                with self.db.cursor_command(
                    "find", collection, filter={}, batchSize=FETCH_DOCS, readConcern=self._read_concern()
                ) as cursor:
                    for d in cursor.batch_size(FETCH_DOCS):
                        batch.append((record_key(d["_id"]), ext_json(mask_document(d, mask, where))))
                        if len(batch) == FETCH_DOCS:
                            yield batch
                            batch = []
            except PyMongoError as e:
                raise self._failed(e, f"read of {collection}") from e
            yield batch

        return scan


def verify_collections(
    src: MongoSource,
    writer: BronzeWriter,
    tables: Sequence[str],
    wait_s: float,
    range_rows: int,
    max_keys: int,
    show_progress: bool,
) -> list[TableResult]:
    """Compare each of `tables` (`database.collection`) with silver at one cluster time; one result per table.

    Waits up to `wait_s` seconds for bronze's safe bound to reach the run's time (on a server
    without snapshot reads: each pass's time). Raises SourceUnavailableError if the server is
    lost, SourceError if it refuses the run's first read for another reason than its snapshot.
    """
    results = [TableResult(src.name, t) for t in tables]
    path = silver_path(writer)
    if not writer.exists(WAL_EVENTS_TABLE):
        return [r.not_verified("bronze does not exist yet: run `changelake-ingest run` first") for r in results]
    if not writer.tables.exists(path):
        return [r.not_verified(f"no silver consumer_records at {path}: run `dbt build` first") for r in results]
    if not results:
        return results
    client = connect(src)
    try:
        reads = SnapshotReads(src, client)
        try:
            at = reads.begin(results[0].table.partition(".")[2])
        except SnapshotReadError as e:
            return [r.not_verified(str(e)) for r in results]
        position = None
        if at is None:
            compat.warn_no_verify_snapshot(src.name)
        else:
            position = pack_cluster_time(at)
            reason = _bronze_behind(writer, src.name, position, wait_s)
            if reason is not None:
                return [r.not_verified(reason) for r in results]
        silver = Silver(path, writer.tables.storage_options)
        silver_pos = silver.position(src.name)
        if silver_pos is None:
            return [
                r.not_verified(f"silver holds no records of source {src.name} yet: run `dbt build`") for r in results
            ]
        running = {s.table for s in SourcePositions.read(writer, src.name).snapshots}
        collections = _Collections(reads, silver, writer, src, silver_pos, range_rows, max_keys, show_progress)
        out = []
        for r in results:
            t0 = time.monotonic()
            if r.table in running:
                r.position, r.silver_position = position, silver_pos
                r.not_verified("a snapshot of the collection is running: verify after it completes")
            elif position is not None:
                r = collections.compare(r.table, position)
            else:
                r = _compat_pass(collections, client, r.table, wait_s)
            r.seconds = time.monotonic() - t0
            log.info("verified source=%s table=%s status=%s seconds=%.1f", src.name, r.table, r.status, r.seconds)
            out.append(r)
        return out
    finally:
        client.close()


def _bronze_behind(writer: BronzeWriter, source: str, position: int, wait_s: float) -> str | None:
    """Why bronze cannot serve a comparison at `position` (its bound did not reach it in time), or None."""
    bound = wait_for_bronze(writer, source, position, wait_s)
    if bound is not None and bound >= position:
        return None
    at = "no writer position" if bound is None else f"its safe bound {bound}"
    return (
        f"bronze has not reached the read's position {position} within {wait_s:g} s ({at}): is "
        "`changelake-ingest run` running, or a snapshot holding the bound back?"
    )


def _compat_pass(
    collections: _Collections, client: MongoClient[dict[str, Any]], name: str, wait_s: float
) -> TableResult:
    """A collection on a server without snapshot reads: a pass counts only if no write happened while it read."""
    src = collections.src
    for attempt in range(1, COMPAT_ATTEMPTS + 1):
        before = pack_cluster_time(cluster_time(client))
        reason = _bronze_behind(collections.writer, src.name, before, wait_s)
        if reason is not None:
            r = TableResult(src.name, name).not_verified(reason)
            r.attempts = attempt
            return r
        # Compared at bronze's bound B >= before: if the cluster time is still `before` after the
        # pass, no write lies in (before, B] (the oplog only grows), so the state at B is the one
        # read. B, not `before`: ingest places snapshot pages of an idle compat server above the
        # last write (snapshot.py), and silver's records there would otherwise count as newer.
        bound = SourcePositions.read(collections.writer, src.name).safe_bound
        r = collections.compare(name, max(before, bound or before))
        r.attempts = attempt
        if r.status is Status.NOT_VERIFIED or pack_cluster_time(cluster_time(client)) == before:
            return r
        log.info("verify source=%s table=%s: writes raced the read (attempt %d)", src.name, name, attempt)
    r = TableResult(src.name, name).not_verified(
        f"the server gives no snapshot reads (no atClusterTime) and writes raced each of {COMPAT_ATTEMPTS} reads: "
        "verify when the collection is quiet, or against a replica set (docs/verify.md)"
    )
    r.attempts = COMPAT_ATTEMPTS
    return r


class _Collections:
    """Compares one collection at a time with silver at a position (the run's time, or a compat pass's)."""

    def __init__(
        self,
        reads: SnapshotReads,
        silver: Silver,
        writer: BronzeWriter,
        src: MongoSource,
        silver_pos: int,
        range_rows: int,
        max_keys: int,
        show_progress: bool,
    ) -> None:
        """Compare with `silver`, complete up to `silver_pos`; bronze's changes after it are skipped."""
        self.reads, self.silver, self.writer, self.src = reads, silver, writer, src
        self.silver_pos = silver_pos
        self.range_rows, self.max_keys, self.show_progress = range_rows, max_keys, show_progress
        self.masks = src.masks()

    def compare(self, table: str, position: int) -> TableResult:
        """The collection's result at `position`; a failed read makes it not verified, saying why."""
        r = TableResult(self.src.name, table, position=position, silver_position=self.silver_pos)
        db, _, coll = table.partition(".")
        changed = changed_keys(self.writer, self.src.name, table, self.silver_pos, position)
        if changed.truncated:
            return r.not_verified(
                "the collection was dropped (or renamed) after silver's position: verify after the next dbt run"
            )
        skip = changed.keys | self.silver.unusable_keys(self.src.name, db, coll, position)
        r.skipped_keys = len(skip)
        r.reread_keys = len(self.silver.reread_keys(self.src.name, db, coll))
        try:
            return compare(
                r,
                self.reads.rows(coll, self.masks.table(coll)),
                self.silver.rows(self.src.name, db, coll),
                self.reads.count(coll),
                skip,
                range_rows=self.range_rows,
                max_keys=self.max_keys,
                progress=Progress(f"{self.src.name}: {table}", enabled=self.show_progress),
            )
        except SourceUnavailableError:
            raise
        except SourceError as e:  # SnapshotTooOld, SnapshotUnavailable, another refusal: the others go on
            failed = TableResult(self.src.name, table, position=position, silver_position=self.silver_pos)
            failed.skipped_keys = r.skipped_keys
            return failed.not_verified(str(e))
