"""A continuous `run` against the real PostgreSQL answers probes, posts alert transitions, reports lineage."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.bronze.writer import BronzeWriter
from tests.helpers.ingest_process import free_port, start_run, stop, wait_for, write_config
from tests.helpers.pg import prepare
from tests.unit.ops.recorder import recording

pytestmark = pytest.mark.integration
HOOK = "/hooks/changelake"
EVENTS = "/api/v1/lineage"


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError:
        return 0, {}  # not listening yet


def test_probes_webhook_and_lineage_of_a_running_stream(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, note text)", ["items"])
    src = s.config()
    prepare(src)
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"initial": False}}
    source["heartbeat_seconds"] = 3600  # the stream raises its position only when changes come
    port = free_port()
    with recording() as endpoint:
        cfg = write_config(
            tmp_path,
            source,
            alerts={"max_position_age_seconds": 2, "webhook": {"url": endpoint.base + HOOK}},
            lineage={"url": endpoint.base, "namespace": "test"},
            log={"format": "json"},
        )
        proc = start_run(cfg, "--metrics-port", str(port))
        try:
            wait_for(lambda: probe(port, "/readyz")[0] == 200, proc, 60, "ready")
            status, live = probe(port, "/healthz")
            assert status == 200 and s.name in live["sources"], live
            assert [e["eventType"] for e in endpoint.bodies(EVENTS)] == ["START"]

            s.execute(f"insert into {s.tables[0]} values (1, 'a')")
            # Idle after that insert: the writer's row ages past 2 s, and the watcher's next read of
            # bronze.stream_positions (every 10 s) makes the source stale, so not ready.
            wait_for(lambda: probe(port, "/readyz")[0] == 503, proc, 40, "stale, not ready")
            _, body = probe(port, "/readyz")
            assert body["sources"][s.name]["state"] == "stale"
            assert any("writer_stale" in r for r in body["reasons"]), body
            status, live = probe(port, "/healthz")  # stale positions, but the loop still turns:
            assert status == 200 and live["sources"][s.name] < 5, live  # its beat is recent, 10+ s into the run
            endpoint.wait(lambda: len(endpoint.bodies(HOOK)) == 1)
        finally:
            rc, err = stop(proc)
        assert rc == 0, err
        endpoint.wait(lambda: len(endpoint.bodies(EVENTS)) == 2)
    hook = endpoint.bodies(HOOK)
    assert len(hook) == 1 and f"{s.name}: alert writer_stale started" in hook[0]["text"], hook
    start, done = endpoint.bodies(EVENTS)
    assert done["eventType"] == "COMPLETE" and done["run"]["runId"] == start["run"]["runId"]
    db = psycopg.conninfo.conninfo_to_dict(s.dsn)
    assert [(d["namespace"], d["name"]) for d in done["inputs"]] == [
        (f"postgres://{db['host']}:{db['port']}", f"{db['dbname']}.{s.tables[0]}")
    ]
    assert {d["name"] for d in done["outputs"]} == {
        f"{tmp_path}/warehouse/bronze/wal_events",
        f"{tmp_path}/warehouse/bronze/stream_positions",
    }
    facet = done["run"]["facets"]["changelake_positions"]
    in_bronze = {p.writer_id: p.durable_lsn for p, _ in BronzeWriter(str(tmp_path / "warehouse")).positions(s.name)}
    assert facet["safeBound"] == in_bronze["stream"] > 0
    assert [(w["writerId"], w["durablePosition"]) for w in facet["writers"]] == [("stream", in_bronze["stream"])]
    for line in err.splitlines():  # log.format json: every log line is one object
        assert {"ts", "level", "logger", "message"} <= json.loads(line).keys(), line
