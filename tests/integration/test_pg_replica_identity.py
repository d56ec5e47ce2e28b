"""Replica identities as users set them (review findings W2, W3, C2, C4), on a real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.config import SnapshotSettings
from ingest.errors import SourceError
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


def published_tables(s: Any) -> int:
    """How many tables the source's publication holds."""
    with psycopg.connect(s.dsn) as c:
        row = c.execute(
            "select count(*) from pg_publication_tables where pubname = %s", (s.config().publication_name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_using_index_keys_records_by_that_index_in_the_stream_and_the_snapshot(
    warehouse: Path, make_source: Any
) -> None:
    """W2: under USING INDEX a delete's old key carries the index columns; keyed by the PK it was null."""
    s = make_source("create table items (id int primary key, code text not null unique, v text)", ["items"])
    s.execute("alter table items replica identity using index items_code_key")
    s.execute("insert into items values (1, 'a', 'x'), (2, 'b', 'y')")
    src = s.config()
    prepare(src)
    capture_once(warehouse, src, snapshots=True)
    s.execute("update items set v = 'x2' where code = 'a'")
    s.execute("update items set id = 10 where code = 'b'")  # a primary-key change the identity does not see
    s.execute("delete from items where code = 'a'")
    capture_once(warehouse, src)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert [p.record_pk for p in pages] == ['{"code":"a"}', '{"code":"b"}']
    events = bronze_events(warehouse, s.name)
    assert [(e.action, e.record_pk, e.old_record_pk) for e in events] == [
        ("update", '{"code":"a"}', None),
        ("update", '{"code":"b"}', None),
        ("delete", '{"code":"a"}', None),
    ]
    assert json.loads(events[1].record)["id"] == 10


def test_replica_identity_nothing_is_refused_before_the_publication_is_touched(make_source: Any) -> None:
    """C4: publishing a table with no replica identity breaks the application's own UPDATE and DELETE."""
    s = make_source("create table items (id int primary key, v text)", ["items"])
    s.execute("alter table items replica identity nothing")
    s.execute("insert into items values (1, 'a')")
    with pytest.raises(SourceError, match="REPLICA IDENTITY NOTHING: once published, the application's UPDATE"):
        prepare(s.config())
    s.execute("delete from items where id = 1")  # the source application is unharmed
    assert published_tables(s) == 0


def test_a_deferrable_primary_key_under_identity_default_is_refused_before_the_publication_is_touched(
    make_source: Any,
) -> None:
    """Postgres takes no deferrable index as a replica identity: published, the table breaks the application."""
    s = make_source("create table items (id int primary key deferrable initially deferred, v text)", ["items"])
    s.execute("insert into items values (1, 'a')")
    with pytest.raises(
        SourceError, match=r"DEFERRABLE primary key and REPLICA IDENTITY DEFAULT.*REPLICA IDENTITY FULL"
    ):
        prepare(s.config())
    s.execute("update items set v = 'b' where id = 1")  # the source application is unharmed
    assert published_tables(s) == 0


def test_full_identity_without_a_key_streams_keyed_by_every_column(warehouse: Path, make_source: Any) -> None:
    """W3: accepted for the stream (every column is the key); its snapshot, which needs a key, is refused."""
    s = make_source("create table log (at int, msg text)", ["log"])
    s.execute("alter table log replica identity full")
    src = s.config(snapshot=SnapshotSettings(initial=False))
    prepare(src)
    s.execute("insert into log values (1, 'a')")
    s.execute("update log set msg = 'b' where at = 1")
    capture_once(warehouse, src)
    events = bronze_events(warehouse, s.name)
    assert [(e.action, e.record_pk, e.old_record_pk) for e in events] == [
        ("insert", '{"at":1,"msg":"a"}', None),
        ("update", '{"at":1,"msg":"b"}', '{"at":1,"msg":"a"}'),
    ]


def test_a_keyless_table_in_a_users_publication_is_named_up_front(make_source: Any) -> None:
    """C2: a table the user's publication adds without a usable identity stopped the stream at every start."""
    s = make_source("create table items (id int primary key); create table nokey (a int)", ["items"])
    src = s.config(create_publication=False)
    s.execute(f"create publication {src.publication_name} for table items, nokey")
    with pytest.raises(SourceError, match=rf"also publishes {s.schema}\.nokey, which has no usable replica identity"):
        prepare(src)
