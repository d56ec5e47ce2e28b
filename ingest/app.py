"""Wiring in one place: which sources and which bronze writer, for each CLI command."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from ingest.bronze.schemas import SOURCE_RELATIONS_TABLE, STREAM_POSITIONS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.capture.retry import retrying
from ingest.config import RUN_ONCE_MAX_SECONDS, Config, MongoSource, PostgresSource, SourceConfig
from ingest.errors import ConfigError, IngestError
from ingest.events import WriterPosition
from ingest.ops import metrics
from ingest.ops.health import Alert, AlertKind, SourceHealth, report, slot_alerts, writer_alerts
from ingest.ops.probes import PROBES
from ingest.ops.watch import SlotReader, Watcher
from ingest.ops.webhook import WebhookNotifier
from ingest.sources.base import Source, bronze_status

if TYPE_CHECKING:
    from ingest.ops.lineage import Lineage
    from ingest.verify import Run

log = logging.getLogger(__name__)
T = TypeVar("T")

# The decoder thread holds the GIL almost all the time; the commit thread needs it for short
# stretches between delta-rs calls (building Arrow columns), and by default waits up to 5 ms for
# each hand-over. 1 ms: `run --once` over 1M changes 7.5-7.6 s instead of 8.1-9.6 s (0.5 ms: 8.0 s;
# 2 ms: 8.4 s), bench/ingest_throughput.py.
GIL_SWITCH_INTERVAL_S = 0.001


def _warm_arrow_conversion() -> None:
    """Have pyarrow's one-time pandas probe run on a side thread while the start waits on the servers.

    The first `pa.array` of a process imports pandas (pyarrow asks whether its input is a pandas
    object): 0.25-0.3 s of CPU that otherwise lands in the commit thread's first batch, on the way
    to the first commit. Done here it overlaps the source checks, the slot and bronze's reads,
    where the main thread mostly waits; the commit thread's own call then finds it done (the
    import lock makes it wait for a probe still running, never run it twice).
    """
    import pyarrow as pa

    threading.Thread(target=pa.array, args=([],), name="warm-arrow", daemon=True).start()


class _StopFlag:
    """Set by SIGINT/SIGTERM: the capture finishes its batch, acknowledges and exits."""

    def __init__(self) -> None:
        self.stop = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        log.warning("signal=%s stopping after the current batch", signal.Signals(signum).name)
        self.stop = True

    def __call__(self) -> bool:
        return self.stop


def adapter(src: SourceConfig) -> Source:
    """The adapter of a configured source, by kind (imported on use: a command loads one driver)."""
    if isinstance(src, PostgresSource):
        from ingest.sources.postgres.adapter import PostgresAdapter

        return PostgresAdapter(src)
    if isinstance(src, MongoSource):
        from ingest.sources.mongodb.adapter import MongoAdapter

        return MongoAdapter(src)
    raise ConfigError(f"sources.{src.name}: no adapter for kind {src.kind!r}")  # the config allows no other


def slot_reader(src: SourceConfig) -> SlotReader | None:
    """The slot probe of a source that has a slot (Postgres), for the watcher and `status --json`."""
    if isinstance(src, PostgresSource):
        from ingest.sources.postgres.slot_probe import SlotProbe

        return SlotProbe(src)
    return None


def _selected(cfg: Config, source: str | None) -> list[Source]:
    return [adapter(s) for s in ([cfg.source(source)] if source else cfg.sources)]


def _positions(writer: BronzeWriter, source: str) -> list[tuple[WriterPosition, datetime]]:
    """The source's writer rows, none before bronze exists."""
    return writer.positions(source) if writer.exists(STREAM_POSITIONS_TABLE) else []


def _serve_metrics(cfg: Config, port: int | None) -> None:
    port = cfg.metrics.port if port is None else port
    if not port:
        return
    try:
        metrics.serve(port, cfg.metrics.address)
    except OSError as e:
        raise ConfigError(f"metrics.port {port}: cannot serve metrics on {cfg.metrics.address}: {e.strerror}") from None


def _final_positions(writer: BronzeWriter, source: str) -> list[WriterPosition]:
    """The source's writer positions for its lineage event; none if bronze cannot be read (the run's own error wins)."""
    try:
        return [p for p, _ in _positions(writer, source)]
    except Exception as e:  # delta-rs errors too: a lineage facet must not replace the run's own outcome
        log.warning("lineage positions unreadable source=%s error=%s: %s", source, type(e).__name__, e)
        return []


def _lineage(cfg: Config) -> Lineage | None:
    """The OpenLineage emitter of `lineage:` (imported on use: the client is not needed otherwise)."""
    if cfg.lineage is None:
        return None
    from ingest.ops.lineage import Lineage

    return Lineage(cfg.lineage, cfg.warehouse_uri)


def _writer(cfg: Config) -> BronzeWriter:
    return BronzeWriter(cfg.warehouse_uri, cfg.storage_options or None)


