"""OpenLineage run events reach a real HTTP endpoint: START, then COMPLETE or FAIL, with datasets and positions."""

from __future__ import annotations

import pytest

from ingest.config import LineageConfig, parse_config
from ingest.errors import ConfigError
from ingest.events import WriterKind, WriterPosition
from ingest.ops.lineage import Lineage, datasets
from tests.unit.ops.recorder import recording

BASE = (
    "sources: [{kind: postgres, name: shop, dsn: 'host=db.internal port=6543 dbname=shop', tables: [public.orders]}]\n"
)
EVENTS = "/api/v1/lineage"


def test_a_run_reports_start_then_complete_with_inputs_outputs_and_positions() -> None:
    cfg = parse_config(BASE)
    positions = [
        WriterPosition("shop", "stream", WriterKind.STREAM, 300, 300),
        WriterPosition("shop", "snapshot-x", WriterKind.SNAPSHOT, 200, 200),
    ]
    with recording() as endpoint:
        lineage = Lineage(LineageConfig(url=endpoint.base, namespace="prod"), "/data/wh")
        run = lineage.start(cfg.sources[0])
        run.complete(positions, lambda p: f"0/{p:X}")
        endpoint.wait(lambda: len(endpoint.bodies(EVENTS)) == 2)
    start, done = endpoint.bodies(EVENTS)
    assert (start["eventType"], done["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == done["run"]["runId"]
    assert done["job"] == {"namespace": "prod", "name": "changelake.ingest.shop", "facets": {}}
    assert [(d["namespace"], d["name"]) for d in done["inputs"]] == [
        ("postgres://db.internal:6543", "shop.public.orders")
    ]
    assert [(d["namespace"], d["name"]) for d in done["outputs"]] == [
        ("file", "/data/wh/bronze/wal_events"),
        ("file", "/data/wh/bronze/stream_positions"),
    ]
    facet = done["run"]["facets"]["changelake_positions"]
    assert (facet["source"], facet["safeBound"], facet["safeBoundText"]) == ("shop", 200, "0/C8")
    assert [w["writerId"] for w in facet["writers"]] == ["snapshot-x", "stream"]


def test_a_failed_run_reports_fail_with_the_error_and_an_unreachable_collector_is_only_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = parse_config(BASE)
    with recording() as endpoint:
        run = Lineage(LineageConfig(url=endpoint.base), "s3://lake/wh").start(cfg.sources[0])
        run.fail(RuntimeError("slot is invalidated"), [], str)
        endpoint.wait(lambda: len(endpoint.bodies(EVENTS)) == 2)
    fail = endpoint.bodies(EVENTS)[1]
    assert fail["eventType"] == "FAIL"
    assert fail["run"]["facets"]["errorMessage"]["message"] == "RuntimeError: slot is invalidated"
    no_writer = fail["run"]["facets"]["changelake_positions"]
    assert "safeBound" not in no_writer and no_writer["writers"] == []  # the client leaves nulls out
    assert fail["outputs"][0]["namespace"] == "s3://lake" and fail["outputs"][0]["name"] == "wh/bronze/wal_events"
    # The endpoint is gone now: emitting warns and returns.
    run.complete([], str)
    assert any("lineage emit failed source=shop event=COMPLETE" in r.getMessage() for r in caplog.records)


def test_mongodb_inputs_and_lineage_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    mongo = parse_config("sources: [{kind: mongodb, name: m, uri: 'mongodb://h1:27018/', database: app}]\n")
    assert [(d.namespace, d.name) for d in datasets(mongo.sources[0], "/w").inputs] == [("mongodb://h1:27018", "app")]
    with pytest.raises(ConfigError, match=r"lineage\.url"):
        parse_config(BASE + "lineage: {url: 'collector:5000'}\n")
    with pytest.raises(ConfigError, match=r"lineage\.transport: unknown key"):
        parse_config(BASE + "lineage: {url: 'http://c', transport: kafka}\n")
    monkeypatch.delenv("OL_KEY_UNSET", raising=False)
    with pytest.raises(ConfigError, match="OL_KEY_UNSET"):
        Lineage(LineageConfig(url="http://c", api_key_env="OL_KEY_UNSET"), "/w")
