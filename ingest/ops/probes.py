"""Liveness and readiness of a running ingest, for `/healthz` and `/readyz` on the metrics endpoint.

Liveness: each source's capture loop beats (every turn of its stream loop, and every slice of a
retry backoff, asks whether to stop: that question, asked from the run's thread, is the beat). A
beat older than the liveness threshold means the loop is stuck (a deadlock, or waiting on a commit
queue behind a hung bronze commit): a supervisor should restart it.

Readiness: the watcher's latest verdict (ingest/ops/health.py rules). A source that is
unreachable, whose slot is lost or missing, or whose writer position is stale is not ready;
lagging is still ready (it is catching up, and restarting it would not help).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ingest.ops.health import ALERT_STATE, Alert, State

# A loop turns at least every few seconds (a replication keepalive, a batch window, a backoff
# slice); two minutes of silence is a stuck process, not a slow one.
DEFAULT_LIVENESS_S: Final = 120.0
NOT_READY_STATES: Final = frozenset({State.UNREACHABLE, State.LOST, State.STALE})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an endpoint answers: an HTTP status and a JSON body saying why."""

    status: int
    body: dict[str, Any]

    def encoded(self) -> bytes:
        """The body as UTF-8 JSON."""
        return json.dumps(self.body, sort_keys=True).encode()


class Probes:
    """Holds the heartbeat and latest alerts of each running source.

    Responsibilities: record beats (the capture loop) and verdicts (the watcher), forget a source
    whose run ended, and judge `/healthz` and `/readyz` from them. Thread-safe: the loop, the
    watcher and the HTTP threads touch it at once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """An empty register; `clock` is monotonic seconds (a test passes its own)."""
        self.clock = clock
        self.liveness_s = DEFAULT_LIVENESS_S
        self._lock = threading.Lock()
        self._beats: dict[str, float] = {}
        self._alerts: dict[str, tuple[Alert, ...]] = {}
        self._watched: set[str] = set()

    def beat(self, source: str) -> None:
        """The capture loop of `source` turned."""
        now = self.clock()
        with self._lock:
            self._beats[source] = now

    def watching(self, source: str) -> None:
        """A watcher started for `source`: not ready until its first verdict."""
        with self._lock:
            self._watched.add(source)

    def judged(self, source: str, alerts: Sequence[Alert]) -> None:
        """The watcher's latest alerts for `source`."""
        with self._lock:
            self._alerts[source] = tuple(alerts)

    def forget(self, source: str) -> None:
        """The run of `source` ended: it is neither beating nor watched any more."""
        with self._lock:
            self._beats.pop(source, None)
            self._alerts.pop(source, None)
            self._watched.discard(source)

    def beating(self, source: str, should_stop: Callable[[], bool]) -> Callable[[], bool]:
        """`should_stop`, each call of which from this thread is a beat of `source` (the first beat is now).

        Only the calling thread beats: the stream loop runs in it, while a snapshot thread asks the
        same question and would keep a stuck stream looking alive.
        """
        self.beat(source)
        owner = threading.get_ident()

        def asked() -> bool:
            if threading.get_ident() == owner:
                self.beat(source)
            return should_stop()

        return asked

    def liveness(self) -> Verdict:
        """200 while every running source's loop beat within `liveness_s`, else 503 naming the stuck ones."""
        now = self.clock()
        with self._lock:
            ages = {s: round(now - t, 3) for s, t in self._beats.items()}
        stuck = sorted(s for s, age in ages.items() if age > self.liveness_s)
        body: dict[str, Any] = {"status": "ok" if not stuck else "stuck", "sources": ages}
        if stuck:
            body["reason"] = f"capture loop of {', '.join(stuck)} has not turned for more than {self.liveness_s:g} s"
        return Verdict(503 if stuck else 200, body)

    def readiness(self) -> Verdict:
        """200 when every watched source has a verdict and none is unreachable, lost or stale; else 503."""
        with self._lock:
            watched = sorted(self._watched)
            alerts = {s: self._alerts.get(s) for s in watched}
        sources: dict[str, Any] = {}
        reasons: list[str] = []
        for s in watched:
            found = alerts[s]
            if found is None:
                sources[s] = {"ready": False, "state": None, "alerts": []}
                reasons.append(f"{s}: not checked yet")
                continue
            blocking = [a for a in found if ALERT_STATE[a.kind] in NOT_READY_STATES]
            sources[s] = {
                "ready": not blocking,
                "state": max((ALERT_STATE[a.kind] for a in found), key=list(State).index, default=State.HEALTHY),
                "alerts": [{"kind": a.kind.value, "message": a.message} for a in found],
            }
            reasons += [f"{s}: {a.kind.value}: {a.message}" for a in blocking]
        if not watched:
            reasons.append("no source is being captured")
        body: dict[str, Any] = {"status": "ready" if not reasons else "not_ready", "sources": sources}
        if reasons:
            body["reasons"] = reasons
        return Verdict(503 if reasons else 200, body)


PROBES: Final = Probes()
