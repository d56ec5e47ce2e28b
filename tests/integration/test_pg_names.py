"""Mixed-case and special-character names end to end through ingest (review finding C3).

`'schema.Table'::regclass` folded the name to lower case, and the snapshot of such a table failed
on every start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from ingest.bronze.writer import BronzeWriter
from ingest.config import SnapshotSettings
from ingest.sources.postgres.verify import verify_tables
from ingest.verify import Status
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare
from tests.integration.test_verify_edges import Ingesting, fold_snapshot

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


PCT = "price%s"  # psycopg's placeholder spelled inside a table name


def test_percent_s_in_names_is_snapshotted_streamed_reread_and_verified(
    tmp_path: Path, warehouse: Path, make_source: Any
) -> None:
    """A table or column name containing "%s" broke every snapshot page query.

    The page query was rendered with psycopg's %s placeholders, which were then replaced by libpq's
    $n textually, the first "%s" of a quoted identifier first: every start failed with a syntax
    error, and so did a TOAST re-read of listed keys.
    """
    s = make_source(f'create table "{PCT}" ("id%s" int primary key, "cost%s" text)', [PCT])
    (table,) = s.tables
    quoted = f'{s.schema}."{PCT}"'
    s.execute(f"insert into {quoted} select g, 'c' || g from generate_series(1, 5) g")
    src = s.config()
    prepare(src)
    # Pages of 2 rows: the keyset cursor's "after" and "until" bounds are both bound parameters.
    capture_once(warehouse, src, snapshots=True, page_rows=2)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert sorted(json.loads(p.record)["id%s"] for p in pages) == [1, 2, 3, 4, 5]
    assert {p.table_name for p in pages} == {PCT}

    s.execute(f"""update {quoted} set "cost%s" = 'after' where "id%s" = 3""")
    capture_once(warehouse, src)
    assert [json.loads(e.record) for e in bronze_events(warehouse, s.name)] == [{"id%s": 3, "cost%s": "after"}]

    # verify reads the table under the same names (the updated key changed after silver: skipped).
    fold_snapshot(warehouse, s.name)
    with Ingesting(warehouse, src):
        (r,) = verify_tables(src, BronzeWriter(warehouse), [table], 30, 1000, 10, False, "run-pct")
    assert (r.status, r.source_rows, r.skipped_keys) == (Status.EQUAL, 5, 1), r

    # A re-read of listed keys (what silver asks for an unchanged TOAST value without an image).
    marked = tmp_path / "consumer_records"
    rows = [
        {"source": s.name, "table_schema": s.schema, "table_name": PCT, "record_pk": f'{{"id%s":{i}}}'}
        | {"deleted": False, "needs_reread": True, "commit_lsn": 1, "commit_index": 0}
        for i in (2, 4)
    ]
    write_deltalake(marked, pa.Table.from_pylist(rows))
    capture_once(warehouse, s.config(snapshot=SnapshotSettings(reread_from=str(marked))), snapshots=True)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert sorted(json.loads(p.record)["id%s"] for p in pages) == [1, 2, 2, 3, 4, 4, 5]
