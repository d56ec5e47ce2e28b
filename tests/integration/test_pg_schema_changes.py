"""Schema changes between the WAL and its decoding (review findings C1, W9, W12), on a real server."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ingest.errors import SourceError, SourceUnavailableError
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


def keyed(warehouse: Path, source: str) -> list[tuple[str, str, str | None]]:
    return [(e.action, e.record_pk, e.old_record_pk) for e in bronze_events(warehouse, source)]


def test_old_wal_is_keyed_by_its_own_key_after_the_key_column_is_renamed(
    warehouse: Path, make_source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """C1: the key came from today's catalog ('id2', not in the old Relation): every restart failed."""
    s = make_source("create table items (id int primary key, v text)", ["items"])
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1, 'a'), (2, 'b')")
    s.execute("update items set id = 3 where id = 2")
    s.execute("delete from items where id = 1")
    s.execute("alter table items rename column id to id2")
    s.execute("insert into items values (4, 'd')")
    with caplog.at_level(logging.WARNING, logger="ingest.sources.postgres.changes"):
        capture_once(warehouse, src)
    assert keyed(warehouse, s.name) == [
        ("insert", '{"id":1}', None),
        ("insert", '{"id":2}', None),
        ("update", '{"id":3}', '{"id":2}'),
        ("delete", '{"id":1}', None),
        ("insert", '{"id2":4}', None),
    ]
    assert "the catalog's key ['id2'] is not the one this WAL was written with (['id'])" in caplog.text


def test_old_wal_is_keyed_by_its_own_key_after_the_key_moves_to_a_later_column(
    warehouse: Path, make_source: Any
) -> None:
    """C1: the primary key moved to a column added after the WAL (and to an older column): no crash loop."""
    s = make_source(
        "create table items (id int primary key, v text); create table other (id int primary key, code text not null)",
        ["items", "other"],
    )
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1, 'a'); insert into other values (1, 'x')")
    s.execute("update items set v = 'b' where id = 1; update other set code = 'y' where id = 1")
    s.execute("alter table items add column k int; update items set k = 10 * id")
    s.execute("alter table items drop constraint items_pkey, add primary key (k)")
    # A key moved to a column the old WAL does carry: keyed by the catalog, it would split records.
    s.execute("alter table other drop constraint other_pkey, add primary key (code)")
    s.execute("insert into items values (2, 'c', 20)")
    capture_once(warehouse, src)
    events = bronze_events(warehouse, s.name)
    assert [(e.table_name, e.action, e.record_pk) for e in events] == [
        ("items", "insert", '{"id":1}'),
        ("other", "insert", '{"id":1}'),
        ("items", "update", '{"id":1}'),
        ("other", "update", '{"id":1}'),
        ("items", "update", '{"id":1}'),  # k = 10 * id, written while id was still the key
        ("items", "insert", '{"k":20}'),
    ]
    assert json.loads(events[-1].record) == {"id": 2, "v": "c", "k": 20}


def test_old_wal_of_a_table_dropped_since_is_keyed_by_its_relation_message(warehouse: Path, make_source: Any) -> None:
    """C1: a dropped table has no key in the catalog; its old WAL is keyed by the Relation's key flags."""
    tables = "create table items (id int primary key); create table gone (a int, b int, primary key (b))"
    s = make_source(tables, ["items", "gone"])
    prepare(s.config())
    s.execute("insert into gone values (1, 2); update gone set a = 5 where b = 2")
    s.execute("drop table gone")
    s.execute("insert into items values (1)")
    s.tables = [f"{s.schema}.items"]  # a dropped configured table is refused by name at start
    src = s.config()
    capture_once(warehouse, src)
    assert [(e.table_name, e.action, e.record_pk) for e in bronze_events(warehouse, s.name)] == [
        ("gone", "insert", '{"b":2}'),
        ("gone", "update", '{"b":2}'),
        ("items", "insert", '{"id":1}'),
    ]


def latest_columns(warehouse: Path, source: str) -> list[str]:
    """The columns of the table's latest recorded shape: silver.table_columns' pick."""
    shapes = read(warehouse / "bronze" / "source_relations", f"source = '{source}'", "first_seen_lsn, ingested_at")
    return [c.name for c in shapes[-1].columns]


def test_a_shape_that_returns_to_an_earlier_one_is_recorded_again(warehouse: Path, make_source: Any) -> None:
    """W12: shapes were deduplicated by hash, so after ADD then DROP COLUMN the latest kept the phantom column."""
    s = make_source("create table items (id int primary key, v text)", ["items"])
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1, 'a')")
    s.execute("alter table items add column x int; insert into items values (2, 'b', 2)")
    s.execute("alter table items drop column x; insert into items values (3, 'c')")
    capture_once(warehouse, src)
    assert latest_columns(warehouse, s.name) == ["id", "v"]
    # ... and across a restart: the last recorded shape comes from bronze.
    s.execute("alter table items add column x int; insert into items values (4, 'd', 4)")
    capture_once(warehouse, src)
    assert latest_columns(warehouse, s.name) == ["id", "v", "x"]
    s.execute("alter table items drop column x; insert into items values (5, 'e')")
    capture_once(warehouse, src)
    assert latest_columns(warehouse, s.name) == ["id", "v"]


