"""Watches one source while ingest runs: slot health and bronze positions into metrics and alert log lines.

A daemon thread polls every POLL_INTERVAL_S, apart from the capture: it never touches the decode
loop, and its queries (one on the source, one read of bronze.stream_positions) cost the stream
nothing but a moment of the GIL. Schema changes are events the capture reports (SHAPE_CHANGES):
each is counted and logged when met, and holds a `schema_changed` alert for SCHEMA_CHANGE_HOLD_S.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

from ingest.config import AlertsConfig
from ingest.errors import IngestError
from ingest.events import WriterKind, WriterPosition
from ingest.ops import metrics
from ingest.ops.health import Alert, AlertKind, SlotState, slot_alerts, writer_alerts
from ingest.ops.probes import PROBES
from ingest.positions import SnapshotProgress, safe_bound

log = logging.getLogger(__name__)

POLL_INTERVAL_S: Final = 5.0  # slot health; Postgres needs no more than a query every few seconds
POSITIONS_INTERVAL_S: Final = 10.0  # bronze.stream_positions (snapshot progress, position age, safe bound)
ALERT_REPEAT_S: Final = 300.0  # an alert that holds is logged again this often
STOP_WAIT_S: Final = 5.0  # how long a stopping run waits for a poll in progress
# How long a schema change holds its `schema_changed` alert: a change is an event, not a state, and
# the alert must outlast a few watcher polls and Prometheus scrapes to be seen, then clear by itself.
SCHEMA_CHANGE_HOLD_S: Final = 600.0

PositionRows = Sequence[tuple[WriterPosition, datetime]]
# Told of each alert transition: (source, alert, started); alerts.webhook posts it.
Notify = Callable[[str, Alert, bool], None]


@dataclass(frozen=True, slots=True)
class ShapeChange:
    """One change of a captured table's shape: its kinds (added, dropped, ...) with their columns."""

    source: str
    table: str
    kinds: Mapping[str, Sequence[str]]
    at: float  # time.monotonic() when the capture met it

    def alert(self) -> Alert:
        """The `schema_changed` alert this change holds."""
        return shape_change_alert(self.table, self.kinds)


def shape_change_alert(table: str, kinds: Mapping[str, Sequence[str]]) -> Alert:
    """The `schema_changed` alert of a change of `table`'s shape: its kinds with their columns."""
    what = "; ".join(f"{k} {', '.join(cols)}" for k, cols in kinds.items())
    return Alert(AlertKind.SCHEMA_CHANGED, f"table {table} changed shape: {what}", table=table)


class ShapeChanges:
    """The schema changes the captures of this process met, for the watchers (thread-safe).

    Responsibilities: count each change in changelake_schema_changes_total (once per kind), log it
    in one structured line, and keep the latest change of each table for SCHEMA_CHANGE_HOLD_S so
    the watcher of its source holds a `schema_changed` alert. A table that changes again while its
    alert holds extends it (the new change is counted and logged; the alert's notice is not sent again).
    """

    def __init__(self) -> None:
        """No change met yet."""
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str], ShapeChange] = {}

    def record(self, source: str, table: str, kinds: Mapping[str, Sequence[str]]) -> None:
        """A captured table of `source` changed shape; `kinds` maps each kind to its columns (none: no report)."""
        if not kinds:
            return
        for kind in kinds:
            metrics.SCHEMA_CHANGES.labels(source, table, kind).inc()
        change = ShapeChange(source, table, dict(kinds), time.monotonic())
        log.warning(
            "schema change source=%s table=%s kinds=%s %s",
            source,
            table,
            ",".join(kinds),
            change.alert().message,
        )
        with self._lock:
            self._latest[(source, table)] = change

    def alerts(self, source: str, hold_s: float = SCHEMA_CHANGE_HOLD_S) -> list[Alert]:
        """The `schema_changed` alerts of `source` still held (changes less than `hold_s` old)."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, c in self._latest.items() if k[0] == source and now - c.at >= hold_s]:
                del self._latest[key]
            return [c.alert() for (s, _t), c in sorted(self._latest.items()) if s == source]


SHAPE_CHANGES: Final = ShapeChanges()


class SlotReader(Protocol):
    """What the watcher needs of a source's slot probe (Postgres: sources/postgres/slot_probe.py)."""

    def read(self) -> SlotState:
        """The slot now; IngestError if the server does not answer."""

    def close(self) -> None:
        """Release the probe's connection."""


