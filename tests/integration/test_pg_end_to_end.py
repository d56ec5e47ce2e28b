"""Randomized end to end: silver equals the source after SIGKILLs, schema changes and partitions.

DESIGN §7.1 and §7.7 in one run: a partitioned table (captured as its root, rows moving between
partitions), `ADD COLUMN ... DEFAULT` on both tables while they stream (existing rows change
without WAL: ingest re-snapshots), transactions larger than a batch (written in pages), and
ingest killed at fault points and at random moments while the workload writes, in `run --once`
and continuous rounds. Then one dbt run, and `consumer_records` is compared with the source,
column for column; the deleted records are exactly the keys that existed and are gone.
"""

from __future__ import annotations

import json
import os
import random
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import run_killed, run_while_writing
from tests.helpers.pg import bronze_events, prepare
from tests.helpers.silver import dbt, silver, snapshot_rows, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SEED = int(os.environ.get("CHANGELAKE_TEST_SEED", random.randrange(1 << 30)))
TABLES_SQL = (
    "create table items (id int primary key, v text);"
    "create table parts (id int, region int, v text, primary key (id, region)) partition by list (region);"
    "create table parts_0 partition of parts for values in (0);"
    "create table parts_1 partition of parts for values in (1)"
)
KEYS = {"items": ["id"], "parts": ["id", "region"]}
# (fault point, seconds before a SIGKILL): a fault point of the stream, of a snapshot, or a moment
ROUNDS: list[tuple[str | None, float | None]] = [
    ("mid_transaction_flush:1", None),
    (None, 3.0),
    ("snapshot_after_page_commit:1", None),
    ("after_position_commit:2", None),
    (None, 5.0),
]
STOP_AFTER_S = 10.0  # a continuous round that nobody kills is stopped with SIGTERM


def workload(conn: psycopg.Connection[Any], rnd: random.Random, next_id: list[int], alter: int | None) -> None:
    """Row changes on both tables, a partition move now and then, a transaction larger than a batch.

    With `alter`: a column with a default is added to each table partway through.
    """
    for n in range(16):
        if alter is not None and n == 8:
            conn.execute(f"alter table items add column c{alter} int default {alter}")
            conn.execute(f"alter table parts add column d{alter} text default 'd{alter}'")
        with conn.transaction():
            for _ in range(rnd.randint(1, 3)):
                table = rnd.choice(["items", "parts"])
                (count,) = conn.execute(f"select count(*) from {table}").fetchone() or (0,)
                op = rnd.random()
                if op < 0.45 or count == 0:
                    next_id[0] += 1
                    if table == "items":
                        conn.execute("insert into items (id, v) values (%s, %s)", (next_id[0], f"v{rnd.random():.5f}"))
                    else:
                        conn.execute(
                            "insert into parts (id, region, v) values (%s, %s, %s)",
                            (next_id[0], rnd.randint(0, 1), f"p{rnd.random():.5f}"),
                        )
                    continue
                cols = ", ".join(KEYS[table])
                key = f"(select {cols} from {table} order by {cols} offset {rnd.randrange(count)} limit 1)"
                where = f"({cols}) = {key}"
                if op < 0.75:
                    conn.execute(f"update {table} set v = %s where {where}", (f"u{rnd.random():.5f}",))
                elif op < 0.85 and table == "parts":
                    conn.execute(f"update parts set region = 1 - region where {where}")  # moves partition
                elif op < 0.9 and table == "items":
                    next_id[0] += 1
                    conn.execute(f"update items set id = %s where {where}", (next_id[0],))
                else:
                    conn.execute(f"delete from {table} where {where}")
    with conn.transaction():  # larger than a batch (40 events): written in pages
        start, next_id[0] = next_id[0] + 1, next_id[0] + 60
        conn.execute(
            "insert into items (id, v) select g, 'bulk' from generate_series(%s::int, %s::int) g", (start, next_id[0])
        )
        conn.execute(
            "insert into parts (id, region, v) select g, g %% 2, 'bulk' from generate_series(%s::int, %s::int) g",
            (start, next_id[0]),
        )