def test_a_column_retyped_during_a_snapshot_is_ridden_out(warehouse: Path, make_source: Any) -> None:
    """W9: a page read after ALTER COLUMN TYPE went through the old type's encoder (int -> text: invalid JSON)."""
    s = make_source("create table items (id int primary key, n int)", ["items"])
    s.execute("insert into items select g, g from generate_series(1, 4) g")
    src = s.config()
    prepare(src)

    def retype_before_page_2(point: str, task: Any, page: int) -> None:
        if point == "before_read" and page == 2:
            s.execute("alter table items alter column n type text using 'n' || n")

    with pytest.raises(SourceUnavailableError, match=r"changed shape during its snapshot \(column n of .* type"):
        capture_once(warehouse, src, snapshots=True, snapshot_hook=retype_before_page_2, page_rows=1)
    capture_once(warehouse, src, snapshots=True, page_rows=1)  # what the retry loop does next
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "high_watermark_lsn")
    first, again = pages[0].snapshot_id, [p for p in pages if p.snapshot_id != pages[0].snapshot_id]
    assert [json.loads(p.record) for p in pages if p.snapshot_id == first] == [
        {"id": 1, "n": 1},
        {"id": 2, "n": 2},
        {"id": 3, "n": "n3"},
        {"id": 4, "n": "n4"},
    ]
    # The retry's start finds the column retyped since the recorded shape: a re-snapshot retypes 1 and 2.
    assert [json.loads(p.record) for p in again] == [{"id": i, "n": f"n{i}"} for i in range(1, 5)]


def snapshots_of(warehouse: Path, source: str) -> list[list[dict[str, Any]]]:
    """Each snapshot's records in key order, snapshots in the order they were read."""
    rows = read(
        warehouse / "bronze/snapshot_pages",
        f"source = '{source}' and row_index >= 0",
        "high_watermark_lsn, row_index",
    )
    by_id: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_id.setdefault(r.snapshot_id, []).append(json.loads(r.record))
    return [sorted(recs, key=lambda rec: rec["id"]) for recs in by_id.values()]


def test_add_column_with_a_default_between_runs_resnapshots_the_table(warehouse: Path, make_source: Any) -> None:
    """W9 (DESIGN §7.7): existing rows get the default without WAL; silver lacked it until each row changed."""
    s = make_source("create table items (id int primary key, v text)", ["items"])
    s.execute("insert into items select g, 'v' || g from generate_series(1, 3) g")
    src = s.config()
    prepare(src)
    s.execute("insert into items values (4, 'v4')")
    capture_once(warehouse, src, snapshots=True)
    assert len(snapshots_of(warehouse, s.name)) == 1  # the initial one
    s.execute("alter table items add column c int default 7, add column d int")  # d: NULL everywhere, no WAL
    capture_once(warehouse, src, snapshots=True)
    done = snapshots_of(warehouse, s.name)
    assert len(done) == 2
    assert done[-1] == [{"id": i, "v": f"v{i}", "c": 7, "d": None} for i in range(1, 5)]
    capture_once(warehouse, src, snapshots=True)  # nothing changed since: no third snapshot
    assert len(snapshots_of(warehouse, s.name)) == 2


def test_schema_changes_met_in_the_stream_resnapshot_the_table(warehouse: Path, make_source: Any) -> None:
    """W9: a column added with a default, dropped or retyped while the stream runs re-snapshots the table.

    The changes happen during the run (in its initial snapshot), so the start's check cannot see
    them: the stream meets them as a new Relation message. A column added without a default does not.
    """
    s = make_source("create table items (id int primary key, v text, gone text, n int)", ["items"])
    s.execute("insert into items select g, 'v' || g, 'x', g from generate_series(1, 3) g")
    src = s.config()
    prepare(src)
    s.execute("insert into items values (4, 'v4', 'x', 4)")

    def alter_during_the_snapshot(point: str, task: Any, page: int) -> None:
        if point == "after_read" and page == 3 and task.snapshot_id == first[0]:  # its last row
            s.execute("alter table items add column plain int; update items set v = 'w' where id = 4")
            s.execute("alter table items add column c int default 7, drop column gone, alter column n type text")
            s.execute("update items set v = 'w2' where id = 4")

    first: list[str] = []

    def hook(point: str, task: Any, page: int) -> None:
        if not first:
            first.append(task.snapshot_id)
        alter_during_the_snapshot(point, task, page)

    capture_once(warehouse, src, snapshots=True, snapshot_hook=hook, page_rows=1)
    # The stream asked in this run: done already, or a snapshot writer waiting for the next run.
    waiting = read(warehouse / "bronze/stream_positions", f"source = '{s.name}' and writer_kind = 'snapshot'")
    assert len(snapshots_of(warehouse, s.name)) + len(waiting) == 2
    capture_once(warehouse, src, snapshots=True)  # performs a request the first run's snapshots missed
    done = snapshots_of(warehouse, s.name)
    assert len(done) == 2  # the add without a default asked for none; the second change for one
    assert done[-1] == [
        {"id": i, "v": "w2" if i == 4 else f"v{i}", "n": str(i), "plain": None, "c": 7} for i in range(1, 5)
    ]


