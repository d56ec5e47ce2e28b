"""`/healthz` of a real `run` turns 503 while its capture loop is stuck behind a hung bronze commit, and back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ingest_process import free_port, stop, wait_for, write_config
from tests.helpers.pg import ROOT, bronze_events, prepare
from tests.integration.test_ops_endpoints import probe

pytestmark = pytest.mark.integration

# Ingest with its bronze event commits held while the gate file exists (an object store that hangs).
GATED_INGEST = """
import pathlib, sys, time
from ingest import cli
from ingest.bronze.writer import BronzeWriter
gate = pathlib.Path(sys.argv[1])
append = BronzeWriter.append_events
def held(self, *args, **kw):
    while gate.exists():
        time.sleep(0.05)
    return append(self, *args, **kw)
BronzeWriter.append_events = held
sys.exit(cli.main(sys.argv[2:]))
"""


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    return probe(port, "/healthz")


def test_a_loop_stuck_behind_a_hung_commit_is_not_alive_until_it_moves(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key)", ["items"])
    prepare(s.config())
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"initial": False}}
    cfg = write_config(tmp_path, source, batch={"max_events": 5, "max_seconds": 0.1}, metrics={"liveness_seconds": 2})
    gate = tmp_path / "hold-commits"
    gate.touch()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", GATED_INGEST, str(gate), "-c", str(cfg), "run", "--metrics-port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: healthz(port)[0] == 200, proc, 60, "alive")
        for i in range(30):  # 30 transactions: batches of 5 queue behind the held commit, then the loop waits
            s.execute(f"insert into {s.tables[0]} values ({i})")
        wait_for(lambda: healthz(port)[0] == 503, proc, 30, "not alive")
        _, body = healthz(port)
        assert body["status"] == "stuck" and s.name in body["reason"] and body["sources"][s.name] > 2, body
        gate.unlink()  # the store answers again
        wait_for(lambda: healthz(port)[0] == 200, proc, 30, "alive again")
        wait_for(lambda: len(bronze_events(tmp_path / "warehouse", s.name)) == 30, proc, 30, "30 rows in bronze")
    finally:
        gate.unlink(missing_ok=True)
        rc, err = stop(proc)
    assert rc == 0, err
