"""A captured table altered while `run` streams, and while ingest is stopped: counted, logged and alerted by kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ingest_process import free_port, ingest, key, scrape, start_run, stop, wait_for, write_config
from tests.helpers.pg import prepare
from tests.unit.ops.recorder import recording

pytestmark = pytest.mark.integration
HOOK = "/hooks/changelake"


def _changes(stderr: str) -> list[dict[str, Any]]:
    """The `schema change` log lines (log.format json)."""
    docs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [d for d in docs if d["message"].startswith("schema change ")]


def test_schema_changes_raise_the_metric_the_alert_and_a_log_line(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, name text, qty int)", ["items"])
    prepare(s.config())
    table = s.tables[0]
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"initial": False}}
    port = free_port()
    count = {
        kind: key("changelake_schema_changes_total", source=s.name, table=table, kind=kind)
        for kind in ("added", "dropped", "renamed", "retyped", "key_changed")
    }
    active = key("changelake_alert_active", source=s.name, alert="schema_changed")
    with recording() as endpoint:
        cfg = write_config(tmp_path, source, alerts={"webhook": {"url": endpoint.base + HOOK}}, log={"format": "json"})
        proc = start_run(cfg, "--metrics-port", str(port))
        try:
            s.execute(f"insert into {table} values (1, 'a', 1)")
            events = key("changelake_events_total", source=s.name, writer="stream")
            wait_for(lambda: scrape(port).get(events, 0) >= 1, proc, 60, "the first event")
            assert scrape(port).get(active) == 0

            # The stream meets the new shape with the next change of the table (its Relation message).
            s.execute(f"alter table {table} add column note text")
            s.execute(f"insert into {table} values (2, 'b', 2, 'n')")
            wait_for(lambda: scrape(port).get(count["added"]) == 1, proc, 30, "added counted")
            wait_for(lambda: scrape(port).get(active) == 1, proc, 15, "schema_changed active")
            endpoint.wait(lambda: len(endpoint.bodies(HOOK)) == 1)

            s.execute(f"alter table {table} rename column name to title")
            s.execute(f"alter table {table} alter column qty type bigint")
            s.execute(f"update {table} set qty = 3 where id = 1")
            wait_for(lambda: scrape(port).get(count["retyped"]) == 1, proc, 30, "retyped counted")
            got = scrape(port)
        finally:
            rc, err = stop(proc)
        assert rc == 0, err
    assert (got[count["renamed"]], got[count["added"]], got.get(count["dropped"], 0)) == (1, 1, 0)
    assert got[active] == 1  # held (ingest/ops/watch.py SCHEMA_CHANGE_HOLD_S), not cleared by the next poll
    [hook] = endpoint.bodies(HOOK)  # one notice per table while its alert holds
    assert f"{s.name}: alert schema_changed started: table {table} changed shape: added note" in hook["text"], hook
    logged = [(d["table"], d["kinds"]) for d in _changes(err)]
    assert logged == [(table, "added"), (table, "renamed,retyped")], err

    # Changed while ingest was stopped, with no row change after it: met at the next start (catalog).
    s.execute(f"alter table {table} drop column note, drop constraint items_pkey, add primary key (id, title)")
    p = ingest(cfg, "run", "--once")
    assert p.returncode == 0, p.stderr
    [line] = _changes(p.stderr)
    assert (line["table"], line["kinds"]) == (table, "dropped,key_changed"), line
    assert "key_changed (id) -> (id, title)" in line["message"]

    # `status --json`, another process with ingest stopped, holds the alert from bronze's recorded
    # shapes: the table's latest change, in the running alert's words; the state stays healthy.
    p = ingest(cfg, "status", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    [doc] = [d for d in json.loads(p.stdout)["sources"] if d["name"] == s.name]
    held = [a for a in doc["alerts"] if a["kind"] == "schema_changed"]
    assert [(a["table"], a["message"]) for a in held] == [
        (table, f"table {table} changed shape: dropped note; key_changed (id) -> (id, title)")
    ], doc["alerts"]
    assert doc["state"] == "healthy", doc
