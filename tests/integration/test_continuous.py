"""The continuous mode (ops/continuous.sh): ingest streaming, dbt rounds on the warm engine, silver fresh."""

from __future__ import annotations

import json
import os
import re
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


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def descendants(root: int) -> dict[int, str]:
    """The living descendants of process `root`, with their command lines."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                try:
                    found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except (FileNotFoundError, ProcessLookupError):
                    continue
                frontier.append(pid)
    return found


def wait_for_dbt(root: int) -> list[int]:
    """The PIDs of the dbt processes of the round that `root` (ops/continuous.sh) starts next."""
    deadline = time.monotonic() + 120
    while not (pids := [pid for pid, cmd in descendants(root).items() if "/dbt " in cmd and alive(pid)]):
        assert time.monotonic() < deadline, "no dbt round started"
        time.sleep(0.2)
    return pids


def test_continuous_mode_keeps_silver_fresh_and_stops_cleanly(tmp_path: Path, make_source: Any) -> None:
    """Changes committed while it runs reach consumer_records without a restart, round after round;
    SIGTERM in the middle of a round stops ingest, the round's dbt and the warm engine it started,
    with exit 0."""
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
        # SIGTERM in the middle of a round: its dbt stops with the script, before the engine.
        s.execute("insert into t values (100, 100)")
        dbt_pids = wait_for_dbt(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "continuous.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            subprocess.run(["bash", str(ROOT / "scripts/cluster.sh"), "down"], env=env, timeout=120)
        log.close()
    text = (tmp_path / "continuous.log").read_text()
    assert "continuous: stopped" in text and "silver built in" in text, text[-4000:]
    # The cut round's dbt is gone with the script, and did not fail against a stopped engine.
    assert [pid for pid in dbt_pids if alive(pid)] == []
    assert "stopped SparkContext" not in text and not re.search(r"ERROR=[1-9]", text), text[-4000:]
    # The engine it started is gone, and so is ingest (its slot is free for the next run).
    assert not Path(f"/proc/{thrift_pid}").exists()
    slots = s.conn.execute(
        "select active from pg_replication_slots where slot_name like %s", (f"%{s.suffix}%",)
    ).fetchall()
    assert slots == [(False,)]
    # No JVM or Spark start-up line reached the terminal.
    assert "Setting default log level" not in text and "Using incubator modules" not in text
