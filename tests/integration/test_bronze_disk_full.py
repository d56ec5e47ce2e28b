"""A warehouse that runs out of space: retried, then exit 75 (try again later), nothing lost after.

On a real PostgreSQL, `run --once` writes into a warehouse on a 3 MB tmpfs (mounting one needs
root: skipped otherwise), then again after the filesystem has grown.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ingest_process import ingest, write_config
from tests.helpers.pg import bronze_events, prepare

pytestmark = pytest.mark.integration

ROWS = 6000  # ~1.3 KB of incompressible text each: more than the filesystem holds


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """tmp_path/warehouse on a 3 MB tmpfs (unmounted at teardown)."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(warehouse)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield warehouse
    finally:
        subprocess.run(["umount", "-l", str(warehouse)], check=False)


def test_a_full_disk_exits_75_and_loses_nothing(tmp_path: Path, small_disk: Path, make_source: Any) -> None:
    """A full disk (any bronze write I/O failure) exited 2, which the shipped systemd unit never restarts.

    And a Rust panic backtrace of delta-rs's worker thread reached the terminal.
    """
    s = make_source("create table items (id int primary key, v text)", ["items"])
    (table,) = s.tables
    prepare(s.config())
    s.execute(
        f"insert into {table} select g, (select string_agg(md5(g::text || i::text), '') "
        f"from generate_series(1, 40) i) from generate_series(1, {ROWS}) g"
    )
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": [table], "snapshot": {"initial": False}}
    cfg = write_config(tmp_path, source)

    full = ingest(cfg, "run", "--once", timeout=300)
    assert full.returncode == 75, full.stderr[-3000:]
    assert "warehouse unavailable" in full.stderr and "No space left on device" in full.stderr, full.stderr[-3000:]
    assert "stack backtrace" not in full.stderr, full.stderr[-3000:]
    # delta-rs's panic line: only ingest's own lines reach the terminal, the panic goes into the log
    assert "panicked at" not in full.stderr, full.stderr[-3000:]

    subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
    again = ingest(cfg, "run", "--once", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    keys = [e.record_pk for e in bronze_events(tmp_path / "warehouse", s.name) if e.action == "insert"]
    assert len(keys) == len(set(keys)) == ROWS
