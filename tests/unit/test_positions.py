"""A snapshot writer's progress record survives its round trip through the writer row's `resume_token`."""

from __future__ import annotations

import json

from ingest.events import TableSnapshot, WriterKind, WriterPosition
from ingest.positions import SnapshotProgress


def _row(token: str) -> WriterPosition:
    return WriterPosition("s", "snapshot-abc", WriterKind.SNAPSHOT, 7, 7, token)


def test_a_whole_table_snapshot_keeps_its_table_snapshot() -> None:
    whole = TableSnapshot("parent", 4, 100, 105, (101, 103))
    progress = SnapshotProgress("public.t", "abc", 2, 20, until=("9",), bounded=True, whole=True, table_snapshot=whole)
    token = progress.to_json()
    assert json.loads(token)["table_snapshot"] == {
        "id": "parent",
        "parts": 4,
        "xmin": 100,
        "xmax": 105,
        "xip": [101, 103],
    }
    assert SnapshotProgress.from_row(_row(token)) == progress


def test_a_whole_table_snapshot_before_its_bound_has_none_yet() -> None:
    progress = SnapshotProgress("public.t", "abc", whole=True)
    assert SnapshotProgress.from_row(_row(progress.to_json())) == progress


def test_a_row_an_older_ingest_wrote_has_no_table_snapshot() -> None:
    """Its pages so far carry none: the pages it reads on carry none either."""
    old = {"table": "public.t", "snapshot_id": "abc", "pages": 3, "rows": 30, "estimated_rows": None}
    token = json.dumps(old | {"rows_per_s": None, "until": ["9"]})
    progress = SnapshotProgress.from_row(_row(token))
    assert (progress.whole, progress.table_snapshot, progress.until) == (False, None, ("9",))
    assert "table_snapshot" not in json.loads(progress.to_json())
