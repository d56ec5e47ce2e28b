"""Snapshot control: pause and resume kept in bronze across a restart, and filtered snapshots (--where).

A paused snapshot reads no page (before or after a restart of its run) while the stream and the
safe bound go on; resumed, it completes and its rows are the table's. A filtered snapshot lands
exactly the rows its predicate selects, with the facts dbt places any page row by, and a
predicate that is not one read-only filter of the table is refused with nothing queued.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.capture.snapshots import set_paused
from ingest.config import BatchConfig
from ingest.errors import SourceError
from ingest.events import WriterKind
from ingest.positions import FILTERED_SNAPSHOT_PREFIX, SnapshotProgress, SourcePositions
from ingest.progress import Progress
from ingest.sources.base import bronze_status
from ingest.sources.postgres.capture import PostgresCapture
from ingest.sources.postgres.snapshot import SnapshotTask, request_snapshot
from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import ingest, status_json, write_config
from tests.helpers.pg import PgSource, bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

PAGE_ROWS = 50
SEED = int(os.environ.get("CHANGELAKE_TEST_SEED", random.randrange(1 << 30)))


def until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} not reached within {seconds} s"
        time.sleep(0.1)


def page_rows(warehouse: Path, source: str) -> list[Any]:
    return read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}'")


def pages_landed(warehouse: Path, source: str) -> int:
    return len({(r.snapshot_id, r.page_number) for r in page_rows(warehouse, source)})


def snapshot_rows(warehouse: Path, source: str) -> list[Any]:
    return [r for r in page_rows(warehouse, source) if r.record_pk is not None]


class Running:
    """A continuous `run` of one source in a thread of this process (the capture `run` performs)."""

    def __init__(self, warehouse: Path, src: Any, hook: Any = None) -> None:
        self.stopping = threading.Event()
        self.error: list[BaseException] = []
        cap = PostgresCapture(
            src,
            BatchConfig(max_events=10_000, max_seconds=0.2),
            BronzeWriter(warehouse),
            Progress(src.name, enabled=False),
            snapshot_hook=hook,
            page_rows=PAGE_ROWS,
        )
        self.thread = threading.Thread(target=self._run, args=(cap,), daemon=True)
        self.thread.start()

    def _run(self, cap: PostgresCapture) -> None:
        try:
            cap.run(once=False, should_stop=self.stopping.is_set)
        except BaseException as e:  # re-raised by stop()
            self.error.append(e)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert not self.thread.is_alive() and not self.error, self.error


def safe_bound_passes(warehouse: Path, s: PgSource, sql: str) -> None:
    """Commit `sql` at the source, then wait until the source's safe bound is past it."""
    s.execute(sql)
    lsn = s.current_wal()
    writer = BronzeWriter(warehouse)
    until(lambda: (SourcePositions.read(writer, s.name).safe_bound or 0) >= lsn, 20, "the safe bound past the change")