class Watcher:
    """Owns the watch thread of one source.

    Responsibilities: probe the slot (if the source has one) and read the source's writer rows,
    set the slot, position, safe-bound and snapshot metrics, judge alerts with the same rules as
    `status --json` (ingest/ops/health.py), and log each alert at WARNING when it starts (and every
    ALERT_REPEAT_S while it holds) and at INFO when it clears.
    """

    def __init__(
        self,
        source: str,
        alerts: AlertsConfig,
        positions: Callable[[], PositionRows],
        probe: SlotReader | None = None,
        interval_s: float = POLL_INTERVAL_S,
        positions_interval_s: float = POSITIONS_INTERVAL_S,
        notify: Notify | None = None,
        schema_hold_s: float = SCHEMA_CHANGE_HOLD_S,
    ) -> None:
        """Watch `source`; `positions` reads its writer rows from bronze (empty before bronze exists).

        `notify` hears when each alert starts and ends (once per transition, not per poll);
        `schema_hold_s`: how long a schema change holds its alert (seconds).
        """
        self.schema_hold_s = schema_hold_s
        self.notify = notify
        self.source = source
        self.cfg = alerts
        self.positions = positions
        self.probe = probe
        self.interval_s = interval_s
        self.positions_interval_s = positions_interval_s
        self.alerts: list[Alert] = []
        self._writer_alerts: list[Alert] = []
        self._last_positions = -float("inf")
        self._logged: dict[tuple[AlertKind, str | None], float] = {}
        self._started: dict[tuple[AlertKind, str | None], Alert] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name=f"watch-{source}", daemon=True)
        for kind in AlertKind:
            metrics.ALERT_ACTIVE.labels(source, kind.value).set(0)

    def start(self) -> Watcher:
        """Start polling (the first poll is at once); `/readyz` waits for its first verdict."""
        PROBES.watching(self.source)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and close the probe."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_WAIT_S)
        if self.probe is not None and not self._thread.is_alive():
            # A probe still waiting on a server that does not answer is left to the daemon thread:
            # closing a connection under a running query is not safe.
            self.probe.close()
        PROBES.forget(self.source)

    def _work(self) -> None:
        while True:
            try:
                self.poll()
            except Exception as e:  # a failed poll is reported and the next one tries again
                log.warning("watch source=%s poll failed error=%s: %s", self.source, type(e).__name__, e)
            if self._stop.wait(self.interval_s):
                return

    def poll(self) -> None:
        """One round: probe, maybe read positions, set metrics, log alert changes."""
        found: list[Alert] = []
        if self.probe is not None:
            try:
                slot = self.probe.read()
            except IngestError as e:
                metrics.SOURCE_UP.labels(self.source).set(0)
                found.append(Alert(AlertKind.SOURCE_UNREACHABLE, str(e)))
            else:
                metrics.SOURCE_UP.labels(self.source).set(1)
                self._slot_metrics(slot)
                found += slot_alerts(slot, self.cfg)
        if time.monotonic() - self._last_positions >= self.positions_interval_s:
            self._last_positions = time.monotonic()
            rows = self.positions()
            now = datetime.now(UTC)
            self._position_metrics(rows, now)
            self._writer_alerts = writer_alerts(rows, self.cfg, now)
        self._set_alerts(found + self._writer_alerts + SHAPE_CHANGES.alerts(self.source, self.schema_hold_s))

    def _slot_metrics(self, slot: SlotState) -> None:
        metrics.set_wal_status(self.source, slot.slot, slot.wal_status if slot.exists else None)
        lag = metrics.SLOT_LAG.labels(self.source, slot.slot)
        safe = metrics.SLOT_SAFE_WAL.labels(self.source, slot.slot)
        lag.set(slot.lag_bytes if slot.lag_bytes is not None else float("nan"))
        safe.set(slot.safe_wal_size_bytes if slot.safe_wal_size_bytes is not None else float("nan"))
        keep = metrics.SLOT_KEEP_LIMIT.labels(self.source)
        keep.set(slot.max_wal_keep_size_bytes if slot.max_wal_keep_size_bytes is not None else float("nan"))

    def _position_metrics(self, rows: PositionRows, now: datetime) -> None:
        for pos, updated in rows:
            metrics.POSITION_AGE.labels(self.source, pos.writer_id).set((now - updated).total_seconds())
            metrics.DURABLE_POSITION.labels(self.source, pos.writer_id).set(pos.durable_lsn)
        if rows:  # a retired writer's series go; none before bronze exists (the committer may have set one)
            writers = [(self.source, p.writer_id) for p, _ in rows]
            metrics.forget(metrics.POSITION_AGE, writers, self.source)
            metrics.forget(metrics.DURABLE_POSITION, writers, self.source)
        bound = safe_bound(p for p, _ in rows)
        if bound is not None:
            metrics.SAFE_BOUND.labels(self.source).set(bound)
        tables = []
        paused: dict[str, bool] = {}
        for pos, _ in rows:
            if pos.writer_kind is not WriterKind.SNAPSHOT:
                continue
            p = SnapshotProgress.from_row(pos)
            tables.append((self.source, p.table))
            paused[p.table] = paused.get(p.table, False) or p.paused
            metrics.SNAPSHOT_PAUSED.labels(self.source, p.table).set(int(paused[p.table]))
            metrics.SNAPSHOT_ROWS.labels(self.source, p.table).set(p.rows)
            metrics.SNAPSHOT_PAGES.labels(self.source, p.table).set(p.pages)
            left = max(0, p.estimated_rows - p.rows) if p.estimated_rows is not None else float("nan")
            metrics.SNAPSHOT_ROWS_LEFT.labels(self.source, p.table).set(left)
        for gauge in (
            metrics.SNAPSHOT_ROWS,
            metrics.SNAPSHOT_PAGES,
            metrics.SNAPSHOT_ROWS_LEFT,
            metrics.SNAPSHOT_PAUSED,
        ):
            metrics.forget(gauge, tables, self.source)

    def _set_alerts(self, found: list[Alert]) -> None:
        now = time.monotonic()
        active = {(a.kind, a.subject): a for a in found}
        for kind in AlertKind:
            metrics.ALERT_ACTIVE.labels(self.source, kind.value).set(1 if any(k == kind for k, _ in active) else 0)
        for key, a in active.items():
            last = self._logged.get(key)
            if last is None or now - last >= ALERT_REPEAT_S:
                log.warning("alert source=%s alert=%s %s", self.source, a.kind.value, a.message)
                self._logged[key] = now
        for key in [k for k in self._logged if k not in active]:
            log.info("alert cleared source=%s alert=%s", self.source, key[0].value)
            del self._logged[key]
        self._tell(active)
        self.alerts = found
        PROBES.judged(self.source, found)

    def _tell(self, active: dict[tuple[AlertKind, str | None], Alert]) -> None:
        """Notify each alert that started and each that ended since the last poll."""
        if self.notify is None:
            return
        for key, a in active.items():
            if key not in self._started:
                self._started[key] = a
                self.notify(self.source, a, True)
        for key in [k for k in self._started if k not in active]:
            self.notify(self.source, self._started.pop(key), False)
