"""The metric names are a contract: the dashboard, the alert rules and the docs use exactly the registry's."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from ingest import cli
from ingest.capture import retry
from ingest.config import parse_config
from ingest.errors import ConfigError, SourceError, SourceUnavailableError
from ingest.events import Action, ChangeEvent, SourceKind
from ingest.ops import metrics
from ingest.ops.metrics import REGISTRY, WriterMetrics, metric_names

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "ops/grafana/changelake.json"
RULES = ROOT / "ops/prometheus/alerts.yml"
DOC = ROOT / "docs/operations.md"
NAME = re.compile(r"\bchangelake_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


def families() -> dict[str, str]:
    """Every family as queried (counters with _total), with its type."""
    out = {}
    for f in REGISTRY.collect():
        out[f.name + ("_total" if f.type == "counter" else "")] = f.type
    return out


def family_of(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and families().get(name[: -len(suffix)]) == "histogram":
            return name[: -len(suffix)]
    return name


def test_every_metric_the_dashboard_queries_exists() -> None:
    used = {n for e in dashboard_exprs() for n in NAME.findall(e)}
    assert used, "the dashboard queries no changelake metric"
    assert used - metric_names() == set()


def test_the_dashboard_shows_every_metric() -> None:
    used = {family_of(n) for e in dashboard_exprs() for n in NAME.findall(e)}
    assert set(families()) - used == set()


def test_every_metric_the_alert_rules_use_exists() -> None:
    rules = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used and used - metric_names() == set()


def test_the_docs_list_exactly_the_registry() -> None:
    documented = set(re.findall(r"^\| `(changelake_[a-z0-9_]+)\{", DOC.read_text(), re.M))
    assert documented == set(families())


def test_names_say_their_unit() -> None:
    units = ("_total", "_seconds", "_bytes", "_position", "_rows", "_pages", "_rows_left", "_up", "_active", "_status")
    assert [n for n in families() if not n.endswith(units)] == []
    assert all(n.startswith("changelake_") for n in families())


def sample(name: str, **labels: str) -> float:
    v = REGISTRY.get_sample_value(name, labels)
    assert v is not None, f"{name}{labels} not exported"
    return v


def event(lsn: int, ts_us: int) -> ChangeEvent:
    return ChangeEvent(commit_lsn=lsn, commit_index=0, xid=1, commit_ts_us=ts_us, action=Action.INSERT)


def test_a_batch_moves_events_latency_freshness_and_position() -> None:
    m = WriterMetrics("m_batch", SourceKind.POSTGRES, "stream")
    m.raised(0, 1000)
    now_us = int(time.time() * 1e6)
    m.committed([event(1100, now_us - 5_000_000), event(1200, now_us - 2_000_000)], 0.04)
    m.raised(1000, 1200)
    assert sample("changelake_events_total", source="m_batch", writer="stream") == 2
    assert sample("changelake_batches_total", source="m_batch", writer="stream") == 1
    assert sample("changelake_commit_duration_seconds_count", source="m_batch", writer="stream") == 1
    assert sample("changelake_commit_duration_seconds_bucket", source="m_batch", writer="stream", le="0.05") == 1
    assert sample("changelake_commit_duration_seconds_bucket", source="m_batch", writer="stream", le="0.025") == 0
    assert 2 <= sample("changelake_freshness_seconds", source="m_batch") < 3
    assert 5 <= sample("changelake_batch_freshness_seconds_sum", source="m_batch") < 6
    assert sample("changelake_last_event_commit_timestamp_seconds", source="m_batch") == pytest.approx(
        (now_us - 2_000_000) / 1e6
    )
    assert sample("changelake_writer_durable_position", source="m_batch", writer="stream") == 1200
    assert sample("changelake_wal_bytes_total", source="m_batch") == 200  # not the 1000 it registered at


def test_mongodb_positions_are_not_wal_bytes() -> None:
    m = WriterMetrics("m_mongo", SourceKind.MONGODB, "stream")
    m.raised(0, 5 << 32)
    m.raised(5 << 32, 6 << 32)
    assert REGISTRY.get_sample_value("changelake_wal_bytes_total", {"source": "m_mongo"}) == 0


def test_retries_and_errors_are_counted_by_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "FIRST_DELAY_S", 0.01)
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise SourceUnavailableError("connection refused")
        return "ok"

    assert retry.retrying(flaky, "m_retry", lambda: False, None, 0.05) == "ok"
    assert sample("changelake_retries_total", source="m_retry") == 2
    assert sample("changelake_errors_total", source="m_retry", kind="transient") == 2

    def broken() -> str:
        raise SourceError("publication missing")

    with pytest.raises(SourceError):
        retry.retrying(broken, "m_retry", lambda: False, None, 0.05)
    assert sample("changelake_errors_total", source="m_retry", kind="permanent") == 1
    assert sample("changelake_retries_total", source="m_retry") == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_serves_the_registry_only() -> None:
    WriterMetrics("m_http", SourceKind.POSTGRES, "stream").committed([event(1, int(time.time() * 1e6))], 0.01)
    port = free_port()
    metrics.serve(port, "127.0.0.1")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'changelake_events_total{source="m_http",writer="stream"} 1.0' in body
    assert "process_cpu_seconds_total" not in body and "python_gc" not in body
    with pytest.raises(OSError):
        metrics.serve(port, "127.0.0.1")  # taken: app.run turns this into a config error naming the key


def test_metrics_and_alerts_config_keys() -> None:
    base = "sources: [{kind: postgres, name: s, dsn: 'host=x', tables: [a.b]}]\n"
    cfg = parse_config(base + "metrics: {port: 9464}\nalerts: {max_lag_bytes: 1000, max_position_age_seconds: 60}\n")
    assert (cfg.metrics.port, cfg.alerts.max_lag_bytes, cfg.alerts.max_position_age_seconds) == (9464, 1000, 60)
    assert (parse_config(base).metrics.port, parse_config(base).alerts.slot_keep_fraction) == (0, 0.8)
    with pytest.raises(ConfigError, match=r"alerts\.max_lag: unknown key"):
        parse_config(base + "alerts: {max_lag: 1}\n")
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        parse_config(base + "metrics: {port: 70000}\n")


def test_a_taken_metrics_port_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        f"warehouse: {tmp_path / 'wh'}\n"
        "sources: [{kind: postgres, name: s, dsn: 'postgresql://nobody@127.0.0.1:1/x', tables: [a.b]}]\n"
    )
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["-c", str(cfg), "run", "--once", "--metrics-port", str(port)]) == cli.EXIT_USER_ERROR
    assert f"metrics.port {port}: cannot serve metrics" in capsys.readouterr().err
