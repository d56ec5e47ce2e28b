"""The fake bronze for local dbt work (tests/helpers/bronze_fixture.py) is written to the contract."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from ingest.bronze.schemas import ALL_TABLES
from tests.helpers.bronze_fixture import write


def test_every_phase_writes_tables_with_the_contract_schemas(tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    counts = []
    for phase in (1, 2, 3):
        write(str(warehouse), phase)
        counts.append(DeltaTable(str(warehouse / "bronze/wal_events")).to_pyarrow_table().num_rows)
    for table in ALL_TABLES:
        dt = DeltaTable(str(warehouse / "bronze" / table.name))
        assert dt.schema().to_arrow().names == table.schema.names  # type: ignore[union-attr]
        assert tuple(dt.metadata().partition_columns) == table.partition_by
    assert counts[0] > 0 and counts[1] > counts[0] and counts[2] == counts[1]  # phase 3 only raises positions
