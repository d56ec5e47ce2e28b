"""A retried event batch is committed once, whatever its position (review finding C8).

Real delta-rs tables in a temporary warehouse: `BronzeWriter.append_events` records the batch's
Delta app transaction and skips a batch whose version the table already records.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.bronze.writer import TXN_MAX_LSN, BronzeWriter
from ingest.events import Action, ChangeEvent

# A MongoDB clusterTime packed as (seconds << 32) | increment, from 2026; a Postgres LSN past
# 8 TiB of WAL; a batch that ends deep in a transaction of more than a million events.
MONGO_CLUSTER_TIME = (1_795_000_000 << 32) | 17
POSITIONS = {
    "mongodb": (MONGO_CLUSTER_TIME, 3),
    "postgres-past-8TiB": (TXN_MAX_LSN + 4096, 0),
    "huge-transaction": (4096, 1_500_000),
}


def _batch(commit_lsn: int, last_index: int) -> list[ChangeEvent]:
    return [
        ChangeEvent(commit_lsn, i, 7, 1_795_000_000_000_000, Action.INSERT, "db", "t", record_pk=f'{{"_id":{i}}}')
        for i in (last_index - 1, last_index)
    ]


@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_a_retried_batch_is_committed_once(tmp_path: Path, case: str) -> None:
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    commit_lsn, last_index = POSITIONS[case]
    batch = _batch(commit_lsn, last_index)
    uri = str(tmp_path / "bronze" / "wal_events")

    writer.append_events("src", "mongodb", "stream", batch)
    writer.append_events("src", "mongodb", "stream", batch)  # the retry: the table records it
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 2

    # the next batch of the same writer, one position later, is not mistaken for a retry
    writer.append_events("src", "mongodb", "stream", _batch(commit_lsn, last_index + 2))
    writer.append_events("src", "mongodb", "stream", _batch(commit_lsn + 1, 1))
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 6
