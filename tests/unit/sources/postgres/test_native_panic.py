"""A panic of the compiled decoder: the row is decoded in Python, and one log line names the table.

PyO3 raises a Rust panic as `pyo3_runtime.PanicException`, a BaseException: no `except Exception`
(the CLI's one-line error included) catches it, so it ended the run with a Python traceback after
the panic's own lines. The compiled decoder has no known panic, so a stand-in with its interface
raises one the way PyO3 does.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest

from ingest.events import ChangeEvent
from ingest.sources.postgres import native
from ingest.sources.postgres.changes import ChangeBuilder
from ingest.sources.postgres.pgoutput import decode
from tests.unit.sources.postgres.recorded import FixtureCatalog

INT8, TEXT = 20, 25
PanicException = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})


class PanickingEncoder:
    """The compiled RowEncoder's interface, with a bug: every call panics."""

    def __init__(self, *_args: Any) -> None:
        pass

    def change(self, _payload: bytes) -> Any:
        raise PanicException("index out of bounds: the len is 2 but the index is 7")

    copy_rows_of = copy_page_of = change


def _payloads() -> list[bytes]:
    relation = b"R" + struct.pack("!I", 7) + b"shop\0orders\0d" + struct.pack("!h", 2)
    relation += b"\x01id\0" + struct.pack("!Ii", INT8, -1) + b"\x00note\0" + struct.pack("!Ii", TEXT, -1)

    def insert(i: int) -> bytes:
        values = [str(i).encode(), b"hello"]
        row = struct.pack("!h", 2) + b"".join(b"t" + struct.pack("!i", len(v)) + v for v in values)
        return b"I" + struct.pack("!I", 7) + b"N" + row

    begin = b"B" + struct.pack("!QqI", 100, 0, 5)
    return [begin, relation, insert(1), insert(2)]


def _events(use_native: bool) -> list[ChangeEvent]:
    catalog = FixtureCatalog()
    catalog.columns[7] = ["id", "note"]
    b = ChangeBuilder(catalog, use_native=use_native)
    out = [b.feed_payload(p) if use_native else b.feed(decode(p)) for p in _payloads()]
    return [e for e in out if isinstance(e, ChangeEvent)]


def test_a_panic_is_decoded_in_python_with_one_line_naming_the_table(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native, "_RowEncoder", PanickingEncoder)
    with caplog.at_level(logging.WARNING):
        fast = _events(use_native=True)
    assert fast == _events(use_native=False) and len(fast) == 2
    (line,) = [r.getMessage() for r in caplog.records if "compiled" in r.getMessage()]  # once, not per row
    assert "shop.orders" in line and "index out of bounds" in line and "\n" not in line
    assert not any(r.exc_info for r in caplog.records), "no traceback"


def test_a_panic_in_a_copy_buffer_is_a_refusal_naming_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_RowEncoder", PanickingEncoder)
    enc = native.row_encoder([native._bytes_int], ['"id":'], ["id"], [0], table="shop.orders")
    with pytest.raises(ValueError, match=r"compiled decoder panicked on shop\.orders"):
        enc.copy_page_of(b"1\n")


def test_the_guard_passes_results_and_refusals_through() -> None:
    enc = native.row_encoder([native._bytes_int, native._bytes_str], ['"id":', '"note":'], ["id", "note"], [0])
    assert enc.copy_rows_of(b"1\thi\n") == [('{"id":1}', '{"id":1,"note":"hi"}')]
    with pytest.raises(ValueError):
        enc.copy_rows_of(b"1\n")  # a row one column short: handed back to Python


class InterruptedEncoder(PanickingEncoder):
    """The compiled RowEncoder's interface, interrupted (Ctrl-C) while it decodes a row."""

    def change(self, _payload: bytes) -> Any:
        raise KeyboardInterrupt


def test_the_stream_decoder_lets_anything_but_a_panic_through(monkeypatch: pytest.MonkeyPatch) -> None:
    # ChangeBuilder.feed_payload guards the unguarded per-row call itself: only a panic is a refusal.
    monkeypatch.setattr(native, "_RowEncoder", InterruptedEncoder)
    with pytest.raises(KeyboardInterrupt):
        _events(use_native=True)
