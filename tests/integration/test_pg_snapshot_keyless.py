"""Snapshots of keyless tables (REPLICA IDENTITY FULL, no primary key): CTID pages keyed by every column.

Bronze's page rows and stream events are folded here without dbt, with the placement rule of
docs/snapshots.md (a page row is dropped when an event for its key commits at or before its
watermark and its snapshot could not see it), and compared with the source's rows.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest.bronze.writer import BronzeWriter
from ingest.errors import SourceError, SourceUnavailableError
from ingest.sources.postgres import snapshot
from ingest.sources.postgres.pages import tid_block
from ingest.sources.postgres.snapshot import Snapshotter, request_snapshot
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("CHANGELAKE_TEST_SEED", random.randrange(1 << 30)))
XID_EPOCH = 1 << 32
# Rows with unique `a` and a filler wide enough for a few dozen rows a block; every 7th row twice.
FILL = (
    "insert into {t} select g, 'v' || g, repeat('x', 150) from generate_series(1, {n}) g;"
    "insert into {t} select a, b, c from {t} where a % 7 = 0;"
)


HELD = (1, 2, 3, 500, 1500)  # the rows a transaction held open across a page's read updates


def canonical(record: str) -> str:
    return json.dumps(json.loads(record), sort_keys=True)


def source_rows(conn: Any, table: str) -> Counter[str]:
    """The table's rows as a multiset of records (JSON with sorted keys)."""
    rows = conn.execute(f"select row_to_json(t)::text from {table} t").fetchall()
    return Counter(canonical(r[0]) for r in rows)


def visible(xid: int, page: Any) -> bool:
    """Whether a 32-bit event xid committed before the page's snapshot (widened near its xmax)."""
    xmax = page.snapshot_xmax
    wide = (xmax - xmax % XID_EPOCH) + xid
    if wide > xmax + XID_EPOCH // 2:
        wide -= XID_EPOCH
    return wide < xmax and wide not in (page.snapshot_xip or [])


def placed_fold(warehouse: Path, source: str, table: str) -> tuple[dict[str, str], int]:
    """The table's live records (record_pk -> record) from bronze, and how many page rows were superseded."""
    schema, name = table.split(".")
    events = read(
        warehouse / "bronze" / "wal_events",
        f"source = '{source}' and action != 'message'",
        "commit_lsn, commit_index",
    )
    pages = read(
        warehouse / "bronze" / "snapshot_pages",
        f"source = '{source}' and table_name = '{name}' and record_pk is not null",
    )
    touched: dict[str | None, list[tuple[int, int]]] = {}
    for e in events:
        if e.action == "truncate" and table in (e.truncated_tables or []):
            touched.setdefault(None, []).append((e.commit_lsn, e.xid))
        elif e.table_schema == schema and e.table_name == name:
            for key in {e.record_pk, e.old_record_pk} - {None}:
                touched.setdefault(key, []).append((e.commit_lsn, e.xid))
    changes: list[tuple[tuple[int, int, int], Any]] = [
        ((e.commit_lsn, 0, e.commit_index), e) for e in events if e.table_name == name or e.action == "truncate"
    ]
    superseded = 0
    for p in pages:
        assert json.loads(p.record_pk) == json.loads(p.record), "a keyless table's key is the whole row"
        hits = [*touched.get(p.record_pk, []), *touched.get(None, [])]
        if any(lsn <= p.high_watermark_lsn and not visible(xid, p) for lsn, xid in hits):
            superseded += 1
            continue
        changes.append(((p.high_watermark_lsn, 1, p.row_index), p))
    live: dict[str, str] = {}
    for _, c in sorted(changes, key=lambda c: c[0]):
        action = getattr(c, "action", "snapshot")
        if action == "truncate":
            live = {} if table in (c.truncated_tables or []) else live
        elif action == "delete":
            live.pop(c.record_pk, None)
        else:
            if getattr(c, "old_record_pk", None):
                live.pop(c.old_record_pk, None)
            live[c.record_pk] = c.record
    return live, superseded


