"""A history-lost recovery (`on_history_lost: resnapshot`) killed anywhere still re-snapshots every table.

The recovery writes up to three things: snapshot requests, a tombstone (a truncate of every table:
MongoDB's, and Postgres' only where snapshots cannot mend silver) and the stream's position past
the lost history. It used to commit the tombstone and the position first and register the
snapshots last, so a crash in between left every table truncated in silver for good: the next
start saw nothing lost and every table as snapshotted already. Here ingest is SIGKILLed at each
step (ingest/faults.py), restarted normally, and bronze must then hold, after the last tombstone
(or, for Postgres, after the lost history), a complete snapshot of every table with the rows the
source has.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pymongo import MongoClient

from ingest.bronze.writer import BronzeWriter
from ingest.sources.mongodb.changes import pack_cluster_time, record_key
from ingest.sources.mongodb.source import cluster_time
from tests.helpers.bronze_fold import live_records
from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import run_killed
from tests.helpers.pg import ROOT, bronze_events, drop_slot, prepare
from tests.helpers.scratch_pg import ScratchCluster
from tests.integration.test_pg_restore import restored_past_bronze
from tests.mongo.server import mongo_java_server

pytestmark = [pytest.mark.integration, pytest.mark.crash]

RESTORED_PORT = 25349  # a scratch cluster restored from a copy (test_pg_restore.py)
PG_POINTS = ["recovery_after_snapshot_requests:1", "recovery_after_tombstone:1", "recovery_after_position:1"]
# MongoDB's tombstone and position go through the committer: its own points fall between them.
MONGO_POINTS = [
    "recovery_after_snapshot_requests:1",
    "after_events_commit:1",
    "after_position_commit:1",
    "recovery_after_position:1",
]


def resnapshotted(
    warehouse: Path, source: str, prefix: str, tables: list[str] | None = None, after_lsn: int | None = None
) -> dict[str, list[str]]:
    """table -> the record keys of its complete snapshot read after the last tombstone.

    Fails unless every table the tombstone truncated has one, every writer row but the stream's
    is retired, and no page of that snapshot lies at or before the tombstone. Without a tombstone
    (a Postgres recovery writes none), for `tables` and after `after_lsn`, and the snapshot must be
    a whole-table one (`table_snapshot`: silver searches it for the keys the gap deleted); after a
    tombstone (MongoDB's recovery) any complete snapshot will do.
    """
    tombstones = [e for e in bronze_events(warehouse, source) if e.message_prefix == prefix]
    whole_table = tables is not None and after_lsn is not None
    if tables is None or after_lsn is None:
        assert tombstones, "no history-lost tombstone in bronze"
        tables, after_lsn = list(tombstones[-1].truncated_tables), tombstones[-1].commit_lsn
    else:
        assert tombstones == [], "a tombstone the recovery did not need"
    pages = read(
        warehouse / "bronze/snapshot_pages", f"source = '{source}' and row_index >= 0", "page_number, row_index"
    )
    out: dict[str, list[str]] = {}
    for table in tables:
        schema, name = table.split(".", 1)
        mine = [p for p in pages if (p.table_schema, p.table_name) == (schema, name)]
        after = {p.snapshot_id for p in mine if p.high_watermark_lsn > after_lsn}
        done = sorted(
            sid
            for sid in after
            if any(p.last_page for p in mine if p.snapshot_id == sid)
            and all(
                p.high_watermark_lsn > after_lsn and (p.table_snapshot is not None or not whole_table)
                for p in mine
                if p.snapshot_id == sid
            )
        )
        assert done, f"{table}: no complete whole-table snapshot after {after_lsn}"
        out[table] = sorted(p.record_pk for p in mine if p.snapshot_id == done[-1])
    writers = [p.writer_id for p, _ in BronzeWriter(warehouse).positions(source)]
    assert writers == ["stream"], f"snapshot writers left unfinished: {writers}"
    return out


# -- Postgres: a real server; the slot is dropped and recreated while ingest is away ----------------


@pytest.mark.parametrize("crash_at", PG_POINTS)
def test_pg_resnapshot_recovery_killed_at_any_step_still_resnapshots_every_table(
    crash_at: str, tmp_path: Path, make_source: Any
) -> None:
    """Gap recovery used to commit the tombstone and position before registering the re-snapshot."""
    s = make_source(
        "create table items (id int primary key, v text); create table other (id int primary key)",
        [
            "items",
            "other",
        ],
    )
    prepare(s.config())
    warehouse = tmp_path / "warehouse"
    cfg = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "on_history_lost": "resnapshot"}
    cfg.write_text(yaml.safe_dump({"warehouse": str(warehouse), "batch": {"max_seconds": 0.2}, "sources": [source]}))
    s.execute("insert into items values (1, 'a'), (2, 'b'), (3, 'c')")
    s.execute("insert into other values (10), (11)")
    assert run_killed(cfg, None, None, once=True, stop_after=60) == 0
    # Everything bronze holds from before the gap (the stream's events, the initial snapshot's pages).
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}'")
    before_gap = max([e.commit_lsn for e in bronze_events(warehouse, s.name)] + [p.high_watermark_lsn for p in pages])
    # The history is lost: the slot goes, and changes are made while there is none.
    drop_slot(s.conn, f"changelake_{s.name}")
    s.execute("delete from items where id = 1")
    s.execute("insert into items values (4, 'd')")
    s.execute("delete from other where id = 10")

    assert run_killed(cfg, crash_at, None, once=True, stop_after=60) == -signal.SIGKILL, f"{crash_at} not reached"
    assert run_killed(cfg, None, None, once=True, stop_after=60) == 0

    tables = [f"{s.schema}.items", f"{s.schema}.other"]
    found = resnapshotted(warehouse, s.name, "changelake.historyLost", tables, before_gap)
    assert found == {
        f"{s.schema}.items": ['{"id":2}', '{"id":3}', '{"id":4}'],
        f"{s.schema}.other": ['{"id":11}'],
    }
    s.execute("insert into items values (5, 'e')")
    assert run_killed(cfg, None, None, once=True, stop_after=60) == 0
    assert bronze_events(warehouse, s.name)[-1].record == '{"id":5,"v":"e"}'


def folded(warehouse: Path, source: str) -> dict[str, dict[str, Any]]:
    """Bronze folded to each table's live records (bronze_fold), less the keys silver finds absent.

    A table's last complete whole-table snapshot ends every record it did not read (docs/snapshots.md,
    "Re-snapshots find deletes"); the fold is taken before any later change of the table.
    """
    live = live_records(warehouse, source)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{source}'")
    events = bronze_events(warehouse, source)
    for table, records in live.items():
        whole: dict[str, list[Any]] = {}
        for p in pages:
            if f"{p.table_schema}.{p.table_name}" == table and p.table_snapshot is not None:
                whole.setdefault(p.table_snapshot["id"], []).append(p)
        complete = [
            rows
            for rows in whole.values()
            if len({r.snapshot_id for r in rows if r.last_page}) == rows[0].table_snapshot["parts"]
        ]
        if not complete:
            continue
        last = max(complete, key=lambda rows: max(r.high_watermark_lsn for r in rows))
        at = max(r.high_watermark_lsn for r in last)
        later = [
            e
            for e in events
            if e.commit_lsn > at and table in (f"{e.table_schema}.{e.table_name}", *(e.truncated_tables or ()))
        ]
        assert later == [], f"{table}: changed after its last whole-table snapshot"
        keys = [r.record_pk for r in last if r.record_pk is not None]
        assert len(keys) == len(set(keys)), f"{table}: a key read twice by one snapshot"
        live[table] = {k: v for k, v in records.items() if k in keys}
    return live


def source_records(s: Any, table: str) -> list[dict[str, Any]]:
    """The source table's rows as `record` holds them (simple types only), sorted."""
    rows = s.conn.execute(f"select row_to_json(t)::text from {s.schema}.{table} t").fetchall()
    return sorted((json.loads(r[0]) for r in rows), key=lambda r: json.dumps(r, sort_keys=True))


