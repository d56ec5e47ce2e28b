"""A pattern-selected table that left scope while ingest was stopped (between two `run --once`), on a real server.

Dropped, renamed out of the pattern or moved to another schema: its records are tombstoned by the
next start, as a named table's are. Left out by a config edit (the table still there, same
relation under the same name): it only leaves the publication, its records stay.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.config import PostgresSource
from tests.helpers.bronze_fold import live_records
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


def published(s: Any, src: PostgresSource) -> set[str]:
    rows = s.conn.execute(
        "select schemaname || '.' || tablename from pg_publication_tables where pubname = %s", (src.publication_name,)
    ).fetchall()
    return {str(r[0]) for r in rows}


def live(warehouse: Path, source: str) -> dict[str, set[str]]:
    """`schema.table` -> its live record keys, for the tables with any."""
    return {t: set(records) for t, records in live_records(warehouse, source).items() if records}


def tombstoned(warehouse: Path, s: Any, src: PostgresSource) -> list[str]:
    """The tables bronze holds a tableGone truncate of, one entry per truncate, in position order."""
    prefix = f"changelake.tableGone:{src.slot_name}"
    return [e.truncated_tables[0] for e in bronze_events(warehouse, s.name) if e.message_prefix == prefix]


@pytest.fixture
def elsewhere(pg_dsn: str) -> Iterator[str]:
    """A second schema to move a table into (outside the pattern); dropped at teardown."""
    name = f"elsewhere_{secrets.token_hex(4)}"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"create schema {name}")
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"drop schema if exists {name} cascade")


def test_tables_that_left_a_pattern_while_stopped_are_tombstoned_and_a_config_exclusion_is_not(
    warehouse: Path, make_source: Any, elsewhere: str
) -> None:
    """Bug pinned: a table a pattern captured that was dropped, renamed out or moved out between two
    `run --once` runs kept its records live in bronze's fold (and so silver and gold) forever: the
    start only resolved the selection anew, and only a running `run` tombstoned such a table.
    """
    s = make_source(
        "create table dropped (id int primary key, v text); create table moved (id int primary key, v text); "
        "create table renamed (id int primary key, v text); create table excluded (id int primary key, v text); "
        "create table kept (id int primary key, v text); create table relabelled (id int primary key, v text)",
        [],
    )
    first = PostgresSource(
        kind="postgres", name=s.name, dsn=s.dsn, tables=[f"{s.schema}.*"], exclude=[f"{s.schema}.old_*"]
    )
    prepare(first)
    names = ["dropped", "moved", "renamed", "relabelled", "excluded", "kept"]
    for t in names:
        s.execute(f"insert into {t} values (1, 'a'), (2, 'b')")
    capture_once(warehouse, first, snapshots=True)
    before = live(warehouse, s.name)
    assert before == {f"{s.schema}.{t}": {'{"id":1}', '{"id":2}'} for t in names}

    # Ingest is stopped: a migration drops one, moves one away, renames one out of the pattern,
    # and the config is edited to exclude a fourth that stays as it was.
    s.execute("insert into moved values (3, 'c'); insert into renamed values (3, 'c')")
    s.execute("drop table dropped")
    s.execute(f"alter table moved set schema {elsewhere}")
    s.execute("alter table renamed rename to old_renamed")
    s.execute("alter table relabelled rename to relabelled_new")  # still selected, under another name
    s.execute("insert into kept values (3, 'c')")
    second = PostgresSource(
        kind="postgres",
        name=s.name,
        dsn=s.dsn,
        tables=[f"{s.schema}.*"],
        exclude=[f"{s.schema}.old_*", f"{s.schema}.excluded"],
    )
    capture_once(warehouse, second, snapshots=True)

    # The old name's records end; the new name is a new table, snapshotted.
    assert live(warehouse, s.name) == {
        f"{s.schema}.excluded": {'{"id":1}', '{"id":2}'},
        f"{s.schema}.kept": {'{"id":1}', '{"id":2}', '{"id":3}'},
        f"{s.schema}.relabelled_new": {'{"id":1}', '{"id":2}'},
    }
    gone = [f"{s.schema}.dropped", f"{s.schema}.moved", f"{s.schema}.relabelled", f"{s.schema}.renamed"]
    assert sorted(tombstoned(warehouse, s, second)) == gone
    assert published(s, second) == {f"{s.schema}.kept", f"{s.schema}.relabelled_new"}

    # The next start finds them tombstoned already: no second truncate each.
    s.execute("insert into kept values (4, 'd')")
    capture_once(warehouse, second, snapshots=True)
    assert sorted(tombstoned(warehouse, s, second)) == gone
    assert set(live(warehouse, s.name)) == {f"{s.schema}.excluded", f"{s.schema}.kept", f"{s.schema}.relabelled_new"}


def test_a_table_that_came_back_and_left_again_is_tombstoned_again(warehouse: Path, make_source: Any) -> None:
    """A tombstone in bronze stops a start from writing another only while it is bronze's last word on the table.

    Renamed out (tombstoned), renamed back (re-snapshotted, live again), then dropped: the second
    leave is tombstoned too.
    """
    s = make_source("create table t (id int primary key, v text); create table kept (id int primary key)", [])
    src = PostgresSource(kind="postgres", name=s.name, dsn=s.dsn, tables=[f"{s.schema}.*"], exclude=[f"{s.schema}.x_*"])
    prepare(src)
    s.execute("insert into t values (1, 'a'), (2, 'b')")
    capture_once(warehouse, src, snapshots=True)
    s.execute("alter table t rename to x_t")
    capture_once(warehouse, src, snapshots=True)
    assert set(live(warehouse, s.name)) == set()
    s.execute("alter table x_t rename to t")
    s.execute("insert into t values (3, 'c')")
    capture_once(warehouse, src, snapshots=True)
    assert live(warehouse, s.name) == {f"{s.schema}.t": {'{"id":1}', '{"id":2}', '{"id":3}'}}
    s.execute("drop table t")
    capture_once(warehouse, src, snapshots=True)
    assert set(live(warehouse, s.name)) == set()
    assert tombstoned(warehouse, s, src) == [f"{s.schema}.t", f"{s.schema}.t"]
