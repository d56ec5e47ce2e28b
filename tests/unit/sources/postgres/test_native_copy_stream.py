"""A COPY received by the compiled code (PageBuilder.read_copy) builds the page Python builds from the same lines.

A stand-in libpq (ctypes callbacks with PQgetCopyData's and PQfreemem's signatures) hands out
recorded COPY lines one message at a time, as the server's COPY OUT does, then the end (-1) or a
failure (-2). The page must hold the rows Python encodes, cut where a cursor-read page is cut,
every later line read and dropped, every buffer freed once; lines the compiled encoder refuses
come back raw, from the first refused one, at most a chunk at a time, for Python to encode.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.sources.postgres import copy_text, native
from ingest.sources.postgres.pages import PageReader
from ingest.sources.postgres.rows import json_keys
from ingest.sources.postgres.values import Encoder, _bytes_int, _bytes_str
from tests.unit.sources.postgres.test_copy_columns import page_of, python_page
from tests.unit.sources.postgres.test_copy_page import table

pytestmark = pytest.mark.skipif(not native.available(), reason="native/ not built (make setup)")

GET_COPY_DATA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)
FREEMEM = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
KIND_INT, KIND_BOOL = 0, 2  # native/src/lib.rs
CONN = 0x1000  # the stand-in's connection: any address but 0, never read


class FakeLibpq:
    """PQgetCopyData and PQfreemem over recorded messages: each a line, then `end` (-1 or -2) forever."""

    def __init__(self, messages: list[bytes], end: int = native.COPY_END) -> None:
        self.messages, self.end, self.read = list(messages), end, 0
        self.live: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.freed = 0
        self._get, self._free = GET_COPY_DATA(self.get_copy_data), FREEMEM(self.freemem)  # kept alive here
        address = ctypes.cast(self._get, ctypes.c_void_p).value
        free = ctypes.cast(self._free, ctypes.c_void_p).value
        assert address and free
        self.functions = native.CopyFunctions(address, free)

    def get_copy_data(self, conn: int, buf: Any, is_async: int) -> int:
        assert conn == CONN and is_async == 0
        if self.read == len(self.messages):
            return self.end
        message = self.messages[self.read]
        self.read += 1
        data = ctypes.create_string_buffer(message, len(message))
        self.live[ctypes.addressof(data)] = data
        buf[0] = ctypes.addressof(data)
        return len(message)

    def freemem(self, ptr: int) -> None:
        del self.live[ptr]  # a KeyError here: freed twice, or not libpq's
        self.freed += 1


def lines_of(buf: bytes) -> list[bytes]:
    return buf.splitlines(keepends=True)


@settings(max_examples=200, deadline=None)
@given(table(), st.integers(1, 400))
def test_a_received_copy_is_the_python_page(case: tuple[list[Encoder], list[int], bytes], budget: int) -> None:
    encoders, keys, buf = case
    names = [f"c{i}" for i in range(len(encoders))]
    enc = native.row_encoder(encoders, json_keys(names), names, keys)
    expected, expected_cut = python_page(
        copy_text.page_rows("s.t", json_keys(names), encoders, names, keys, buf), budget
    )
    lib = FakeLibpq(lines_of(buf))
    page = enc.page()
    conn = SimpleNamespace(pgconn_ptr=CONN)
    status, cut, refused = native.read_copy(page, conn, lib.functions, budget, False, (5, 1 << 20), "s.t")
    assert (status, cut, refused) == (native.COPY_END, expected_cut, None)
    rows, chars, last = page_of(enc, page)
    assert rows == expected and chars == sum(len(r[1]) for r in rows) and last == rows[-1][2]
    # After a cut the stream was read to its end all the same; every buffer libpq gave was freed once.
    assert lib.read == len(lib.messages) and lib.freed == lib.read and not lib.live


def tagged(rows: int, tag_every: int) -> list[bytes]:
    """COPY lines of (id, tag): the tag NULL but on every `tag_every`-th row."""
    return [f"{i}\t{'x' + str(i) if i % tag_every == 0 else chr(92) + 'N'}\n".encode() for i in range(1, rows + 1)]


def reader_for(lib: FakeLibpq) -> PageReader:
    """A PageReader whose connection is the stand-in's (the COPY methods use only these)."""
    reader = object.__new__(PageReader)
    reader.src = SimpleNamespace(name="src")  # type: ignore[assignment]
    conn = SimpleNamespace(pgconn_ptr=CONN, get_error_message=lambda: "server closed the connection unexpectedly")
    reader.conn = conn  # type: ignore[assignment]
    return reader


SHAPE = SimpleNamespace(schema="s", name="t", columns=["id", "tag"], key_positions=[0])
ENCODERS: list[Encoder] = [_bytes_int, _bytes_str]


def tag_as_bool() -> Any:
    """A compiled encoder of (id, tag) reading `tag` as a boolean: a NULL tag as Python encodes it, a tag refused."""
    names = SHAPE.columns
    enc = native.row_encoder(ENCODERS, json_keys(names), names, SHAPE.key_positions, table="s.t")
    enc._enc = native._RowEncoder([KIND_INT, KIND_BOOL], json_keys(names), names, SHAPE.key_positions)
    return enc


