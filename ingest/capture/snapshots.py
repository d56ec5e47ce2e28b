"""Runs a source's snapshots on a thread beside its stream; a failure stops the stream's loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

SnapshotWork = Callable[[Callable[[], bool]], None]


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
        """Stop after the current page and wait."""
        self._halt = True
        self._thread.join()
