"""Ingest as a subprocess for the operations tests: a config file, `run`, `status --json`, metrics scrapes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.conninfo import make_conninfo

from tests.helpers.pg import ROOT


def write_config(tmp_path: Path, source: dict[str, Any], **sections: Any) -> Path:
    """An ingest config of one source into tmp_path/warehouse, with extra top-level sections."""
    cfg = tmp_path / "ingest.yml"
    doc = {"warehouse": str(tmp_path / "warehouse"), "batch": {"max_seconds": 0.2}, **sections, "sources": [source]}
    cfg.write_text(yaml.safe_dump(doc))
    return cfg


def ingest(cfg: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run one ingest command to its end."""
    return subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def status_json(cfg: Path) -> tuple[int, dict[str, Any]]:
    """`status --json`: its exit code and document."""
    p = ingest(cfg, "status", "--json")
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def start_run(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    """A continuous `run` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM (finish the batch, acknowledge, exit 0); exit code and stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def wait_for(check: Callable[[], bool], proc: subprocess.Popen[str], seconds: float, what: str = "") -> None:
    """Poll `check` until true; fail (saying `what` was awaited) if ingest exits or time runs out."""
    deadline = time.monotonic() + seconds
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"ingest exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or 'condition'} not reached within {seconds} s")
        time.sleep(0.3)


def run_killed(cfg: Path, crash_at: str | None, kill_after: float | None, once: bool, stop_after: float) -> int:
    """One `run` (`--once` or continuous): killed at fault point `crash_at` (ingest/faults.py), or
    SIGKILLed after `kill_after` seconds, else it ends by itself; a continuous run that reaches
    neither is stopped with SIGTERM after `stop_after` seconds, as a deploy would. Its exit code
    (0 or -SIGKILL; anything else fails with ingest's stderr).
    """
    env = dict(os.environ)
    env.pop("CHANGELAKE_CRASH_AT", None)
    if crash_at:
        env["CHANGELAKE_CRASH_AT"] = crash_at
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", *(["--once"] if once else [])],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    limit = kill_after if kill_after is not None else (None if once else stop_after)
    if limit is not None:
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL if kill_after is not None else signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"ingest failed ({proc.returncode}): {err.decode()[-3000:]}")
    return proc.returncode


def run_while_writing(
    s: Any,
    write: Callable[[psycopg.Connection[Any]], None],
    cfg: Path,
    crash_at: str | None,
    kill_after: float | None,
    once: bool,
    stop_after: float,
) -> int:
    """`run_killed` while `write(conn)` changes the source on a connection of its own (a thread).

    Kills then land inside open transactions and between a commit and its acknowledgement, not
    only on a quiet source. A failure of `write` is raised here, after the run.
    """
    conn = psycopg.connect(make_conninfo(s.dsn, options=f"-c search_path={s.schema}"), autocommit=True)
    failed: list[BaseException] = []

    def target() -> None:
        try:
            write(conn)
        except BaseException as e:  # re-raised below, in the caller's thread
            failed.append(e)

    writer = threading.Thread(target=target)
    writer.start()
    try:
        rc = run_killed(cfg, crash_at, kill_after, once, stop_after)
    finally:
        writer.join()
        conn.close()
    if failed:
        raise failed[0]
    return rc


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key(name: str, **labels: str) -> str:
    """A sample's key in `scrape()`: `name{a="x",b="y"}`, labels sorted."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def scrape(port: int) -> dict[str, float]:
    """The endpoint's samples by `key()`; empty if it is not up yet."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[key(s.name, **s.labels)] = s.value
    return out
