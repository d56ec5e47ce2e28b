"""Users' incremental models on changelake's bounds, and what dbt can certify (docs/dbt.md).

The example models (models/examples, enabled by var changelake_examples) read silver through the
macros changes_since and records_changed_since. A first dbt run is killed right after both have
written their rows, before dbt records the run; the next round (updates, deletes, a truncate)
must still leave every event in it exactly once, and the record model equal to consumer_records.
A real `changelake-ingest verify` between the rounds finds silver equal to the source; the next
build records gold.completeness, checked against silver and that verify run, and
`dbt source freshness` reports the commit time at the safe bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import ingest, start_run, stop, write_config
from tests.helpers.pg import ROOT, capture_once, prepare
from tests.helpers.silver import DBT, NO_UNIT_TESTS, dbt, silver

pytestmark = pytest.mark.integration

TABLES = """
create table orders (id int primary key, note text);
create table lines (id int primary key, order_id int);
"""
EXAMPLES = ("--vars", "{changelake_examples: true}")
WRITTEN = (
    "OK created sql incremental model examples.example_change_log",
    "OK created sql incremental model examples.example_current_records",
)


def examples(warehouse: Path, model: str) -> list[Any]:
    return read(warehouse / "dbt" / "examples.db" / model)


def run_killed_after_examples_wrote(warehouse: Path) -> None:
    """`dbt run` of the example models and their silver, SIGKILLed once both have written."""
    env = dict(
        os.environ,
        PWD=str(ROOT),
        CHANGELAKE_WAREHOUSE=str(warehouse),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(warehouse.parent / "dbt-target"),
        DBT_LOG_PATH=str(warehouse.parent / "dbt-logs"),
    )
    command = [str(DBT), "run", "--select", "+path:models/examples", *EXAMPLES, "--project-dir", str(ROOT)]
    p = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if all(any(w in s for s in seen) for w in WRITTEN):
                os.killpg(p.pid, signal.SIGKILL)
                break
    finally:
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL, "".join(seen[-40:])


def verify(tmp_path: Path, s: Any) -> dict[str, Any]:
    """A real `changelake-ingest verify --json` of the source against silver, with ingest running
    (verify waits for bronze's safe bound to pass its snapshot's position); its document."""
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}
    cfg = write_config(tmp_path, source)
    run = start_run(cfg)
    try:
        p = ingest(cfg, "verify", "--json", "--no-progress", "--wait", "60", timeout=180)
    finally:
        code, err = stop(run)
    assert code == 0, err
    assert p.stdout, p.stderr
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


def test_user_models_read_each_change_once_across_a_killed_run(
    tmp_path: Path, warehouse: Path, make_source: Any
) -> None:
    s = make_source(TABLES, ["orders", "lines"])
    prepare(s.config())
    s.execute("insert into orders select g, 'n' || g from generate_series(1, 5) g")
    s.execute("insert into lines select g, g from generate_series(1, 3) g")
    s.execute("update orders set note = 'changed' where id = 2")
    s.execute("delete from orders where id = 3")
    capture_once(warehouse, s.config())
    run_killed_after_examples_wrote(warehouse)
    assert examples(warehouse, "example_change_log") and examples(warehouse, "example_current_records")
    # verify against the silver the killed run left: both tables equal, in bronze.verification_runs.
    verified = verify(tmp_path, s)
    assert verified["result"] == "equal" and len(verified["tables"]) == 2, verified

    # The next round, after the killed run: its batch, a truncate and deletes included.
    s.execute("insert into orders values (6, 'n6'), (7, 'n7')")
    s.execute("update orders set note = 'again' where id = 1")
    s.execute("delete from orders where id = 4")
    s.execute("truncate lines")
    s.execute("insert into lines values (10, 6)")
    capture_once(warehouse, s.config())
    # The tests of completeness and of the example models only (one row per (source, seq) in the
    # change log after the killed run, one per key in the records): the others are the dbt flow's.
    selection: tuple[str, ...] = ("--select", "+path:models/examples", "+completeness", "*completeness*")
    selection += ("*changelake_rules_example_*",)
    selection += ("--indirect-selection", "empty")
    dbt(warehouse, "build", *NO_UNIT_TESTS, *selection, *EXAMPLES)
    results = json.loads((warehouse.parent / "dbt-target" / "run_results.json").read_text())["results"]
    tests = {r["unique_id"].split(".")[2]: r["status"] for r in results if r["unique_id"].startswith("test.")}
    rules = [t for t in tests if t.startswith("changelake_rules_completeness")]
    assert "assert_gold_completeness_is_consistent" in tests and len(rules) == 1, tests
    for model in ("example_change_log", "example_current_records"):
        assert [t for t in tests if t.startswith(f"changelake_rules_{model}_")], (model, tests)
    assert len(tests) == 4 and set(tests.values()) == {"pass"}, tests

    events = [e for e in silver(warehouse, "sequin_events") if e.source == s.name]
    logged = examples(warehouse, "example_change_log")
    seqs = sorted(r.seq for r in logged)
    assert seqs == sorted(e.seq for e in events) == list(range(1, len(events) + 1)), "each event exactly once"
    by_seq = {e.seq: (e.action, e.record_pk, e.record) for e in events}
    assert {r.seq: (r.action, r.record_pk, r.record) for r in logged} == by_seq
    assert {"delete", "truncate"} <= {r.action for r in logged}

    def state(rows: list[Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
        return {(r.table_name, r.record_pk): (r.record, r.deleted, r.commit_lsn) for r in rows if r.source == s.name}

    records = state(examples(warehouse, "example_current_records"))
    assert records == state(silver(warehouse, "consumer_records"))
    assert {pk for (table, pk), (_, deleted, _) in records.items() if table == "lines" and deleted} == {
        json.dumps({"id": i}, separators=(",", ":")) for i in (1, 2, 3)
    }, "the truncate's tombstones"

    (loaded,) = [r for r in silver(warehouse, "loaded_bounds") if r.source == s.name]
    (row,) = [r for r in read(warehouse / "dbt" / "gold.db" / "completeness") if r.source == s.name]
    last = max(events, key=lambda e: e.seq)
    assert (row.complete_through_lsn, row.last_change_seq, row.last_change_lsn) == (
        loaded.loaded_safe_lsn,
        last.seq,
        last.commit_lsn,
    )
    # Committed through the last bronze commit at or below the bound, which may be a heartbeat or the
    # drain marker of a `--once` run after the last change (the last change's time until 2026-11-27).
    through = read(
        warehouse / "bronze" / "wal_events",
        where=f"source = '{s.name}' and commit_lsn <= {loaded.loaded_safe_lsn}",
        order_by="commit_lsn desc, commit_index desc",
    )[0]
    assert row.complete_through_commit_at == through.commit_timestamp >= last.commit_timestamp, (through, last)
    assert (row.last_verify_run_id, row.verify_status, row.tables_verified) == (verified["run_id"], "equal", 2)
    # The same certificate in dbt's run artifacts: the completeness node's result message.
    (built,) = [r for r in results if r["unique_id"] == "model.changelake.completeness"]
    assert built["adapter_response"]["code"] == "completeness", built
    message = built["adapter_response"]["_message"]
    assert f"{s.name} through position {loaded.loaded_safe_lsn}, committed through 20" in message, message
    assert message.startswith("complete: ") and f"{s.name} " in message and "verify equal" in message, message

    # Freshness: the commit time of the last bronze row (heartbeats included) at or below the safe bound.
    dbt(warehouse, "source", "freshness", "--select", "source:changelake.bronze.wal_events")
    (result,) = json.loads((warehouse.parent / "dbt-target" / "sources.json").read_text())["results"]
    (position,) = [p.durable_lsn for p in read(warehouse / "bronze" / "stream_positions") if p.source == s.name]
    visible = read(warehouse / "bronze" / "wal_events", f"source = '{s.name}' and commit_lsn <= {position}")
    expected = max(e.commit_timestamp for e in visible)
    assert datetime.fromisoformat(result["max_loaded_at"]) == expected.replace(tzinfo=UTC)
