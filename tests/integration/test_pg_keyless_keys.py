"""A keyless table's record key (every column) is the same bytes from the stream, a CTID snapshot and a re-read.

Odd values in such keys: NULL, the empty string, the text 'null', a JSON null inside a json
column, numeric text with trailing zeros, an array, a json object with its own spacing, float
NaN and -0, booleans, padded char(n), inet with and without a netmask, timestamptz infinity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from ingest.config import SnapshotSettings
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

DDL = (
    "create table odd (a int, b text, j json, n numeric, arr int[], f float8, ok bool, c char(3), ip inet, "
    "ts timestamptz); alter table odd replica identity full;"
)
ROWS = (
    "insert into odd values "
    "(1, null, null, null, null, null, null, null, null, null),"
    "(2, '', '{}', 1.50, '{1,2}', 0.1, true, 'a', '10.0.0.1', '2026-01-02 03:04:05.5+00'),"
    "(3, 'null', 'null', 10, null, 'NaN', false, 'ab ', '10.0.0.0/8', null),"
    "(null, 'x', '{\"k\":  null}', 0.000, '{}', 1e300, null, '', null, 'infinity'),"
    "(5, null, '[1, null]', 12345678901234567890.123456789, '{null,3}', -0.0, true, null, '::1', null),"
    # A row the re-read must not return: it differs from row 1 only in b being '' instead of NULL.
    "(1, '', null, null, null, null, null, null, null, null)"
)


def page_keys(warehouse: Path, source: str) -> dict[str, list[str]]:
    """Each snapshot's page rows' record_pk, by snapshot id."""
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{source}' and record_pk is not null", "row_index")
    by_id: dict[str, list[str]] = {}
    for p in pages:
        by_id.setdefault(p.snapshot_id, []).append(p.record_pk)
    return by_id


def test_keyless_keys_are_the_same_bytes_from_the_stream_a_snapshot_and_a_reread(
    warehouse: Path, tmp_path: Path, make_source: Any
) -> None:
    """Regression: a re-read key of a keyless table took a NULL column as the text 'null' (and a json
    column as JSON re-serialized), so it read no row, the wrong row, or failed on json's missing '='.
    """
    s = make_source(DDL, ["odd"])
    src = s.config()
    prepare(src)
    s.execute(ROWS)
    capture_once(warehouse, src)
    streamed = [e.record_pk for e in bronze_events(warehouse, s.name)]
    assert len(streamed) == 6

    capture_once(warehouse, src, snapshots=True)
    (snapshot,) = page_keys(warehouse, s.name).values()
    assert sorted(snapshot) == sorted(streamed), "a CTID page keys a row as the stream does"

    # silver marks every row but the last for a re-read (as it does an unchanged TOAST value without an image)
    marked = tmp_path / "consumer_records"
    rows = [
        {"source": s.name, "table_schema": s.schema, "table_name": "odd", "record_pk": pk}
        | {"deleted": False, "needs_reread": True, "commit_lsn": 1, "commit_index": i}
        for i, pk in enumerate(streamed[:-1])
    ]
    write_deltalake(marked, pa.Table.from_pylist(rows))
    capture_once(warehouse, s.config(snapshot=SnapshotSettings(reread_from=str(marked))), snapshots=True)
    (reread,) = [keys for keys in page_keys(warehouse, s.name).values() if keys != snapshot]
    assert sorted(reread) == sorted(streamed[:-1]), "each marked key re-read once, byte for byte, and no other row"
