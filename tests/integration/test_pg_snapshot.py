"""Snapshots beside the stream (DESIGN §5): pages in bronze, writer rows, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, silver, source_rows

pytestmark = pytest.mark.integration


def pages(warehouse: Path, source: str) -> list[Any]:
    order = "table_name, high_watermark_lsn, row_index"
    return read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}'", order)


def writers(warehouse: Path, source: str) -> list[Any]:
    return read(warehouse / "bronze" / "stream_positions", f"source = '{source}'")


def test_initial_snapshot_writes_keyset_pages_and_retires_its_writer(warehouse: Path, make_source: Any) -> None:
    s = make_source(
        "create table a (id int primary key, v text, flag boolean);"
        "create table b (k1 text, k2 int, v jsonb, primary key (k1, k2));"
        "create table empty (id bigint primary key)",
        ["a", "b", "empty"],
    )
    s.execute("insert into a select g, 'v' || g, g % 2 = 0 from generate_series(1, 25) g")
    s.execute("""insert into b select 'k' || (g % 3), g, jsonb_build_object('g', g) from generate_series(1, 7) g""")
    prepare(s.config())
    capture_once(warehouse, s.config(), snapshots=True, page_rows=10)

    got = pages(warehouse, s.name)
    a = [r for r in got if r.table_name == "a"]
    assert [json.loads(r.record_pk)["id"] for r in a] == list(range(1, 26))
    assert [r.page_number for r in a] == [0] * 10 + [1] * 10 + [2] * 5
    assert [r.last_page for r in a] == [False] * 20 + [True] * 5
    assert json.loads(a[1].record) == {"id": 2, "v": "v2", "flag": True}
    assert a[-1].key_text == ["25"]
    hws = sorted({r.high_watermark_lsn for r in a})
    assert len(hws) == 3 and all(r.snapshot_xmax >= r.snapshot_xmin > 0 for r in a)
    # Unsplit: every page carries the one whole-table snapshot, its bound read under an older snapshot.
    (whole,) = {json.dumps(r.table_snapshot, sort_keys=True) for r in a}
    assert a[0].table_snapshot["id"] == a[0].snapshot_id and a[0].table_snapshot["parts"] == 1
    assert all(a[0].table_snapshot["xmax"] <= r.snapshot_xmax for r in a), whole
    assert all(r.table_snapshot["id"] == r.snapshot_id and r.table_snapshot["parts"] == 1 for r in got)
    b = [r for r in got if r.table_name == "b"]
    keys = [(json.loads(r.record_pk)["k1"], json.loads(r.record_pk)["k2"]) for r in b]
    assert keys == sorted(keys) and len(keys) == 7 and b[-1].last_page
    empty = [r for r in got if r.table_name == "empty"]
    assert len(empty) == 1 and empty[0].record_pk is None and empty[0].row_index == -1 and empty[0].last_page
    # Every snapshot writer retired; only the stream's row is left.
    assert [w.writer_id for w in writers(warehouse, s.name)] == ["stream"]
    # The stream saw every watermark (the run drained past them).
    where = f"source = '{s.name}' and message_prefix = 'changelake.watermark'"
    marks = read(warehouse / "bronze" / "wal_events", where)
    assert len(marks) == 3 + 1 + 1
    # A page's high watermark is the end of its message's record; the mark's commit_lsn is where its
    # commit record starts: the same position unless another record came between (table a's last
    # watermark can be the run's last one: the tables are snapshotted side by side).
    assert max(m.commit_lsn for m in marks) >= max(hws)

    # A second run snapshots nothing again: every table has a completed snapshot.
    capture_once(warehouse, s.config(), snapshots=True, page_rows=10)
    assert len(pages(warehouse, s.name)) == len(got)


RACE_TABLES = ["del_t", "upd_t", "held_t", "vis_t", "trunc_t", "pk_t"]
SEED = int(os.environ.get("CHANGELAKE_TEST_SEED", random.randrange(1 << 30)))


class Races:
    """Statements run by the snapshotter's hooks at the exact moment of a page (DESIGN §5 races)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.schema = schema
        self.c2 = psycopg.connect(dsn, autocommit=True)
        self.c2.execute(f"set search_path = {schema}")
        self.held_xid: int | None = None
        self.fired: list[tuple[str, str]] = []

    def __call__(self, point: str, task: Any, page: int) -> None:
        table = task.table.split(".")[1]
        if page != 0:
            return
        x = self.c2.execute
        if (table, point) == ("del_t", "after_read"):  # a delete after the page's read, before its watermark
            x("delete from del_t where id = 5")
        elif (table, point) == ("upd_t", "after_read"):  # an update in the same spot
            x("update upd_t set v = 'during' where id = 5")
            x("insert into upd_t values (1000, 'beyond the cursor')")
        elif (table, point) == ("held_t", "before_read"):  # open across the read ...
            x("begin")
            x("update held_t set v = 'held' where id = 5")
            self.held_xid = int(str(x("select pg_current_xact_id()::text").fetchone()[0]))  # type: ignore[index]
        elif (table, point) == ("held_t", "after_read"):  # ... committed before the watermark: invisible to the page
            x("commit")
        elif (table, point) == ("vis_t", "after_begin"):  # committed after BEGIN, before the snapshot: visible
            x("update vis_t set v = 'visible' where id = 5")
        elif (table, point) == ("trunc_t", "after_read"):
            x("truncate trunc_t")
            x("insert into trunc_t values (3, 'again'), (100, 'after')")
        elif (table, point) == ("pk_t", "after_read"):  # PK changes: away from a read key, into the read range
            x("update pk_t set id = 1000 where id = 5")
            x("update pk_t set id = 0 where id = 15")
        else:
            return
        self.fired.append((table, point))