@pytest.mark.parametrize("crash_at", PG_POINTS)
def test_pg_resnapshot_recovery_with_a_tombstone_killed_at_any_step_loses_and_resurrects_nothing(
    crash_at: str, tmp_path: Path, make_source: Any
) -> None:
    """The truncate fallback, killed at each step: a keyless partitioned table cannot be re-snapshotted.

    Its records are truncated just below the new slot's start (once, however often the recovery is
    started again) and come back as its rows change; the keyed table is re-snapshotted whole. Folded,
    bronze holds every row of the keyed table and none a row the source no longer has.
    """
    s = make_source(
        "create table items (id int primary key, v text);"
        "create table notes (v text, region text) partition by list (region);"
        "create table notes_eu partition of notes for values in ('eu');"
        "create table notes_us partition of notes for values in ('us');"
        "alter table notes replica identity full; alter table notes_eu replica identity full;"
        "alter table notes_us replica identity full",
        ["items", "notes"],
    )
    prepare(s.config())
    warehouse = tmp_path / "warehouse"
    cfg = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "on_history_lost": "resnapshot"}
    cfg.write_text(yaml.safe_dump({"warehouse": str(warehouse), "batch": {"max_seconds": 0.2}, "sources": [source]}))
    s.execute("insert into items values (1, 'a'), (2, 'b'), (3, 'c')")
    s.execute("insert into notes values ('a', 'eu'), ('b', 'us'), ('c', 'eu')")
    assert run_killed(cfg, None, None, once=True, stop_after=60) == 0
    items, tombstoned = f"{s.schema}.items", f"{s.schema}.notes"
    assert sorted(json.dumps(r, sort_keys=True) for r in folded(warehouse, s.name)[tombstoned].values()) == [
        json.dumps(r, sort_keys=True) for r in source_records(s, "notes")
    ]
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}'")
    before_gap = max([e.commit_lsn for e in bronze_events(warehouse, s.name)] + [p.high_watermark_lsn for p in pages])
    # The history is lost: the slot goes, and both tables change while there is none.
    drop_slot(s.conn, f"changelake_{s.name}")
    s.execute("delete from items where id = 1")
    s.execute("update items set v = 'gap' where id = 2")
    s.execute("insert into items values (4, 'd')")
    s.execute("delete from notes where v = 'a'")
    s.execute("update notes set v = 'c2' where v = 'c'")
    s.execute("insert into notes values ('d', 'us')")

    def tombstones() -> list[Any]:
        return [e for e in bronze_events(warehouse, s.name) if e.message_prefix == "changelake.historyLost"]

    assert run_killed(cfg, crash_at, None, once=True, stop_after=60) == -signal.SIGKILL, f"{crash_at} not reached"
    written = len(tombstones())
    assert written == (0 if crash_at == "recovery_after_snapshot_requests:1" else 1)
    assert run_killed(cfg, None, None, once=True, stop_after=60) == 0

    (tombstone,) = tombstones()  # written once, however often the recovery ran
    assert (tombstone.action, list(tombstone.truncated_tables)) == ("truncate", [tombstoned])
    assert tombstone.commit_lsn > before_gap
    recovered = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0")
    assert {p.table_name for p in recovered if p.high_watermark_lsn > tombstone.commit_lsn} == {"items"}
    writers = [p.writer_id for p, _ in BronzeWriter(warehouse).positions(s.name)]
    assert writers == ["stream"], f"snapshot writers left unfinished: {writers}"
    bronze = folded(warehouse, s.name)
    assert bronze[items] == {json.dumps({"id": r["id"]}, separators=(",", ":")): r for r in source_records(s, "items")}
    assert bronze[tombstoned] == {}  # truncated: the rows the gap left come back as they change

    s.execute("update notes set v = 'b2' where v = 'b'")
    s.execute("insert into notes values ('e', 'eu')")
    assert run_killed(cfg, None, None, once=True, stop_after=60) == 0
    now = sorted(json.dumps(r, sort_keys=True) for r in live_records(warehouse, s.name)[tombstoned].values())
    assert now == sorted(
        json.dumps(r, sort_keys=True) for r in ({"v": "b2", "region": "us"}, {"v": "e", "region": "eu"})
    )
    assert set(now) <= {json.dumps(r, sort_keys=True) for r in source_records(s, "notes")}


