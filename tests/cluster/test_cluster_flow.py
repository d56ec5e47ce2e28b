"""The whole flow on a real Spark standalone cluster: ingest beside it, dbt through the Thrift server.

scripts/cluster.sh starts a master, a worker and a Thrift server (own ports, state dir and
warehouse, so a user's `make cluster-up` is left alone); ingest runs `run --once` in a subprocess
with config/cluster.yml (delta-rs, no JVM) into the warehouse the Thrift server reads;
`dbt build --target cluster` runs through the Thrift server; silver is read back through the
Thrift server too, and bronze written by delta-rs is read by the cluster's Spark.

Checks DESIGN §7.1 and §7.2 on a small random workload, and that dbt's work ran on the worker's
executor, from the Thrift server's REST API (/api/v1/applications/<id>/executors).
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.helpers.dbt_flow import (
    CAPTURED,
    SEED,
    TABLES,
    assert_event_log_matches_bronze,
    assert_records_match_source,
    workload,
)
from tests.helpers.pg import ROOT, TD_LINE, prepare

pytestmark = pytest.mark.cluster

CLUSTER_SH = ROOT / "scripts" / "cluster.sh"
DBT = Path(sys.executable).with_name("dbt")
UP_TIMEOUT_S = 300
DOWN_TIMEOUT_S = 120
STEP_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Cluster:
    """A running cluster of scripts/cluster.sh and the environment its clients need."""

    env: dict[str, str]
    warehouse: Path
    state: Path
    master_url: str
    master_ui: str
    thrift_port: int
    thrift_ui: str

    def query(self, sql: str) -> list[Any]:
        """Rows (attribute access, like pyspark's Row) of `sql` run by the Thrift server."""
        from pyhive import hive
        from pyspark.sql import Row  # a plain tuple subclass: no JVM

        conn = hive.connect(host="127.0.0.1", port=self.thrift_port, username="changelake")
        try:
            cur = conn.cursor()
            cur.execute(sql)
            names = [d[0].split(".")[-1] for d in cur.description]
            return [Row(**dict(zip(names, r, strict=True))) for r in cur.fetchall()]
        finally:
            conn.close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master, a worker and a Thrift server on free loopback ports; always stopped at the end."""
    root = tmp_path_factory.mktemp("cluster")
    ports = {k: free_port() for k in ("MASTER", "MASTER_UI", "WORKER_UI", "THRIFT", "THRIFT_UI")}
    env = dict(
        os.environ,
        CHANGELAKE_STATE=str(root / "state"),
        CHANGELAKE_WAREHOUSE=str(root / "warehouse"),
        CHANGELAKE_PYTHON=sys.executable,
        CHANGELAKE_SPARK_HOST="127.0.0.1",
        **{f"CHANGELAKE_{k}_PORT": str(v) for k, v in ports.items()},
    )
    c = Cluster(
        env=env,
        warehouse=root / "warehouse",
        state=root / "state" / "cluster",
        master_url=f"spark://127.0.0.1:{ports['MASTER']}",
        master_ui=f"http://127.0.0.1:{ports['MASTER_UI']}",
        thrift_port=ports["THRIFT"],
        thrift_ui=f"http://127.0.0.1:{ports['THRIFT_UI']}",
    )
    try:
        t0 = time.monotonic()
        up = subprocess.run(
            ["bash", str(CLUSTER_SH), "up"], env=env, capture_output=True, text=True, timeout=UP_TIMEOUT_S
        )
        assert up.returncode == 0, f"cluster.sh up failed:\n{up.stderr[-4000:]}"
        print(f"cluster up in {time.monotonic() - t0:.1f} s")
        yield c
    finally:
        down = subprocess.run(
            ["bash", str(CLUSTER_SH), "down"], env=env, capture_output=True, text=True, timeout=DOWN_TIMEOUT_S
        )
        assert down.returncode == 0, f"cluster.sh down failed:\n{down.stderr[-4000:]}"
        for pid_file in c.state.glob("*.pid"):  # down removes each PID file once its daemon is gone
            raise AssertionError(f"{pid_file.name} left behind by cluster.sh down")


def cluster_config(c: Cluster, s: Any, path: Path) -> Path:
    """config/cluster.yml as a user has it, with this test's source instead of the demo's."""
    cfg = yaml.safe_load((ROOT / "config" / "cluster.yml").read_text())
    cfg["sources"] = [{"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}]
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_ingest(c: Cluster, cfg: Path) -> None:
    """`changelake-ingest run --once` in its own process, as a scheduler runs it."""
    r = subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", "--once"],
        cwd=ROOT,
        env=c.env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert r.returncode == 0, f"ingest failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"


def dbt_cluster(c: Cluster, tmp: Path, *args: str) -> str:
    env = dict(
        c.env, DBT_PROFILES_DIR=str(ROOT), DBT_TARGET_PATH=str(tmp / "dbt-target"), DBT_LOG_PATH=str(tmp / "dbt-logs")
    )
    r = subprocess.run(
        [str(DBT), *args, "--target", "cluster", "--project-dir", str(ROOT)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert r.returncode == 0, f"dbt {' '.join(args)} --target cluster failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def worker_tasks(executors: list[dict[str, Any]]) -> int:
    """Completed tasks on non-driver executors (0 in local mode, where the driver runs them all)."""
    return sum(e["completedTasks"] for e in executors if e["id"] != "driver")


def thrift_executors(c: Cluster) -> tuple[str, list[dict[str, Any]]]:
    apps = get_json(f"{c.thrift_ui}/api/v1/applications")
    assert len(apps) == 1, apps
    app_id: str = apps[0]["id"]
    return app_id, get_json(f"{c.thrift_ui}/api/v1/applications/{app_id}/executors")


def master_apps(c: Cluster) -> set[str]:
    state = get_json(f"{c.master_ui}/json/")
    return {a["id"] for a in state["activeapps"] + state["completedapps"]}


def committed_changes(dsn: str, slot: str, schema: str) -> list[tuple[str, str]]:
    """(table, action) of every change in `schema`, in commit order, as test_decoding reports it."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("select data from pg_logical_slot_peek_changes(%s, null, null)", (slot,)).fetchall()
    out = []
    for (data,) in rows:
        m = TD_LINE.match(data)
        if m and m["table"].startswith(f"{schema}."):
            out.append((m["table"].split(".", 1)[1], m["action"].lower()))
    return out


def test_ingest_and_dbt_build_on_the_cluster(cluster: Cluster, tmp_path: Path, make_source: Any) -> None:
    print(f"cluster flow seed: {SEED} (rerun with CHANGELAKE_TEST_SEED={SEED})")
    c = cluster
    rnd = random.Random(SEED)
    s = make_source(TABLES, CAPTURED)
    prepare(s.config())
    # An independent record of the committed history: Postgres's own decoder, from before the workload.
    oracle_slot = f"oracle_{s.suffix}"  # dropped with the source (its name holds the suffix)
    s.execute("select pg_create_logical_replication_slot(%s, 'test_decoding')", (oracle_slot,))
    workload(s, rnd, [], truncate_lines=True)

    t0 = time.monotonic()
    run_ingest(c, cluster_config(c, s, tmp_path / "ingest.yml"))
    print(f"ingest run --once (delta-rs): {time.monotonic() - t0:.1f} s")

    thrift_app, before = thrift_executors(c)
    assert thrift_app in master_apps(c)
    t0 = time.monotonic()
    # The unit tests read no warehouse data: the session target runs them (test_dbt_flow).
    dbt_cluster(c, tmp_path, "build", "--exclude-resource-type", "unit_test")
    print(f"dbt build --target cluster: {time.monotonic() - t0:.1f} s")
    _, after = thrift_executors(c)
    assert worker_tasks(after) > worker_tasks(before), f"dbt build ran nothing on the worker: {after}"
    # The position guard through the Thrift server: the guarded MERGE keeps a row against an older event.
    out = dbt_cluster(c, tmp_path, "run-operation", "check_merge_guard")
    assert "merge guard holds on target cluster (spark): 1: stored, newer; 2: batch, newer" in out, out

    # DESIGN §7.1: consumer_records equal the source tables; tombstones are exactly the gone keys.
    bronze = c.query(
        "select table_name, record_pk, old_record_pk, commit_lsn, commit_index from bronze.wal_events "
        f"where source = '{s.name}' and action != 'message' order by commit_lsn, commit_index"
    )
    records = c.query(
        f"select source, table_name, record_pk, record, deleted from silver.consumer_records where source = '{s.name}'"
    )
    pages = c.query(
        f"select table_name, record_pk from bronze.snapshot_pages where source = '{s.name}' and record_pk is not null"
    )
    assert pages, "the initial snapshot wrote no page rows"
    assert_records_match_source(records, bronze, s, pages)

    # DESIGN §7.2: sequin_events is bronze once each in position order, and bronze is exactly what
    # Postgres committed (test_decoding), change for change, in commit order.
    events = c.query(
        "select source, seq, commit_lsn, commit_index, table_name, action from silver.sequin_events "
        f"where source = '{s.name}'"
    )
    assert_event_log_matches_bronze(events, bronze, s)
    history = committed_changes(s.dsn, oracle_slot, s.schema)
    assert history, "the oracle slot saw no changes"
    assert [(e.table_name, e.action) for e in sorted(events, key=lambda e: e.seq)] == history
