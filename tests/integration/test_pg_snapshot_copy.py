"""Snapshot pages read by COPY and the compiled encoder land in bronze as the cursor-read Python pages do.

The same table is snapshotted with the compiled code receiving the COPY from libpq (COPY pages as
Arrow buffers, no Python per line), with Python receiving it and the compiled encoder taking its
buffers (where libpq's functions are not found), without the compiled encoder (the Python path
every page took before), with the compiled encoder refusing every other buffer, and with the
compiled receiver refusing the lines of one column's values (pages mixing its rows with rows
Python encoded): bronze's page rows must be equal byte for byte, keys with COPY's escaped
characters included, and COPY pages must keep the page byte budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest

from ingest.events import PageColumns
from ingest.sources.postgres import native, pages
from ingest.sources.postgres.native_guard import GuardedEncoder
from ingest.sources.postgres.pages import PageReader
from tests.helpers.delta_rows import read
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration

TABLE = """create table t (
    k1 text, k2 int, f float8, b boolean, n numeric, ts timestamptz, v varchar(20), big bigint, tag text,
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
           g::bigint * 1000000007,
           case when g % 4 = 0 then 'x' || g end
    from generate_series(1, 95) g"""
KIND_BOOL = 2  # native/src/lib.rs: a text column read as boolean refuses every value but NULL, t and f
COLUMNS = ["page_number", "row_index", "last_page", "record_pk", "record", "key_text"]


def page_rows(warehouse: Path, source: str) -> list[tuple[Any, ...]]:
    got = read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}'", "page_number, row_index")
    return [tuple(getattr(r, c) for c in COLUMNS) for r in got]


Mode = Literal["python", "native", "lines", "refuse_buffers", "refuse_lines"]


def snapshot(warehouse: Path, src: Any, monkeypatch: pytest.MonkeyPatch, mode: Mode) -> int:
    """Snapshot `src` into `warehouse`; how many pages were read by COPY (each one as columns).

    `python`: no compiled encoder. `native`: the compiled code receives each COPY from libpq.
    `lines`: libpq's functions not found, Python receives the lines. `refuse_buffers`: as `lines`
    with COPY buffers of 3 lines, every other one refused by the compiled encoder. `refuse_lines`:
    the compiled receiver reads column `tag` as a boolean, so it refuses each row with a tag
    value (a fourth of them) and Python encodes that line and up to 2 after it.
    """
    copies = []
    real, real_into, real_read = PageReader._copy, GuardedEncoder.copy_into, native.read_copy
    into_calls: list[int] = []
    reads: list[bytes | None] = []

    def counted(self: PageReader, *args: Any) -> Any:
        out = real(self, *args)
        assert isinstance(out[0], PageColumns)
        copies.append(out[0].count)
        return out

    def refusing(self: GuardedEncoder, page: Any, buf: bytes, max_chars: int) -> bool:
        into_calls.append(1)
        if mode == "refuse_buffers" and len(into_calls) % 2:
            raise ValueError("refused by the test")
        return real_into(self, page, buf, max_chars)

    def read_copy(*args: Any) -> Any:
        out = real_read(*args)
        reads.append(out[2])
        return out

    real_encoder = native._RowEncoder

    def tag_as_bool(codes: list[int], keys: list[str], names: list[str], pk: list[int]) -> Any:
        return real_encoder(
            [KIND_BOOL if n == "tag" else c for c, n in zip(codes, names, strict=True)], keys, names, pk
        )

    with monkeypatch.context() as m:
        m.setattr(PageReader, "_copy", counted)
        m.setattr(GuardedEncoder, "copy_into", refusing)
        m.setattr(native, "read_copy", read_copy)
        if mode == "python":
            m.setattr(native, "_RowEncoder", None)
        if mode in ("lines", "refuse_buffers"):
            m.setattr(native, "copy_functions", lambda: None)
        if mode in ("refuse_buffers", "refuse_lines"):
            m.setattr(pages, "COPY_CHUNK_ROWS", 3)
        if mode == "refuse_lines":
            m.setattr(native, "_RowEncoder", tag_as_bool)
        capture_once(warehouse, src, snapshots=True, page_rows=10)
    if mode in ("native", "refuse_lines"):
        assert not into_calls and len(reads) >= len(copies)
        refused = [r for r in reads if r is not None]
        assert (mode == "refuse_lines") == bool(refused)
        # Each refusal hands back the refused line and at most 2 after it, the first one with a tag.
        assert all(0 < r.count(b"\n") <= 3 and b"\tx" in r.split(b"\n")[0] for r in refused)
    if mode in ("lines", "refuse_buffers"):
        assert not reads and len(into_calls) >= len(copies) + (mode == "refuse_buffers") * len(copies)
    return len(copies)


def test_copy_pages_are_byte_identical_to_python_pages(
    tmp_path: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_source(TABLE, ["t"])
    s.execute(ROWS)
    prepare(s.config())
    assert snapshot(tmp_path / "python", s.config(), monkeypatch, "python") == 0
    slow = page_rows(tmp_path / "python", s.name)
    assert len(slow) == 95
    # Every page after the first (which measures the table's record width) is read by COPY.
    for mode in ("native", "lines", "refuse_buffers", "refuse_lines"):
        assert snapshot(tmp_path / mode, s.config(), monkeypatch, mode) == 9, mode
        assert page_rows(tmp_path / mode, s.name) == slow, mode
    fast = page_rows(tmp_path / "native", s.name)
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
