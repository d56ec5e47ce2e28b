"""Database encodings and value-text settings (review C6), on databases of the real server."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from ingest.config import SnapshotSettings
from ingest.sources.postgres.values import ValueMappingError
from tests.helpers.delta_rows import read
from tests.helpers.pg import PgSource, bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


class DbSource(PgSource):
    """A source in its own database. The test's connections speak UTF-8; ingest gets the plain DSN,
    so the database's own settings (client_encoding included) are what it meets unless it pins them."""

    def __init__(self, dsn: str, ingest_dsn: str, tables_sql: str, tables: list[str]) -> None:
        super().__init__(dsn, tables_sql, tables)
        self.ingest_dsn = ingest_dsn

    def config(self, **extra: Any) -> Any:
        return super().config(**extra).model_copy(update={"dsn": self.ingest_dsn})


@pytest.fixture
def database(pg_dsn: str) -> Iterator[Any]:
    """Factory of throwaway databases in an encoding; sources made in them are dropped first."""
    made: list[tuple[str, list[DbSource]]] = []

    def make(encoding: str, tables_sql: str, tables: list[str], *settings: str) -> DbSource:
        name = f"cl_{encoding.lower()}_{secrets.token_hex(3)}"
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute(f"create database {name} encoding '{encoding}' template template0 lc_collate 'C' lc_ctype 'C'")
            for setting in settings:
                c.execute(f"alter database {name} set {setting}")
        s = DbSource(
            make_conninfo(pg_dsn, dbname=name, client_encoding="UTF8"),
            make_conninfo(pg_dsn, dbname=name),
            tables_sql,
            tables,
        )
        made.append((name, [s]))
        return s

    yield make
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for name, sources in made:
            for s in sources:
                s.drop()
            c.execute(f"drop database if exists {name} with (force)")


def test_a_latin1_database_arrives_as_utf8_and_value_settings_are_pinned(warehouse: Path, database: Any) -> None:
    """C6: client_encoding was not pinned (a LATIN1 database sent LATIN1 bytes, decoded as UTF-8: a
    crash at that event forever), nor bytea_output (a database set to `escape` changed `record`)."""
    s = database(
        "LATIN1",
        "create table items (id int primary key, name text, data bytea)",
        ["items"],
        "bytea_output = 'escape'",
        "client_encoding = 'LATIN1'",
    )
    s.execute("insert into items values (1, 'café', '\\x00ff'::bytea)")
    src = s.config()
    prepare(src)
    s.execute("insert into items values (2, 'naïve', '\\x41'::bytea)")
    capture_once(warehouse, src, snapshots=True)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    (event,) = bronze_events(warehouse, s.name)
    rows = [{"id": 1, "name": "café", "data": "\\x00ff"}, {"id": 2, "name": "naïve", "data": "\\x41"}]
    assert [json.loads(p.record) for p in pages] == rows
    assert json.loads(event.record) == rows[1]


SQL_ASCII_ITEMS = "create table items (id int primary key, name text, tags text[])"


def _non_utf8_rows(s: DbSource) -> None:
    # Bytes a SQL_ASCII database takes as they are: Latin-1 'é' (0xe9), and a valid UTF-8 'é'.
    s.execute("insert into items values (1, convert_from('\\x636166e9'::bytea, 'SQL_ASCII'), '{a}')")
    s.execute("insert into items values (2, 'café', array[convert_from('\\x78e9'::bytea, 'SQL_ASCII')])")


def test_a_non_utf8_value_is_an_error_naming_table_and_column(warehouse: Path, database: Any) -> None:
    """C6: a UnicodeDecodeError at the same event on every start, with no word of what to do."""
    s = database("SQL_ASCII", SQL_ASCII_ITEMS, ["items"])
    src = s.config(snapshot=SnapshotSettings(initial=False))
    prepare(src)
    _non_utf8_rows(s)
    with pytest.raises(
        ValueMappingError, match=rf'table {s.schema}\.items, column "name": the value is not UTF-8.*non_utf8'
    ):
        capture_once(warehouse, src)


@pytest.mark.parametrize(("policy", "name", "tag"), [("latin1", "café", "xé"), ("replace", "caf\ufffd", "x\ufffd")])
def test_non_utf8_values_are_taken_as_the_policy_says(
    warehouse: Path, database: Any, policy: str, name: str, tag: str
) -> None:
    """C6: `non_utf8: latin1 | replace`, alike in the stream and in snapshot pages; UTF-8 values untouched."""
    s = database("SQL_ASCII", SQL_ASCII_ITEMS, ["items"])
    _non_utf8_rows(s)
    src = s.config(non_utf8=policy)
    prepare(src)
    s.execute("update items set id = id + 10")
    capture_once(warehouse, src, snapshots=True)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    events = [e for e in bronze_events(warehouse, s.name) if e.action == "update"]
    expected = [{"name": name, "tags": ["a"]}, {"name": "café", "tags": [tag]}]
    assert [{k: v for k, v in json.loads(p.record).items() if k != "id"} for p in pages] == expected
    assert [{k: v for k, v in json.loads(e.record).items() if k != "id"} for e in events] == expected
