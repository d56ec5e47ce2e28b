"""What every source adapter offers the CLI, and the bronze-side status lines they share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ingest.bronze.schemas import STREAM_POSITIONS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig
from ingest.events import WriterKind
from ingest.positions import SnapshotProgress, SourcePositions

if TYPE_CHECKING:
    from ingest.verify import TableResult

PositionFormat = Callable[[int], str]


class Source(Protocol):
    """One configured source, as `app.py` drives it (Postgres: adapter.py; MongoDB: adapter.py).

    The stream, its batching and its snapshots live below (`capture/` and each source's package);
    this is the surface the commands need.
    """

    name: str

    def check(self) -> None:
        """Fail fast on a source that cannot run (unreachable, misconfigured) before bronze is touched."""

    def setup(self) -> str:
        """Create what the source needs (Postgres: publication and slot); one summary line."""

    def run(self, batch: BatchConfig, writer: BronzeWriter, once: bool, should_stop: Callable[[], bool]) -> list[str]:
        """Capture into bronze until `should_stop()` (or, with `once`, the source's current position)."""

    def captures(self, table: str) -> bool:
        """Whether `table` (`schema.table`, or `database.collection`) is captured by this source."""

    def request_snapshot(self, writer: BronzeWriter, table: str, where: str | None = None) -> tuple[str, int]:
        """Register an on-demand snapshot of `table`; its writer id and start position.

        `where`: a filtered snapshot, of the rows this predicate selects (Postgres only). A running
        `run` picks it up within seconds, otherwise the next `run` does.
        """

    def source_status(self) -> list[str]:
        """Status lines of the source server itself (slot, lag, cluster time); IngestError if unreachable."""

    def format_position(self, position: int) -> str:
        """A position as this source's users read it (an LSN, a cluster time)."""

    def captured_tables(self) -> list[str]:
        """What `verify` compares when no table is named: every table (every collection in scope) now."""

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
        """Compare `tables` with silver at one position of the source (docs/verify.md); one result per table.

        Waits up to `wait_s` seconds for bronze to reach that position; `run_id` names the run.
        """


def bronze_status(writer: BronzeWriter, source: str, fmt: PositionFormat) -> list[str]:
    """Status lines of a source's writers in bronze: positions, snapshot progress, safe bound, last commit."""
    if not writer.exists(STREAM_POSITIONS_TABLE):
        return ["bronze not created yet (run `changelake-ingest run` first)"]
    positions = SourcePositions.read(writer, source)
    lines = []
    for pos, updated in sorted(positions.rows, key=lambda r: r[0].writer_id):
        lines.append(
            f"writer {pos.writer_id} ({pos.writer_kind.value}): durable {fmt(pos.durable_lsn)}, "
            f"updated {updated:%Y-%m-%d %H:%M:%S}"
        )
        if pos.writer_kind is WriterKind.SNAPSHOT:
            lines.append("  " + SnapshotProgress.from_row(pos).summary())
    if positions.safe_bound is not None:
        lines.append(f"safe bound: {fmt(positions.safe_bound)}")
    last = writer.max_commit_time(source)
    lines.append(f"last commit in bronze: {last:%Y-%m-%d %H:%M:%S} UTC" if last else "no events in bronze yet")
    return lines
