"""COPY ... TO STDOUT text format: a field's escapes resolved, and whole lines read as page rows in Python.

The compiled encoder (native.py) reads the same lines faster; this is the path that takes a buffer
it refuses, and raises the error a user sees (a value that does not map, a key that is not UTF-8).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ingest.events import SnapshotRow
from ingest.sources.postgres.rows import encode_key, encode_record
from ingest.sources.postgres.values import Encoder

COPY_NULL = b"\\N"
_COPY_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)
_COPY_CHARS = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def copy_unescape(field: bytes) -> bytes:
    """A COPY text-format field's value: its backslash escapes resolved (COPY's rules)."""
    if b"\\" not in field:
        return field

    def one(m: re.Match[bytes]) -> bytes:
        octal, hexa, char = m.groups()
        if octal is not None:
            return bytes([int(octal, 8) & 0xFF])
        if hexa is not None:
            return bytes([int(hexa, 16)])
        return _COPY_CHARS.get(char, char)

    return _COPY_ESCAPE.sub(one, field)


def copy_values(lines: bytes) -> list[list[bytes | None]]:
    """The rows of a buffer of whole COPY text lines, each as its fields' values (None for NULL)."""
    return [
        [None if f == COPY_NULL else copy_unescape(f) for f in line.split(b"\t")] for line in lines[:-1].split(b"\n")
    ]


def page_rows(
    table: str,
    keys_json: Sequence[str],
    encoders: Sequence[Encoder],
    columns: Sequence[str],
    key_positions: Sequence[int],
    lines: bytes,
) -> list[SnapshotRow]:
    """A buffer of whole COPY text lines as snapshot page rows, encoded as a cursor-read page encodes them."""
    rows = []
    for values in copy_values(lines):
        record, _ = encode_record(table, keys_json, encoders, columns, values)
        record_pk = encode_key(table, keys_json, encoders, key_positions, values)
        rows.append(SnapshotRow(record_pk, record, tuple((values[i] or b"").decode() for i in key_positions)))
    return rows