def test_a_paused_snapshot_reads_no_page_across_a_restart_and_completes_when_resumed(
    tmp_path: Path, make_source: Any
) -> None:
    s = make_source("create table t (id int primary key, v text)", ["t"])
    s.execute("insert into t select g, 'v' || g from generate_series(1, 3000) g")
    table = f"{s.schema}.t"
    options = {"page_rows": PAGE_ROWS}
    cfg = write_config(
        tmp_path, {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": [table], "snapshot": options}
    )
    # A heartbeat a second: a restarted stream's position passes WAL written after its last change
    # (a running-xacts record, another test's writes) at its next heartbeat, 30 s by default.
    src = s.config(snapshot=options, heartbeat_seconds=1)
    prepare(src)
    warehouse = tmp_path / "warehouse"
    paused_at: list[int] = []

    def pause_before_page_5(point: str, task: SnapshotTask, page: int) -> None:
        if point == "before_read" and page == 5 and not paused_at:
            set_paused(BronzeWriter(warehouse), s.name, table, True)  # what `snapshot pause` runs
            paused_at.append(page)

    run = Running(warehouse, src, pause_before_page_5)
    until(lambda: bool(paused_at), 30, "page 5 of the snapshot")
    # The run notices the pause within a page: page 5 was being read when it was written.
    time.sleep(1.0)
    landed = pages_landed(warehouse, s.name)
    assert 5 <= landed <= 7, landed
    # The stream goes on and the paused writer does not hold the safe bound back; no page lands.
    s.execute("update t set v = 'changed while paused' where id = 2000")
    safe_bound_passes(warehouse, s, "insert into t values (5000, 'after the pause')")
    assert pages_landed(warehouse, s.name) == landed
    run.stop()

    # Restarted, the run keeps the pause (it is in bronze) and still lets the safe bound go on.
    run = Running(warehouse, src)
    safe_bound_passes(warehouse, s, "insert into t values (5001, 'after the restart')")
    time.sleep(1.0)
    assert pages_landed(warehouse, s.name) == landed
    writer = BronzeWriter(warehouse)
    assert any(" paused after " in line for line in bronze_status(writer, s.name, str))
    _, doc = status_json(cfg)
    (snap,) = doc["sources"][0]["snapshots"]
    assert snap["paused"] is True and snap["table"] == table and snap["where"] is None

    p = ingest(cfg, "snapshot", "resume", snap["snapshot_id"])
    assert p.returncode == 0 and "resumed" in p.stdout, p.stderr
    until(lambda: not SourcePositions.read(writer, s.name).snapshots, 60, "the snapshot's end")
    run.stop()

    rows = snapshot_rows(warehouse, s.name)
    got = {json.loads(r.record_pk)["id"]: json.loads(r.record)["v"] for r in rows}
    assert len(rows) == len(got) == 3000, "every row once; rows inserted later come by the stream"
    with psycopg.connect(s.dsn) as c:
        source = dict(c.execute(f"select id, v from {table} where id <= 3000").fetchall())
    assert got == source
    assert got[2000] == "changed while paused"  # read after the resume, where the pause left off


def test_a_filtered_snapshot_lands_only_its_rows_placed_like_any_page(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table t (id int primary key, v text, kind text)", ["t"])
    s.execute(
        "insert into t select g, 'v' || g, case g % 3 when 0 then 'a' else 'b' end from generate_series(1, 600) g"
    )
    table = f"{s.schema}.t"
    options = {"initial": False, "page_rows": 40}
    cfg = write_config(
        tmp_path, {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": [table], "snapshot": options}
    )
    src = s.config(snapshot=options)
    prepare(src)
    warehouse = tmp_path / "warehouse"
    before = s.current_wal()
    p = ingest(cfg, "snapshot", table, "--where", "kind = 'a' and id <= 450 -- the first quarters")
    assert p.returncode == 0 and "where kind = 'a'" in p.stdout, p.stderr

    # A transaction open across page 1's read, committed before its watermark: the page cannot see
    # it, and its change commits below the watermark (dbt supersedes the page row by it).
    holder = psycopg.connect(s.dsn)
    held: list[int] = []

    def hold_across_page_1(point: str, task: SnapshotTask, page: int) -> None:
        if page != 1:
            return
        if point == "before_read":
            holder.execute(f"update {table} set v = 'held' where id = 150")
            row = holder.execute("select txid_current()").fetchone()
            assert row is not None
            held.append(int(row[0]))
        elif point == "after_read":
            holder.commit()

    capture_once(warehouse, src, snapshots=True, page_rows=40, snapshot_hook=hold_across_page_1)
    holder.close()

    rows = snapshot_rows(warehouse, s.name)
    ids = [json.loads(r.record_pk)["id"] for r in rows]
    assert sorted(ids) == [g for g in range(1, 451) if g % 3 == 0], "exactly the rows the predicate selects, once"
    assert {r.snapshot_id[: len(FILTERED_SNAPSHOT_PREFIX)] for r in rows} == {FILTERED_SNAPSHOT_PREFIX}
    assert all(r.table_snapshot is None for r in page_rows(warehouse, s.name)), "a filtered snapshot is not whole"
    pages = {r.page_number: r for r in page_rows(warehouse, s.name)}
    assert len(pages) == 4 and [n for n, r in pages.items() if r.last_page] == [3]
    assert all(r.snapshot_xmax is not None and r.high_watermark_lsn > before for r in pages.values())
    row_150 = next(r for r in rows if json.loads(r.record_pk)["id"] == 150)
    assert json.loads(row_150.record)["v"] == "v150" and row_150.page_number == 1
    assert held[0] >= pages[1].snapshot_xmax or held[0] in pages[1].snapshot_xip, "invisible to the page"
    update = next(e for e in bronze_events(warehouse, s.name) if e.action == "update")
    assert update.commit_lsn <= pages[1].high_watermark_lsn

    # A filtered snapshot is not the table's snapshot: a start with initial snapshots reads it whole.
    assert BronzeWriter(warehouse).completed_snapshots(s.name) == {}
    capture_once(warehouse, s.config(snapshot={"page_rows": 600}), snapshots=True)
    whole = [r for r in snapshot_rows(warehouse, s.name) if not r.snapshot_id.startswith(FILTERED_SNAPSHOT_PREFIX)]
    assert sorted(json.loads(r.record_pk)["id"] for r in whole) == list(range(1, 601))
    assert {(r.table_snapshot["id"], r.table_snapshot["parts"]) for r in whole} == {(whole[0].snapshot_id, 1)}


def test_a_bad_predicate_is_refused_and_nothing_is_queued(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table t (id int primary key, v text); create sequence n", ["t"])
    s.execute("insert into t values (1, 'a'), (2, 'b')")
    table = f"{s.schema}.t"
    src = s.config(snapshot={"initial": False})
    warehouse = tmp_path / "warehouse"
    writer = BronzeWriter(warehouse)
    refused = {
        "nosuch > 1": 'column "nosuch" does not exist',
        "id >": "syntax error",
        "id + 1": "argument of WHERE must be type boolean",
        "true) or (true": "closes a parenthesis it did not open",
        "id = 1; delete from t": "holds a ';'",
        "v = 'a": "quote is never closed",
        "id = $1": "there is no parameter $1",
        f"nextval('{s.schema}.n') > 0": "read-only transaction",
    }
    for where, why in refused.items():
        with pytest.raises(SourceError) as e:
            request_snapshot(src, writer, table, where)
        assert why in str(e.value) and "nothing was queued" in str(e.value), (where, str(e.value))
    cfg = write_config(
        tmp_path, {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": [table], "snapshot": {"initial": False}}
    )
    p = ingest(cfg, "snapshot", table, "--where", "nosuch > 1")
    assert p.returncode == 2 and 'column "nosuch" does not exist' in p.stderr, p.stderr
    rows = writer.positions(s.name) if (warehouse / "bronze" / "stream_positions").exists() else []
    assert [pos for pos, _ in rows if pos.writer_kind is WriterKind.SNAPSHOT] == []
    with psycopg.connect(s.dsn) as c:
        assert c.execute(f"select last_value, is_called from {s.schema}.n").fetchone() == (1, False)
    # A predicate that holds is queued, and shows in the writer row.
    task = request_snapshot(src, writer, table, "v in ('a', ')')")
    (progress,) = [SnapshotProgress.from_row(pos) for pos, _ in writer.positions(s.name)]
    assert progress.where == "v in ('a', ')')" and progress.snapshot_id == task.snapshot_id

    # Paused, `run --once` does not wait for it, reads none of it, and leaves the safe bound past its changes.
    p = ingest(cfg, "snapshot", "pause", task.snapshot_id)
    assert p.returncode == 0 and f"snapshot {task.snapshot_id} of {table} paused" in p.stdout, p.stderr
    prepare(src)
    s.execute("insert into t values (3, 'c')")
    lsn = s.current_wal()
    capture_once(warehouse, src, snapshots=True)
    assert not (warehouse / "bronze" / "snapshot_pages").exists() or page_rows(warehouse, s.name) == []
    (progress,) = SourcePositions.read(writer, s.name).snapshots
    assert progress.paused and (SourcePositions.read(writer, s.name).safe_bound or 0) >= lsn


def test_interleaved_pause_and_resume_end_as_the_last_command_and_never_lower_the_position(
    tmp_path: Path, make_source: Any
) -> None:
    """Regression: the pause lived in the writer row the run rewrites, so a pause written while the run
    rewrote the row could be lost; and the command's own rewrite of the row, from a read a moment
    before, lowered the position the run had raised meanwhile (the safe bound stepped back).
    """
    s = make_source("create table t (id int primary key, v text)", ["t"])
    s.execute("insert into t select g, 'v' || g from generate_series(1, 4000) g")
    table = f"{s.schema}.t"
    src = s.config(snapshot={"page_rows": PAGE_ROWS}, heartbeat_seconds=1)
    prepare(src)
    warehouse = tmp_path / "warehouse"
    writer = BronzeWriter(warehouse)

    def slow_pages(point: str, task: SnapshotTask, page: int) -> None:
        if point == "before_read":
            time.sleep(0.03)  # the snapshot runs for the whole sequence of commands

    run = Running(warehouse, src, slow_pages)
    landed = warehouse / "bronze" / "snapshot_pages"
    until(lambda: landed.exists() and pages_landed(warehouse, s.name) >= 2, 30, "the snapshot's first pages")
    positions: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            rows = [p for p, _ in writer.positions(s.name) if p.writer_kind is WriterKind.SNAPSHOT]
            positions.extend(p.durable_lsn for p in rows)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rng = random.Random(SEED)
    commands = [rng.random() < 0.5 for _ in range(15)] + [True]
    for paused in commands:
        set_paused(writer, s.name, table, paused)  # what `snapshot pause|resume` runs
        (progress,) = SourcePositions.read(writer, s.name).snapshots
        assert progress.paused is paused, "the state is the last command's"
        time.sleep(rng.uniform(0, 0.3))
    sampling.set()
    sampler.join()
    assert positions == sorted(positions), "a command never lowers the snapshot writer's position"

    # The last command (a pause) holds: after the page being read, no page lands.
    time.sleep(1.0)
    pages = pages_landed(warehouse, s.name)
    time.sleep(1.0)
    assert pages_landed(warehouse, s.name) == pages
    (progress,) = SourcePositions.read(writer, s.name).snapshots
    assert progress.paused and progress.rows < 4000
    set_paused(writer, s.name, progress.snapshot_id, False)
    until(lambda: not SourcePositions.read(writer, s.name).snapshots, 60, "the snapshot's end")
    run.stop()
    rows = snapshot_rows(warehouse, s.name)
    assert sorted(json.loads(r.record_pk)["id"] for r in rows) == list(range(1, 4001)), "every row once"


def queued_snapshot(tmp_path: Path, make_source: Any) -> tuple[PgSource, Any, Path, BronzeWriter, SnapshotTask]:
    """A source with a 120-row table and one snapshot of it requested, not started."""
    s = make_source("create table t (id int primary key, v text)", ["t"])
    s.execute("insert into t select g, 'v' || g from generate_series(1, 120) g")
    src = s.config(snapshot={"initial": False, "page_rows": PAGE_ROWS})
    prepare(src)
    warehouse = tmp_path / "warehouse"
    writer = BronzeWriter(warehouse)
    return s, src, warehouse, writer, request_snapshot(src, writer, f"{s.schema}.t")


def test_a_pause_flag_in_a_writer_row_from_before_the_control_records_is_honoured(
    tmp_path: Path, make_source: Any
) -> None:
    """A writer row that says paused (as `snapshot pause` wrote it before its records existed) holds the
    snapshot until a resume record; the records then decide."""
    s, src, warehouse, writer, task = queued_snapshot(tmp_path, make_source)
    table = task.table
    ((pos, started),) = writer.positions(s.name)
    old = SnapshotProgress.from_row(pos)
    writer.raise_position(replace(pos, resume_token=replace(old, paused=True).to_json()), started)
    capture_once(warehouse, src, snapshots=True)
    assert page_rows(warehouse, s.name) == []
    (progress,) = SourcePositions.read(writer, s.name).snapshots
    assert progress.paused and progress.snapshot_id == task.snapshot_id
    set_paused(writer, s.name, table, False)
    capture_once(warehouse, src, snapshots=True)
    assert len(snapshot_rows(warehouse, s.name)) == 120
    assert not SourcePositions.read(writer, s.name).snapshots


def test_a_run_rewriting_the_writer_row_from_before_a_pause_does_not_undo_it(tmp_path: Path, make_source: Any) -> None:
    """Regression: a run that read the writer row, then wrote it back after `snapshot pause` committed,
    undid the pause (the run's rewrite carried the row as it read it); and the command rewrote the row
    itself, with the position it read, under a run raising it."""
    s, src, warehouse, writer, task = queued_snapshot(tmp_path, make_source)
    table = task.table
    ((before, updated),) = writer.positions(s.name)
    set_paused(writer, s.name, table, True)
    ((after, updated_after),) = writer.positions(s.name)
    assert (after.durable_lsn, updated_after) == (before.durable_lsn, updated), "the command leaves the row alone"
    # The run's write of the row as it read it before the pause (its position raised meanwhile).
    stale = replace(task, durable_lsn=task.durable_lsn + 1)
    writer.raise_positions([(stale.position(s.name), stale.started_at)])
    (progress,) = SourcePositions.read(writer, s.name).snapshots
    assert progress.paused, "the pause holds"
    capture_once(warehouse, src, snapshots=True)
    assert page_rows(warehouse, s.name) == []
