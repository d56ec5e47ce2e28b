"""Runs a source's snapshots on a thread beside its stream; a failure stops the stream's loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ingest.bronze.writer import BronzeWriter
from ingest.events import WriterKind
from ingest.positions import SnapshotProgress

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


def cancel_requests(writer: BronzeWriter, source: str, table: str) -> int:
    """Remove the source's snapshot writers of `table` (requested, queued or interrupted); how many.

    Pages a snapshot committed stay in bronze: each row was the table's row at its watermark. A
    `run` performing one of them keeps its own copy of the request; stop it first.
    """
    rows = [
        pos
        for pos, _ in writer.positions(source)
        if pos.writer_kind is WriterKind.SNAPSHOT and SnapshotProgress.from_row(pos).table == table
    ]
    for pos in rows:
        writer.remove_writer(source, pos.writer_id)
        log.info("snapshot request cancelled source=%s table=%s writer=%s", source, table, pos.writer_id)
    return len(rows)
