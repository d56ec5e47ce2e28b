"""A continuous `run` rides out what real sources do (issue 20): restarts and killed connections.

The same ingest process keeps running, reconnects with backoff from its durable position, and
bronze ends with every change exactly once. A `run --once` that cannot reach its source gives
up after `retry.max_seconds` with exit code 75 (EX_TEMPFAIL), which a scheduler can tell from a
configuration error (2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ingest.config import PostgresSource
from tests.helpers.ingest_process import start_run, stop, wait_for, write_config
from tests.helpers.pg import bronze_count, bronze_events, prepare
from tests.helpers.scratch_pg import ScratchCluster
from tests.helpers.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration


def config(tmp_path: Path, name: str, dsn: str, tables: list[str], **retry: float) -> Path:
    source = {"kind": "postgres", "name": name, "dsn": dsn, "tables": tables, "snapshot": {"initial": False}}
    return write_config(tmp_path, source, **({"retry": retry} if retry else {}))


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
        wait_for(lambda: bronze_count(tmp_path / "warehouse", s.name) == 10, proc, 60)
        s.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = %s",
            (src.slot_name,),
        )
        insert(s.dsn, f"{s.schema}.items", range(11, 21))
        wait_for(lambda: bronze_count(tmp_path / "warehouse", s.name) >= 20, proc, 60)
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
        wait_for(lambda: bronze_count(tmp_path / "warehouse", src.name) == 10, proc, 60)
        scratch.stop()  # pg_ctl -m fast: what a minor upgrade or a maintenance window does
        time.sleep(5)
        assert proc.poll() is None, "ingest exited while the source was down"
        scratch.start()
        insert(scratch.dsn, "public.items", range(11, 21))
        wait_for(lambda: bronze_count(tmp_path / "warehouse", src.name) >= 20, proc, 90)
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


@pytest.fixture
def proxied(make_source: Any) -> Iterator[tuple[Any, TcpProxy, str]]:
    """A source, a proxy in front of its server, and the source's DSN through the proxy."""
    s = make_source("create table items (id int primary key)", ["items"])
    params = conninfo_to_dict(s.dsn)
    proxy = TcpProxy(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
    yield s, proxy, make_conninfo(s.dsn, host="127.0.0.1", port=str(proxy.port))
    proxy.close()


def test_a_network_blackhole_is_ridden_out(tmp_path: Path, proxied: tuple[Any, TcpProxy, str]) -> None:
    """Packets vanish for longer than the server's wal_sender_timeout (scaled: 3 s; by default 60 s)."""
    s, proxy, via_proxy = proxied
    dsn = make_conninfo(via_proxy, options="-c wal_sender_timeout=3s")
    prepare(s.config())
    cfg = config(tmp_path, s.name, dsn, s.tables, max_delay_seconds=2)
    proc = start_run(cfg)
    try:
        insert(s.dsn, f"{s.schema}.items", range(1, 11))
        wait_for(lambda: bronze_count(tmp_path / "warehouse", s.name) == 10, proc, 60)
        proxy.blackhole()
        time.sleep(10)
        insert(s.dsn, f"{s.schema}.items", range(11, 16))  # written during the outage (direct, not proxied)
        proxy.heal()
        insert(s.dsn, f"{s.schema}.items", range(16, 21))
        wait_for(lambda: bronze_count(tmp_path / "warehouse", s.name) >= 20, proc, 90)
    finally:
        rc, err = stop(proc)
    assert rc == 0, err
    assert ids(tmp_path / "warehouse", s.name) == list(range(1, 21))
    assert "unreachable" in err and "Traceback" not in err


def test_a_silent_server_is_taken_for_a_broken_path(
    warehouse: Path, proxied: tuple[Any, TcpProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blackhole sends no reset: ingest asks for a reply every status interval and gives up on silence."""
    from ingest.bronze.writer import BronzeWriter
    from ingest.config import BatchConfig
    from ingest.errors import SourceUnavailableError
    from ingest.progress import Progress
    from ingest.sources.postgres import capture

    monkeypatch.setattr(capture, "STATUS_INTERVAL_S", 0.5)
    monkeypatch.setattr(capture, "SERVER_SILENCE_S", 3.0)
    s, proxy, via_proxy = proxied
    src = s.config().model_copy(update={"dsn": via_proxy, "heartbeat_seconds": 3600})
    prepare(src)
    insert(s.dsn, f"{s.schema}.items", range(1, 4))
    cap = capture.PostgresCapture(
        src, BatchConfig(max_seconds=0.1), BronzeWriter(warehouse), Progress(s.name, enabled=False), snapshots=False
    )

    def blackhole_once_captured() -> bool:
        if bronze_count(warehouse, s.name) == 3:
            proxy.blackhole()
        return False

    t0 = time.monotonic()
    with pytest.raises(SourceUnavailableError, match="no word from the server"):
        cap.run(once=False, should_stop=blackhole_once_captured)
    assert time.monotonic() - t0 < 60
    assert ids(warehouse, s.name) == [1, 2, 3]  # what was durable stays; nothing past it was acknowledged