def random_load(dsn: str, schema: str, seed: int, stop: threading.Event) -> None:
    """Inserts, updates, deletes and PK changes on r1/r2 until `stop`."""
    rnd = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"set search_path = {schema}")
        ids = {t: [r[0] for r in c.execute(f"select id from {t}").fetchall()] for t in ("r1", "r2")}
        for _ in range(1500):  # bounded, whatever happens to the snapshot
            if stop.is_set():
                return
            t = rnd.choice(["r1", "r2"])
            keys = ids[t]
            with c.transaction():
                for _ in range(rnd.randint(1, 3)):
                    op = rnd.random()
                    if op < 0.35 or not keys:
                        new = max(keys, default=0) + 1
                        c.execute(f"insert into {t} values (%s, %s)", (new, f"n{new}"))
                        keys.append(new)
                    elif op < 0.7:
                        c.execute(f"update {t} set v = v || '+' where id = %s", (rnd.choice(keys),))
                    elif op < 0.9:
                        c.execute(f"delete from {t} where id = %s", (keys.pop(rnd.randrange(len(keys))),))
                    else:
                        old = keys.pop(rnd.randrange(len(keys)))
                        new = max([*keys, old]) + 1 + rnd.randint(0, 50)
                        c.execute(f"update {t} set id = %s where id = %s", (new, old))
                        keys.append(new)
            time.sleep(rnd.uniform(0.002, 0.02))


def check_live_equal(warehouse: Path, s: Any, tables: list[str], label: str) -> None:
    recs = [r for r in silver(warehouse, "consumer_records") if r.source == s.name]
    for table in tables:
        live = {r.record_pk: json.loads(r.record) for r in recs if r.table_name == table and not r.deleted}
        assert live == source_rows(s, table, ["id"]), f"{label}: {table} differs from the source"
        for r in recs:
            if r.table_name == table and r.deleted:
                assert r.record_pk not in live


@pytest.mark.usefixtures("engine")
def test_snapshot_races_and_concurrent_load_reproduce_the_source(
    warehouse: Path, make_source: Any, pg_dsn: str
) -> None:
    print(f"snapshot seed: {SEED} (rerun with CHANGELAKE_TEST_SEED={SEED})")
    # Deterministic interleavings (DESIGN §5, §7.4), all in one source.
    races = make_source(";".join(f"create table {t} (id int primary key, v text)" for t in RACE_TABLES), RACE_TABLES)
    for t in RACE_TABLES:
        races.execute(f"insert into {t} select g, 'v' || g from generate_series(1, 25) g")
    prepare(races.config())
    hook = Races(pg_dsn, races.schema)
    # The hooks share one session (held_t's transaction stays open across its read): one snapshot at a time.
    serial = races.config(snapshot={"max_parallel": 1})
    capture_once(warehouse, serial, snapshots=True, page_rows=10, snapshot_hook=hook)
    assert len(hook.fired) == 7, hook.fired
    held = [p for p in pages(warehouse, races.name) if p.table_name == "held_t" and p.page_number == 0]
    # The race really happened: the held transaction was in progress for the page's snapshot ...
    assert hook.held_xid is not None
    assert hook.held_xid >= held[0].snapshot_xmax or hook.held_xid in held[0].snapshot_xip
    assert json.loads(held[4].record)["v"] == "v5"  # ... so the page read the old value
    vis = [p for p in pages(warehouse, races.name) if p.table_name == "vis_t" and p.page_number == 0]
    assert json.loads(vis[4].record)["v"] == "visible"

    # Randomized: write load on two tables while they are snapshotted in small pages, two seeds.
    loads = []
    for k in range(2):
        s = make_source(
            "create table r1 (id int primary key, v text); create table r2 (id int primary key, v text)", ["r1", "r2"]
        )
        s.execute("insert into r1 select g, 'a' || g from generate_series(1, 50) g")
        s.execute("insert into r2 select g * 3, 'b' || g from generate_series(1, 30) g")
        prepare(s.config())
        stop = threading.Event()
        writer = threading.Thread(target=random_load, args=(pg_dsn, s.schema, SEED + k, stop))
        writer.start()
        try:
            capture_once(warehouse, s.config(), snapshots=True, page_rows=8)
        finally:
            stop.set()
            writer.join()
        capture_once(warehouse, s.config(), snapshots=True, page_rows=8)  # quiescent: catch up
        loads.append(s)

    dbt(warehouse, "build", *NO_UNIT_TESTS)
    check_live_equal(warehouse, races, RACE_TABLES, "races")
    recs = {(r.table_name, r.record_pk): r for r in silver(warehouse, "consumer_records") if r.source == races.name}
    assert recs[("del_t", '{"id":5}')].deleted  # invariant 4: the page read before the delete does not undo it
    assert recs[("pk_t", '{"id":5}')].deleted and not recs[("pk_t", '{"id":1000}')].deleted
    assert recs[("upd_t", '{"id":6}')].origin == "snapshot"
    for k, s in enumerate(loads):
        check_live_equal(warehouse, s, ["r1", "r2"], f"seed {SEED + k}")