class Workload:
    """Writes to a keyless table at the moments of its snapshot's pages (the snapshotter's hook).

    Every logical row has its own `a`; a duplicate is an exact copy, and updates and deletes act on
    every copy of an `a` at once, so the table's distinct rows stay what the stream can key.
    """

    avoid: tuple[int, ...] = ()  # values of `a` steps leave alone

    def __init__(self, dsn: str, table: str, seed: int) -> None:
        self.table = table
        self.rnd = random.Random(seed)
        self.c = psycopg.connect(dsn, autocommit=True)
        self.held = psycopg.connect(dsn, autocommit=True)
        self.ops = 0

    def step(self) -> None:
        t, rnd, x = self.table, self.rnd, self.c.execute
        skip = f" where a not in ({', '.join(map(str, self.avoid))})" if self.avoid else ""
        row = x(f"select a from {t} tablesample bernoulli (5){skip} limit 1").fetchone()
        a = int(row[0]) if row else (0 if self.avoid else 1)  # no row has a = 0
        op = rnd.random()
        if op < 0.3:
            x(f"insert into {t} select max(a) + 1, 'new', repeat('y', 150) from {t}")
        elif op < 0.45:
            x(f"insert into {t} select a, b, c from {t} where a = %s limit 1", (a,))  # a duplicate of a row
        elif op < 0.8:
            x(f"update {t} set b = b || '+' where a = %s", (a,))  # moves every copy to a new CTID
        else:
            x(f"delete from {t} where a = %s", (a,))
        self.ops += 1

    def __call__(self, point: str, task: Any, page: int) -> None:
        if page == 2 and point == "before_read":  # open across the read, committed before the watermark
            self.held.execute("begin")
            self.held.execute(f"update {self.table} set b = b || '#' where a in {HELD}")
        elif page == 2 and point == "after_read":
            self.held.execute("commit")
        if point == "after_read" or (point == "after_begin" and page != 2):  # invisible to the page, or visible
            for _ in range(3):
                self.step()


def test_keyless_snapshot_under_concurrent_writes_folds_to_the_source(
    warehouse: Path, make_source: Any, pg_dsn: str
) -> None:
    print(f"keyless snapshot seed: {SEED} (rerun with CHANGELAKE_TEST_SEED={SEED})")
    s = make_source("create table t (a int, b text, c text); alter table t replica identity full", ["t"])
    s.execute(FILL.format(t="t", n=3000))
    s.execute("delete from t where a between 600 and 1400")  # empty blocks: CTID ranges with no rows
    s.execute("vacuum t")
    prepare(s.config())
    table = s.tables[0]
    load = Workload(pg_dsn, table, SEED)
    capture_once(warehouse, s.config(), snapshots=True, page_rows=150, snapshot_hook=load)
    capture_once(warehouse, s.config(), snapshots=True)  # quiescent: the stream catches up

    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'")
    assert len({p.page_number for p in pages}) >= 10 and any(p.last_page for p in pages)
    assert load.ops >= 60
    live, superseded = placed_fold(warehouse, s.name, table)
    want = source_rows(s.conn, table)
    assert any(n > 1 for n in want.values()), "the table holds duplicate rows"
    # Silver keeps one record per distinct row (docs/snapshots.md, "Keyless tables").
    assert Counter(canonical(r) for r in live.values()) == Counter(set(want))
    assert superseded > 0, "writes between a page's read and its watermark were placed"
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]


def completed_rows(warehouse: Path, source: str, name: str) -> tuple[Counter[str], list[Any]]:
    """The rows of the table's completed snapshot (as a multiset), and every page row of the table."""
    rows = read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}' and table_name = '{name}'")
    done = {r.snapshot_id for r in rows if r.last_page}
    assert len(done) == 1
    return Counter(canonical(r.record) for r in rows if r.snapshot_id in done and r.record is not None), rows