@pytest.mark.usefixtures("engine")
def test_silver_equals_the_source_after_sigkills_schema_changes_and_partition_moves(
    tmp_path: Path, make_source: Any
) -> None:
    print(f"end-to-end seed: {SEED} (rerun with CHANGELAKE_TEST_SEED={SEED})")
    rnd = random.Random(SEED)
    s = make_source(TABLES_SQL, ["items", "parts"])
    s.execute("insert into items select g, 'seed' || g from generate_series(1, 30) g")
    s.execute("insert into parts select g, g % 2, 'seed' || g from generate_series(1, 30) g")
    prepare(s.config())  # the slot exists before the first change the rounds make
    next_id = [30]
    warehouse = tmp_path / "warehouse"
    cfg = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"page_rows": 7}}
    cfg.write_text(
        yaml.safe_dump(
            {"warehouse": str(warehouse), "batch": {"max_events": 40, "max_seconds": 1}, "sources": [source]}
        )
    )
    kills = 0
    for n, (crash_at, kill_after) in enumerate(ROUNDS):
        # Something to read from the start (a fault point is reached whatever the timing); round 2
        # adds columns before ingest starts (the start meets them), round 3 while it runs (the stream).
        workload(s.conn, rnd, next_id, alter=n if n == 2 else None)
        seed, alter = rnd.random(), n if n == 3 else None
        rc = run_while_writing(
            s,
            partial(workload, rnd=random.Random(seed), next_id=next_id, alter=alter),
            cfg,
            crash_at,
            kill_after,
            n % 2 == 0,
            STOP_AFTER_S,
        )
        if crash_at:
            assert rc != 0, f"seed {SEED}: crash point {crash_at} was never reached"
        kills += rc != 0
    # Quiescent: `run --once` until no snapshot is left to do (a run whose snapshots were done when
    # its stream met a schema change leaves that re-snapshot to the next run, as a scheduler runs it).
    for _ in range(4):
        assert run_killed(cfg, None, None, once=True, stop_after=STOP_AFTER_S) == 0
        writers = read(warehouse / "bronze/stream_positions", f"source = '{s.name}' and writer_kind = 'snapshot'")
        if not writers:
            break
    assert not writers, f"seed {SEED}: snapshots still to do after four runs: {writers}"
    assert kills >= 3, f"seed {SEED}: only {kills} rounds were killed"

    bronze = bronze_events(warehouse, s.name)
    pages = snapshot_rows(warehouse, s.name)
    snapshots = {(p.table_name, p.snapshot_id) for p in pages}
    # The initial snapshots and at least one re-snapshot of each table after its ADD COLUMN.
    assert {t for t, _ in snapshots} == {"items", "parts"} and len(snapshots) >= 4, snapshots
    # A partition move: the server sends a delete of the old key and an insert of the new one.
    moves = {
        (e.commit_lsn, json.loads(e.record_pk)["id"])
        for e in bronze
        if e.table_name == "parts" and e.action == "delete"
    }
    assert any(
        (e.commit_lsn, json.loads(e.record_pk)["id"]) in moves
        for e in bronze
        if e.action == "insert" and e.table_name == "parts"
    )
    dbt(warehouse, "run", "--select", "+consumer_records", "schema_changes")
    recs = [r for r in silver(warehouse, "consumer_records") if r.source == s.name]
    for table, pk in KEYS.items():
        expected = source_rows(s, table, pk)
        live = {r.record_pk: json.loads(r.record) for r in recs if r.table_name == table and not r.deleted}
        assert live.keys() == expected.keys(), f"seed {SEED}: {table} keys differ"
        differ = [k for k in expected if live[k] != expected[k]]
        assert not differ, (
            f"seed {SEED}: {table}: {len(differ)} rows differ, e.g. {live[differ[0]]} != {expected[differ[0]]}"
        )
        seen = {e.record_pk for e in bronze if e.table_name == table and e.record_pk}
        seen |= {e.old_record_pk for e in bronze if e.table_name == table and e.old_record_pk}
        seen |= {p.record_pk for p in pages if p.table_name == table}
        deleted = {r.record_pk for r in recs if r.table_name == table and r.deleted}
        assert deleted == seen - set(expected), f"seed {SEED}: {table} tombstones differ"
    # Gold's schema log: each table's first shape, then the columns rounds 2 (before a start) and 3
    # (in the stream) added, in position order; nothing dropped, renamed, retyped or rekeyed.
    changes = sorted(
        (r for r in read(warehouse / "dbt/gold.db/schema_changes") if r.source == s.name),
        key=lambda r: (r.changed_at_lsn, r.change_kind),
    )
    added_tables = sorted(r.table_name for r in changes if r.change_kind == "table_added")
    assert added_tables == ["items", "parts"], f"seed {SEED}: {changes}"
    added = [(r.table_name, r.column_name, r.new_definition) for r in changes if r.change_kind != "table_added"]
    assert sorted(added) == [
        ("items", "c2", "integer"),
        ("items", "c3", "integer"),
        ("parts", "d2", "text"),
        ("parts", "d3", "text"),
    ], f"seed {SEED}: {changes}"
    assert [c for t, c, _ in added if t == "items"] == ["c2", "c3"], "the log is not in position order"
    # A change's commit time is that of the first event at its position, when silver has one there.
    first_commit = {}
    for e in sorted(bronze, key=lambda e: e.commit_timestamp):
        first_commit.setdefault(e.commit_lsn, e.commit_timestamp)
    assert [r.changed_at for r in changes] == [first_commit.get(r.changed_at_lsn) for r in changes], changes
