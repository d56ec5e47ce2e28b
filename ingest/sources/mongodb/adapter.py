"""The MongoDB source as the commands drive it: checks, run, snapshot requests, status and verify."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.progress import Progress
from ingest.sources.mongodb.capture import MongoCapture
from ingest.sources.mongodb.changes import unpack_cluster_time
from ingest.sources.mongodb.filters import parse_filter
from ingest.sources.mongodb.snapshot import request_snapshot
from ingest.sources.mongodb.source import (
    cluster_time,
    collections,
    connect,
    selected,
    unmatched_patterns,
    user_collections,
)

if TYPE_CHECKING:
    from ingest.verify import TableResult


class MongoAdapter:
    """One configured MongoDB source (a database, or some of its collections)."""

    def __init__(self, src: MongoSource) -> None:
        """Wrap the source's config; nothing is opened until a command runs."""
        self.src = src
        self.name = src.name

    def check(self) -> None:
        """The server is reachable and has a cluster time (a replica set or sharded cluster)."""
        self.setup()

    def setup(self) -> str:
        """Nothing to create on the server: check it and list what will be captured."""
        client = connect(self.src)
        try:
            ts = cluster_time(client)
            names = collections(client, self.src)
            unmatched = (
                unmatched_patterns(self.src, user_collections(client, self.src))
                if self.src.selection.has_patterns
                else []
            )
        finally:
            client.close()
        listed = ", ".join(names) or "none yet"
        at = f"clusterTime {ts.time}.{ts.inc}"
        waiting = f"; matching nothing yet: {', '.join(unmatched)}" if unmatched else ""
        return f"{self.name}: MongoDB {self.src.database} reachable at {at}; collections: {listed}{waiting}"

    def run(self, batch: BatchConfig, writer: BronzeWriter, once: bool, should_stop: Callable[[], bool]) -> list[str]:
        """Stream (and snapshot) into bronze; the run's summary line."""
        progress = Progress(self.name)
        cap = MongoCapture(self.src, batch, writer, progress)
        cap.run(once=once, should_stop=should_stop)
        return [
            progress.done()
            + f", durable at {self.format_position(cap.durable_lsn)}"
            + (f", snapshots completed: {', '.join(cap.snapshots_done)}" if cap.snapshots_done else "")
            + (f", {cap.skipped} re-delivered events skipped" if cap.skipped else "")
            + (f", {cap.out_of_scope} events of collections outside the selection skipped" if cap.out_of_scope else "")
        ]

    def captures(self, table: str) -> bool:
        """Whether `database.collection` is in scope (matched by `collections`, or every one, less `exclude`)."""
        db, _, coll = table.partition(".")
        return db == self.src.database and bool(coll) and selected(self.src, coll)

    def request_snapshot(self, writer: BronzeWriter, table: str, where: str | None = None) -> tuple[str, int]:
        """Register a snapshot writer for the collection at the safe bound; its id and start.

        With `where` (a query filter as Extended JSON), a filtered snapshot of the documents it
        selects, checked against the server before it is registered (snapshot.request_snapshot).
        Text that is not one JSON object is refused before the server is reached.
        """
        if where is not None:
            parse_filter(where)
        client = connect(self.src)
        try:
            progress, start = request_snapshot(self.src, client, writer, table.partition(".")[2], where)
        finally:
            client.close()
        return progress.writer_id, start

    def source_status(self) -> list[str]:
        """The server's cluster time."""
        client = connect(self.src)
        try:
            ts = cluster_time(client)
        finally:
            client.close()
        return [f"server clusterTime {ts.time}.{ts.inc}"]

    def format_position(self, position: int) -> str:
        """A packed cluster time as `clusterTime <seconds>.<increment> (<UTC time>)`."""
        ts = unpack_cluster_time(position)
        return f"clusterTime {ts.time}.{ts.inc} ({datetime.fromtimestamp(ts.time, UTC):%Y-%m-%d %H:%M:%S} UTC)"

    def captured_tables(self) -> list[str]:
        """Every collection in scope now, as `database.collection`."""
        client = connect(self.src)
        try:
            return [f"{self.src.database}.{c}" for c in collections(client, self.src)]
        finally:
            client.close()

    def verify(
        self,
        writer: BronzeWriter,
        tables: Sequence[str],
        wait_s: float,
        range_rows: int,
        max_keys: int,
        show_progress: bool,
        run_id: str,
    ) -> list[TableResult]:
        """Compare the collections with silver at one cluster time; verify writes nothing here, so no `run_id`."""
        from ingest.sources.mongodb.verify import verify_collections

        return verify_collections(self.src, writer, tables, wait_s, range_rows, max_keys, show_progress)
