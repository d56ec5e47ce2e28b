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
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ingest.config import PostgresSource
from tests.helpers.ingest_process import start_run, stop, wait_for, write_config
from tests.helpers.pg import ROOT, bronze_count, bronze_events, prepare
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
    cluster = ScratchCluster(25341)
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


def start_logged_run(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    """A continuous `run` whose stderr goes to `log`, readable while it runs."""
    return subprocess.Popen(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def sigterm_and_time(proc: subprocess.Popen[bytes], limit: float) -> tuple[int | None, float]:
    """SIGTERM; the exit code (None if it did not exit within `limit` s, then SIGKILLed) and the seconds it took."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc: int | None = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = None
        proc.kill()
        proc.wait()
    return rc, time.monotonic() - t0


@pytest.fixture
def sync_scratch() -> Iterator[ScratchCluster]:
    cluster = ScratchCluster(25371)
    yield cluster
    cluster.remove()


def set_sync_standbys(dsn: str, names: str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        if names is None:
            c.execute("alter system reset synchronous_standby_names")
        else:
            c.execute(f"alter system set synchronous_standby_names = '{names}'")
        c.execute("select pg_reload_conf()")


def test_synchronous_replication_neither_deadlocks_ingest_nor_the_application(
    tmp_path: Path, sync_scratch: ScratchCluster
) -> None:
    """Regression: with `synchronous_standby_names = '*'` ingest's own walsender is a sync standby, and
    ingest's heartbeat (a commit) waited for it on the loop that acknowledges: ingest hung, every
    application commit on the source hung behind it, and SIGTERM was not honoured."""
    dsn = sync_scratch.dsn
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("create table items (id int primary key)")
    src = PostgresSource(kind="postgres", name="syncrep", dsn=dsn, tables=["public.items"], heartbeat_seconds=1)
    prepare(src)
    source = {"kind": "postgres", "name": src.name, "dsn": dsn, "tables": src.tables, "heartbeat_seconds": 1}
    cfg = write_config(tmp_path, {**source, "snapshot": {"initial": False}})
    warehouse = tmp_path / "warehouse"
    proc = start_logged_run(cfg, tmp_path / "ingest.log")
    done: list[int] = []
    try:
        insert(dsn, "public.items", range(1, 2))
        wait_for_proc(lambda: bronze_count(warehouse, src.name) == 1, proc, 60)
        set_sync_standbys(dsn, "*")
        time.sleep(3)  # heartbeats fire while the walsender is the sync standby

        def app_writes() -> None:
            try:
                for i in range(2, 12):
                    insert(dsn, "public.items", range(i, i + 1))
                    done.append(i)
                    time.sleep(0.5)  # several heartbeats among the application's commits
            except psycopg.Error:
                pass  # the server went away under a hung commit (teardown): `done` tells what completed

        writer = threading.Thread(target=app_writes, daemon=True)
        writer.start()
        writer.join(timeout=60)
        assert done == list(range(2, 12)), f"application commits hung after {done}"
        wait_for_proc(lambda: bronze_count(warehouse, src.name) == 11, proc, 30)
        with psycopg.connect(dsn) as c:
            row = c.execute("select application_name, sync_state from pg_stat_replication").fetchone()
        assert row == ("changelake_syncrep", "sync"), row  # the name to keep out of synchronous_standby_names
        rc, took = sigterm_and_time(proc, 20)
    finally:
        set_sync_standbys(dsn, None)  # releases anything still waiting
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "ingest.log").read_text()
    assert rc == 0 and took < 20, (rc, took, log[-3000:])
    assert ids(warehouse, src.name) == list(range(1, 12))


def wait_for_proc(check: Callable[[], bool], proc: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert proc.poll() is None, f"ingest exited ({proc.returncode})"
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.3)


def test_a_frozen_peer_is_detected_and_sigterm_ends_the_run(tmp_path: Path, proxied: tuple[Any, TcpProxy, str]) -> None:
    """Regression: a peer that keeps the connection open and answers nothing (a stalled proxy, a
    frozen server) hung ingest forever: the heartbeat's commit blocked the loop before its silence
    check, no timeout bounded it, and SIGTERM waited for the peer."""
    s, proxy, via_proxy = proxied
    prepare(s.config())
    source = {"kind": "postgres", "name": s.name, "dsn": via_proxy, "tables": s.tables, "heartbeat_seconds": 2}
    cfg = write_config(tmp_path, {**source, "snapshot": {"initial": False}}, retry={"max_delay_seconds": 2})
    log = tmp_path / "ingest.log"
    proc = start_logged_run(cfg, log)
    try:
        insert(s.dsn, f"{s.schema}.items", range(1, 4))
        wait_for_proc(lambda: bronze_count(tmp_path / "warehouse", s.name) == 3, proc, 60)
        time.sleep(1)
        proxy.blackhole()
        t0 = time.monotonic()
        wait_for_proc(lambda: "unreachable" in log.read_text(), proc, 50)
        detected = time.monotonic() - t0
        time.sleep(2)  # a reconnect attempt is under way through the frozen proxy
        rc, took = sigterm_and_time(proc, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert detected < 45, text[-3000:]
    assert rc is not None and took < 30, (took, text[-3000:])
    assert rc in (0, 75) and "Traceback" not in text, text[-3000:]
    assert ids(tmp_path / "warehouse", s.name) == [1, 2, 3]