def test_keyless_snapshot_resumes_by_ctid_and_starts_over_after_a_rewrite(warehouse: Path, make_source: Any) -> None:
    """Each row read exactly once across a crash; a VACUUM FULL mid-snapshot (new CTIDs) restarts it."""
    ddl = "create table {t} (a int, b text, c text); alter table {t} replica identity full;"
    s = make_source(ddl.format(t="crashed") + ddl.format(t="rewritten"), ["crashed", "rewritten"])
    for t in ("crashed", "rewritten"):
        s.execute(FILL.format(t=t, n=1500))
        s.execute(f"delete from {t} where a % 2 = 0 and a < 700")  # holes that VACUUM FULL closes
    src = s.config(snapshot={"max_parallel": 1})
    prepare(src)
    crashed, rewritten = s.tables
    fired: list[str] = []

    def crash(point: str, task: Any, page: int) -> None:
        if task.table == crashed and point == "before_read" and page == 3:
            raise SourceUnavailableError("stopped before page 3")

    def rewrite(point: str, task: Any, page: int) -> None:
        if task.table == rewritten and point == "before_read" and page == 2 and not fired:
            s.execute("vacuum full rewritten")
            fired.append("vacuum full")

    with pytest.raises(SourceUnavailableError, match="stopped before page 3"):
        capture_once(warehouse, src, snapshots=True, page_rows=100, snapshot_hook=crash)
    capture_once(warehouse, src, snapshots=True, page_rows=100, snapshot_hook=rewrite)

    got, rows = completed_rows(warehouse, s.name, "crashed")
    assert len({r.snapshot_id for r in rows}) == 1, "resumed, not started again"
    # The CTID bound (block count) was kept with its snapshot in the writer row: the same across the crash.
    assert len({json.dumps(r.table_snapshot, sort_keys=True) for r in rows}) == 1
    assert (rows[0].table_snapshot["id"], rows[0].table_snapshot["parts"]) == (rows[0].snapshot_id, 1)
    assert all(rows[0].table_snapshot["xmax"] <= r.snapshot_xmax for r in rows)
    assert got == source_rows(s.conn, crashed)
    assert fired
    got, rows = completed_rows(warehouse, s.name, "rewritten")
    assert got == source_rows(s.conn, rewritten)
    assert len({r.snapshot_id for r in rows}) == 2, "the rewrite started a new snapshot"
    assert all(r.table_snapshot["id"] == r.snapshot_id and r.table_snapshot["parts"] == 1 for r in rows)
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]


def test_a_keyless_partitioned_table_is_refused(warehouse: Path, make_source: Any) -> None:
    s = make_source(
        "create table p (a int, b text) partition by range (a);"
        "create table p1 partition of p for values from (0) to (100);"
        "alter table p replica identity full; alter table p1 replica identity full",
        ["p"],
    )
    from ingest.bronze.writer import BronzeWriter

    with pytest.raises(SourceError, match="partitioned and has no primary key"):
        request_snapshot(s.config(), BronzeWriter(warehouse), s.tables[0])


class RangedWorkload(Workload):
    """The workload beside a snapshot cut into block ranges: its hook runs on several threads.

    Only the first range holds a transaction open across its page 2; the others' steps leave the
    rows it updates alone (a step waiting for their lock under the workload's lock would keep the
    first range from committing it).
    """

    avoid = HELD

    def __init__(self, dsn: str, table: str, seed: int) -> None:
        super().__init__(dsn, table, seed)
        self.lock = threading.Lock()

    def __call__(self, point: str, task: Any, page: int) -> None:
        with self.lock:
            if task.start is None and page == 0 and point == "after_read":
                # Row a = 1 (block 0) is on the page just read: this update is one its watermark passes.
                self.c.execute(f"update {self.table} set b = b || '!' where a = 1")
            if task.start is None:
                super().__call__(point, task, page)
            elif point in ("after_begin", "after_read"):
                for _ in range(2):
                    self.step()


def whole_snapshots(rows: list[Any]) -> dict[str, tuple[int, set[str], set[str]]]:
    """Per whole-table snapshot id: its parts, the snapshot ids of its pages, and those that ended."""
    out: dict[str, tuple[int, set[str], set[str]]] = {}
    for r in rows:
        if r.table_snapshot is None:
            continue
        parts, ids, ended = out.setdefault(r.table_snapshot["id"], (r.table_snapshot["parts"], set(), set()))
        assert parts == r.table_snapshot["parts"], "every range's pages carry the same table snapshot"
        ids.add(r.snapshot_id)
        if r.last_page:
            ended.add(r.snapshot_id)
    return out


