"""The Prometheus metrics of ingest (names are a contract: docs/operations.md, ops/grafana/changelake.json).

Every metric lives in one registry, REGISTRY, served by `serve()` when `run --metrics-port N` (or
`metrics.port`) is set. Nothing here runs per change event: the committer reports once per batch,
the retry loop once per failure, and the watcher (ingest/ops/watch.py) every few seconds.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from ingest.events import ChangeEvent, SourceKind
from ingest.ops.probes import PROBES, Verdict

log = logging.getLogger(__name__)

REGISTRY: Final = CollectorRegistry(auto_describe=True)

# Bronze commits take tens of milliseconds with delta-rs, a slow object store seconds.
COMMIT_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Source commit -> bronze is about a batch window (1 s by default) when keeping up; minutes when not.
FRESHNESS_BUCKETS_S: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
WAL_STATUSES: Final = ("reserved", "extended", "unreserved", "lost")

EVENTS: Final = Counter(
    "changelake_events_total", "Change events appended to bronze.wal_events.", ["source", "writer"], registry=REGISTRY
)
WAL_BYTES: Final = Counter(
    "changelake_wal_bytes_total",
    "Postgres WAL made durable in bronze: how far the stream writer's durable LSN advanced, in bytes.",
    ["source"],
    registry=REGISTRY,
)
BATCHES: Final = Counter(
    "changelake_batches_total", "Batches committed to bronze.", ["source", "writer"], registry=REGISTRY
)
COMMIT_SECONDS: Final = Histogram(
    "changelake_commit_duration_seconds",
    "Time to make one batch durable: relation shapes, events and the position row.",
    ["source", "writer"],
    buckets=COMMIT_BUCKETS_S,
    registry=REGISTRY,
)
FRESHNESS: Final = Gauge(
    "changelake_freshness_seconds",
    "Source commit to bronze: age of the newest event of the last batch when it became durable.",
    ["source"],
    registry=REGISTRY,
)
BATCH_FRESHNESS: Final = Histogram(
    "changelake_batch_freshness_seconds",
    "Source commit to bronze of the oldest event of each batch (the worst delay in the batch).",
    ["source"],
    buckets=FRESHNESS_BUCKETS_S,
    registry=REGISTRY,
)
LAST_EVENT_TS: Final = Gauge(
    "changelake_last_event_commit_timestamp_seconds",
    "Source commit time (Unix seconds) of the newest event in bronze.",
    ["source"],
    registry=REGISTRY,
)
DURABLE_POSITION: Final = Gauge(
    "changelake_writer_durable_position",
    "A writer's durable position (Postgres: LSN in bytes; MongoDB: packed cluster time).",
    ["source", "writer"],
    registry=REGISTRY,
)
POSITION_AGE: Final = Gauge(
    "changelake_writer_position_age_seconds",
    "Seconds since a writer last raised its row in bronze.stream_positions.",
    ["source", "writer"],
    registry=REGISTRY,
)
SAFE_BOUND: Final = Gauge(
    "changelake_safe_bound_position",
    "A source's safe bound: the lowest durable position of its writers (DESIGN §4).",
    ["source"],
    registry=REGISTRY,
)
SOURCE_UP: Final = Gauge(
    "changelake_source_up", "1 if the last probe of the source server succeeded, else 0.", ["source"], registry=REGISTRY
)
SLOT_LAG: Final = Gauge(
    "changelake_slot_lag_bytes",
    "WAL the slot holds back: pg_current_wal_lsn() minus the slot's confirmed_flush_lsn.",
    ["source", "slot"],
    registry=REGISTRY,
)
SLOT_SAFE_WAL: Final = Gauge(
    "changelake_slot_safe_wal_size_bytes",
    "WAL that can still be written before the slot is invalidated (pg_replication_slots.safe_wal_size).",
    ["source", "slot"],
    registry=REGISTRY,
)
SLOT_KEEP_LIMIT: Final = Gauge(
    "changelake_slot_max_wal_keep_size_bytes",
    "The server's max_slot_wal_keep_size in bytes (absent: unlimited).",
    ["source"],
    registry=REGISTRY,
)
SLOT_WAL_STATUS: Final = Gauge(
    "changelake_slot_wal_status",
    "1 for the slot's current wal_status (reserved, extended, unreserved, lost, missing), 0 for the others.",
    ["source", "slot", "wal_status"],
    registry=REGISTRY,
)
SNAPSHOT_ROWS: Final = Gauge(
    "changelake_snapshot_rows", "Rows a running snapshot has written.", ["source", "table"], registry=REGISTRY
)
SNAPSHOT_PAGES: Final = Gauge(
    "changelake_snapshot_pages", "Pages a running snapshot has written.", ["source", "table"], registry=REGISTRY
)
SNAPSHOT_ROWS_LEFT: Final = Gauge(
    "changelake_snapshot_rows_left",
    "Rows a running snapshot still has to read (from the table's row estimate).",
    ["source", "table"],
    registry=REGISTRY,
)
SNAPSHOT_PAUSED: Final = Gauge(
    "changelake_snapshot_pause_status",
    "1 while `snapshot pause` holds a snapshot of the table (it reads no page until `snapshot resume`), else 0.",
    ["source", "table"],
    registry=REGISTRY,
)
RETRIES: Final = Counter(
    "changelake_retries_total",
    "Restarts of a source's capture from its durable position after a transient failure.",
    ["source"],
    registry=REGISTRY,
)
ERRORS: Final = Counter(
    "changelake_errors_total",
    "Failures of a source's capture by kind: transient (retried) or permanent (the run stops).",
    ["source", "kind"],
    registry=REGISTRY,
)
SCHEMA_CHANGES: Final = Counter(
    "changelake_schema_changes_total",
    "Shape changes of captured tables met by the capture, by kind (added, dropped, renamed, retyped, key_changed).",
    ["source", "table", "kind"],
    registry=REGISTRY,
)
ALERT_ACTIVE: Final = Gauge(
    "changelake_alert_active",
    "1 while an alert holds (slot_lag, slot_near_limit, wal_unreserved, slot_lost, slot_missing, "
    "writer_stale, source_unreachable, schema_changed), else 0.",
    ["source", "alert"],
    registry=REGISTRY,
)

# The error kinds of ERRORS.
TRANSIENT: Final = "transient"
PERMANENT: Final = "permanent"


# The probe paths; every other path serves the metrics, as prometheus-client does.
PROBE_PATHS: Final[dict[str, Callable[[], Verdict]]] = {
    "/healthz": PROBES.liveness,
    "/readyz": PROBES.readiness,
}


def _app() -> Callable[[dict[str, Any], Callable[..., Any]], list[bytes]]:
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        judge = PROBE_PATHS.get(environ.get("PATH_INFO", ""))
        if judge is None:
            out: list[bytes] = metrics_app(environ, start_response)
            return out
        verdict = judge()
        reason = "OK" if verdict.status == 200 else "Service Unavailable"
        start_response(f"{verdict.status} {reason}", [("Content-Type", "application/json")])
        return [verdict.encoded()]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per request, none of them keeping the process alive."""

    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    """No access log: a scrape every few seconds would drown the log."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class names it
        """Log nothing."""


def serve(port: int, address: str = "127.0.0.1") -> WSGIServer:
    """Serve /metrics, /healthz and /readyz at http://address:port from a daemon thread; OSError if taken."""
    server_class = _Server6 if ":" in address else _Server
    httpd = make_server(address, port, _app(), server_class, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics serving address=%s port=%d", address, port)
    return httpd


class WriterMetrics:
    """The per-batch metrics of one writer, with its label values bound once (a batch costs microseconds)."""

    def __init__(self, source: str, source_kind: str, writer_id: str) -> None:
        """Bind the labels of `writer_id` of `source`."""
        self.is_postgres = source_kind == SourceKind.POSTGRES
        self.events = EVENTS.labels(source, writer_id)
        self.batches = BATCHES.labels(source, writer_id)
        self.commit_seconds = COMMIT_SECONDS.labels(source, writer_id)
        self.position = DURABLE_POSITION.labels(source, writer_id)
        self.wal_bytes = WAL_BYTES.labels(source)
        self.freshness = FRESHNESS.labels(source)
        self.batch_freshness = BATCH_FRESHNESS.labels(source)
        self.last_event_ts = LAST_EVENT_TS.labels(source)

    def committed(self, events: Sequence[ChangeEvent], seconds: float) -> None:
        """A batch of `events` (position order) became durable in `seconds`."""
        self.batches.inc()
        self.commit_seconds.observe(seconds)
        if not events:
            return
        self.events.inc(len(events))
        now_us = time.time() * 1_000_000
        newest = max(events[-1].commit_ts_us, events[0].commit_ts_us)
        oldest = min(events[-1].commit_ts_us, events[0].commit_ts_us)
        self.freshness.set(max(0.0, (now_us - newest) / 1e6))
        self.batch_freshness.observe(max(0.0, (now_us - oldest) / 1e6))
        self.last_event_ts.set(newest / 1e6)

    def raised(self, before: int, after: int) -> None:
        """The writer's durable position went from `before` to `after`."""
        self.position.set(after)
        if self.is_postgres and before > 0:
            self.wal_bytes.inc(max(0, after - before))


def metric_names() -> set[str]:
    """Every metric name as queried in PromQL (counters with `_total`, histograms' series)."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        for sample in family.samples:
            names.add(sample.name)
        if family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_count", "_sum")}
        else:
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def set_wal_status(source: str, slot: str, status: str | None) -> None:
    """Mark the slot's current wal_status (None: the slot does not exist, `missing`)."""
    current = status or "missing"
    for s in (*WAL_STATUSES, "missing"):
        SLOT_WAL_STATUS.labels(source, slot, s).set(1 if s == current else 0)


def forget(gauge: Gauge, keep: Iterable[tuple[str, ...]], source: str) -> None:
    """Remove `gauge`'s series of `source` whose labels are not in `keep` (a retired snapshot, writer)."""
    keep_set = set(keep)
    for labels in list(gauge._metrics):  # no public listing of a metric's children
        if labels[0] == source and labels not in keep_set:
            gauge.remove(*labels)
