"""Alert rules, states and exit codes, and the `status --json` schema against docs/operations.md."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ingest import cli
from ingest.config import AlertsConfig
from ingest.events import WriterKind, WriterPosition, int_to_lsn
from ingest.ops.health import (
    ALERT_STATE,
    STATE_EXIT,
    AlertKind,
    ExitCode,
    SlotState,
    SourceHealth,
    State,
    report,
    slot_alerts,
    writer_alerts,
)
from ingest.positions import SnapshotProgress

ROOT = Path(__file__).resolve().parents[3]
GB = 1 << 30
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def slot(
    lag: int | None = 0,
    wal_status: str | None = "reserved",
    keep: int | None = 10 * GB,
    safe: int | None = None,
    exists: bool = True,
) -> SlotState:
    cur = 50 * GB
    safe = safe if safe is not None or keep is None or lag is None else keep - lag
    return SlotState(
        "changelake_s", exists, cur - lag if lag is not None else None, cur, wal_status, safe, keep, None, lag
    )


def kinds(alerts: list[Any]) -> list[AlertKind]:
    return [a.kind for a in alerts]


def test_a_slot_keeping_up_is_healthy() -> None:
    assert slot_alerts(slot(lag=100), AlertsConfig()) == []


def test_lag_near_max_slot_wal_keep_size_warns_before_the_slot_is_lost() -> None:
    cfg = AlertsConfig()
    assert slot_alerts(slot(lag=int(7.9 * GB)), cfg) == []
    assert kinds(slot_alerts(slot(lag=8 * GB), cfg)) == [AlertKind.SLOT_NEAR_LIMIT]
    assert kinds(slot_alerts(slot(lag=1 * GB, safe=GB), cfg)) == [AlertKind.SLOT_NEAR_LIMIT]  # server's own count
    assert kinds(slot_alerts(slot(lag=GB), AlertsConfig(slot_keep_fraction=0.05))) == [AlertKind.SLOT_NEAR_LIMIT]
    assert slot_alerts(slot(lag=100 * GB, keep=None), cfg) == []  # unlimited: only max_lag_bytes applies


def test_a_configured_lag_threshold() -> None:
    cfg = AlertsConfig(max_lag_bytes=1000)
    assert slot_alerts(slot(lag=1000), cfg) == []
    assert kinds(slot_alerts(slot(lag=1001), cfg)) == [AlertKind.SLOT_LAG]


def test_wal_status_unreserved_lost_and_missing() -> None:
    assert kinds(slot_alerts(slot(wal_status="unreserved"), AlertsConfig())) == [AlertKind.WAL_UNRESERVED]
    assert kinds(slot_alerts(slot(wal_status="lost", lag=None), AlertsConfig())) == [AlertKind.SLOT_LOST]
    missing = slot(lag=None, wal_status=None, exists=False)
    assert kinds(slot_alerts(missing, AlertsConfig())) == [AlertKind.SLOT_MISSING]


def row(writer_id: str, age_s: float, token: str | None = None) -> tuple[WriterPosition, datetime]:
    kind = WriterKind.SNAPSHOT if writer_id.startswith("snapshot-") else WriterKind.STREAM
    return WriterPosition("s", writer_id, kind, 5000, 5000, token), NOW - timedelta(seconds=age_s)


def test_a_writer_not_raised_for_the_configured_time_is_stale() -> None:
    rows = [row("stream", 301), row("snapshot-a", 10)]
    assert writer_alerts(rows, AlertsConfig(), NOW) == []  # off unless configured
    stale = writer_alerts(rows, AlertsConfig(max_position_age_seconds=300), NOW)
    assert [(a.kind, a.writer_id) for a in stale] == [(AlertKind.WRITER_STALE, "stream")]


def test_the_worst_state_sets_the_exit_code() -> None:
    assert {STATE_EXIT[s] for s in State} == set(ExitCode)
    assert len({ExitCode.HEALTHY, ExitCode.LAGGING, ExitCode.STALE, ExitCode.LOST_OR_UNREACHABLE}) == 4
    assert set(ALERT_STATE) == set(AlertKind)
    lagging = SourceHealth(
        "a", "postgres", NOW, slot=slot(lag=9 * GB), alerts=tuple(slot_alerts(slot(lag=9 * GB), AlertsConfig()))
    )
    healthy = SourceHealth("b", "postgres", NOW, slot=slot())
    doc = report([(healthy, int_to_lsn), (lagging, int_to_lsn)], NOW)
    assert (doc["state"], doc["exit_code"]) == ("lagging", 3)
    assert [s["state"] for s in doc["sources"]] == ["healthy", "lagging"]


def documented_fields() -> set[str]:
    text = (ROOT / "docs/operations.md").read_text()
    section = text[text.index("## `status --json`") :]
    return set(re.findall(r"^\| `([a-z_\[\].]+)` \|", section, re.M))


def flatten(value: Any, prefix: str = "") -> set[str]:
    out = set()
    if isinstance(value, dict):
        for k, v in value.items():
            key = f"{prefix}.{k}" if prefix else k
            out.add(key)
            out |= flatten(v, key)
    elif isinstance(value, list):
        for v in value:
            out |= flatten(v, prefix + "[]")
    return out


def full_document() -> dict[str, Any]:
    progress = SnapshotProgress("public.t", "abc", pages=2, rows=20, estimated_rows=100, rows_per_s=5.0)
    rows = (row("stream", 5), row("snapshot-abc", 1, progress.to_json()))
    health = SourceHealth(
        "s",
        "postgres",
        NOW,
        slot=slot(lag=9 * GB),
        writers=rows,
        last_commit_at=NOW,
        alerts=tuple(
            slot_alerts(slot(lag=9 * GB), AlertsConfig())
            + writer_alerts(rows, AlertsConfig(max_position_age_seconds=2), NOW)
        ),
    )
    return report([(health, int_to_lsn)], NOW)


def test_the_json_schema_is_the_documented_one() -> None:
    """Every field of docs/operations.md is in the document and nothing else is: the schema is stable."""
    doc = full_document()
    assert flatten(doc) == documented_fields()
    src = doc["sources"][0]
    assert src["snapshots"] == [
        {
            "table": "public.t",
            "snapshot_id": "abc",
            "writer_id": "snapshot-abc",
            "pages": 2,
            "rows": 20,
            "estimated_rows": 100,
            "rows_left": 80,
            "rows_per_second": 5.0,
            "paused": False,
            "where": None,
        }
    ]
    assert src["writers"][1]["position_age_seconds"] == 5.0 and src["writers"][1]["updated_at"].endswith("Z")
    assert src["safe_bound"] == 5000 and src["safe_bound_text"] == int_to_lsn(5000)
    assert [a["kind"] for a in src["alerts"]] == ["slot_near_limit", "writer_stale"]
    assert (doc["state"], doc["exit_code"]) == ("stale", 4)
    json.dumps(doc)


def test_status_json_of_an_unreachable_source_exits_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        f"warehouse: {tmp_path / 'wh'}\nsources:\n  - name: shop\n    kind: postgres\n"
        "    dsn: postgresql://nobody:secret@127.0.0.1:1/x\n    tables: [public.orders]\n"
    )
    assert cli.main(["-c", str(cfg), "status", "--json"]) == 5
    out = capsys.readouterr().out
    doc = json.loads(out)
    src = doc["sources"][0]
    assert (doc["state"], src["state"], src["reachable"], src["slot"]) == ("unreachable", "unreachable", False, None)
    assert [a["kind"] for a in src["alerts"]] == ["source_unreachable"] and src["writers"] == []
    assert "secret" not in out