@pytest.mark.parametrize("budget", [1 << 30, 400])
def test_refused_lines_are_encoded_in_python_in_their_place(budget: int) -> None:
    """Rows the compiled receiver refuses come back a chunk at a time and keep their place and the budget."""
    lines = tagged(40, 7)
    enc, lib = tag_as_bool(), FakeLibpq(lines)
    reads: list[bytes | None] = []
    real = native.read_copy

    def read_copy(*args: Any) -> Any:
        out = real(*args)
        reads.append(out[2])
        return out

    page = enc.page()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(native, "read_copy", read_copy)
        m.setattr("ingest.sources.postgres.pages.COPY_CHUNK_ROWS", 3)
        cut = reader_for(lib)._copy_native(SHAPE, ENCODERS, enc, page, lib.functions, budget)
    slow = copy_text.page_rows("s.t", json_keys(SHAPE.columns), ENCODERS, SHAPE.columns, [0], b"".join(lines))
    expected, expected_cut = python_page(slow, budget)
    rows, _, _ = page_of(enc, page)
    assert rows == expected and cut == expected_cut and len(rows) > 7
    refused = [r for r in reads if r is not None]
    # Rows 7, 14, ... are refused, each with the 2 lines after it; none after the cut.
    assert refused[0] == b"".join(lines[6:9]) and all(
        r.startswith(b"%d\tx" % (7 * (i + 1))) for i, r in enumerate(refused)
    )
    # Every tagged row read before the cut was refused, the row that cut the page included.
    assert len(refused) == (len(rows) + cut) // 7
    assert lib.read == len(lines) and lib.freed == lib.read and not lib.live


def test_a_refused_chunk_ends_at_its_byte_limit() -> None:
    lines = tagged(10, 2)
    enc, lib = tag_as_bool(), FakeLibpq(lines)
    page = enc.page()
    conn = SimpleNamespace(pgconn_ptr=CONN)
    status, cut, refused = native.read_copy(page, conn, lib.functions, 1 << 30, False, (100, 1), "s.t")
    assert (status, cut, refused, len(page)) == (native.COPY_MORE, False, lines[1], 1)
    status, cut, refused = native.read_copy(page, conn, lib.functions, 1 << 30, False, (2, 1 << 20), "s.t")
    assert (status, refused, len(page)) == (native.COPY_MORE, lines[3] + lines[4], 2)  # line 3 (id 3) encoded
    status, cut, refused = native.read_copy(page, conn, lib.functions, 1 << 30, False, (100, 1 << 20), "s.t")
    assert (status, refused) == (native.COPY_END, b"".join(lines[5:]))  # the end, with what it refused before it


def test_a_failed_read_raises_psycopgs_error() -> None:
    """libpq's -2 (the connection lost mid-COPY) raises what psycopg's get_copy_data raised for it."""
    enc = native.row_encoder(ENCODERS, json_keys(SHAPE.columns), SHAPE.columns, [0], table="s.t")
    lib = FakeLibpq(tagged(5, 100), end=native.COPY_FAILED)
    with pytest.raises(psycopg.OperationalError, match="receiving copy data failed: server closed the connection"):
        reader_for(lib)._copy_native(SHAPE, ENCODERS, enc, enc.page(), lib.functions, 1 << 30)
    assert lib.freed == lib.read == 5 and not lib.live


def test_a_closed_connection_or_no_functions_is_refused() -> None:
    enc = native.row_encoder(ENCODERS, json_keys(SHAPE.columns), SHAPE.columns, [0], table="s.t")
    lib = FakeLibpq([])
    with pytest.raises(ValueError, match="closed"):
        native.read_copy(enc.page(), SimpleNamespace(pgconn_ptr=None), lib.functions, 1, False, (1, 1), "s.t")
    with pytest.raises(ValueError, match="libpq's functions"):
        native.read_copy(enc.page(), SimpleNamespace(pgconn_ptr=CONN), native.CopyFunctions(0, 0), 1, False, (1, 1), "")


def test_libpqs_functions_are_psycopgs_or_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any) -> None:
    """The functions come from the libpq psycopg loaded; when it cannot be found, None and one debug line."""
    # The cached lookup is module state: both halves are put back as they were, or a later test in
    # this process would find the None this test caches below.
    monkeypatch.setattr(native, "_functions", None)
    monkeypatch.setattr(native, "_functions_looked_up", False)
    found = native.copy_functions()
    assert found is not None and found.get_copy_data and found.freemem
    if psycopg.pq.__impl__ == "python":
        return  # the ctypes implementation hands its library over: nothing to look for
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
    monkeypatch.setattr(native, "PROC_MAPS", maps)
    monkeypatch.setattr(native, "_functions_looked_up", False)
    with caplog.at_level(logging.DEBUG, logger=native.__name__):
        assert native.copy_functions() is None and native.copy_functions() is None
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] and "0 libpq libraries" in caplog.text
