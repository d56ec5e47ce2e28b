"""The Dagster example (examples/dagster/) run by Dagster itself, in process, on a real source and dbt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterEventType, materialize

from ingest.events import lsn_to_int
from tests.helpers.delta_rows import read
from tests.helpers.pg import ROOT, prepare

sys.path.insert(0, str(ROOT / "examples" / "dagster"))
from changelake_dagster import ChangelakeRound, bronze, silver_and_gold  # noqa: E402

pytestmark = pytest.mark.integration


def _round(tmp_path: Path, source: dict[str, Any], **kw: Any) -> ChangelakeRound:
    cfg, wh = tmp_path / "ingest.yml", tmp_path / "wh"
    cfg.write_text(yaml.safe_dump({"warehouse": str(wh), "retry": {"max_seconds": 1}, "sources": [source]}))
    return ChangelakeRound(
        project_dir=str(ROOT),
        config=str(cfg),
        warehouse=str(wh),
        extra_env={
            "DBT_PROFILES_DIR": str(ROOT),
            "DBT_TARGET": "local",
            "DBT_TARGET_PATH": str(tmp_path / "dbt-target"),
            "DBT_LOG_PATH": str(tmp_path / "dbt-logs"),
        },
        **kw,
    )


def test_a_round_fills_bronze_then_dbt_builds_and_the_safe_bound_is_metadata(tmp_path: Path, make_source: Any) -> None:
    """bronze (run --once) then silver_and_gold (dbt, only `safe_bounds`: one JVM, one model)."""
    s = make_source("create table t (id int primary key, v text)", ["t"])
    prepare(s.config())
    s.execute("insert into t select g, 'v' || g from generate_series(1, 20) g")
    written = s.current_wal()
    job = _round(
        tmp_path,
        {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables},
        dbt_args="run --select safe_bounds",
    )

    result = materialize([bronze, silver_and_gold], resources={"changelake": job})

    assert result.success
    meta = result.asset_materializations_for_node("bronze")[0].metadata
    text = meta[f"safe_bound/{s.name}"].value
    exact = meta["safe_bounds"].value[s.name]
    assert exact["safe_bound_text"] == text and lsn_to_int(str(text)) == exact["safe_bound"]
    assert exact["safe_bound"] >= written, "run --once drains past every commit made before it started"
    assert len(read(tmp_path / "wh" / "bronze" / "wal_events", f"source = '{s.name}' and action = 'insert'")) == 20
    built = result.asset_materializations_for_node("silver_and_gold")[0].metadata
    assert built["dbt"].value == "built"
    bounds = read(tmp_path / "wh" / "dbt" / "silver.db" / "safe_bounds", f"source = '{s.name}'")
    assert [b.safe_lsn for b in bounds] == [exact["safe_bound"]]


def test_exit_75_is_retried_then_fails_and_dbt_does_not_run(tmp_path: Path) -> None:
    """An unreachable source: ingest exits 75, the step asks for a retry, runs again, then fails."""
    source = {"kind": "postgres", "name": "nowhere", "dsn": "postgresql://nobody@127.0.0.1:1/x", "tables": ["p.t"]}
    job = _round(tmp_path, source, retries=1, retry_wait_seconds=0)

    result = materialize([bronze, silver_and_gold], resources={"changelake": job}, raise_on_error=False)

    assert not result.success
    kinds = [e.event_type for e in result.all_events if e.step_key == "bronze"]
    assert kinds.count(DagsterEventType.STEP_UP_FOR_RETRY) == 1
    assert kinds.count(DagsterEventType.STEP_RESTARTED) == 1
    assert kinds[-1] == DagsterEventType.STEP_FAILURE
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE)
    assert "source unavailable" in str(failure.event_specific_data), "the error says why"
    assert not result.asset_materializations_for_node("silver_and_gold")
    assert not (tmp_path / "dbt-target").exists(), "dbt never started"
