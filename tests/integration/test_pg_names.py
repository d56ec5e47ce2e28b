"""Mixed-case and special-character names end to end through ingest (review finding C3).

`'schema.Table'::regclass` folded the name to lower case, and the snapshot of such a table failed
on every start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

ODD = 'Order Items "v2"'  # capitals, a space and double quotes in one table name


def test_mixed_case_and_quoted_names_are_snapshotted_and_streamed(warehouse: Path, make_source: Any) -> None:
    quoted = '"' + ODD.replace('"', '""') + '"'
    s = make_source(f'create table {quoted} ("Id" int primary key, "Note Text" text)', [ODD])
    src = s.config()
    prepare(src)
    s.execute(f"insert into {quoted} values (1, 'before')")
    capture_once(warehouse, src, snapshots=True)  # the initial snapshot reads the table
    s.execute(f"""update {quoted} set "Note Text" = 'after' where "Id" = 1""")
    capture_once(warehouse, src)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert [(p.table_name, json.loads(p.record)) for p in pages] == [(ODD, {"Id": 1, "Note Text": "before"})]
    events = bronze_events(warehouse, s.name)
    assert [(e.table_name, e.record_pk, json.loads(e.record)["Note Text"]) for e in events] == [
        (ODD, '{"Id":1}', "before"),
        (ODD, '{"Id":1}', "after"),
    ]