def test_a_large_keyless_table_is_read_in_block_ranges_side_by_side(warehouse: Path, make_source: Any) -> None:
    """Cut into max_parallel CTID ranges, each its own writer: every row read exactly once, in contiguous ranges.

    A small keyless table stays one writer, and a filtered snapshot of the large one is not cut.
    """
    ddl = "create table {t} (a int, b text, c text); alter table {t} replica identity full;"
    s = make_source(ddl.format(t="big") + ddl.format(t="small"), ["big", "small"])
    s.execute(FILL.format(t="big", n=3000))
    s.execute("delete from big where a between 600 and 1400")  # empty blocks inside a range
    s.execute(FILL.format(t="small", n=300))
    s.execute("vacuum big")  # reltuples: the estimate the split is decided by
    s.execute("vacuum small")
    src = s.config(snapshot={"max_parallel": 3, "split_rows": 1000})
    prepare(src)
    big, small = s.tables
    spans: dict[str, list[float]] = {}

    def timed(point: str, task: Any, page: int) -> None:
        if task.table == big and task.where is None and point in ("before_read", "after_read"):
            spans.setdefault(task.snapshot_id, []).append(time.monotonic())

    capture_once(warehouse, src, snapshots=True, page_rows=100, snapshot_hook=timed)
    request_snapshot(src, BronzeWriter(warehouse), big, where="a % 2 = 0")
    capture_once(warehouse, src, snapshots=True, page_rows=100)

    rows = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and table_name = 'big'")
    whole = [r for r in rows if r.table_snapshot is not None]
    (first, (parts, ids, ended)), *others = whole_snapshots(whole).items()
    assert others == [] and parts == 3 and ids == ended and len(ids) == 3, "three ranges, each completed"
    assert first in ids, "the table snapshot's id is its first range's"
    got = Counter(canonical(r.record) for r in whole if r.record is not None)
    assert got == source_rows(s.conn, big), "every row read exactly once (duplicates once per copy)"
    # The ranges are contiguous in block order: each range's rows sit below the next range's.
    blocks = sorted(
        (min(b), max(b))
        for b in (
            [tid_block(r.key_text[0]) for r in whole if r.snapshot_id == sid and r.record is not None] for sid in ids
        )
    )
    assert all(hi < lo for (_, hi), (lo, _) in zip(blocks, blocks[1:], strict=False))
    assert min(r.table_snapshot["xmax"] for r in whole) <= min(r.snapshot_xmax for r in whole)
    times = [(t[0], t[-1]) for t in spans.values()]
    assert any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(times) for b0, b1 in times[i + 1 :]), "side by side"
    filtered = [r for r in rows if r.table_snapshot is None]
    assert len({r.snapshot_id for r in filtered}) == 1 and filtered[0].snapshot_id.startswith("where-")
    assert sorted(json.loads(r.record)["a"] for r in filtered if r.record is not None) == sorted(
        json.loads(k)["a"] for k, n in source_rows(s.conn, big).items() for _ in range(n) if json.loads(k)["a"] % 2 == 0
    )
    got_small, small_rows = completed_rows(warehouse, s.name, "small")
    assert got_small == source_rows(s.conn, small)
    assert {(r.table_snapshot["id"], r.table_snapshot["parts"]) for r in small_rows} == {(small_rows[0].snapshot_id, 1)}
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]


def test_keyless_block_ranges_under_concurrent_writes_fold_to_the_source(
    warehouse: Path, make_source: Any, pg_dsn: str
) -> None:
    """Inserts, duplicates, updates and deletes beside every range: bronze folds to the source's rows."""
    print(f"keyless ranges seed: {SEED} (rerun with CHANGELAKE_TEST_SEED={SEED})")
    s = make_source("create table t (a int, b text, c text); alter table t replica identity full", ["t"])
    s.execute(FILL.format(t="t", n=3000))
    s.execute("delete from t where a between 600 and 1400")
    s.execute("vacuum t")
    src = s.config(snapshot={"max_parallel": 3, "split_rows": 1000})
    prepare(src)
    table = s.tables[0]
    load = RangedWorkload(pg_dsn, table, SEED)
    capture_once(warehouse, src, snapshots=True, page_rows=150, snapshot_hook=load)
    capture_once(warehouse, src, snapshots=True)  # quiescent: the stream catches up

    rows = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'")
    ((parts, ids, ended),) = whole_snapshots(rows).values()
    assert parts == 3 and ids == ended and len(ids) == 3
    assert load.ops >= 60
    live, superseded = placed_fold(warehouse, s.name, table)
    want = source_rows(s.conn, table)
    assert any(n > 1 for n in want.values()), "the table holds duplicate rows"
    assert Counter(canonical(r) for r in live.values()) == Counter(set(want))
    assert superseded > 0, "writes between a page's read and its watermark were placed"
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]


