"""`verify` for MongoDB: read collections at one cluster time and compare them with silver (docs/verify.md).

The position P: the run's first `find` with `readConcern: {level: "snapshot"}` returns the
snapshot's `atClusterTime` T, and every later read of the run (each collection, its count, the
re-read that bisects a mismatch) names it (`atClusterTime: T`). A read at T sees every write at
or before T and none after, so P = T exactly: unlike a Postgres snapshot, no in-progress
transaction has to be placed below it. Keys changed after silver's position are skipped as for
Postgres (ingest/verify.py). A snapshot read lives as long as the server keeps T's history
(`minSnapshotHistoryWindowInSeconds`, 300 s by default): a longer read fails and the collection
is reported not verified, saying so.

A server that returns no `atClusterTime` (compat.py: the test server) reads without isolation.
There, a collection's pass counts only if the cluster time after it (the comparison and its
bisection included) is the one before it: no write happened while it read, so every document it
saw was its state from that cluster time up to bronze's bound, where it is compared. Otherwise
the collection is read again, up to COMPAT_ATTEMPTS times, then reported not verified: a raced
read never reports a mismatch.

Documents are encoded exactly as a snapshot page encodes them (snapshot.py: record_key of the
`_id`, canonical Extended JSON of the masked document), so both sides compare ingest's JSON.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bson.int64 import Int64
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
from ingest.sources.mongodb.source import cluster_time, collections, connect
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

FETCH_DOCS = 5000
COMPAT_ATTEMPTS = 3
SNAPSHOT_TOO_OLD = 239  # the read outlived the server's snapshot history window
SNAPSHOT_UNAVAILABLE = 246


def default_tables(src: MongoSource) -> list[str]:
    """Every collection in the source's scope, as `database.collection`."""
    client = connect(src)
    try:
        return [f"{src.database}.{c}" for c in collections(client, src)]
    finally:
        client.close()


