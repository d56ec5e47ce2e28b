"""Posts alert transitions to a Slack-compatible webhook (`alerts.webhook`), off the watcher's thread.

One post when an alert starts and one when it ends: the watcher calls `notify` on transitions
only, so an alert that holds for hours sends nothing more. A post that fails is retried a bounded
number of times with backoff, then dropped with a WARNING: an unreachable chat server must never
block or stop the capture.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Final

from ingest.config import WebhookConfig
from ingest.ops.health import Alert

log = logging.getLogger(__name__)

FIRST_BACKOFF_S: Final = 1.0  # doubles after each failed attempt
MAX_QUEUED: Final = 1000  # a webhook down for long drops notices past this rather than growing memory
STOP_WAIT_S: Final = 5.0


class WebhookNotifier:
    """Owns the posting thread of one process.

    Responsibilities: turn an alert transition into a `{"text": ...}` payload (Slack's incoming
    webhook format, also read by Mattermost, Rocket.Chat and Teams' Slack-compatible hooks), post
    it with a timeout, retry `retries` times, and never raise to the caller. The URL is a
    credential: no log line shows it.
    """

    def __init__(self, cfg: WebhookConfig, backoff_s: float = FIRST_BACKOFF_S) -> None:
        """Post to `cfg.url`; `backoff_s` is the first wait between attempts (seconds)."""
        self.cfg = cfg
        self.backoff_s = backoff_s
        self._queue: queue.Queue[dict[str, str] | None] = queue.Queue(MAX_QUEUED)
        self._thread = threading.Thread(target=self._work, name="alert-webhook", daemon=True)
        self._thread.start()

    def notify(self, source: str, alert: Alert, started: bool) -> None:
        """Queue the notice that `alert` of `source` started (or ended); returns at once."""
        if started:
            text = f":rotating_light: changelake {source}: alert {alert.kind.value} started: {alert.message}"
        else:
            text = f":white_check_mark: changelake {source}: alert {alert.kind.value} cleared"
        try:
            self._queue.put_nowait({"text": text})
        except queue.Full:
            log.warning("alert webhook queue full source=%s alert=%s: notice dropped", source, alert.kind.value)

    def close(self) -> None:
        """Send what is queued (waiting up to STOP_WAIT_S), then stop the thread."""
        try:
            self._queue.put(None, timeout=STOP_WAIT_S)
        except queue.Full:
            return
        self._thread.join(timeout=STOP_WAIT_S)

    def _work(self) -> None:
        while (payload := self._queue.get()) is not None:
            self._post(payload)

    def _post(self, payload: dict[str, str]) -> None:
        body = json.dumps(payload).encode()
        delay = self.backoff_s
        for attempt in range(1, self.cfg.retries + 2):
            request = urllib.request.Request(
                self.cfg.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.cfg.timeout_seconds) as reply:
                    reply.read()
                return
            except (urllib.error.URLError, OSError) as e:
                # HTTPError's text holds no URL; URLError's reason does not either.
                why = f"HTTP {e.code}" if isinstance(e, urllib.error.HTTPError) else type(e).__name__
                if attempt > self.cfg.retries:
                    log.warning("alert webhook post failed attempts=%d error=%s: notice dropped", attempt, why)
                    return
                log.info("alert webhook post failed attempt=%d error=%s retry_in=%.1fs", attempt, why, delay)
                time.sleep(delay)
                delay *= 2