def run(cfg: Config, once: bool, source: str | None, metrics_port: int | None = None) -> list[str]:
    """Capture the selected sources into bronze; returns the runs' summary lines.

    `metrics_port` (else `metrics.port`; 0: none) serves Prometheus metrics while it runs; a watcher
    thread per source keeps slot and position metrics current and logs alerts (ingest/ops/watch.py).
    """
    sources = _selected(cfg, source)
    if len(sources) > 1 and not once:
        raise ConfigError("continuous run captures one source per process; pass --source NAME")
    _warm_arrow_conversion()
    stop = _StopFlag()
    max_seconds = cfg.retry.max_seconds or (RUN_ONCE_MAX_SECONDS if once else None)

    def retried(attempt: Callable[[], T], s: Source, should_stop: Callable[[], bool] = stop) -> T:
        # A source that is down is waited for (ingest/capture/retry.py); a permanent error is not.
        return retrying(attempt, s.name, should_stop, max_seconds, cfg.retry.max_delay_seconds)

    PROBES.liveness_s = cfg.metrics.liveness_seconds
    _serve_metrics(cfg, metrics_port)
    for s in sources:  # fail fast on a misconfigured source before touching bronze
        retried(s.check, s)
    writer = _writer(cfg)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    lines: list[str] = []
    watched = _writer(cfg)  # the watcher's own table handles: its reads never touch the committer's
    lineage = _lineage(cfg)
    notifier = WebhookNotifier(cfg.alerts.webhook) if cfg.alerts.webhook is not None else None
    notify = notifier.notify if notifier is not None else None
    try:
        for s in sources:
            probe = slot_reader(cfg.source(s.name))
            watcher = Watcher(s.name, cfg.alerts, partial(_positions, watched, s.name), probe, notify=notify)
            watcher.start()
            beating = PROBES.beating(s.name, stop)  # every stop question the loop asks is a heartbeat
            run_lineage = lineage.start(cfg.source(s.name)) if lineage is not None else None
            try:
                lines += retried(partial(s.run, cfg.batch, writer, once, beating), s, beating)
            except BaseException as e:
                if run_lineage is not None:
                    run_lineage.fail(e, _final_positions(watched, s.name), s.format_position)
                raise
            else:
                if run_lineage is not None:
                    run_lineage.complete(_final_positions(watched, s.name), s.format_position)
            finally:
                watcher.stop()
    finally:
        if notifier is not None:
            notifier.close()
    return lines


def setup(cfg: Config, source: str | None) -> list[str]:
    """Check each selected source and create what it needs (Postgres: publication and slot)."""
    return [s.setup() for s in _selected(cfg, source)]


def snapshot(cfg: Config, table: str, source: str | None, where: str | None = None) -> str:
    """Register an on-demand snapshot of `table`, of the rows `where` selects (DESIGN §5); returns what was done."""
    candidates = [s for s in _selected(cfg, source) if s.captures(table)]
    if not candidates:
        raise ConfigError(
            f"no configured source captures {table!r} (list it under sources.<n>.tables, or .collections)"
        )
    if len(candidates) > 1:
        names = ", ".join(s.name for s in candidates)
        raise ConfigError(f"{table} is captured by several sources ({names}); pass --source NAME")
    src = candidates[0]
    writer_id, start = src.request_snapshot(_writer(cfg), table, where)
    what = f"{table} where {where}" if where else table
    return (
        f"{src.name}: snapshot of {what} requested (writer {writer_id}, starting at "
        f"{src.format_position(start)}); a running `changelake-ingest run` starts it within seconds, "
        "otherwise the next `run` (or `run --once`) does"
    )


def pause_snapshot(cfg: Config, target: str, source: str | None, paused: bool) -> str:
    """Pause (or resume) the snapshots of `target`, a table or a snapshot id (docs/snapshots.md).

    Kept in bronze (an appended snapshot_control record): it holds across restarts. MongoDB snapshots are
    refused: their runner does not read the pause.
    """
    from ingest.capture.snapshots import set_paused, snapshots_of

    writer = _writer(cfg)
    names = [source] if source else [s.name for s in cfg.sources]
    if not writer.exists(STREAM_POSITIONS_TABLE):
        names = []
    if any(cfg.source(n).kind == "mongodb" and snapshots_of(writer, n, target) for n in names):
        raise ConfigError(f"a MongoDB snapshot cannot be paused; `snapshot cancel {target}` (run stopped) removes it")
    found = {n: set_paused(writer, n, target, paused) for n in names}
    if not any(found.values()):
        raise ConfigError(f"no snapshot of {target} is registered (sources: {', '.join(names)})")
    verb = "paused" if paused else "resumed"
    return "; ".join(
        f"{n}: snapshot {p.snapshot_id} of {p.table} {verb} at {p.rows:,} rows, {p.pages} pages"
        for n, ps in found.items()
        for p in ps
    )


