"""`/healthz` follows each capture loop's heartbeat and `/readyz` the watcher's verdict, on the metrics port."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from ingest.config import AlertsConfig
from ingest.ops import metrics
from ingest.ops.health import Alert, AlertKind
from ingest.ops.probes import PROBES, Probes
from ingest.ops.watch import Watcher
from tests.unit.ops.test_watch import GB, Readings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_once_a_loop_stops_beating_and_recovers_when_it_turns() -> None:
    clock = Clock()
    p = Probes(clock)
    p.liveness_s = 60
    assert p.liveness().status == 200  # nothing running yet: the process itself is alive
    stop_flag = p.beating("a", lambda: False)
    assert p.liveness().body["sources"] == {"a": 0.0}  # a source about to run counts from now
    assert stop_flag() is False  # the wrapped question still answers as the run's stop flag
    p.beat("b")
    clock.now += 61
    other = threading.Thread(target=stop_flag)  # a snapshot thread asking the same question
    other.start()
    other.join()
    p.beat("b")
    verdict = p.liveness()
    assert verdict.status == 503
    assert verdict.body["status"] == "stuck" and "a" in verdict.body["reason"] and "b" not in verdict.body["reason"]
    assert verdict.body["sources"] == {"a": 61.0, "b": 0.0}
    stop_flag()
    assert p.liveness().status == 200
    clock.now += 100
    p.forget("a")
    p.forget("b")
    assert p.liveness().status == 200  # an ended run is not a stuck one


def test_readiness_needs_a_verdict_and_no_blocking_alert() -> None:
    p = Probes(Clock())
    assert p.readiness().status == 503 and p.readiness().body["reasons"] == ["no source is being captured"]
    p.watching("r")
    assert p.readiness().body["reasons"] == ["r: not checked yet"]
    p.judged("r", [Alert(AlertKind.SLOT_LAG, "lag 5 GB")])
    ready = p.readiness()
    assert ready.status == 200, ready.body  # lagging is catching up: still ready
    assert ready.body["sources"]["r"]["state"] == "lagging"
    for kind in (AlertKind.SOURCE_UNREACHABLE, AlertKind.WRITER_STALE, AlertKind.SLOT_LOST, AlertKind.SLOT_MISSING):
        p.judged("r", [Alert(AlertKind.SLOT_LAG, "lag"), Alert(kind, "why")])
        v = p.readiness()
        assert v.status == 503 and v.body["reasons"] == [f"r: {kind.value}: why"], v.body


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_metrics_port_answers_probes_from_a_running_watcher() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = metrics.serve(port, "127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    slot = Readings()
    w = Watcher("probe_src", AlertsConfig(max_lag_bytes=GB), lambda: [], slot, interval_s=0.05)
    try:
        w.start()
        deadline = time.monotonic() + 5
        while get(base + "/readyz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        status, body = get(base + "/readyz")
        assert status == 200 and json.loads(body)["sources"]["probe_src"]["ready"] is True
        slot.down = True
        while get(base + "/readyz")[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        status, body = get(base + "/readyz")
        doc = json.loads(body)
        assert status == 503 and doc["sources"]["probe_src"]["state"] == "unreachable"
        assert any("source_unreachable" in r for r in doc["reasons"])
        PROBES.beat("probe_src")
        status, body = get(base + "/healthz")
        assert status == 200 and "probe_src" in json.loads(body)["sources"]
        assert b"changelake_source_up" in get(base + "/metrics")[1]
    finally:
        w.stop()
        PROBES.forget("probe_src")
        server.shutdown()
        server.server_close()
