"""The Postgres source as the commands drive it: setup, run, snapshot requests, status and verify."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, PostgresSource
from ingest.events import int_to_lsn
from ingest.progress import Progress
from ingest.sources.postgres.admin import PostgresAdmin, prepare_source
from ingest.sources.postgres.capture import PostgresCapture
from ingest.sources.postgres.scope import resolve_scope
from ingest.sources.postgres.snapshot import request_snapshot

if TYPE_CHECKING:
    from ingest.verify import TableResult


class PostgresAdapter:
    """One configured Postgres source (a publication, a slot, its tables)."""

    def __init__(self, src: PostgresSource) -> None:
        """Wrap the source's config; nothing is opened until a command runs."""
        self.src = src
        self.name = src.name

    def check(self) -> None:
        """Check the server and tables, and create the publication and slot if missing."""
        prepare_source(self.src).close()

    def setup(self) -> str:
        """Create the publication and slot; say where the slot starts."""
        admin = prepare_source(self.src)
        try:
            h = admin.slot_health()
        finally:
            admin.close()
        return (
            f"{self.name}: publication {self.src.publication_name} and slot {self.src.slot_name} ready "
            f"(slot at {int_to_lsn(h.confirmed_flush_lsn or 0)})"
        )

    def run(self, batch: BatchConfig, writer: BronzeWriter, once: bool, should_stop: Callable[[], bool]) -> list[str]:
        """Stream (and snapshot) into bronze; the run's summary lines."""
        progress = Progress(self.name)
        cap = PostgresCapture(self.src, batch, writer, progress)
        cap.run(once=once, should_stop=should_stop)
        lines = [
            progress.done()
            + f", durable at {int_to_lsn(cap.durable_lsn)}"
            + (f", {cap.skipped} re-delivered events skipped" if cap.skipped else "")
        ]
        for task in cap.snapshotter.completed:
            lines.append(f"{self.name}: snapshot of {task.table} completed, {task.rows:,} rows in {task.pages} pages")
        return lines

    def _in_scope(self) -> None:
        """Resolve a selection with patterns against the catalog now: the source's tables are those in scope."""
        if self.src.selection.has_patterns:
            admin = PostgresAdmin(self.src)
            try:
                self.src.set_tables(resolve_scope(admin).tables)
            finally:
                admin.close()

    def captures(self, table: str) -> bool:
        """Whether `schema.table` is one of the configured tables, or matched by the selection's patterns."""
        return table in self.src.tables or (table.count(".") == 1 and self.src.selection.matches(table.split(".")))

    def request_snapshot(self, writer: BronzeWriter, table: str, where: str | None = None) -> tuple[str, int]:
        """Register a snapshot writer for `table` (of the rows `where` selects) at the safe bound; its id and start."""
        self._in_scope()
        task = request_snapshot(self.src, writer, table, where)
        return task.writer_id, task.durable_lsn

    def source_status(self) -> list[str]:
        """The slot: confirmed position, server position, lag, WAL status, active walsender."""
        admin = PostgresAdmin(self.src)
        try:
            h = admin.slot_health()
        finally:
            admin.close()
        lag = f"{h.lag_bytes:,} bytes" if h.lag_bytes is not None else "n/a (no slot)"
        confirmed = int_to_lsn(h.confirmed_flush_lsn) if h.confirmed_flush_lsn is not None else "n/a"
        lines = [
            f"slot {h.slot}: confirmed {confirmed}, server at {int_to_lsn(h.current_wal_lsn)}, "
            f"lag {lag}, wal_status {h.wal_status or 'n/a'}, "
            f"{'active pid ' + str(h.active_pid) if h.active_pid else 'inactive'}"
        ]
        if h.wal_status == "lost":
            lines.append("  SLOT INVALIDATED: run `changelake-ingest run` for recovery steps")
        return lines

    def format_position(self, position: int) -> str:
        """An LSN as Postgres prints it."""
        return int_to_lsn(position)

    def captured_tables(self) -> list[str]:
        """The configured tables, the patterns' matches as of now."""
        self._in_scope()
        return list(self.src.tables)

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
        """Compare the tables with silver in one snapshot; `run_id` is the content of the message it commits."""
        from ingest.sources.postgres.verify import verify_tables

        self._in_scope()
        return verify_tables(self.src, writer, tables, wait_s, range_rows, max_keys, show_progress, run_id)