def cancel_snapshot(cfg: Config, table: str, source: str | None) -> str:
    """Remove the queued snapshot requests of `table` or a snapshot id (docs/snapshots.md); what was done.

    Looked up in bronze, not in the config: a request for a table no longer configured can go too.
    """
    from ingest.capture.snapshots import cancel_requests

    writer = _writer(cfg)
    names = [source] if source else [s.name for s in cfg.sources]
    done = {n: cancel_requests(writer, n, table) for n in names} if writer.exists(STREAM_POSITIONS_TABLE) else {}
    if not any(done.values()):
        raise ConfigError(f"no queued snapshot of {table} (sources: {', '.join(names)})")
    return "; ".join(f"{n}: {k} queued snapshot(s) of {table} cancelled" for n, k in done.items() if k)


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What `status` prints for one source."""

    source: str
    lines: list[str]


def status(cfg: Config, source: str | None) -> list[SourceStatus]:
    """The source server's state, then its writers' positions, safe bound and last commit in bronze."""
    writer = _writer(cfg)
    out = []
    for s in _selected(cfg, source):
        try:
            lines = s.source_status()
        except IngestError as e:
            lines = [f"source unreachable: {e}"]
        out.append(SourceStatus(s.name, lines + bronze_status(writer, s.name, s.format_position)))
    return out


def source_health(cfg: Config, src: Source, writer: BronzeWriter, now: datetime) -> SourceHealth:
    """One source's health: the server (slot) probed once, its writer rows and last commit read from bronze."""
    src_cfg = cfg.source(src.name)
    probe = slot_reader(src_cfg)
    slot, error = None, None
    try:
        if probe is not None:
            slot = probe.read()
        else:
            src.source_status()
    except IngestError as e:
        error = str(e)
    finally:
        if probe is not None:
            probe.close()
    alerts: list[Alert] = []
    if error is not None:
        alerts.append(Alert(AlertKind.SOURCE_UNREACHABLE, error))
    if slot is not None:
        alerts += slot_alerts(slot, cfg.alerts)
    rows = _positions(writer, src.name)
    alerts += writer_alerts(rows, cfg.alerts, now)
    if isinstance(src_cfg, PostgresSource) and writer.exists(SOURCE_RELATIONS_TABLE):
        alerts += _recorded_schema_changes(src_cfg, writer, now)
    last = writer.max_commit_time(src.name) if rows else None
    return SourceHealth(src.name, src_cfg.kind, now, error, slot, tuple(rows), last, tuple(alerts))


def _recorded_schema_changes(src: PostgresSource, writer: BronzeWriter, now: datetime) -> list[Alert]:
    """The `schema_changed` alerts bronze's recorded shapes hold now (held as long as a running run holds one)."""
    from ingest.ops.watch import SCHEMA_CHANGE_HOLD_S
    from ingest.sources.postgres.schema_changes import recorded_shape_change_alerts

    def excluded(table: str) -> list[str]:
        rules = src.columns.get(table)
        return rules.exclude_columns if rules is not None else []

    since = now - timedelta(seconds=SCHEMA_CHANGE_HOLD_S)
    return recorded_shape_change_alerts(writer.shape_history(src.name), excluded, since)


def status_report(cfg: Config, source: str | None) -> dict[str, Any]:
    """`status --json`: the document of docs/operations.md; its `exit_code` is the command's exit code."""
    writer = _writer(cfg)
    now = datetime.now(UTC)
    healths = [(source_health(cfg, s, writer, now), s.format_position) for s in _selected(cfg, source)]
    return report(healths, now)


def verify(
    cfg: Config,
    tables: list[str],
    source: str | None,
    wait_s: float,
    range_rows: int,
    max_keys: int,
    show_progress: bool,
) -> tuple[Run, Callable[[str, int], str]]:
    """Compare tables with silver at one position of their source (docs/verify.md); the run is recorded.

    `tables` empty: every table (every collection in scope) of the selected sources. Returns the
    run and how to print a source's position.
    """
    from ingest.verify import Run, record_run

    chosen = _selected(cfg, source)
    adapters = {s.name: s for s in chosen}
    by_source: dict[str, list[str]] = {}
    for table in tables:
        candidates = [s for s in chosen if s.captures(table)]
        if not candidates:
            raise ConfigError(
                f"no configured source captures {table!r} (list it under sources.<n>.tables, or .collections)"
            )
        if len(candidates) > 1:
            names = ", ".join(s.name for s in candidates)
            raise ConfigError(f"{table} is captured by several sources ({names}); pass --source NAME")
        by_source.setdefault(candidates[0].name, []).append(table)
    if not tables:
        by_source = {s.name: s.captured_tables() for s in chosen}
    writer = _writer(cfg)
    run = Run()
    for name, listed in by_source.items():
        run.results += adapters[name].verify(writer, listed, wait_s, range_rows, max_keys, show_progress, run.run_id)
    run.finished_at = datetime.now(UTC)
    record_run(writer, run)
    formats = {s.name: s.format_position for s in chosen}
    return run, lambda src, pos: formats[src](pos)
