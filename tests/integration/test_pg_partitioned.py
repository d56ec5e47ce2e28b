"""A partitioned table is captured as its root, across restarts (DESIGN §7.7, issue 13 W1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.errors import SourceError
from tests.helpers.pg import bronze_events, capture_once, prepare
from tests.helpers.silver import snapshot_rows

pytestmark = pytest.mark.integration

PARTITIONED = """
create table orders (id int, region text, v text, primary key (id, region)) partition by list (region);
create table orders_eu partition of orders for values in ('eu');
create table orders_us partition of orders for values in ('us');
"""


def test_partitioned_table_is_captured_as_its_root_across_restarts(warehouse: Path, make_source: Any) -> None:
    """Regression: every start died with `DuplicateObject: relation "orders" is already member of
    publication` (pg_publication_tables lists the partitions, so the root looked missing)."""
    s = make_source(PARTITIONED, ["orders"])
    s.execute("insert into orders values (1, 'eu', 'a'), (2, 'us', 'b')")  # read by the snapshot
    src = s.config()
    prepare(src)
    prepare(src)  # a second start on the same publication
    s.execute("insert into orders values (3, 'eu', 'c'), (4, 'us', 'd')")
    s.execute("update orders set v = 'x' where id = 2")
    capture_once(warehouse, src, snapshots=True)
    s.execute("delete from orders where id = 3")
    s.execute("create table orders_ap partition of orders for values in ('ap')")
    s.execute("insert into orders values (5, 'ap', 'e')")  # a partition attached while captured
    capture_once(warehouse, src, snapshots=True)  # a restart: no error, the stream goes on

    events = bronze_events(warehouse, s.name)
    assert {(e.table_schema, e.table_name) for e in events} == {(s.schema, "orders")}
    assert [(e.action, json.loads(e.record_pk)["id"]) for e in events] == [
        ("insert", 3),
        ("insert", 4),
        ("update", 2),
        ("delete", 3),
        ("insert", 5),
    ]
    pages = snapshot_rows(warehouse, s.name)
    assert {p.table_name for p in pages} == {"orders"}
    assert sorted(json.loads(p.record_pk)["id"] for p in pages) == [1, 2, 3, 4]  # every partition, once
    with psycopg.connect(s.dsn) as c:
        row = c.execute("select pubviaroot from pg_publication where pubname = %s", (src.publication_name,)).fetchone()
    assert row == (True,)


def test_a_users_publication_of_partitions_is_refused_with_the_fix(make_source: Any) -> None:
    s = make_source(PARTITIONED, ["orders"])
    src = s.config(create_publication=False)
    s.execute(f"create publication {src.publication_name} for table orders")
    with pytest.raises(SourceError, match="publish_via_partition_root = true"):
        prepare(src)
    s.execute(f"alter publication {src.publication_name} set (publish_via_partition_root = true)")
    prepare(src)
