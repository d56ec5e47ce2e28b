"""The continuous mode (ops/continuous.sh): ingest streaming, dbt rounds on the warm engine, silver fresh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake.exceptions import TableNotFoundError

from tests.helpers.ingest_process import free_port
from tests.helpers.pg import ROOT, prepare
from tests.helpers.silver import silver

pytestmark = pytest.mark.integration
# The engine's first start and first full build on a busy 2-core machine, then an incremental round.
VISIBLE_TIMEOUT_S = 420


def live(warehouse: Path, source: str) -> dict[str, Any]:
    """consumer_records' live rows of the source, by id (read with delta-rs: no JVM of the test's own)."""
    try:
        records = silver(warehouse, "consumer_records")
    except TableNotFoundError:  # the first build has not committed it yet
        return {}
    mine = [r for r in records if r.source == source and not r.deleted]
    return {json.loads(r.record_pk)["id"]: json.loads(r.record)["v"] for r in mine}


def wait_for(warehouse: Path, source: str, want: dict[int, int], proc: subprocess.Popen[str]) -> float:
    t0 = time.monotonic()
    while (got := live(warehouse, source)) != want:
        assert proc.poll() is None, f"ops/continuous.sh ended (exit {proc.returncode}) with silver at {got}"
        assert time.monotonic() - t0 < VISIBLE_TIMEOUT_S, f"silver still {got}, want {want}"
        time.sleep(1)
    return time.monotonic() - t0


def test_continuous_mode_keeps_silver_fresh_and_stops_cleanly(tmp_path: Path, make_source: Any) -> None:
    """Changes committed while it runs reach consumer_records without a restart, round after round;
    SIGTERM stops ingest, the dbt loop and the warm engine it started, with exit 0."""
    s = make_source("create table t (id int primary key, v int)", ["t"])
    prepare(s.config())
    cfg, wh, state = tmp_path / "ingest.yml", tmp_path / "wh", tmp_path / "state"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}
    cfg.write_text(yaml.safe_dump({"warehouse": str(wh), "sources": [source]}))
    env = dict(
        os.environ,
        CHANGELAKE_CONFIG=str(cfg),
        CHANGELAKE_WAREHOUSE=str(wh),
        CHANGELAKE_STATE=str(state),
        CHANGELAKE_THRIFT_PORT=str(free_port()),
        CHANGELAKE_THRIFT_UI_PORT=str(free_port()),
        CHANGELAKE_DBT_ARGS="run --select silver",
        CHANGELAKE_CONTINUOUS_PAUSE="1",
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(tmp_path / "dbt-target"),
        DBT_LOG_PATH=str(tmp_path / "dbt-logs"),
    )
    log = (tmp_path / "continuous.log").open("w")
    proc = subprocess.Popen(
        ["bash", str(ROOT / "ops/continuous.sh")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        s.execute("insert into t select g, g from generate_series(1, 20) g")
        first = wait_for(wh, s.name, {i: i for i in range(1, 21)}, proc)
        # A second round on the same running engine and ingest: updates and deletes.
        s.execute("update t set v = v * 10 where id <= 5")
        s.execute("delete from t where id > 15")
        second = wait_for(wh, s.name, {i: i * 10 if i <= 5 else i for i in range(1, 16)}, proc)
        print(f"commit to consumer_records: first round {first:.0f} s (engine start included), next {second:.0f} s")
        thrift_pid = int((state / "cluster" / "thrift.pid").read_text())
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "continuous.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run(["bash", str(ROOT / "scripts/cluster.sh"), "down"], env=env, timeout=120)
        log.close()
    text = (tmp_path / "continuous.log").read_text()
    assert "continuous: stopped" in text and "silver built in" in text, text[-4000:]
    # The engine it started is gone, and so is ingest (its slot is free for the next run).
    assert not Path(f"/proc/{thrift_pid}").exists()
    slots = s.conn.execute(
        "select active from pg_replication_slots where slot_name like %s", (f"%{s.suffix}%",)
    ).fetchall()
    assert slots == [(False,)]
    # No JVM or Spark start-up line reached the terminal.
    assert "Setting default log level" not in text and "Using incubator modules" not in text