@pytest.mark.parametrize("crash_at", PG_POINTS)
def test_pg_restored_source_recovery_killed_at_any_step_tombstones_once_and_snapshots_after_it(
    crash_at: str, tmp_path: Path
) -> None:
    """Bronze holds transactions under xids the restored server has not handed out: every table is
    truncated below the new slot's start and re-snapshotted past it. Killed at each step, the
    tombstone is still written once and the keyed table comes back whole, without the lost rows.
    """
    scratch = ScratchCluster(RESTORED_PORT)
    try:
        warehouse = tmp_path / "warehouse"
        s, _, durable = restored_past_bronze(scratch, tmp_path, warehouse, lost=30, lost_transactions=30)
        cfg = tmp_path / "ingest.yml"
        source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "on_history_lost": "resnapshot"}
        config = {"warehouse": str(warehouse), "batch": {"max_seconds": 0.2}, "sources": [source]}
        cfg.write_text(yaml.safe_dump(config))
        acct = f"{s.schema}.acct"

        def tombstones() -> list[Any]:
            return [e for e in bronze_events(warehouse, s.name) if e.message_prefix == "changelake.historyLost"]

        assert run_killed(cfg, crash_at, None, once=True, stop_after=60) == -signal.SIGKILL, f"{crash_at} not reached"
        assert len(tombstones()) == (0 if crash_at == "recovery_after_snapshot_requests:1" else 1)
        assert run_killed(cfg, None, None, once=True, stop_after=60) == 0

        (tombstone,) = tombstones()  # written once, however often the recovery ran
        assert (tombstone.action, list(tombstone.truncated_tables)) == ("truncate", [acct])
        assert tombstone.commit_lsn >= durable
        found = resnapshotted(warehouse, s.name, "changelake.historyLost")
        assert found == {acct: [f'{{"id":{i}}}' for i in (101, 102, 103)]}
        bronze = folded(warehouse, s.name)
        want = {json.dumps({"id": r["id"]}, separators=(",", ":")): r for r in source_records(s, "acct")}
        assert bronze[acct] == want  # none of the lost history's ids 1-30
        s.execute("insert into acct values (104, 'new-104')")
        assert run_killed(cfg, None, None, once=True, stop_after=60) == 0
        assert bronze_events(warehouse, s.name)[-1].record == '{"id":104,"owner":"new-104"}'
        s.conn.close()
    finally:
        scratch.remove()


