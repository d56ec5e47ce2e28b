"""A continuous `run` rides out what real sources do (issue 20): restarts and killed connections.

The same ingest process keeps running, reconnects with backoff from its durable position, and
bronze ends with every change exactly once. A `run --once` that cannot reach its source gives
up after `retry.max_seconds` with exit code 75 (EX_TEMPFAIL), which a scheduler can tell from a
configuration error (2).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest.config import PostgresSource
from tests.helpers.pg import ROOT, bronze_events, prepare
from tests.helpers.scratch_pg import ScratchCluster

pytestmark = pytest.mark.integration


def config(tmp_path: Path, name: str, dsn: str, tables: list[str], **retry: float) -> Path:
    cfg = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": name, "dsn": dsn, "tables": tables, "snapshot": {"initial": False}}
    doc: dict[str, Any] = {"warehouse": str(tmp_path / "warehouse"), "batch": {"max_seconds": 0.2}, "sources": [source]}
    if retry:
        doc["retry"] = retry
    cfg.write_text(yaml.safe_dump(doc))
    return cfg


def start_run(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(check: Callable[[], bool], proc: subprocess.Popen[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"ingest exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {seconds} s")
        time.sleep(0.3)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def count(warehouse: Path, source: str) -> int:
    """Events in bronze so far (none before ingest created the table)."""
    return len(bronze_events(warehouse, source)) if (warehouse / "bronze/wal_events/_delta_log").exists() else 0


def ids(warehouse: Path, source: str) -> list[int]:
    return [json.loads(e.record)["id"] for e in bronze_events(warehouse, source)]


def insert(dsn: str, table: str, values: range) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in values:
            c.execute(f"insert into {table} values (%s)", (i,))


def test_a_terminated_walsender_is_reconnected(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key)", ["items"])
    src = s.config()
    prepare(src)
    cfg = config(tmp_path, s.name, s.dsn, s.tables)
    proc = start_run(cfg)
    try:
        insert(s.dsn, f"{s.schema}.items", range(1, 11))
        wait_for(lambda: count(tmp_path / "warehouse", s.name) == 10, proc, 60)
        s.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = %s",
            (src.slot_name,),
        )
        insert(s.dsn, f"{s.schema}.items", range(11, 21))
        wait_for(lambda: count(tmp_path / "warehouse", s.name) >= 20, proc, 60)
    finally:
        rc, err = stop(proc)
    assert rc == 0, err
    assert ids(tmp_path / "warehouse", s.name) == list(range(1, 21))
    assert "unreachable" in err and "attempt=1" in err and "Traceback" not in err


@pytest.fixture
def scratch() -> Iterator[ScratchCluster]:
    cluster = ScratchCluster(54341)
    yield cluster
    cluster.remove()


def test_a_postgres_restart_is_ridden_out(tmp_path: Path, scratch: ScratchCluster) -> None:
    with psycopg.connect(scratch.dsn, autocommit=True) as c:
        c.execute("create table items (id int primary key)")
    src = PostgresSource(kind="postgres", name="restarted", dsn=scratch.dsn, tables=["public.items"])
    prepare(src)
    cfg = config(tmp_path, src.name, scratch.dsn, src.tables, max_delay_seconds=2)
    proc = start_run(cfg)
    try:
        insert(scratch.dsn, "public.items", range(1, 11))
        wait_for(lambda: count(tmp_path / "warehouse", src.name) == 10, proc, 60)
        scratch.stop()  # pg_ctl -m fast: what a minor upgrade or a maintenance window does
        time.sleep(5)
        assert proc.poll() is None, "ingest exited while the source was down"
        scratch.start()
        insert(scratch.dsn, "public.items", range(11, 21))
        wait_for(lambda: count(tmp_path / "warehouse", src.name) >= 20, proc, 90)
    finally:
        rc, err = stop(proc)
    assert rc == 0, err
    assert ids(tmp_path / "warehouse", src.name) == list(range(1, 21))
    assert "unreachable" in err and "Traceback" not in err


def test_run_once_gives_up_on_an_unreachable_source_with_exit_75(tmp_path: Path) -> None:
    cfg = config(tmp_path, "nowhere", "postgresql://nobody@127.0.0.1:1/x", ["public.t"], max_seconds=2)
    t0 = time.monotonic()
    proc = start_run(cfg, "--once")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert time.monotonic() - t0 < 60
    last = err.strip().splitlines()[-1]
    assert last.startswith("changelake-ingest: source unavailable: source 'nowhere' unreachable for")
    assert "Traceback" not in err
