"""Runs a source's snapshots on a thread beside its stream; a failure stops the stream's loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from ingest.bronze.writer import BronzeWriter
from ingest.events import WriterKind
from ingest.positions import SnapshotProgress, SourcePositions

log = logging.getLogger(__name__)

SnapshotWork = Callable[[Callable[[], bool]], None]
STOP_WAIT_S = 30.0  # how long a stopping run waits for the snapshot's current page


class SnapshotThread:
    """Owns the snapshot thread of one source.

    Responsibilities: run `work(should_stop)` (a source's snapshotter: read pages, commit them,
    raise and retire its writers) until it returns or is told to stop, keep its failure for the
    stream's loop to raise (`check()`, called on every loop turn: a failed snapshot must not
    leave its writer row holding the safe bound while the stream runs on), and stop it after the
    current page on shutdown. An unfinished snapshot resumes on the next run.
    """

    def __init__(self, source: str, work: SnapshotWork, should_stop: Callable[[], bool]) -> None:
        """Start the thread."""
        self.source = source
        self._stop = should_stop
        self._halt = False
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(work,), name=f"snapshot-{source}", daemon=True)
        self._thread.start()

    def _work(self, work: SnapshotWork) -> None:
        try:
            work(lambda: self._halt or self._stop())
        except BaseException as e:  # re-raised in the stream's thread by check()
            log.error("snapshot failed source=%s error=%s", self.source, e)
            self.error = e
        finally:
            self.finished.set()

    def check(self) -> None:
        """Raise the snapshot's failure, if any."""
        if self.error is not None:
            raise self.error

    @property
    def done(self) -> bool:
        """Whether every snapshot finished (the thread ended without failure)."""
        return self.finished.is_set() and self.error is None

    def join(self) -> None:
        """Wait for the work to end by itself (e.g. `--once`: every queued snapshot done)."""
        self._thread.join()

    def stop(self) -> None:
        """Stop after the current page; wait for that at most STOP_WAIT_S.

        A page read from a server that stopped answering can block for as long as the connection's
        TCP timeouts allow (or, for a frozen peer that keeps the connection open, until it answers):
        a stopping run does not wait for it. The thread is a daemon, and a page not yet committed
        is read again by the next run.
        """
        self._halt = True
        self._thread.join(STOP_WAIT_S)
        if self._thread.is_alive():
            log.warning(
                "snapshot source=%s did not stop within %.0f s (its server does not answer); not waiting for it",
                self.source,
                STOP_WAIT_S,
            )


def _matches(progress: SnapshotProgress, target: str) -> bool:
    """Whether a snapshot writer is the one `target` names: its table, snapshot id or writer id."""
    return target in (progress.table, progress.snapshot_id, progress.writer_id)


def snapshots_of(writer: BronzeWriter, source: str, target: str) -> list[SnapshotProgress]:
    """The source's registered snapshots of `target` (a table, snapshot id or writer id)."""
    return [p for p in SourcePositions.read(writer, source).snapshots if _matches(p, target)]


def cancel_requests(writer: BronzeWriter, source: str, target: str) -> int:
    """Remove the source's snapshot writers of `target` (a table or a snapshot id); how many.

    Requested, queued, paused or interrupted ones. Pages a snapshot committed stay in bronze:
    each row was the table's row at its watermark. A `run` performing one of them keeps its own
    copy of the request; stop it first.
    """
    rows = [
        pos
        for pos, _ in writer.positions(source)
        if pos.writer_kind is WriterKind.SNAPSHOT and _matches(SnapshotProgress.from_row(pos), target)
    ]
    for pos in rows:
        writer.remove_writer(source, pos.writer_id)
        log.info("snapshot request cancelled source=%s target=%s writer=%s", source, target, pos.writer_id)
    return len(rows)


def set_paused(writer: BronzeWriter, source: str, target: str, paused: bool) -> list[SnapshotProgress]:
    """Pause (or resume) the source's snapshots of `target` (a table or a snapshot id); the ones changed.

    One record per snapshot appended to bronze's snapshot_control, never rewritten: a snapshot's
    latest record decides (BronzeState.positions shows it in the writer rows), so a run rewriting
    the writer row at the same moment cannot undo the command, and the command never writes the
    row (a row it read a moment before would lower the position the run raised). A running `run`
    reads it within CONTROL_POLL_S and starts no page of a paused snapshot. Returns the snapshots
    whose state this command changed, or all it names when none changed (none: no such snapshot).
    """
    found = snapshots_of(writer, source, target)
    writer.append_snapshot_control(source, [(p.snapshot_id, p.table, paused) for p in found])
    changed = [replace(p, paused=paused) for p in found if p.paused != paused]
    for progress in changed:
        log.info(
            "snapshot %s source=%s table=%s snapshot_id=%s",
            "paused" if paused else "resumed",
            source,
            progress.table,
            progress.snapshot_id,
        )
    return changed or [replace(p, paused=paused) for p in found]
