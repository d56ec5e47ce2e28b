"""gold.schema_changes is rewritten when a shape changes or a change's first event arrives, not per batch.

It reads bronze.source_relations (the shapes) and sequin_events only for each change's commit time
(changed_at). A build whose batch changed no shape and brought no awaited first event leaves it at
its Delta version; a change built before silver held its first event gets its changed_at from the
next build that loads that event. Real ALTERs between ingest runs (a column renamed, one retyped,
the key changed) come out as renamed, retyped and key_changed at the commit of each new shape's first event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare
from tests.helpers.silver import dbt

SCHEMA_CHANGES = Path("dbt") / "gold.db" / "schema_changes"


def changes(warehouse: Path, source: str) -> dict[tuple[str, str | None], Any]:
    """(change_kind, column_name) -> changed_at, for the source's rows."""
    return {
        (r.change_kind, r.column_name): r.changed_at for r in read(warehouse / SCHEMA_CHANGES) if r.source == source
    }


@pytest.mark.usefixtures("engine")
def test_schema_changes_waits_for_shapes_and_first_events_only(warehouse: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, v text)", ["items"])
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1, 'a')")
    capture_once(warehouse, src)
    dbt(warehouse, "run", "--select", "+schema_changes")
    assert ("table_added", None) in changes(warehouse, s.name)

    # A column added; its first event is in bronze, but this build loads no new event into silver.
    s.execute("alter table items add column qty int")
    s.execute("insert into items values (2, 'b', 7)")
    capture_once(warehouse, src)
    dbt(warehouse, "run", "--select", "schema_changes")
    assert changes(warehouse, s.name)[("added", "qty")] is None

    # The next build loads that event: schema_changes runs although source_relations did not move.
    dbt(warehouse, "run", "--select", "+schema_changes")
    (added_at,) = [
        e.commit_timestamp for e in bronze_events(warehouse, s.name) if e.action == "insert" and '"id":2' in e.record_pk
    ]
    assert changes(warehouse, s.name)[("added", "qty")] == added_at
    version = DeltaTable(str(warehouse / SCHEMA_CHANGES)).version()

    # Row changes only: sequin_events takes them, schema_changes is left as it was.
    s.execute("insert into items values (3, 'c', 8); update items set v = 'z' where id = 1")
    capture_once(warehouse, src)
    out = dbt(warehouse, "run", "--select", "+schema_changes")
    assert DeltaTable(str(warehouse / SCHEMA_CHANGES)).version() == version, out
    assert len(read(warehouse / "dbt" / "silver.db" / "sequin_events")) == 4

    # A shape change rewrites it again, with its commit time.
    s.execute("alter table items drop column v")
    s.execute("insert into items values (4, 9)")
    capture_once(warehouse, src)
    dbt(warehouse, "run", "--select", "+schema_changes")
    assert DeltaTable(str(warehouse / SCHEMA_CHANGES)).version() > version
    assert changes(warehouse, s.name)[("dropped", "v")] is not None

    # A rename, a retype and a key change, each from a real ALTER through ingest: the kinds the
    # model tells apart by attnum and key position, at the commit of the first event of each shape.
    s.execute("alter table items rename column qty to quantity")
    s.execute("alter table items alter column id type bigint")
    s.execute("insert into items values (5, 10)")
    s.execute("update items set quantity = 0 where quantity is null")
    s.execute("alter table items drop constraint items_pkey, add primary key (id, quantity)")
    s.execute("insert into items values (6, 11)")
    capture_once(warehouse, src)
    dbt(warehouse, "run", "--select", "+schema_changes")
    events = bronze_events(warehouse, s.name)
    (renamed_at,) = [e for e in events if e.action == "insert" and json.loads(e.record)["id"] == 5]
    (rekeyed_at,) = [e for e in events if e.action == "insert" and json.loads(e.record)["id"] == 6]
    rows = {
        (r.change_kind, r.column_name): r
        for r in read(warehouse / SCHEMA_CHANGES)
        if r.source == s.name and r.changed_at_lsn >= renamed_at.commit_lsn
    }
    assert {k: (r.previous_column_name, r.previous_definition, r.new_definition) for k, r in rows.items()} == {
        ("renamed", "quantity"): ("qty", "integer", "integer"),
        ("retyped", "id"): ("id", "integer", "bigint"),
        ("key_changed", None): (None, "(id) replica identity default", "(id, quantity) replica identity default"),
    }
    for kind, at in (("renamed", renamed_at), ("retyped", renamed_at), ("key_changed", rekeyed_at)):
        (row,) = [r for (k, _), r in rows.items() if k == kind]
        assert (row.changed_at_lsn, row.changed_at) == (at.commit_lsn, at.commit_timestamp), kind
