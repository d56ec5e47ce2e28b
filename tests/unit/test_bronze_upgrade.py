"""A bronze table an older ingest created gets the columns the contract added, at the next start.

Real delta-rs tables in a temporary warehouse. dbt's models name every contract column (gold
schema_changes reads `source_relations.columns[].attnum`): a warehouse whose table predates a
column would fail there until some write happened to merge it, which for `source_relations` is a
PostgreSQL shape change and never comes for a MongoDB-only warehouse.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE, SOURCE_RELATIONS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.events import SnapshotPage, SnapshotRow, TableSnapshot


def _without_attnum(schema: pa.Schema) -> pa.Schema:
    """source_relations as ingest wrote it before it recorded each column's attnum (and a composite's fields)."""
    columns = schema.field("columns")
    element = columns.type.value_type
    old_element = pa.struct([f for f in element if f.name not in {"attnum", "fields"}])
    return schema.set(schema.get_field_index("columns"), pa.field("columns", pa.list_(old_element)))


def test_ensure_tables_adds_the_contract_columns_an_older_table_lacks(tmp_path: Path) -> None:
    uri = tmp_path / "bronze" / "source_relations"
    old_schema = _without_attnum(SOURCE_RELATIONS_TABLE.schema)
    old_row = {name: None for name in old_schema.names} | {"source": "s", "table_name": "t", "columns": []}
    write_deltalake(str(uri), pa.Table.from_pylist([old_row], old_schema), partition_by=["source"])
    assert "attnum" not in str(pa.schema(DeltaTable(str(uri)).schema().to_arrow()))
    assert "fields" not in str(pa.schema(DeltaTable(str(uri)).schema().to_arrow()))

    BronzeWriter(tmp_path).ensure_tables()

    table = DeltaTable(str(uri))
    element = pa.schema(table.schema().to_arrow()).field("columns").type.value_type
    assert [f.name for f in element] == [f.name for f in SOURCE_RELATIONS_TABLE.schema.field("columns").type.value_type]
    # Nothing rewritten: the old row reads as it was.
    assert table.to_pyarrow_table().to_pylist() == [old_row]

    # A second start changes nothing more (no commit when no column is missing).
    version = table.version()
    BronzeWriter(tmp_path).ensure_tables()
    assert DeltaTable(str(uri)).version() == version


def test_snapshot_pages_of_an_older_ingest_gain_table_snapshot_and_take_pages_with_it(tmp_path: Path) -> None:
    """A snapshot_pages table written before `table_snapshot` gains the struct column and keeps its rows."""
    uri = tmp_path / "bronze" / "snapshot_pages"
    schema = SNAPSHOT_PAGES_TABLE.schema
    old_schema = schema.remove(schema.get_field_index("table_snapshot"))
    old_row = {name: None for name in old_schema.names} | {"source": "s", "snapshot_id": "old", "page_number": 0}
    write_deltalake(str(uri), pa.Table.from_pylist([old_row], old_schema), partition_by=["source"])

    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    assert (
        pa.schema(DeltaTable(str(uri)).schema().to_arrow()).field("table_snapshot").type
        == schema.field("table_snapshot").type
    )

    whole = TableSnapshot("new", 3, 10, 12, (11,))
    page = SnapshotPage(
        "new", "public", "t", 0, True, (SnapshotRow('{"id":1}', '{"id":1}', ("1",)),), 5, 0, 10, 13, (11,), whole
    )
    writer.append_page("s", "postgres", "snapshot-new", page)

    rows = {r["snapshot_id"]: r for r in DeltaTable(str(uri)).to_pyarrow_table().to_pylist()}
    assert rows["old"]["table_snapshot"] is None
    assert rows["new"]["table_snapshot"] == {"id": "new", "parts": 3, "xmin": 10, "xmax": 12, "xip": [11]}
