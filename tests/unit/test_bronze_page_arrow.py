"""A snapshot page's Arrow table, built column by column, is the one a row of dicts per record gave.

Both forms of a page: its rows, and its rows as the compiled encoder's Arrow buffers (`columns`),
made here by the compiled PageBuilder when native/ is built and by a plain Python packing of the
same layout either way.
"""

from __future__ import annotations

import io
import struct
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.bronze import writer
from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE
from ingest.events import PageColumns, SnapshotPage, SnapshotRow, TableSnapshot
from ingest.sources.postgres import native

NOW = datetime(2026, 11, 26, 19, 30, tzinfo=UTC)
ROWS = tuple(SnapshotRow(f'{{"id":{i}}}', f'{{"id":{i},"v":"é{i}"}}', (str(i), f"k{i}")) for i in range(1, 2_001))


def dict_rows(source: str, kind: str, writer_id: str, page: SnapshotPage) -> pa.Table:
    """The table as `append_page` built it before: one dict per row, `pa.Table.from_pylist`."""
    rows = page.rows or (None,)
    ts = page.table_snapshot.to_struct() if page.table_snapshot is not None else None
    data: list[dict[str, Any]] = [
        {
            "source": source,
            "source_kind": kind,
            "snapshot_id": page.snapshot_id,
            "table_schema": page.table_schema,
            "table_name": page.table_name,
            "page_number": page.page_number,
            "row_index": i if r is not None else -1,
            "last_page": page.last_page,
            "record_pk": r.record_pk if r is not None else None,
            "record": r.record if r is not None else None,
            "key_text": list(r.key_text) if r is not None else None,
            "snapshot_xmin": page.xmin,
            "snapshot_xmax": page.xmax,
            "snapshot_xip": list(page.xip) if page.xip is not None else None,
            "table_snapshot": ts,
            "high_watermark_lsn": page.high_watermark_lsn,
            "read_at": datetime.fromtimestamp(page.read_at_us / 1_000_000, UTC),
            "writer_id": writer_id,
            "ingested_at": NOW,
        }
        for i, r in enumerate(rows)
    ]
    return pa.Table.from_pylist(data, SNAPSHOT_PAGES_TABLE.schema)


def strings(texts: list[str]) -> tuple[bytes, bytes]:
    """(int32 little-endian offsets, UTF-8 data): an Arrow string column's buffers."""
    data = [t.encode() for t in texts]
    ends = [0]
    for d in data:
        ends.append(ends[-1] + len(d))
    return struct.pack(f"<{len(ends)}i", *ends), b"".join(data)


def packed_columns(rows: tuple[SnapshotRow, ...]) -> PageColumns:
    """The page's rows in the compiled encoder's layout, packed in Python."""
    width = len(rows[0].key_text) if rows else 0
    lists = struct.pack(f"<{len(rows) + 1}i", *range(0, (len(rows) + 1) * width or 1, width or 1))
    return PageColumns(
        len(rows),
        sum(len(r.record) for r in rows),
        strings([r.record_pk for r in rows]),
        strings([r.record for r in rows]),
        lists,
        strings([k for r in rows for k in r.key_text]),
        rows[-1].key_text if rows else (),
    )


def compiled_columns(rows: tuple[SnapshotRow, ...]) -> PageColumns:
    """The page's rows appended to the compiled encoder's page buffers (native/) and read back."""
    width = len(rows[0].key_text) if rows else 1
    names = [f"c{i}" for i in range(width)]
    enc = native.row_encoder([native._bytes_str] * width, [f'"{n}":' for n in names], names, list(range(width)))
    page = enc.page()
    assert not enc.push_rows(page, [(r.record_pk, r.record, r.key_text) for r in rows], 1 << 40)
    count, chars, pk_off, pk, off, rec, lists, key_off, keys, last = enc.buffers(page)
    return PageColumns(count, chars, (pk_off, pk), (off, rec), lists, (key_off, keys), tuple(last))


def parquet_bytes(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


@pytest.mark.parametrize(
    "page",
    [
        SnapshotPage("s1", "public", "t", 3, False, ROWS, 123, 1_764_000_000_123_456, 10, 20, (11, 12)),
        SnapshotPage("s1", "public", "t", 0, True, (), 5, 1_764_000_000_000_000, 1, 2, ()),
        SnapshotPage("s2", "m", "c", 7, True, ROWS[:3], 9, 1_764_000_000_000_001),  # MongoDB: no xids
        SnapshotPage("s3", "public", "t", 1, False, ROWS[:5], 77, 1, 5, 9, (6,), TableSnapshot("s3", 2, 4, 8, (5, 6))),
        SnapshotPage("s3", "public", "t", 2, True, (), 78, 1, 5, 9, None, TableSnapshot("s3", 1, 4, 8, ())),
    ],
)
@pytest.mark.parametrize("form", ["rows", "packed columns", "compiled columns"])
def test_page_table_equals_the_row_built_one(page: SnapshotPage, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bronze must not change by a byte, whichever form the page's rows come in: same schema, values, Parquet."""
    monkeypatch.setattr(writer, "_now", lambda: NOW)
    if form == "compiled columns" and not native.available():
        pytest.skip("native/ not built (make setup)")
    if form != "rows":
        columns = (packed_columns if form == "packed columns" else compiled_columns)(page.rows)
        assert columns == packed_columns(page.rows)
        built = writer._page_to_arrow("src", "postgres", "snapshot-x", replace(page, rows=(), columns=columns))
    else:
        built = writer._page_to_arrow("src", "postgres", "snapshot-x", page)
    expected = dict_rows("src", "postgres", "snapshot-x", page)
    assert built.schema == expected.schema
    assert built.equals(expected)
    assert parquet_bytes(built) == parquet_bytes(expected)
