"""Wiring in one place: which sources and which bronze writer, for each CLI command."""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass
from types import FrameType

from ingest.bronze.schemas import STREAM_POSITIONS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.config import Config, MongoSource, PostgresSource
from ingest.errors import ConfigError, IngestError
from ingest.events import WriterKind, WriterPosition, int_to_lsn
from ingest.progress import Progress

log = logging.getLogger(__name__)

# The decoder thread holds the GIL almost all the time; the commit thread needs it for short
# stretches between delta-rs calls (building Arrow columns), and by default waits up to 5 ms for
# each hand-over. 1 ms: `run --once` over 1M changes 7.5-7.6 s instead of 8.1-9.6 s (0.5 ms: 8.0 s;
# 2 ms: 8.4 s), bench/ingest_throughput.py.
GIL_SWITCH_INTERVAL_S = 0.001


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


def _writer(cfg: Config) -> BronzeWriter:
    return BronzeWriter(cfg.warehouse_uri, cfg.storage_options or None)


def _selected(cfg: Config, source: str | None) -> list[PostgresSource]:
    chosen = [cfg.source(source)] if source else list(cfg.sources)
    return [s for s in chosen if isinstance(s, PostgresSource)]


def _selected_mongo(cfg: Config, source: str | None) -> list[MongoSource]:
    chosen = [cfg.source(source)] if source else list(cfg.sources)
    return [s for s in chosen if isinstance(s, MongoSource)]


def run(cfg: Config, once: bool, source: str | None) -> list[str]:
    """Capture the selected sources into bronze; returns one summary line per source."""
    from ingest.sources.postgres.capture import PostgresCapture, prepare_source

    sources = _selected(cfg, source)
    mongo = _selected_mongo(cfg, source)
    if len(sources) + len(mongo) > 1 and not once:
        raise ConfigError("continuous run captures one source per process; pass --source NAME")
    for s in sources:  # fail fast on the source before touching bronze
        prepare_source(s).close()
    for m in mongo:
        _setup_mongo(m)
    writer = _writer(cfg)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    stop = _StopFlag()
    lines = []
    for s in sources:
        progress = Progress(s.name)
        cap = PostgresCapture(s, cfg.batch, writer, progress)
        cap.run(once=once, should_stop=stop)
        lines.append(
            progress.done()
            + f", durable at {int_to_lsn(cap.durable_lsn)}"
            + (f", {cap.skipped} re-delivered events skipped" if cap.skipped else "")
        )
        for task in cap.snapshotter.completed:
            lines.append(f"{s.name}: snapshot of {task.table} completed, {task.rows:,} rows in {task.pages} pages")
    lines += [_run_mongo(m, cfg, writer, once, stop) for m in mongo]
    return lines


def setup(cfg: Config, source: str | None) -> list[str]:
    """Check each selected source and create its publication and slot."""
    from ingest.sources.postgres.capture import prepare_source

    lines = []
    for s in _selected(cfg, source):
        admin = prepare_source(s)
        h = admin.slot_health()
        admin.close()
        lines.append(
            f"{s.name}: publication {s.publication_name} and slot {s.slot_name} ready "
            f"(slot at {int_to_lsn(h.confirmed_flush_lsn or 0)})"
        )
    lines += [_setup_mongo(m) for m in _selected_mongo(cfg, source)]
    return lines


