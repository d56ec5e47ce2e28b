"""scripts/cluster.sh's idea of a daemon being alive, without Spark: PID files and /proc.

The script knows a daemon by the PID it recorded and the class on that process's command line (a
recycled PID runs something else). While a process execs (the Thrift server goes setsid -> env ->
spark-submit -> spark-class -> java), Linux shows an empty /proc/PID/cmdline for a moment: a live
daemon read at that moment must not count as gone (`up` once stopped waiting for HiveServer2 and
failed, "thrift exited before HiveServer2", on a server that was still starting).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.pg import ROOT

THRIFT_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


def cluster(command: str, state: Path, warehouse: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        CHANGELAKE_STATE=str(state),
        CHANGELAKE_WAREHOUSE=str(warehouse),
        CHANGELAKE_SPARK_HOST="127.0.0.1",
        CHANGELAKE_THRIFT_PORT=str(port),
    )
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "cluster.sh"), command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something listens on (what `serves` probes besides the process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        accepting = threading.Thread(target=accept_all, args=(s,), daemon=True)
        accepting.start()
        yield int(s.getsockname()[1])


def accept_all(s: socket.socket) -> None:
    while True:
        try:
            conn, _ = s.accept()
        except OSError:  # closed: the test is over
            return
        conn.close()


def fake_daemon(tmp_path: Path, state: Path, warehouse: Path, script: str) -> subprocess.Popen[bytes]:
    """A process recorded as the `thrift` daemon of `state`, with the Thrift server's class in its argv."""
    (tmp_path / "daemon.sh").write_text(script)
    proc = subprocess.Popen(["bash", str(tmp_path / "daemon.sh"), THRIFT_CLASS], start_new_session=True)
    (state / "cluster").mkdir(parents=True)
    (state / "cluster" / "thrift.pid").write_text(f"{proc.pid}\n")
    (state / "cluster" / "warehouse").write_text(f"{warehouse}\n")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_daemon_that_is_exec_ing_still_serves(tmp_path: Path, listener: int) -> None:
    """A daemon that execs without end (each exec a moment of empty cmdline) is alive at every `serves`."""
    state, warehouse = tmp_path / "state", tmp_path / "warehouse"
    proc = fake_daemon(tmp_path, state, warehouse, 'exec bash "$0" "$@"\n')
    try:
        answers = [cluster("serves", state, warehouse, listener).returncode for _ in range(60)]
    finally:
        stop(proc)
    assert answers == [0] * 60, f"{answers.count(0)} of 60 `serves` saw the exec-ing daemon alive"


def test_a_dead_or_foreign_daemon_does_not_serve(tmp_path: Path, listener: int) -> None:
    """The same check still says no for a PID that exited, and for a PID running another program."""
    state, warehouse = tmp_path / "state", tmp_path / "warehouse"
    proc = fake_daemon(tmp_path, state, warehouse, "exec sleep 600\n")  # argv: sleep 600, no class
    try:
        foreign = cluster("serves", state, warehouse, listener)
        status = cluster("status", state, warehouse, listener)
    finally:
        stop(proc)
    gone = cluster("serves", state, warehouse, listener)
    assert foreign.returncode == 1
    assert "thrift: stopped" in status.stdout
    assert gone.returncode == 1
