"""A continuous Postgres `run` on a thread of the test process, so a test can lower its intervals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ContinuousCapture:
    """Runs `PostgresCapture.run(once=False)` (snapshots on) until the context exits; re-raises its failure."""

    def __init__(self, warehouse: Path, src: Any) -> None:
        from ingest.bronze.writer import BronzeWriter
        from ingest.config import BatchConfig
        from ingest.progress import Progress
        from ingest.sources.postgres.capture import PostgresCapture

        self.capture = PostgresCapture(
            src, BatchConfig(max_events=10_000, max_seconds=0.2), BronzeWriter(warehouse), Progress(src.name, False)
        )
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="continuous-capture", daemon=True)

    def _run(self) -> None:
        try:
            self.capture.run(once=False, should_stop=self._stop.is_set)
        except BaseException as e:  # surfaced by wait_for and __exit__
            self.error = e

    def __enter__(self) -> ContinuousCapture:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None and exc[0] is None:
            raise self.error

    def wait_for(
        self, check: Callable[[], bool], seconds: float, what: str, tick: Callable[[], None] = lambda: None
    ) -> None:
        """Poll `check` (calling `tick` between polls) until true; fail if the run failed or time runs out."""
        deadline = time.monotonic() + seconds
        while not check():
            if self.error is not None:
                raise AssertionError(f"the run failed while waiting for {what}") from self.error
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {seconds} s")
            tick()
            time.sleep(0.5)
