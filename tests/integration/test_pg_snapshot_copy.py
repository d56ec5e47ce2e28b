"""Snapshot pages read by COPY and the compiled encoder land in bronze as the cursor-read Python pages do.

The same table is snapshotted with the compiled encoder (COPY pages as Arrow buffers, no row
objects), without it (the Python path every page took before), and with the compiled encoder
refusing every other buffer (pages mixing its buffers with rows Python encoded): bronze's page
rows must be equal byte for byte, keys with COPY's escaped characters included, and COPY pages
must keep the page byte budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ingest.events import PageColumns
from ingest.sources.postgres import native, pages
from ingest.sources.postgres.native_guard import GuardedEncoder
from ingest.sources.postgres.pages import PageReader
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration

TABLE = """create table t (
    k1 text, k2 int, f float8, b boolean, n numeric, ts timestamptz, v varchar(20), big bigint,
    primary key (k1, k2)
)"""
# Keys and values COPY writes as escapes (tab, newline, backslash, carriage return), quotes,
# non-ASCII text, NULLs and float specials.
ROWS = """insert into t
    select case g % 6 when 0 then e'a\\tb' when 1 then e'line\\nbreak' when 2 then e'back\\\\slash'
                      when 3 then 'quote"''s' when 4 then 'grüße ☃' else e'cr\\r' end,
           g,
           case g % 5 when 0 then 'NaN'::float8 when 1 then null else g / 7.0 end,
           case when g % 3 = 0 then null else g % 2 = 0 end,
           g * 1.5,
           timestamptz '2024-01-02 03:04:05+00' + g * interval '1 second',
           case when g % 4 = 0 then null else 'v' || g end,
           g::bigint * 1000000007
    from generate_series(1, 95) g"""
COLUMNS = ["page_number", "row_index", "last_page", "record_pk", "record", "key_text"]


def page_rows(warehouse: Path, source: str) -> list[tuple[Any, ...]]:
    got = read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}'", "page_number, row_index")
    return [tuple(getattr(r, c) for c in COLUMNS) for r in got]


def snapshot(
    warehouse: Path, src: Any, monkeypatch: pytest.MonkeyPatch, compiled: bool, refuse_every_other: bool = False
) -> int:
    """Snapshot `src` into `warehouse`; how many pages were read by COPY (each one as columns).

    `refuse_every_other`: COPY buffers of 3 lines, every other one refused by the compiled
    encoder, so a page holds its buffers and Python's rows in turn.
    """
    copies = []
    real, real_into = PageReader._copy, GuardedEncoder.copy_into
    into_calls = []

    def counted(self: PageReader, *args: Any) -> Any:
        out = real(self, *args)
        assert isinstance(out[0], PageColumns)
        copies.append(out[0].count)
        return out

    def refusing(self: GuardedEncoder, page: Any, buf: bytes, max_chars: int) -> bool:
        into_calls.append(1)
        if len(into_calls) % 2:
            raise ValueError("refused by the test")
        return real_into(self, page, buf, max_chars)

    with monkeypatch.context() as m:
        m.setattr(PageReader, "_copy", counted)
        if not compiled:
            m.setattr(native, "_RowEncoder", None)
        if refuse_every_other:
            m.setattr(pages, "COPY_CHUNK_ROWS", 3)
            m.setattr(GuardedEncoder, "copy_into", refusing)
        capture_once(warehouse, src, snapshots=True, page_rows=10)
    assert not refuse_every_other or len(into_calls) > len(copies)
    return len(copies)


def test_copy_pages_are_byte_identical_to_python_pages(
    tmp_path: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_source(TABLE, ["t"])
    s.execute(ROWS)
    prepare(s.config())
    assert snapshot(tmp_path / "python", s.config(), monkeypatch, compiled=False) == 0
    # Every page after the first (which measures the table's record width) is read by COPY.
    assert snapshot(tmp_path / "compiled", s.config(), monkeypatch, compiled=True) == 9
    assert snapshot(tmp_path / "mixed", s.config(), monkeypatch, compiled=True, refuse_every_other=True) == 9
    slow, fast = page_rows(tmp_path / "python", s.name), page_rows(tmp_path / "compiled", s.name)
    assert len(fast) == 95 and fast == slow
    assert page_rows(tmp_path / "mixed", s.name) == slow
    keys = {tuple(r[5]) for r in fast}
    assert ("a\tb", "6") in keys and ("back\\slash", "2") in keys and ("line\nbreak", "1") in keys
    rec = next(json.loads(r[4]) for r in fast if r[5] == ["grüße ☃", "4"])
    assert rec["k1"] == "grüße ☃" and rec["n"] == "6.0" and rec["big"] == 4000000028 and rec["v"] is None


def test_copy_pages_keep_the_page_byte_budget(warehouse: Path, make_source: Any) -> None:
    s = make_source("create table w (id int primary key, pad text)", ["w"])
    # Widths vary row to row, so a page sized from the last page's mean width is cut by its budget.
    s.execute("insert into w select g, repeat('x', 20 + (g * 37) % 200) from generate_series(1, 300) g")
    prepare(s.config())
    budget = 3000
    capture_once(warehouse, s.config(snapshot={"page_bytes": budget}), snapshots=True, page_rows=1000)
    got = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'", "page_number, row_index")
    assert [json.loads(r.record_pk)["id"] for r in got] == list(range(1, 301))
    by_page: dict[int, int] = {}
    for r in got:
        by_page[r.page_number] = by_page.get(r.page_number, 0) + len(r.record)
    assert len(by_page) > 10 and all(size <= budget for size in by_page.values())
    assert [r.last_page for r in got].count(True) == len([r for r in got if r.page_number == max(by_page)])