# -- MongoDB: mongo-java-server; the oplog loses the resume point (tests/helpers/mongo_history_lost.py) --


@pytest.fixture(scope="module")
def mongo_uri() -> Iterator[str]:
    with mongo_java_server() as uri:
        yield uri


def run_mongo(config: Path, crash_at: str | None) -> int:
    """One `run --once` of the runner, killed at `crash_at`; its exit code (0 or -SIGKILL)."""
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_CRASH_AT"}
    if crash_at:
        env["CHANGELAKE_CRASH_AT"] = crash_at
    p = subprocess.run(
        [sys.executable, "-m", "tests.helpers.mongo_history_lost", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode in (0, -signal.SIGKILL), p.stderr[-3000:]
    return p.returncode


@pytest.mark.parametrize("crash_at", MONGO_POINTS)
def test_mongo_resnapshot_recovery_killed_at_any_step_still_resnapshots_every_collection(
    crash_at: str, tmp_path: Path, mongo_uri: str
) -> None:
    """History-lost recovery used to commit the tombstone and position with the snapshots only queued in memory."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    db = client[f"cl_{tmp_path.name[-8:].replace('-', '_')}"]
    name = f"m_{db.name[3:]}"
    try:
        db.products.insert_many([{"_id": i, "v": str(i)} for i in (1, 2, 3)])
        db.orders.insert_many([{"_id": i} for i in (10, 11)])
        source = {
            "kind": "mongodb",
            "name": name,
            "uri": mongo_uri,
            "database": db.name,
            "collections": ["products", "orders"],
            "max_await_seconds": 0.3,
            "on_history_lost": "resnapshot",
        }
        config = tmp_path / "run.json"
        warehouse = tmp_path / "warehouse"

        def write(lost_before: int) -> None:
            config.write_text(json.dumps({"source": source, "warehouse": str(warehouse), "lost_before": lost_before}))

        write(0)
        assert run_mongo(config, None) == 0
        # Changes the oplog then loses, with the stream's resume point.
        db.products.delete_one({"_id": 1})
        db.products.insert_one({"_id": 4, "v": "4"})
        db.orders.delete_one({"_id": 10})
        write(pack_cluster_time(cluster_time(client)))  # the last change: the stream stands before it

        assert run_mongo(config, crash_at) == -signal.SIGKILL, f"{crash_at} not reached"
        assert run_mongo(config, None) == 0

        found = resnapshotted(warehouse, name, "mongodb.historyLost")
        assert found == {
            f"{db.name}.products": sorted(record_key(i) for i in (2, 3, 4)),
            f"{db.name}.orders": [record_key(11)],
        }
    finally:
        client.drop_database(db.name)
        client.close()
