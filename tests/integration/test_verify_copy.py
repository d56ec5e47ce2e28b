"""`verify` reads the source with COPY and the compiled encoder: the same rows as the cursor path.

On a real server, a table whose values need every COPY text escape (tabs, newlines, backslashes,
control characters, bytea's hex output) and every value kind the compiled encoder takes, read
three ways inside one REPEATABLE READ snapshot: COPY + compiled encoder, COPY + the Python
fallback (what a batch the compiled encoder refuses takes), and the cursor + Python path.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from ingest.sources.postgres import native
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.catalog import captured_shape, table_shape
from ingest.sources.postgres.copy_text import copy_unescape
from ingest.sources.postgres.values import TYPE_CATALOG_SQL, TypeCatalog
from ingest.sources.postgres.verify import FETCH_ROWS, VerifySnapshot

pytestmark = pytest.mark.integration

TABLE_SQL = (
    "create table odd (id int primary key, b bigint, n numeric, f float8, r real, ok boolean, t text, "
    "v varchar(40), bin bytea, ts timestamptz, d date, u uuid, j jsonb, e text)"
)
NASTY = ["", "\t", "\n", "\\", "\\N", "a\tb\nc\\d", "\r\x0b\x0c\x08", "\x01\x1f", "é€😀", '"quoted"', "N", "\\x41"]


class Refusing:
    """A compiled encoder that refuses every buffer: the Python fallback decodes each batch."""

    def copy_rows_of(self, buf: bytes) -> Any:
        raise ValueError("refused")


def rows_of(src: Any, mode: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    real = native.row_encoder
    with monkeypatch.context() as m:
        if mode == "cursor":
            m.setattr(native, "row_encoder", lambda *a: None)
        elif mode == "fallback":
            m.setattr(native, "row_encoder", lambda *a: Refusing() if real(*a) is not None else None)
        else:  # the compiled encoder must take this table, or the comparison compares the cursor with itself
            m.setattr(native, "row_encoder", lambda *a: real(*a) or pytest.fail("no compiled encoder"))
        admin = PostgresAdmin(src)
        snap = VerifySnapshot(src)
        try:
            types = TypeCatalog.from_rows(admin.type_catalog_rows(TYPE_CATALOG_SQL))
            snap.begin()
            qualified = next(iter(src.tables))
            shape = captured_shape(table_shape(admin, qualified), None, src.name)
            encoders = [types.column_encoder(oid) for oid in shape.type_oids]
            scan = snap.rows(qualified, shape.columns, shape.key_positions, shape.scan, encoders)
            return [row for batch in scan() for row in batch]
        finally:
            snap.close()
            admin.close()


@pytest.mark.skipif(not native.available(), reason="the compiled decoder is not built (make setup builds it)")
def test_copy_rows_are_the_cursor_rows(make_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_source(TABLE_SQL, ["odd"])
    rnd = random.Random(7)
    rows = []
    for i in range(FETCH_ROWS + 37):  # more than one batch
        text = "".join(rnd.choice(NASTY) for _ in range(rnd.randint(0, 4)))
        rows.append(
            (
                i,
                rnd.choice([None, rnd.randint(-(2**63), 2**63 - 1)]),
                rnd.choice([None, "1.50", "-0.000001", "NaN", "123456789012345678901234567890.5"]),
                rnd.choice([None, 1.5, -2.25e-300, float("nan"), float("inf"), float("-inf")]),
                rnd.choice([None, 3.25, float("nan")]),
                rnd.choice([None, True, False]),
                rnd.choice([None, text]),
                text[:40],
                rnd.choice([None, text.encode(), bytes(range(256))]),
                rnd.choice([None, "2026-11-23 10:00:00.123456+00", "infinity"]),
                rnd.choice([None, "2026-11-23", "-infinity"]),
                rnd.choice([None, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
                rnd.choice([None, '{"a": "\\t\\n", "b": [1, 2.5]}']),
                rnd.choice(NASTY),
            )
        )
    with s.conn.cursor() as cur:
        cur.executemany(f"insert into {s.schema}.odd values ({', '.join(['%s'] * 14)})", rows)
    src = s.config()
    compiled = rows_of(src, "copy", monkeypatch)
    assert len(compiled) == len(rows)
    assert compiled == rows_of(src, "cursor", monkeypatch)
    assert compiled == rows_of(src, "fallback", monkeypatch)


def test_copy_unescape_follows_copy_text_rules() -> None:
    assert copy_unescape(b"a\\tb\\nc\\\\d") == b"a\tb\nc\\d"
    assert copy_unescape(b"\\101\\7\\x41\\x4g\\q") == b"A\x07A\x04gq"
    assert copy_unescape(b"plain") == b"plain"
