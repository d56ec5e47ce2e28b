"""Postgres -> bronze: a key column whose value is TOASTed out of line and left alone by an UPDATE.

pgoutput sends such a column of the new row with the unchanged marker ('u', value not sent). When
it is part of the key, `record_pk` takes its value from the old tuple the server sends with it:

- REPLICA IDENTITY FULL without a primary key (every column is the key): the old row (`O`) is sent
  in full, its TOASTed values flattened. Regression: an UPDATE of such a table that left its
  TOASTed column alone crash-looped the stream (the key column was an error).
- A primary key whose value is TOASTed out of line, under REPLICA IDENTITY DEFAULT: the old key
  (`K`) is sent whenever it holds an out-of-line value. This is reachable, within a narrow band,
  checked on PostgreSQL 15: a btree index tuple holds at most 2704 bytes ("index row size ...
  exceeds btree version 4 maximum 2704"; larger values are refused at insert), while the heap
  moves a value out of line once the row passes ~2 kB (TOAST_TUPLE_THRESHOLD) and it does not
  compress. So an incompressible text key of about 2.1-2.7 kB (81 md5 hex strings: 2592 bytes)
  lives in the TOAST table and comes as 'u' on an update of another column.

`record` keeps the bronze contract for these columns as for any unchanged-TOAST one: absent, and
listed in `unchanged_toast`. Each test runs with the compiled row decoder and with the Python one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ingest.config import SnapshotSettings
from ingest.sources.postgres import native
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

# Random hex, in one statement so the value never crosses the client: incompressible enough for
# pglz, so it is stored out of line (each test checks that it is).
BIG_SQL = "(select string_agg(md5(random()::text), '') from generate_series(1, %s))"


@pytest.fixture(params=["compiled", "python"])
def decoder(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Decode row changes with the compiled RowEncoder, or force the Python path."""
    if request.param == "compiled":
        assert native.available(), "make setup builds native/ (pip install ./native)"
    else:
        monkeypatch.setattr(native, "_RowEncoder", None)
        monkeypatch.setattr(native, "_warned", True)
    return str(request.param)


def out_of_line_values(s: Any, table: str) -> int:
    """How many values of `table` are stored in its TOAST table (distinct chunk ids)."""
    toast = s.conn.execute(
        "select reltoastrelid::regclass::text from pg_class where oid = %s::regclass", (f"{s.schema}.{table}",)
    ).fetchone()[0]
    return int(s.conn.execute(f"select count(distinct chunk_id) from {toast}").fetchone()[0])


def source_with_big_row(make_source: Any, table_sql: str, table: str, md5s: int) -> tuple[Any, str]:
    """A prepared source of `table` (big text column first, then an int) holding one row: a random
    text of `md5s` md5 strings, stored out of line, and 0. Returns the source and the text."""
    s = make_source(table_sql, [table])
    prepare(s.config(snapshot=SnapshotSettings(initial=False)))  # a table keyed by FULL has no snapshot
    s.execute(f"insert into {table} select {BIG_SQL % md5s}, 0")
    assert out_of_line_values(s, table) == 1
    return s, str(s.conn.execute(f"select * from {table}").fetchone()[0])


def test_full_identity_without_primary_key_update_leaving_a_toasted_column_alone(
    warehouse: Any, make_source: Any, decoder: str
) -> None:
    """Regression: REPLICA IDENTITY FULL update of a table with a TOASTed column crash-looped the stream."""
    ddl = "create table notes (body text, n int); alter table notes replica identity full"
    s, big = source_with_big_row(make_source, ddl, "notes", 400)
    s.execute("update notes set n = n")  # the key (the whole row) stays the same
    s.execute("update notes set n = 1")  # the key changes with n
    capture_once(warehouse, s.config(snapshot=SnapshotSettings(initial=False)))
    ins, same, changed = bronze_events(warehouse, s.name)
    assert [e.action for e in (ins, same, changed)] == ["insert", "update", "update"]
    assert json.loads(ins.record_pk) == {"body": big, "n": 0}
    # The updates sent body as unchanged TOAST: absent from record, listed, and in the key.
    for ev in (same, changed):
        assert list(ev.unchanged_toast) == ["body"] and "body" not in json.loads(ev.record)
        assert json.loads(ev.old_record)["body"] == big
    assert same.record_pk == ins.record_pk and same.old_record_pk is None
    assert json.loads(changed.record_pk) == {"body": big, "n": 1}
    assert changed.old_record_pk == ins.record_pk


def test_primary_key_toasted_out_of_line_update_of_another_column(
    warehouse: Any, make_source: Any, decoder: str
) -> None:
    """A text primary key of 2592 incompressible bytes: within the btree limit, stored out of line."""
    s, big = source_with_big_row(make_source, "create table keyed (k text primary key, n int)", "keyed", 81)
    assert len(big) == 2592
    s.execute("update keyed set n = 1")
    capture_once(warehouse, s.config())
    ins, upd = bronze_events(warehouse, s.name)
    assert [e.action for e in (ins, upd)] == ["insert", "update"]
    assert json.loads(ins.record_pk) == {"k": big}
    assert upd.record_pk == ins.record_pk and upd.old_record_pk is None
    assert list(upd.unchanged_toast) == ["k"] and json.loads(upd.record) == {"n": 1}
    assert json.loads(upd.old_record) == {"k": big, "n": None}  # the old key tuple: key columns only