def test_keyless_block_ranges_resume_after_a_crash(warehouse: Path, make_source: Any, tmp_path: Path) -> None:
    """Killed (SIGKILL) after a page commit, then failed mid-range: each range resumes after its last durable page."""
    s = make_source("create table t (a int, b text, c text); alter table t replica identity full", ["t"])
    s.execute(FILL.format(t="t", n=3000))
    s.execute("vacuum t")
    src = s.config(snapshot={"max_parallel": 3, "split_rows": 1000})
    prepare(src)
    table = s.tables[0]
    cfg = tmp_path / "ingest.yml"
    conf = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}
    conf["snapshot"] = {"max_parallel": 3, "split_rows": 1000, "page_rows": 100}
    cfg.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [conf]}))
    env = {**os.environ, "CHANGELAKE_CRASH_AT": "snapshot_after_page_commit:4"}
    killed = subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", "--once"], env=env, capture_output=True, timeout=600
    )
    assert killed.returncode == -signal.SIGKILL
    after_kill = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'")
    ((parts, ids_before, ended),) = whole_snapshots(after_kill).values()
    assert parts == 3 and len(after_kill) >= 4 * 100 and not ended, "cut, and killed before any range ended"

    def crash(point: str, task: Any, page: int) -> None:
        if task.start is not None and point == "before_read" and page == 5:
            raise SourceUnavailableError("stopped before page 5")

    with pytest.raises(SourceUnavailableError, match="stopped before page 5"):
        capture_once(warehouse, src, snapshots=True, page_rows=100, snapshot_hook=crash)
    capture_once(warehouse, src, snapshots=True, page_rows=100)

    rows = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'")
    ((parts, ids, ended),) = whole_snapshots(rows).values()
    assert ids == ended and len(ids) == 3 and ids_before <= ids, "each range resumed, none started again"
    got = Counter(canonical(r.record) for r in rows if r.record is not None)
    assert got == source_rows(s.conn, table), "every row read exactly once across the crashes"
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]


def test_a_rewrite_under_keyless_block_ranges_starts_the_table_over_once(
    warehouse: Path, make_source: Any, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """VACUUM FULL while the ranges run: one new (cut) snapshot replaces every range, and the old never completes.

    The first range's page is read before the rewrite and written after another range started the
    table over: it is written (true at its watermark) but its range goes no further and its writer
    row is not raised again (it would hold the safe bound back for good).
    """
    s = make_source("create table t (a int, b text, c text); alter table t replica identity full", ["t"])
    s.execute(FILL.format(t="t", n=3000))
    s.execute("delete from t where a % 2 = 0 and a < 1200")  # holes VACUUM FULL closes: rows move down
    s.execute("vacuum t")
    src = s.config(snapshot={"max_parallel": 3, "split_rows": 1000})
    prepare(src)
    table = s.tables[0]
    started_over = threading.Event()
    real = Snapshotter._start_over

    def start_over(self: Snapshotter, task: Any, filenode: int | None) -> None:
        real(self, task, filenode)
        started_over.set()

    monkeypatch.setattr(Snapshotter, "_start_over", start_over)
    monkeypatch.setattr(snapshot, "POSITION_INTERVAL_S", 0.0)  # a range raises its row after every page
    fired: list[bool] = []
    other = psycopg.connect(pg_dsn, autocommit=True)

    def rewrite(point: str, task: Any, page: int) -> None:
        if task.start is None and point == "after_read" and page == 1 and not fired:
            other.execute(f"vacuum full {table}")
            fired.append(started_over.wait(30))  # another range meets the new file first

    try:
        capture_once(warehouse, src, snapshots=True, page_rows=100, snapshot_hook=rewrite)
    finally:
        other.close()
    assert fired == [True]
    assert sum("starts over" in r.getMessage() for r in caplog.records if r.levelname == "WARNING") == 1

    rows = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'")
    snapshots = whole_snapshots(rows)
    assert len(snapshots) == 2, "the table started over once, not once per range"
    complete = {tid: v for tid, v in snapshots.items() if len(v[2]) == v[0]}
    ((new, (parts, ids, ended)),) = complete.items()
    assert parts == 3 and ids == ended, "the new snapshot is cut again and completes"
    ((old_parts, old_ids, old_ended),) = [v for tid, v in snapshots.items() if tid != new]
    assert old_parts == 3 and len(old_ended) < old_parts, "the old table snapshot never completes"
    assert old_ids - old_ended, "the range that met the rewrite wrote no last page"
    got = Counter(canonical(r.record) for r in rows if r.snapshot_id in ids and r.record is not None)
    assert got == source_rows(s.conn, table)
    writers = read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")
    assert [w.writer_id for w in writers] == ["stream"]
