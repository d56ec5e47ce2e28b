"""One warm engine for the suite's dbt tests: the `engine` target's Thrift server, shared by warehouses.

A dbt command on the local target starts a JVM, boots Derby and warms Spark up (~30 s before its
first node, and a cold JIT after that); a test of six dbt commands paid that six times. The tests
that opt in (fixture `engine`) run dbt with `--target engine` against one Thrift server on
`local[2]` that `scripts/cluster.sh up` starts once per test session (CHANGELAKE_SPARK_LOCAL=1,
as `make engine-up` does), so the suite pays the start and the JIT warm-up once.

The server's own warehouse is a scratch directory: before each test, `serve(warehouse)` drops every
schema the previous test made and creates `bronze`, `silver`, `gold` and `dbt_test__audit` at that test's
`<warehouse>/dbt/<schema>.db`, where the local target would put them, so the tests read silver and
gold with delta-rs at the same paths either way, and the bronze registration finds the test's bronze
(macro register_bronze_tables). Tests that need the local target itself (its Derby metastore, a
killed dbt process taking its JVM along, the scheduled job's and Dagster's own dbt) do not opt in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.ingest_process import free_port
from tests.helpers.pg import ROOT

# dbt_test__audit: where `--store-failures` puts failing rows (test_verify reads them).
SCHEMAS = ("bronze", "silver", "gold", "dbt_test__audit")
START_TIMEOUT_S = 300


class Engine:
    """A Thrift server on a local Spark (scripts/cluster.sh, CHANGELAKE_SPARK_LOCAL=1)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.env = dict(
            os.environ,
            CHANGELAKE_SPARK_LOCAL="1",
            CHANGELAKE_STATE=str(root / "state"),
            CHANGELAKE_WAREHOUSE=str(root / "warehouse"),
            CHANGELAKE_PYTHON=sys.executable,
            CHANGELAKE_SPARK_HOST="127.0.0.1",
            CHANGELAKE_THRIFT_PORT=str(self.port),
            CHANGELAKE_THRIFT_UI_PORT=str(free_port()),
        )
        self.serving: Path | None = None

    def script(self, command: str) -> None:
        r = subprocess.run(
            ["bash", str(ROOT / "scripts" / "cluster.sh"), command],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        assert r.returncode == 0, f"cluster.sh {command} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    def running(self) -> bool:
        r = subprocess.run(
            ["bash", str(ROOT / "scripts" / "cluster.sh"), "serves"],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            timeout=60,
        )
        return r.returncode == 0

    def up(self) -> None:
        """Start the server, or start it again when a previous test left it dead."""
        if not self.running():
            self.script("down")
            self.script("up")

    def down(self) -> None:
        self.serving = None
        self.script("down")

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        from pyhive import hive

        conn = hive.connect(host="127.0.0.1", port=self.port, username="changelake")
        try:
            cur = conn.cursor()
            cur.execute(statement)
            return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def serve(self, warehouse: Path) -> None:
        """Point the server's schemas at `warehouse` (those of the previous test are dropped).

        A previous test that failed or timed out may have left a statement running on the server
        (a dbt process killed mid-node does not cancel it): when the schemas cannot be reset, the
        server is restarted once, so one test's failure does not carry into the next.
        """
        self.up()
        self.serving = None
        try:
            self._reset(warehouse)
        except Exception as first:
            self.script("down")
            self.script("up")
            try:
                self._reset(warehouse)
            except Exception as again:
                raise again from first
        self.serving = warehouse

    def _reset(self, warehouse: Path) -> None:
        for (name,) in self.sql("show databases"):
            if name != "default":
                self.sql(f"drop database if exists `{name}` cascade")
        for name in SCHEMAS:
            self.sql(f"create database `{name}` location '{warehouse / 'dbt' / (name + '.db')}'")

    def dbt_args(self, warehouse: Path) -> tuple[list[str], dict[str, str]]:
        """The extra dbt arguments and environment for `warehouse` (none unless this engine serves it)."""
        if self.serving != warehouse:
            return [], {}
        return ["--target", "engine"], {"CHANGELAKE_SPARK_HOST": "127.0.0.1", "CHANGELAKE_THRIFT_PORT": str(self.port)}


# The session's engine, set by the `engine` fixture (tests/conftest.py) for the test that asked.
current: Engine | None = None