class SnapshotReads:
    """The run's reads of one database, all at the cluster time the first one was given."""

    def __init__(self, src: MongoSource, client: MongoClient[dict[str, Any]]) -> None:
        """Read `src`'s database with `client`; nothing is read until `begin`."""
        self.src, self.db = src, client[src.database]
        self.at: Timestamp | None = None

    def _command(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            reply: dict[str, Any] = self.db.command(*args, **kwargs)
        except OperationFailure as e:
            raise SourceError(f"sources.{self.src.name}: verify read failed (code {e.code}): {e}") from e
        except PyMongoError as e:
            error = SourceUnavailableError if is_transient(e) else SourceError
            raise error(f"sources.{self.src.name}: verify read failed: {type(e).__name__}: {e}") from None
        return reply

    def _read_concern(self) -> dict[str, Any]:
        return {"level": "snapshot", **({"atClusterTime": self.at} if self.at is not None else {})}

    def begin(self, collection: str) -> Timestamp | None:
        """The run's first snapshot read (a document of `collection`): its `atClusterTime` (None: none given)."""
        reply = self._command("find", collection, filter={}, limit=1, batchSize=1, readConcern=self._read_concern())
        cursor = reply["cursor"]
        if cursor.get("id"):
            self._command("killCursors", collection, cursors=[cursor["id"]])
        at = cursor.get("atClusterTime")
        self.at = at if isinstance(at, Timestamp) else None
        return self.at

    def count(self, collection: str) -> int:
        """The collection's documents at the run's time (sizes the checksum ranges; 0 if it does not exist)."""
        reply = self._command(
            "aggregate", collection, pipeline=[{"$count": "n"}], cursor={}, readConcern=self._read_concern()
        )
        batch = reply["cursor"]["firstBatch"]
        return int(batch[0]["n"]) if batch else 0

    def rows(self, collection: str, mask: TableMask | None) -> Rows:
        """A pass over the collection at the run's time, documents as (record_pk, record)."""

        def encode(docs: list[dict[str, Any]]) -> list[Row]:
            return [(record_key(d["_id"]), ext_json(mask_document(d, mask))) for d in docs]

        def scan() -> Iterator[list[Row]]:
            reply = self._command("find", collection, filter={}, batchSize=FETCH_DOCS, readConcern=self._read_concern())
            cursor = reply["cursor"]
            yield encode(cursor["firstBatch"])
            while cursor.get("id"):
                reply = self._command("getMore", Int64(cursor["id"]), collection=collection, batchSize=FETCH_DOCS)
                cursor = reply["cursor"]
                yield encode(cursor["nextBatch"])

        return scan


def _snapshot_reason(e: SourceError) -> str:
    cause = e.__cause__
    code = cause.code if isinstance(cause, OperationFailure) else None
    if code in (SNAPSHOT_TOO_OLD, SNAPSHOT_UNAVAILABLE):
        return (
            f"{e}: the read outlived the server's snapshot history; verify the collection alone, or raise "
            "minSnapshotHistoryWindowInSeconds on the replica set"
        )
    return str(e)


def verify_collections(
    src: MongoSource,
    writer: BronzeWriter,
    tables: Sequence[str],
    wait_s: float,
    range_rows: int,
    max_keys: int,
    show_progress: bool,
) -> list[TableResult]:
    """Compare each of `tables` (`database.collection`) with silver at one cluster time; one result per table."""
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
        at = reads.begin(results[0].table.partition(".")[2])
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
        table = _Table(reads, silver, writer, src, silver_pos, range_rows, max_keys, show_progress)
        out = []
        for r in results:
            t0 = time.monotonic()
            if r.table in running:
                r = r.not_verified("a snapshot of the collection is running: verify after it completes")
            elif at is not None:
                r = table.compare(r.table, pack_cluster_time(at))
            else:
                r = _compat_pass(table, client, r.table, wait_s)
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


def _compat_pass(table: _Table, client: MongoClient[dict[str, Any]], name: str, wait_s: float) -> TableResult:
    """A collection on a server without snapshot reads: a pass counts only if no write happened while it read."""
    for attempt in range(1, COMPAT_ATTEMPTS + 1):
        before = pack_cluster_time(cluster_time(client))
        reason = _bronze_behind(table.writer, table.src.name, before, wait_s)
        if reason is not None:
            return TableResult(table.src.name, name).not_verified(reason)
        # Compared at bronze's bound B >= before: if the cluster time is still `before` after the
        # pass, no write lies in (before, B] (the oplog only grows), so the state at B is the one
        # read. B, not `before`: ingest places snapshot pages of an idle compat server above the
        # last write (snapshot.py), and silver's records there would otherwise count as newer.
        bound = SourcePositions.read(table.writer, table.src.name).safe_bound
        r = table.compare(name, max(before, bound or before))
        if r.status is Status.NOT_VERIFIED or pack_cluster_time(cluster_time(client)) == before:
            r.attempts = attempt
            return r
        log.info("verify source=%s table=%s: writes raced the read (attempt %d)", table.src.name, name, attempt)
    r = TableResult(table.src.name, name).not_verified(
        f"the server gives no snapshot reads (no atClusterTime) and writes raced each of {COMPAT_ATTEMPTS} reads: "
        "verify when the collection is quiet, or against a replica set (docs/verify.md)"
    )
    r.attempts = COMPAT_ATTEMPTS
    return r


class _Table:
    """Compares one collection with silver at a position (the run's snapshot time, or a compat pass's start)."""

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
        self.reads, self.silver, self.writer, self.src = reads, silver, writer, src
        self.silver_pos, self.range_rows, self.max_keys, self.show_progress = (
            silver_pos,
            range_rows,
            max_keys,
            show_progress,
        )
        self.masks = src.masks()

    def compare(self, table: str, position: int) -> TableResult:
        """The collection's result at `position`; a failed snapshot read makes it not verified, saying why."""
        r = TableResult(self.src.name, table, position=position, silver_position=self.silver_pos)
        db, _, coll = table.partition(".")
        changed = changed_keys(self.writer, self.src.name, table, self.silver_pos, position)
        if changed.truncated:
            return r.not_verified("the collection was dropped after silver's position: verify after the next dbt run")
        skip = changed.keys | self.silver.unusable_keys(self.src.name, db, coll, position)
        r.skipped_keys = len(skip)
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
        except SourceError as e:
            r = TableResult(self.src.name, table, position=position, silver_position=self.silver_pos)
            return r.not_verified(_snapshot_reason(e))
