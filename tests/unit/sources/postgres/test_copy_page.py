"""A COPY page's rows are the same bytes whether the compiled encoder or Python (copy_text.py) encodes them.

Random rows of random scalar tables, written as the server's COPY text format (escapes, NULLs),
go through `RowEncoder.copy_page_of` and `copy_text.page_rows`; a buffer the compiled encoder
refuses is one Python raises on, with the error a user sees.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.sources.postgres import copy_text, native
from ingest.sources.postgres.rows import json_keys
from ingest.sources.postgres.values import Encoder, ValueMappingError, _bytes_bool, _bytes_float, _bytes_int, _bytes_str

TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)
KINDS: dict[Encoder, Any] = {
    _bytes_int: st.integers(-(2**63), 2**63 - 1).map(str),
    _bytes_float: st.one_of(st.floats().map(repr), st.sampled_from(["NaN", "Infinity", "-Infinity", "-0"])),
    _bytes_bool: st.sampled_from(["t", "f"]),
    _bytes_str: TEXTS,
}
# COPY text format: these characters are written as backslash escapes (the server also may write
# any byte as octal, which the reader must take too).
ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def copy_field(value: str | None, octal: bool) -> bytes:
    if value is None:
        return b"\\N"
    if octal and value:
        return b"".join(b"\\%o" % b for b in value.encode())
    return "".join(ESCAPES.get(c, c) for c in value).encode()


@st.composite
def table(draw: Any) -> tuple[list[Encoder], list[int], bytes]:
    encoders = draw(st.lists(st.sampled_from(list(KINDS)), min_size=1, max_size=5))
    keys = sorted(draw(st.sets(st.integers(0, len(encoders) - 1), min_size=1, max_size=2)))
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        fields = []
        for i, e in enumerate(encoders):
            value = draw(KINDS[e]) if i in keys or draw(st.integers(0, 4)) else None
            fields.append(copy_field(value, draw(st.integers(0, 9)) == 0))
        lines.append(b"\t".join(fields) + b"\n")
    return encoders, keys, b"".join(lines)


@settings(max_examples=300, deadline=None)
@given(table())
def test_random_copy_rows_are_encoded_identically(case: tuple[list[Encoder], list[int], bytes]) -> None:
    encoders, keys, buf = case
    names = [f"c{i}" for i in range(len(encoders))]
    compiled = native.row_encoder(encoders, json_keys(names), names, keys)
    assert compiled is not None
    slow = copy_text.page_rows("s.t", json_keys(names), encoders, names, keys, buf)
    fast = [(pk, rec, tuple(k)) for pk, rec, k in compiled.copy_page_of(buf)]
    assert fast == [(r.record_pk, r.record, r.key_text) for r in slow]


def test_a_buffer_the_compiled_encoder_refuses_gets_the_python_error() -> None:
    names = ["id", "n"]
    compiled = native.row_encoder([_bytes_int, _bytes_bool], json_keys(names), names, [0])
    buf = b"1\tt\n2\tmaybe\n"
    try:
        compiled.copy_page_of(buf)
    except ValueError:
        pass
    else:
        raise AssertionError("a boolean neither t nor f is refused")
    try:
        copy_text.page_rows("s.t", json_keys(names), [_bytes_int, _bytes_bool], names, [0], buf)
    except ValueMappingError as e:
        assert "maybe" in str(e) and "s.t" in str(e)
    else:
        raise AssertionError("Python names the value that does not map")
