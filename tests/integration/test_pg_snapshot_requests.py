"""Snapshot requests that cannot be performed: refused when asked, dropped when queued, cancellable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.events import WriterKind
from ingest.sources.postgres.snapshot import Snapshotter
from tests.helpers.ingest_process import ingest, write_config
from tests.helpers.pg import prepare

pytestmark = pytest.mark.integration

TABLES = "create table keyed (id int primary key, v text); create table loose (v text); "
TABLES += "alter table loose replica identity full"


def snapshot_writers(warehouse: Path, source: str) -> list[str]:
    """The tables of the source's snapshot writer rows (queued or running requests)."""
    from ingest.positions import SnapshotProgress

    writer = BronzeWriter(warehouse)
    return [
        SnapshotProgress.from_row(pos).table
        for pos, _ in writer.positions(source)
        if pos.writer_kind is WriterKind.SNAPSHOT
    ]


def configured(tmp_path: Path, s: Any, tables: list[str] | None = None) -> Path:
    tables = s.tables if tables is None else tables
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": tables, "snapshot": {"initial": False}}
    return write_config(tmp_path, source)


def test_a_snapshot_of_a_keyless_table_is_refused_when_requested(tmp_path: Path, make_source: Any) -> None:
    """`snapshot <keyless table>` was accepted (exit 0), and every later `run` of the source exited 2 on it.

    Keyless under REPLICA IDENTITY FULL is snapshotted by CTID; without FULL its rows have no key.
    """
    s = make_source("create table keyed (id int primary key, v text); create table loose (v text)", ["keyed", "loose"])
    cfg = configured(tmp_path, s)
    p = ingest(cfg, "snapshot", f"{s.schema}.loose")
    assert p.returncode == 2, p.stderr
    assert f"table {s.schema}.loose has no primary key" in p.stderr
    assert not (tmp_path / "warehouse/bronze/stream_positions").exists() or not snapshot_writers(
        tmp_path / "warehouse", s.name
    )
    p = ingest(cfg, "snapshot", f"{s.schema}.nope")
    assert p.returncode == 2 and "no configured source captures" in p.stderr


def test_a_queued_request_that_cannot_be_performed_does_not_wedge_run(tmp_path: Path, make_source: Any) -> None:
    """A request queued before the table left the config (or by an older ingest) stopped every `run` with exit 2."""
    s = make_source(TABLES, ["keyed", "loose"])
    cfg = configured(tmp_path, s, [f"{s.schema}.keyed"])
    src = s.config(snapshot={"initial": False})
    prepare(src)
    writer = BronzeWriter(tmp_path / "warehouse")
    writer.ensure_tables()
    lsn = int(s.conn.execute("select pg_current_wal_lsn() - '0/0'").fetchone()[0])  # type: ignore[index]
    Snapshotter(src, writer).request([f"{s.schema}.loose", f"{s.schema}.keyed"], lambda: lsn)
    s.execute("insert into keyed values (1, 'a')")
    p = ingest(cfg, "run", "--once")
    assert p.returncode == 0, p.stderr
    assert f"snapshot of {s.schema}.loose cannot be performed" in p.stderr
    assert snapshot_writers(tmp_path / "warehouse", s.name) == []  # the keyed one ran, the other was dropped
    assert ingest(cfg, "run", "--once").returncode == 0


def test_a_queued_request_can_be_cancelled(tmp_path: Path, make_source: Any) -> None:
    """Nothing said how to remove a queued request: `snapshot --cancel` does."""
    s = make_source(TABLES, ["keyed", "loose"])
    cfg = configured(tmp_path, s)
    assert ingest(cfg, "snapshot", f"{s.schema}.keyed").returncode == 0
    assert ingest(cfg, "snapshot", f"{s.schema}.keyed").returncode == 0
    assert snapshot_writers(tmp_path / "warehouse", s.name) == [f"{s.schema}.keyed"] * 2
    p = ingest(cfg, "snapshot", "--cancel", f"{s.schema}.keyed")
    assert p.returncode == 0, p.stderr
    assert "2 queued snapshot(s) of" in p.stdout
    assert snapshot_writers(tmp_path / "warehouse", s.name) == []
    p = ingest(cfg, "snapshot", "--cancel", f"{s.schema}.keyed")
    assert p.returncode == 2 and "no queued snapshot of" in p.stderr
