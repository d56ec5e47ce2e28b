"""An existing publication's options are checked on start (review finding W11), on a real server.

Publish actions and row filters decide which changes reach bronze at all; a publication that
drops some, or filters rows the snapshots read anyway, gave a silver that matched nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.errors import SourceError
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


def test_a_users_publication_without_every_action_is_refused(make_source: Any) -> None:
    s = make_source("create table items (id int primary key)", ["items"])
    src = s.config(create_publication=False)
    s.execute(f"create publication {src.publication_name} for table items with (publish = 'insert')")
    with pytest.raises(SourceError, match=r"does not publish update, delete, truncate, so those changes would never"):
        prepare(src)


def test_a_managed_publication_gets_every_action_back(warehouse: Path, make_source: Any) -> None:
    """Before: the deletes were silently never captured (silver kept the rows live)."""
    s = make_source("create table items (id int primary key)", ["items"])
    src = s.config()
    s.execute(f"create publication {src.publication_name} for table items with (publish = 'insert, update')")
    prepare(src)
    s.execute("insert into items values (1), (2); delete from items where id = 1")
    capture_once(warehouse, src)
    assert [(e.action, json.loads(e.record_pk)["id"]) for e in bronze_events(warehouse, s.name)] == [
        ("insert", 1),
        ("insert", 2),
        ("delete", 1),
    ]


def test_a_row_filter_on_a_captured_table_is_refused_before_anything_changes(make_source: Any) -> None:
    s = make_source("create table items (id int primary key)", ["items"])
    if int(s.conn.execute("show server_version_num").fetchone()[0]) < 150000:
        pytest.skip("row filters came in PostgreSQL 15")
    src = s.config()
    s.execute(f"create publication {src.publication_name} for table items where (id > 10)")
    with pytest.raises(SourceError, match=r"publishes t_\w+\.items with a row filter \(WHERE \(id > 10\)\)"):
        prepare(src)
    with psycopg.connect(s.dsn) as c:
        slots = c.execute("select count(*) from pg_replication_slots where slot_name = %s", (src.slot_name,)).fetchone()
    assert slots == (0,)