def snapshot(cfg: Config, table: str, source: str | None) -> str:
    """Register an on-demand snapshot of `table` (DESIGN §5); returns what was done."""
    from ingest.sources.postgres.snapshot import request_snapshot

    candidates = [s for s in _selected(cfg, source) if table in s.tables]
    if not candidates:
        raise ConfigError(f"no configured source captures {table!r} (list it under sources.<n>.tables)")
    if len(candidates) > 1:
        names = ", ".join(s.name for s in candidates)
        raise ConfigError(f"{table} is captured by several sources ({names}); pass --source NAME")
    src = candidates[0]
    task = request_snapshot(src, _writer(cfg), table)
    return (
        f"{src.name}: snapshot of {table} requested (writer {task.writer_id}, starting at "
        f"{int_to_lsn(task.durable_lsn)}); a running `changelake-ingest run` starts it within seconds, "
        "otherwise the next `run` (or `run --once`) does"
    )


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What `status` prints for one source."""

    source: str
    lines: list[str]


def status(cfg: Config, source: str | None) -> list[SourceStatus]:
    """Positions, safe bound, slot lag and WAL status for the selected sources."""
    from ingest.sources.postgres.admin import PostgresAdmin

    sources = _selected(cfg, source)
    writer = _writer(cfg)
    out = []
    for s in sources:
        lines: list[str] = []
        try:
            admin = PostgresAdmin(s)
            h = admin.slot_health()
            admin.close()
            lag = f"{h.lag_bytes:,} bytes" if h.lag_bytes is not None else "n/a (no slot)"
            confirmed = int_to_lsn(h.confirmed_flush_lsn) if h.confirmed_flush_lsn is not None else "n/a"
            lines.append(
                f"slot {h.slot}: confirmed {confirmed}, server at {int_to_lsn(h.current_wal_lsn)}, "
                f"lag {lag}, wal_status {h.wal_status or 'n/a'}, "
                f"{'active pid ' + str(h.active_pid) if h.active_pid else 'inactive'}"
            )
            if h.wal_status == "lost":
                lines.append("  SLOT INVALIDATED: run `changelake-ingest run` for recovery steps")
        except IngestError as e:
            lines.append(f"source unreachable: {e}")
        if writer.exists(STREAM_POSITIONS_TABLE):
            rows = writer.positions(s.name)
            for pos, updated in sorted(rows, key=lambda r: r[0].writer_id):
                lines.append(
                    f"writer {pos.writer_id} ({pos.writer_kind.value}): durable {int_to_lsn(pos.durable_lsn)}, "
                    f"updated {updated:%Y-%m-%d %H:%M:%S}"
                )
                if pos.writer_kind is WriterKind.SNAPSHOT:
                    lines.append("  " + _snapshot_progress(pos))
            if rows:
                lines.append(f"safe bound: {int_to_lsn(min(p.durable_lsn for p, _ in rows))}")
            last = writer.max_commit_time(s.name)
            lines.append(f"last commit in bronze: {last:%Y-%m-%d %H:%M:%S} UTC" if last else "no events in bronze yet")
        else:
            lines.append("bronze not created yet (run `changelake-ingest run` first)")
        out.append(SourceStatus(s.name, lines))
    out += [SourceStatus(m.name, _status_mongo(m, writer)) for m in _selected_mongo(cfg, source)]
    return out


def _snapshot_progress(pos: WriterPosition) -> str:
    """One line of a snapshot writer's progress from its resume token."""
    import json

    try:
        t = json.loads(pos.resume_token or "{}")
    except ValueError:
        return "snapshot progress unreadable"
    rows, est, pages, rate = t.get("rows") or 0, t.get("estimated_rows"), t.get("pages") or 0, t.get("rows_per_s")
    if not pages:
        return f"snapshot of {t.get('table')}: waiting to start"
    left = max(0, est - rows) if isinstance(est, int) else None
    parts = [f"snapshot of {t.get('table')}: {rows:,} rows in {pages} pages"]
    if left is not None:
        parts.append(f"~{left:,} rows left (estimate)")
    if rate:
        parts.append(f"{rate:,.0f} rows/s")
        if left is not None:
            parts.append(f"~{left / rate:,.0f} s to go")
    return ", ".join(parts)


# -- MongoDB sources (docs/mongodb.md) ---------------------------------------------------------


def _run_mongo(src: MongoSource, cfg: Config, writer: BronzeWriter, once: bool, stop: _StopFlag) -> str:
    from ingest.sources.mongodb.capture import MongoCapture
    from ingest.sources.mongodb.changes import unpack_cluster_time

    progress = Progress(src.name)
    cap = MongoCapture(src, cfg.batch, writer, progress)
    cap.run(once=once, should_stop=stop)
    ts = unpack_cluster_time(cap.durable_lsn)
    return (
        progress.done()
        + f", durable at clusterTime {ts.time}.{ts.inc}"
        + (f", snapshots completed: {', '.join(cap.snapshots_done)}" if cap.snapshots_done else "")
        + (f", {cap.skipped} re-delivered events skipped" if cap.skipped else "")
    )


def _setup_mongo(src: MongoSource) -> str:
    """Check that the source is reachable and has a cluster time."""
    from ingest.sources.mongodb.source import cluster_time, collections, connect

    client = connect(src)
    try:
        ts = cluster_time(client)
        names = collections(client, src)
    finally:
        client.close()
    return f"{src.name}: MongoDB {src.database} reachable at clusterTime {ts.time}.{ts.inc}; collections: " + (
        ", ".join(names) or "none yet"
    )


def _status_mongo(src: MongoSource, writer: BronzeWriter) -> list[str]:
    from ingest.sources.mongodb.capture import positions_summary
    from ingest.sources.mongodb.source import cluster_time, connect

    lines: list[str] = []
    try:
        client = connect(src)
        try:
            ts = cluster_time(client)
        finally:
            client.close()
        lines.append(f"server clusterTime {ts.time}.{ts.inc}")
    except IngestError as e:
        lines.append(f"source unreachable: {e}")
    if not writer.exists(STREAM_POSITIONS_TABLE):
        return [*lines, "bronze not created yet (run `changelake-ingest run` first)"]
    return lines + positions_summary(writer, src.name)
