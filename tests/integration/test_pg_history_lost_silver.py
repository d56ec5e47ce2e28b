"""A history-lost recovery mends silver without emptying it (real server, real delta-rs, real dbt).

`on_history_lost: resnapshot` used to truncate every table just below the new slot's start and
then snapshot them again: every consumer of record_history saw every record deleted and created
again, and silver was empty until the snapshots completed. The recovery now only re-snapshots the
tables whole: a key the gap deleted gets an absent tombstone, the others their page row. Here the
slot is dropped while rows are deleted, inserted and updated, a table is truncated, on a keyed, a
partitioned and a keyless table, and rows change while the re-snapshot reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.sources.postgres.snapshot import SnapshotTask
from tests.helpers.pg import bronze_events, capture_once, drop_slot, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, silver, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

TABLES_SQL = """
create table items (id int primary key, v text);
create table orders (id int, region text, v text, primary key (id, region)) partition by list (region);
create table orders_eu partition of orders for values in ('eu');
create table orders_us partition of orders for values in ('us');
create table notes (v text, n int);
alter table notes replica identity full;
create table wiped (id int primary key, v text);
"""
KEYS = {"items": ["id"], "orders": ["id", "region"], "notes": ["v", "n"], "wiped": ["id"]}
REMOVALS = {"delete", "truncate", "absent"}


def _live(warehouse: Path, source: str) -> dict[str, dict[str, Any]]:
    recs = [r for r in silver(warehouse, "consumer_records") if r.source == source]
    return {t: {r.record_pk: json.loads(r.record) for r in recs if r.table_name == t and not r.deleted} for t in KEYS}


def _source(s: Any) -> dict[str, dict[str, Any]]:
    return {t: source_rows(s, t, pk) for t, pk in KEYS.items()}


def test_a_gap_recovery_leaves_silver_equal_to_the_source_without_deleting_surviving_keys(
    warehouse: Path, make_source: Any
) -> None:
    """The recovery used to truncate every table: each surviving record was deleted and created again."""
    s = make_source(TABLES_SQL, list(KEYS))
    s.execute("insert into items select g, 'v' || g from generate_series(1, 6) g")  # read by the snapshot
    s.execute("insert into orders values (1, 'eu', 'a'), (2, 'us', 'b'), (3, 'eu', 'c')")
    src = s.config().model_copy(update={"on_history_lost": "resnapshot"})
    prepare(src)
    s.execute("insert into notes values ('a', 1), ('b', 2), ('c', 3)")  # by the stream
    s.execute("insert into wiped values (1, 'w1'), (2, 'w2'), (3, 'w3')")
    s.execute("insert into items values (8, 'v8')")
    capture_once(warehouse, src, snapshots=True)
    dbt(warehouse, "build", *NO_UNIT_TESTS)
    before = _source(s)
    assert _live(warehouse, s.name) == before

    # The history is lost: the slot goes, and the tables change while there is none.
    drop_slot(s.conn, src.slot_name)
    s.execute("delete from items where id = 1")
    s.execute("insert into items values (7, 'gap insert')")
    s.execute("update items set v = 'gap update' where id = 2")
    s.execute("delete from orders where id = 1")
    s.execute("update orders set v = 'gap update' where id = 2")
    s.execute("insert into orders values (4, 'us', 'gap insert')")
    s.execute("delete from notes where v = 'a'")
    s.execute("insert into notes values ('d', 4)")
    s.execute("truncate wiped")
    s.execute("insert into wiped values (2, 'w2 again'), (4, 'w4')")

    # While the re-snapshot of items reads (two rows a page): a row of a page read already is
    # updated, a row of a page still to read is updated and another deleted.
    changed: list[str] = []

    def while_reading(event: str, task: SnapshotTask, page: int) -> None:
        if event == "after_read" and task.table.endswith(".items") and page == 0 and not changed:
            with psycopg.connect(s.dsn, autocommit=True) as conn:
                conn.execute(f"update {s.schema}.items set v = 'while read' where id in (3, 5)")
                conn.execute(f"delete from {s.schema}.items where id = 6")
            changed.append(task.snapshot_id)

    capture_once(warehouse, src, snapshots=True, page_rows=2, snapshot_hook=while_reading)
    assert changed, "the hook never ran: items was not re-snapshotted in pages"
    s.execute("update items set v = 'after' where id = 4")  # the stream goes on from the new slot
    s.execute("insert into wiped values (5, 'w5')")
    capture_once(warehouse, src)
    dbt(warehouse, "build", *NO_UNIT_TESTS)

    after = _source(s)
    assert _live(warehouse, s.name) == after  # DESIGN invariant 1

    # No key the source had before the gap and still has was ever deleted in silver.
    history = [r for r in silver(warehouse, "record_history") if r.source == s.name]
    survivors = {(t, pk) for t in KEYS for pk in before[t] if pk in after[t]}
    assert ("wiped", '{"id":2}') in survivors and ("items", '{"id":3}') in survivors
    removed = sorted({(h.table_name, h.record_pk, h.ended_by) for h in history if h.ended_by in REMOVALS})
    assert [r for r in removed if (r[0], r[1]) in survivors] == []
    # Keys gone during the gap end with an absent tombstone; the one the stream deleted, with its delete.
    assert removed == [
        ("items", '{"id":1}', "absent"),
        ("items", '{"id":6}', "delete"),
        ("notes", '{"v":"a","n":1}', "absent"),
        ("orders", '{"id":1,"region":"eu"}', "absent"),
        ("wiped", '{"id":1}', "absent"),
        ("wiped", '{"id":3}', "absent"),
    ]
    recs = {(r.table_name, r.record_pk): r for r in silver(warehouse, "consumer_records") if r.source == s.name}
    assert recs[("items", '{"id":1}')].deleted and recs[("items", '{"id":1}')].origin == "snapshot"

    # An unchanged key gains a version with the same record (started by the snapshot's page row):
    # record_history does not fold an identical snapshot row into the version before it.
    unchanged = sorted(
        (h for h in history if (h.table_name, h.record_pk) == ("orders", '{"id":3,"region":"eu"}')),
        key=lambda h: (h.valid_from_lsn, h.valid_from_index),
    )
    assert [(h.started_by, json.loads(h.record)["v"], h.is_current) for h in unchanged] == [
        ("snapshot", "c", False),
        ("snapshot", "c", True),
    ]
    assert not [e for e in bronze_events(warehouse, s.name) if e.message_prefix == "changelake.historyLost"]
