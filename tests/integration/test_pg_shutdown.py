"""SIGTERM/SIGINT to the process group, as systemd and a terminal send it: finish, commit, ack, exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest.bronze.writer import BronzeWriter
from tests.helpers.pg import ROOT, bronze_count, bronze_events, confirmed_flush, prepare

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT_S = 60
EXIT_TIMEOUT_S = 60


def write_config(tmp_path: Path, s: Any) -> Path:
    cfg = tmp_path / "ingest.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "warehouse": str(tmp_path / "warehouse"),
                "batch": {"max_events": 500, "max_seconds": 0.2},
                "sources": [
                    {
                        "kind": "postgres",
                        "name": s.name,
                        "dsn": s.dsn,
                        "tables": s.tables,
                        "snapshot": {"initial": False},
                    }
                ],
            }
        )
    )
    return cfg


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_group_commits_acks_and_exits_0(sig: signal.Signals, tmp_path: Path, make_source: Any) -> None:
    """Regression: SIGTERM to the group killed ingest's Spark JVM before the last batch committed, and
    the run ended with `raising positions of <source>/stream failed` (issue 12)."""
    s = make_source("create table items (id int primary key, v text)", ["items"])
    src = s.config()
    prepare(src)
    cfg = write_config(tmp_path, s)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "-v", "run"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a service or a terminal job has
    )
    inserted = [0]
    stop_load = threading.Event()

    def load() -> None:  # a steady stream of small transactions, running through the signal
        with psycopg.connect(s.dsn, autocommit=True) as c:
            while not stop_load.is_set():
                inserted[0] += 1
                c.execute(f"insert into {s.schema}.items values (%s, 'v')", (inserted[0],))
                time.sleep(0.002)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not bronze_count(tmp_path / "warehouse", s.name):  # the first commit, not only the table's directory
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "ingest committed nothing"
            time.sleep(0.2)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        stop_load.set()
        loader.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "level=ERROR" not in err, err[-3000:]
    assert f"signal={sig.name} stopping after the current batch" in err

    # What was acknowledged is durable: the slot is at the writer's ack position, and every change
    # up to the writer's durable position is in bronze once.
    writer = BronzeWriter(tmp_path / "warehouse")
    pos = [p for p, _ in writer.positions(s.name) if p.writer_id == "stream"][0]
    assert confirmed_flush(s.dsn, src.slot_name) == pos.ack_lsn
    before = bronze_events(tmp_path / "warehouse", s.name)
    assert before and all(e.commit_lsn <= pos.durable_lsn for e in before)
    ids = [json.loads(e.record_pk)["id"] for e in before]
    assert ids == list(range(1, len(ids) + 1)), "a gap or a duplicate before the stop"

    # A restart takes every later change, once: bronze equals the source.
    r = subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", "--once"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    after = [json.loads(e.record_pk)["id"] for e in bronze_events(tmp_path / "warehouse", s.name)]
    assert after == list(range(1, inserted[0] + 1))


def test_a_fast_restart_of_the_source_does_not_wait_for_ingest(tmp_path: Path) -> None:
    """Regression: `pg_ctl restart -m fast` took ~30 s with ingest attached: a stopping server waits
    for each logical client to confirm everything it sent, and ingest confirmed only when its own
    silence timeout fired."""
    from ingest.config import PostgresSource
    from tests.helpers.scratch_pg import ScratchCluster

    cluster = ScratchCluster(25372)
    proc: subprocess.Popen[str] | None = None
    try:
        with psycopg.connect(cluster.dsn, autocommit=True) as c:
            c.execute("create table items (id int primary key)")
            c.execute("create table other (id int)")  # not captured: WAL the stream passes over
        src = PostgresSource(kind="postgres", name="restarting", dsn=cluster.dsn, tables=["public.items"])
        prepare(src)
        cfg = tmp_path / "ingest.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "warehouse": str(tmp_path / "warehouse"),
                    "batch": {"max_seconds": 0.2},
                    "retry": {"max_delay_seconds": 1},
                    "sources": [
                        {"kind": "postgres", "name": src.name, "dsn": cluster.dsn, "tables": src.tables}
                        | {"snapshot": {"initial": False}}
                    ],
                }
            )
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "ingest", "-c", str(cfg), "run"], cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        with psycopg.connect(cluster.dsn, autocommit=True) as c:
            c.execute("insert into items values (1)")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while bronze_count(tmp_path / "warehouse", src.name) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "ingest captured nothing"
            time.sleep(0.2)
        # Idle, as in a maintenance window: ingest has just confirmed the WAL it passed over.
        with psycopg.connect(cluster.dsn, autocommit=True) as c:
            c.execute("insert into other values (1)")
            target = c.execute("select pg_current_wal_lsn() - '0/0'").fetchone()
            assert target is not None
            deadline = time.monotonic() + 30
            while confirmed_flush(cluster.dsn, src.slot_name) < int(target[0]):
                assert time.monotonic() < deadline, "ingest did not confirm the idle WAL"
                time.sleep(0.05)
        t0 = time.monotonic()
        cluster.stop()
        stopped_in = time.monotonic() - t0
        cluster.start()
        with psycopg.connect(cluster.dsn, autocommit=True) as c:
            c.execute("insert into items values (2)")
        deadline = time.monotonic() + 60
        while bronze_count(tmp_path / "warehouse", src.name) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "ingest did not resume"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.remove()
    assert stopped_in < 3, f"the fast shutdown took {stopped_in:.1f} s"
    assert proc.returncode == 0, err[-3000:]
    ids = [json.loads(e.record_pk)["id"] for e in bronze_events(tmp_path / "warehouse", src.name)]
    assert ids == [1, 2]