def test_snapshot_resumes_after_sigkill_from_its_last_durable_page(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table big (id int primary key, v text)", ["big"])
    s.execute("insert into big select g, 'v' || g from generate_series(1, 45) g")
    prepare(s.config())
    warehouse = tmp_path / "warehouse"
    cfg = tmp_path / "ingest.yml"
    src = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"page_rows": 10}}
    cfg.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [src]}))

    def run(crash_at: str | None) -> int:
        env = dict(os.environ)
        env.pop("CHANGELAKE_CRASH_AT", None)
        if crash_at:
            env["CHANGELAKE_CRASH_AT"] = crash_at
        p = subprocess.run(
            [sys.executable, "-m", "ingest", "-c", str(cfg), "run", "--once"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return p.returncode

    assert run("snapshot_after_page_commit:2") == -9  # SIGKILL right after page 1 is committed
    before = pages(warehouse, s.name)
    assert sorted({p.page_number for p in before}) == [0, 1]
    snapshot_writers = [w for w in writers(warehouse, s.name) if w.writer_kind == "snapshot"]
    assert len(snapshot_writers) == 1  # the unfinished snapshot's writer is still registered
    s.execute("update big set v = 'changed' where id in (3, 33)")
    s.execute("delete from big where id = 44")

    assert run(None) == 0
    got = [p for p in pages(warehouse, s.name) if p.snapshot_id == before[0].snapshot_id]
    numbers = [p.page_number for p in got]
    assert sorted(set(numbers)) == [0, 1, 2, 3, 4]
    assert numbers.count(0) == 10 and numbers.count(1) == 10  # not restarted from the first page
    ids = sorted(json.loads(p.record_pk)["id"] for p in got if p.record_pk)
    assert ids == [i for i in range(1, 46) if i != 44]  # resumed after key 20, read 21..45 minus the delete
    assert [w.writer_id for w in writers(warehouse, s.name)] == ["stream"]


def test_a_column_dropped_during_a_snapshot_is_ridden_out(warehouse: Path, make_source: Any) -> None:
    """W9: the page reader kept the columns of the snapshot's start; a DROP COLUMN failed it for good."""
    from ingest.errors import SourceUnavailableError

    s = make_source("create table items (id int primary key, v text, gone text)", ["items"])
    s.execute("insert into items select g, 'v' || g, 'x' from generate_series(1, 4) g")
    src = s.config()
    prepare(src)

    def drop_before_page_2(point: str, task: Any, page: int) -> None:
        if point == "before_read" and page == 2:
            s.execute("alter table items drop column if exists gone")

    with pytest.raises(SourceUnavailableError, match="changed shape during its snapshot"):
        capture_once(warehouse, src, snapshots=True, snapshot_hook=drop_before_page_2, page_rows=1)
    capture_once(warehouse, src, snapshots=True, page_rows=1)  # what the retry loop does next
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "high_watermark_lsn")
    first, again = pages[0].snapshot_id, [p for p in pages if p.snapshot_id != pages[0].snapshot_id]
    assert [json.loads(p.record) for p in pages if p.snapshot_id == first] == [
        {"id": 1, "v": "v1", "gone": "x"},
        {"id": 2, "v": "v2", "gone": "x"},
        {"id": 3, "v": "v3"},
        {"id": 4, "v": "v4"},
    ]
    # The retry's start finds the column dropped since the recorded shape: a re-snapshot drops it from 1 and 2.
    assert [json.loads(p.record) for p in again] == [{"id": i, "v": f"v{i}"} for i in range(1, 5)]