def test_a_dropped_table_is_tombstoned_after_its_last_change(warehouse: Path, make_source: Any) -> None:
    """W12: DROP (or RENAME) TABLE writes no change, so silver kept the table's records live forever.

    The start that finds a configured table gone refuses by name and leaves a message in the WAL
    after its last change; the stream writes it as a truncate of the table, whatever is configured.
    """
    s = make_source(
        "create table items (id int primary key); create table gone (id int primary key)", ["items", "gone"]
    )
    src = s.config()
    prepare(src)
    s.execute("insert into gone values (1), (2)")
    capture_once(warehouse, src)
    s.execute("insert into gone values (3)")
    s.execute("drop table gone")
    with pytest.raises(SourceError, match=rf"configured table {s.schema}\.gone does not exist \(dropped or renamed"):
        capture_once(warehouse, src)
    s.tables = [f"{s.schema}.items"]
    capture_once(warehouse, s.config())
    events = bronze_events(warehouse, s.name)
    # Two truncates: the refused start's, and the next start's, which found the table it had
    # captured gone and the first one not in bronze yet (left_scope.py); the second is a no-op.
    assert [(e.table_name, e.action, e.truncated_tables) for e in events] == [
        ("gone", "insert", None),
        ("gone", "insert", None),
        ("gone", "insert", None),
        ("gone", "truncate", [f"{s.schema}.gone"]),
        ("gone", "truncate", [f"{s.schema}.gone"]),
    ]
    assert events[-1].message_prefix == f"changelake.tableGone:{src.slot_name}"


def test_a_table_gone_from_another_source_is_not_a_truncate_here(warehouse: Path, make_source: Any) -> None:
    """Bug pinned: the tombstone message of a dropped table is in the database's WAL, which every slot
    decodes, so another source on the same database wrote it into its own bronze as a truncate of a
    table it never captured (seen as an extra event in a concurrent test's event log)."""
    gone = make_source(
        "create table items (id int primary key); create table gone (id int primary key)", ["items", "gone"]
    )
    other = make_source("create table t (id int primary key)", ["t"])
    prepare(gone.config())
    prepare(other.config())
    other.execute("insert into t values (1)")
    gone.execute("drop table gone")
    with pytest.raises(SourceError, match="does not exist"):
        capture_once(warehouse, gone.config())
    other.execute("insert into t values (2)")
    capture_once(warehouse, other.config())
    events = bronze_events(warehouse, other.name)
    assert [(e.table_name, e.action) for e in events if e.action != "message"] == [("t", "insert"), ("t", "insert")]
    # The source whose table it was still turns it into a truncate of that table.
    gone.tables = [f"{gone.schema}.items"]
    capture_once(warehouse, gone.config())
    mine = [(e.table_name, e.action, e.truncated_tables) for e in bronze_events(warehouse, gone.name)]
    assert mine == [("gone", "truncate", [f"{gone.schema}.gone"])]


def test_add_column_with_a_default_during_a_continuous_run_resnapshots_the_table(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug pinned: a continuous run met the change only on a row change of that table, or at the next start.

    Only another table changes after the ALTER: no Relation message of the altered table comes.
    """
    from tests.helpers.bronze_fold import live_records, table_rows
    from tests.helpers.capture_thread import ContinuousCapture

    monkeypatch.setattr("ingest.sources.postgres.capture.SHAPE_CHECK_INTERVAL_S", 1.0)
    s = make_source(
        "create table items (id int primary key, v text); create table other (id int primary key)", ["items", "other"]
    )
    s.execute("insert into items values (1, 'a'), (2, 'b')")
    src = s.config()
    prepare(src)
    items = f"{s.schema}.items"

    def items_match() -> bool:
        return live_records(warehouse, s.name).get(items) == table_rows(s.conn, items)

    n = iter(range(1_000_000))
    with ContinuousCapture(warehouse, src) as run:
        run.wait_for(items_match, 60, "items snapshotted")
        s.execute("alter table items add column status text not null default 'active'")
        run.wait_for(
            items_match,
            60,
            "the default in bronze",
            tick=lambda: s.execute("insert into other values (%s)", (next(n),)),
        )
    assert [len(recs) for recs in snapshots_of(warehouse, s.name)] == [2, 2]  # the initial one, and the new one
