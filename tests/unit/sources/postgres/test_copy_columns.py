"""A COPY page built as Arrow buffers by the compiled encoder holds the rows Python encodes, cut where Python cuts.

Random rows of random scalar tables in the server's COPY text format go through
`RowEncoder.copy_into` a buffer at a time, under a random page budget, and through
`copy_text.page_rows` with the cursor page's rule (stop before the row that would pass the
budget; a page's first row is kept whatever its width). A refused or panicked buffer leaves the
page with the rows it had, so the Python rows appended after it follow them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.events import SnapshotRow
from ingest.sources.postgres import copy_text, native
from ingest.sources.postgres.rows import json_keys
from ingest.sources.postgres.values import Encoder, _bytes_bool, _bytes_int, _bytes_str
from tests.unit.sources.postgres.test_copy_page import table
from tests.unit.sources.postgres.test_native_panic import PanickingEncoder

pytestmark = pytest.mark.skipif(not native.available(), reason="native/ not built (make setup)")


def page_of(enc: Any, page: Any) -> tuple[list[tuple[str, str, tuple[str, ...]]], int, tuple[str, ...]]:
    """The page's rows read back from its Arrow buffers as (record_pk, record, key_text), its chars, last key."""
    count, chars, pk_off, pk, off, rec, lists, key_off, keys, last = enc.buffers(page)

    def strings(n: int, offsets: bytes, data: bytes) -> list[str]:
        array = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        array.validate(full=True)
        return list(array.to_pylist())

    key_array = strings(len(key_off) // 4 - 1, key_off, keys)
    key_text = pa.Array.from_buffers(
        pa.list_(pa.string()), count, [None, pa.py_buffer(lists)], children=[pa.array(key_array, pa.string())]
    )
    key_text.validate(full=True)
    rows = zip(strings(count, pk_off, pk), strings(count, off, rec), key_text.to_pylist(), strict=True)
    return [(p, r, tuple(k)) for p, r, k in rows], chars, tuple(last)


def python_page(rows: list[SnapshotRow], budget: int) -> tuple[list[tuple[str, str, tuple[str, ...]]], bool]:
    """The rows a cursor-read page keeps under `budget` characters of record JSON, and whether it was cut."""
    kept: list[tuple[str, str, tuple[str, ...]]] = []
    size = 0
    for r in rows:
        if kept and size + len(r.record) > budget:
            return kept, True
        kept.append((r.record_pk, r.record, r.key_text))
        size += len(r.record)
    return kept, False


@settings(max_examples=300, deadline=None)
@given(table(), st.integers(1, 400), st.integers(1, 3))
def test_random_copy_pages_are_the_python_rows(
    case: tuple[list[Encoder], list[int], bytes], budget: int, chunk_lines: int
) -> None:
    encoders, keys, buf = case
    names = [f"c{i}" for i in range(len(encoders))]
    enc = native.row_encoder(encoders, json_keys(names), names, keys)
    slow = copy_text.page_rows("s.t", json_keys(names), encoders, names, keys, buf)
    expected, expected_cut = python_page(slow, budget)
    lines = buf.splitlines(keepends=True)
    page, cut = enc.page(), False
    for i in range(0, len(lines), chunk_lines):
        cut = enc.copy_into(page, b"".join(lines[i : i + chunk_lines]), budget)
        if cut:
            break
    rows, chars, last = page_of(enc, page)
    assert rows == expected and cut == expected_cut
    assert chars == sum(len(r[1]) for r in rows) and last == rows[-1][2] and len(page) == len(rows)


def test_a_refused_buffer_leaves_the_page_as_it_was() -> None:
    names = ["id", "n", "note"]
    encoders: list[Encoder] = [_bytes_int, _bytes_bool, _bytes_str]
    enc = native.row_encoder(encoders, json_keys(names), names, [0, 2])
    page = enc.page()
    assert not enc.copy_into(page, b"1\tt\ta\\tb\n", 1 << 30)
    with pytest.raises(ValueError):
        enc.copy_into(page, b"2\tf\tok\n3\tmaybe\tno\n", 1 << 30)  # row 2 was appended before row 3 was refused
    python = copy_text.page_rows("s.t", json_keys(names), encoders, names, [0, 2], b"2\tf\tok\n")
    assert not enc.push_rows(page, [(r.record_pk, r.record, r.key_text) for r in python], 1 << 30)
    rows, chars, last = page_of(enc, page)
    assert [r[2] for r in rows] == [("1", "a\tb"), ("2", "ok")] and last == ("2", "ok")
    assert rows[1][1] == '{"id":2,"n":false,"note":"ok"}' and chars == sum(len(r[1]) for r in rows)


def test_an_empty_page_has_no_rows_and_no_last_key() -> None:
    enc = native.row_encoder([_bytes_int], ['"id":'], ["id"], [0])
    assert page_of(enc, enc.page()) == ([], 0, ())


class PanickingPageEncoder(PanickingEncoder):
    """The compiled RowEncoder's page interface, with a bug: encoding a COPY buffer panics."""

    def page(self) -> list[str]:
        return []

    def copy_into(self, _page: Any, buf: bytes, _max_chars: int) -> bool:
        return bool(self.change(buf))


def test_a_panic_in_a_copy_page_is_a_refusal_naming_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_RowEncoder", PanickingPageEncoder)
    enc = native.row_encoder([native._bytes_int], ['"id":'], ["id"], [0], table="shop.orders")
    with pytest.raises(ValueError, match=r"compiled decoder panicked on shop\.orders"):
        enc.copy_into(enc.page(), b"1\n", 100)
