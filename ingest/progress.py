"""Progress of a long-running capture: changes/s and lag, on a terminal or as quiet log lines."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("changelake.progress")

PROGRESS_INTERVAL_S = 2.0


class Progress:
    """Counts events and reports rate and lag every PROGRESS_INTERVAL_S.

    On a terminal it rewrites one status line on stderr; otherwise it logs at INFO (hidden unless
    --verbose), so scheduled runs stay quiet.
    """

    def __init__(self, source: str, enabled: bool | None = None) -> None:
        """Report for `source`; `enabled` defaults to whether stderr is a terminal."""
        self.source = source
        self.tty = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._last_t = self.started
        self._last_n = 0
        self.events = 0
        self.batches = 0
        self.note = ""  # e.g. the progress of a snapshot running beside the stream

    def add(self, n: int) -> None:
        """Count `n` more events made durable."""
        self.events += n
        self.batches += 1

    def tick(self, lag_bytes: int | None) -> None:
        """Report if the interval passed; `lag_bytes` is the server's WAL end minus our durable position."""
        now = time.monotonic()
        if now - self._last_t < PROGRESS_INTERVAL_S:
            return
        rate = (self.events - self._last_n) / (now - self._last_t)
        self._last_t, self._last_n = now, self.events
        lag = "?" if lag_bytes is None else f"{lag_bytes / 1e6:.1f} MB"
        line = f"{self.source}: {self.events} changes, {rate:,.0f} changes/s, lag {lag}"
        if self.note:
            line += f" | {self.note}"
        if self.tty:
            sys.stderr.write("\r" + line + " " * 8)
            sys.stderr.flush()
        else:
            log.info(
                "progress source=%s events=%d rate_per_s=%.0f lag_bytes=%s note=%r",
                self.source,
                self.events,
                rate,
                lag_bytes,
                self.note,
            )

    def done(self) -> str:
        """A one-line summary of the run."""
        secs = time.monotonic() - self.started
        if self.tty:
            sys.stderr.write("\n")
        return (
            f"{self.source}: {self.events} changes in {self.batches} batches, {secs:.1f} s "
            f"({self.events / secs if secs else 0:,.0f} changes/s)"
        )
