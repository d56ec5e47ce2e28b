"""The watcher turns slot and position readings into metrics and one WARNING per alert (not one per poll)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from ingest.config import AlertsConfig
from ingest.errors import SourceUnavailableError
from ingest.events import WriterKind, WriterPosition
from ingest.ops.health import AlertKind, SlotState
from ingest.ops.metrics import REGISTRY
from ingest.ops.watch import Watcher
from ingest.positions import SnapshotProgress

GB = 1 << 30


class Readings:
    """A slot whose state the test sets (the real probe is exercised in tests/integration/test_metrics.py)."""

    def __init__(self) -> None:
        self.lag: int | None = 0
        self.down = False
        self.closed = False

    def read(self) -> SlotState:
        if self.down:
            raise SourceUnavailableError("source 'w': cannot connect: connection refused")
        assert self.lag is not None
        return SlotState(
            "slot_w", True, 100 * GB - self.lag, 100 * GB, "reserved", 10 * GB - self.lag, 10 * GB, 7, self.lag
        )

    def close(self) -> None:
        self.closed = True


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_alerts_are_logged_when_they_start_and_clear(caplog: pytest.LogCaptureFixture) -> None:
    slot = Readings()
    old = datetime.now(UTC) - timedelta(seconds=120)
    progress = SnapshotProgress("public.t", "x1", pages=3, rows=30, estimated_rows=50)
    rows = [
        (WriterPosition("w_src", "stream", WriterKind.STREAM, 900, 901), old),
        (WriterPosition("w_src", "snapshot-x1", WriterKind.SNAPSHOT, 800, 800, progress.to_json()), datetime.now(UTC)),
    ]
    w = Watcher("w_src", AlertsConfig(max_position_age_seconds=60), lambda: rows, slot, positions_interval_s=0)
    caplog.set_level(logging.INFO, logger="ingest.ops.watch")
    w.poll()
    assert [a.kind for a in w.alerts] == [AlertKind.WRITER_STALE]
    assert value("changelake_slot_lag_bytes", source="w_src", slot="slot_w") == 0
    assert value("changelake_slot_wal_status", source="w_src", slot="slot_w", wal_status="reserved") == 1
    assert value("changelake_slot_wal_status", source="w_src", slot="slot_w", wal_status="lost") == 0
    assert value("changelake_safe_bound_position", source="w_src") == 800
    assert value("changelake_snapshot_rows_left", source="w_src", table="public.t") == 20
    assert value("changelake_snapshot_pages", source="w_src", table="public.t") == 3
    assert 119 < (value("changelake_writer_position_age_seconds", source="w_src", writer="stream") or 0) < 130
    assert value("changelake_alert_active", source="w_src", alert="writer_stale") == 1
    assert value("changelake_alert_active", source="w_src", alert="slot_near_limit") == 0

    slot.lag = 9 * GB
    w.poll()
    w.poll()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # each alert once, not once per poll
    assert "alert=writer_stale" in warnings[0] and "alert=slot_near_limit" in warnings[1]
    assert value("changelake_alert_active", source="w_src", alert="slot_near_limit") == 1

    slot.down = True
    rows[:] = [(rows[0][0], datetime.now(UTC))]  # the snapshot completed; the stream moved
    w.poll()
    assert [a.kind for a in w.alerts] == [AlertKind.SOURCE_UNREACHABLE]
    assert value("changelake_source_up", source="w_src") == 0
    assert value("changelake_alert_active", source="w_src", alert="slot_near_limit") == 0
    assert value("changelake_snapshot_rows", source="w_src", table="public.t") is None  # retired: series gone
    assert any("alert cleared source=w_src alert=writer_stale" in r.getMessage() for r in caplog.records)
    w.stop()
    assert slot.closed
