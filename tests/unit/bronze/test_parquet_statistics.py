"""Bronze's Parquet files carry statistics only for the columns readers filter on.

Real delta-rs: `BronzeWriter.append_events` and `append_page` into a temporary warehouse, then
each data file's Parquet footer read with pyarrow. The JSON texts (a record may be 1 MiB) are
written without page or chunk min/max (they cost ~100 MiB of peak RSS per 32 MiB batch of wide
rows and prune nothing); positions and table names keep theirs, and every column is compressed
as delta-rs compresses without properties (given properties, an unset codec meant none: 2 GiB
of compressible values went to Parquet uncompressed, +90 MiB of peak RSS).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE, WAL_EVENTS_TABLE, BronzeTable
from ingest.bronze.writer import BronzeWriter
from ingest.events import Action, ChangeEvent, SnapshotPage, SnapshotRow

WIDE = "x" * 200_000


def _statistics(table_dir: Path) -> dict[str, bool]:
    """Column -> whether every data file's row groups have min/max for it (each column Snappy-compressed)."""
    files = [table_dir / f for f in DeltaTable(str(table_dir)).file_uris()]
    assert files
    have: dict[str, bool] = {}
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            for i in range(meta.num_columns):
                col = meta.row_group(rg).column(i)
                assert col.compression == "SNAPPY", (path, col.path_in_schema, col.compression)
                stats = col.statistics
                with_min_max = stats is not None and stats.has_min_max
                have[col.path_in_schema] = have.get(col.path_in_schema, True) and with_min_max
    return have


@pytest.mark.parametrize("table", [WAL_EVENTS_TABLE, SNAPSHOT_PAGES_TABLE], ids=lambda t: t.name)
def test_json_texts_are_written_without_statistics(tmp_path: Path, table: BronzeTable) -> None:
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    if table is WAL_EVENTS_TABLE:
        events = [
            ChangeEvent(
                4096,
                i,
                7,
                1_795_000_000_000_000,
                Action.UPDATE,
                "public",
                "t",
                1,
                f'{{"id":{i}}}',
                None,
                f'{{"id":{i},"v":"{WIDE}"}}',
                f'{{"id":{i},"v":"old"}}',
            )
            for i in range(3)
        ]
        writer.append_events("src", "postgres", "stream", events)
        indexed = ("commit_lsn", "commit_index", "table_name", "ingested_at")
    else:
        rows = tuple(SnapshotRow(f'{{"id":{i}}}', f'{{"id":{i},"v":"{WIDE}"}}', (str(i),)) for i in range(3))
        writer.append_page(
            "src",
            "postgres",
            "snap-1",
            SnapshotPage("snap-1", "public", "t", 0, True, rows, 4096, 1_795_000_000_000_000),
        )
        indexed = ("snapshot_id", "table_name", "page_number", "high_watermark_lsn")
    have = _statistics(tmp_path / "bronze" / table.name)
    unindexed = table.unindexed_columns()
    assert {"record", "record_pk"} <= set(unindexed)
    assert not any(have[c] for c in unindexed), {c: have[c] for c in unindexed}
    assert all(have[c] for c in indexed), {c: have[c] for c in indexed}
