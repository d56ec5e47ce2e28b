"""Re-snapshots find deletes (issue 32, docs/snapshots.md "Re-snapshots find deletes"), on a real
server, real delta-rs and real dbt.

Changes get lost without a slot gap when a table leaves the publication for a while: nothing of it
is decoded meanwhile, and the stream goes on as if nothing happened. Here rows are deleted, updated
and inserted in that window, on a keyed table large enough to be cut into key ranges and on a
keyless one. A re-snapshot (the one the next run takes on its own, seeing the tables' publication
rows replaced; `snapshot <table>` is the same) then leaves silver equal to the source: the keys it
did not find are tombstoned, without a truncate, while keys written by the stream during and after
the snapshot stay as the stream left them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, frozen, live_records, silver, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

ROWS = 3000


def _absent_rows(warehouse: Path, source: str) -> list[Any]:
    placed = silver(warehouse, "snapshot_rows_placed")
    return [r for r in placed if r.source == source and r.page_number == -1 and r.row_index >= 0]


def test_a_re_snapshot_tombstones_the_keys_lost_changes_deleted(warehouse: Path, make_source: Any) -> None:
    s = make_source(
        "create table items (id int primary key, v text);"
        "create table notes (v text, n int); alter table notes replica identity full",
        ["items", "notes"],
    )
    s.execute(f"insert into items select g, 'v' || g from generate_series(1, {ROWS}) g")
    s.execute("insert into notes values ('a', 1), ('b', 2), ('c', 3)")
    s.execute("analyze items")  # the estimate that cuts it into key ranges
    src = s.config(snapshot={"max_parallel": 3, "split_rows": 1000})
    prepare(src)
    capture_once(warehouse, src, snapshots=True, page_rows=400)
    dbt(warehouse, "build", *NO_UNIT_TESTS)
    # The initial snapshot finds every key the stream knows: nothing is absent.
    assert _absent_rows(warehouse, s.name) == []
    assert len(live_records(warehouse, s.name, "items")) == ROWS

    # Lost changes: the tables leave the publication, rows change, the tables come back.
    publication = f"changelake_{s.name}"
    s.execute(f"alter publication {publication} drop table {s.schema}.items, {s.schema}.notes")
    s.execute("delete from items where id in (1, 1500, 2999)")  # one in each key range
    s.execute("update items set v = 'lost update' where id = 2")
    s.execute(f"insert into items values ({ROWS + 1}, 'lost insert')")
    s.execute("delete from notes where v = 'a'")
    s.execute(f"alter publication {publication} add table {s.schema}.items, {s.schema}.notes")
    capture_once(warehouse, src)
    # The rows came from the initial snapshot; the window's changes are nowhere in bronze.
    assert bronze_events(warehouse, s.name) == [], "the changes were lost, as the test means them to be"

    # The next run with snapshots finds both tables' publication rows replaced (membership.py) and
    # re-snapshots them whole, as `snapshot <table>` would.
    capture_once(warehouse, src, snapshots=True, page_rows=400)
    # The stream goes on after the re-snapshot: a delete and inserts it carries, one of a key it
    # tombstones.
    s.execute("delete from items where id = 4")
    s.execute(f"insert into items values ({ROWS + 2}, 'streamed'), (1, 'back')")
    capture_once(warehouse, src)
    dbt(warehouse, "build", *NO_UNIT_TESTS)

    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and table_name = 'items'")
    resnapshot = {r.table_snapshot["id"] for r in pages if r.table_snapshot is not None}
    assert len(resnapshot) == 2, "the initial snapshot and the re-snapshot, each a whole-table one"
    assert len({r.snapshot_id for r in pages}) == 6, "each cut into three key ranges"

    live_items = live_records(warehouse, s.name, "items")
    assert live_items == source_rows(s, "items", ["id"])
    notes_keys = ["v", "n"]
    assert live_records(warehouse, s.name, "notes") == source_rows(s, "notes", notes_keys)
    recs = {(r.table_name, r.record_pk): r for r in silver(warehouse, "consumer_records") if r.source == s.name}
    assert not recs[("items", '{"id":1}')].deleted and recs[("items", '{"id":1}')].origin == "stream"
    for pk in ['{"id":1500}', '{"id":2999}']:
        assert recs[("items", pk)].deleted and recs[("items", pk)].origin == "snapshot", pk
    assert recs[("items", '{"id":4}')].deleted and recs[("items", '{"id":4}')].origin == "stream"
    assert recs[("notes", '{"v":"a","n":1}')].deleted

    absent = _absent_rows(warehouse, s.name)
    assert sorted((r.table_name, r.record_pk) for r in absent) == [
        ("items", '{"id":1500}'),
        ("items", '{"id":1}'),
        ("items", '{"id":2999}'),
        ("notes", '{"v":"a","n":1}'),
    ]
    history = sorted(
        (r for r in silver(warehouse, "record_history") if r.source == s.name and r.table_name == "items"),
        key=lambda r: (r.valid_from_lsn, r.valid_from_index),
    )
    assert [(h.started_by, h.ended_by) for h in history if h.record_pk == '{"id":1500}'] == [("snapshot", "absent")]
    assert [(h.started_by, h.ended_by) for h in history if h.record_pk == '{"id":1}'] == [
        ("snapshot", "absent"),
        ("insert", None),
    ]

    # Another run places nothing again: the completion is looked at once.
    s.execute("update items set v = 'later' where id = 5")
    capture_once(warehouse, src)
    dbt(warehouse, "build", *NO_UNIT_TESTS)
    assert len(_absent_rows(warehouse, s.name)) == len(absent)
    assert live_records(warehouse, s.name, "items") == source_rows(s, "items", ["id"])

    # DESIGN invariant 5: a full refresh from bronze gives the same silver, absent rows included
    # (the rule reads only what is at or below each completion).
    models = ("snapshot_rows_placed", "consumer_records", "record_history")
    incremental = {m: frozen(silver(warehouse, m)) for m in models}
    dbt(warehouse, "run", "--select", "silver", "--full-refresh")
    assert {m: frozen(silver(warehouse, m)) for m in models} == incremental
