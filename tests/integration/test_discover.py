"""`changelake-ingest discover` on real PostgreSQL and mongo-java-server: what a selection takes, nothing changed."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from ingest.config import MongoSource
from ingest.discover import EXIT_REFUSED
from ingest.sources.mongodb.discover import discover_mongo
from tests.helpers.ingest_process import ingest, write_config
from tests.mongo.server import mongo_java_server

pytestmark = pytest.mark.integration

TABLES = """
create table orders (id int primary key, note text);
insert into orders select g, 'n' from generate_series(1, 500) g;
analyze orders;
create table keyless (v text);
create table by_index (a int not null, b text);
create unique index by_index_a on by_index (a);
alter table by_index replica identity using index by_index_a;
create table events (id int, at date, primary key (id, at)) partition by range (at);
create table events_2020 partition of events for values from ('2020-01-01') to ('2021-01-01');
create table audit_log (id int primary key);
"""


def _discover(cfg: Path, *args: str) -> tuple[int, dict[str, Any]]:
    p = ingest(cfg, "discover", "--json", *args)
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def _objects(s: Any) -> tuple[int, int]:
    """(slots, publications) the source's names could have created."""
    slots = s.conn.execute("select count(*) from pg_replication_slots where slot_name like %s", (f"%{s.suffix}%",))
    pubs = s.conn.execute("select count(*) from pg_publication where pubname like %s", (f"%{s.suffix}%",))
    return int(slots.fetchone()[0]), int(pubs.fetchone()[0])


def test_discover_lists_the_selection_with_keys_sizes_and_refusals(tmp_path: Path, make_source: Any) -> None:
    s = make_source(TABLES, ["orders"])
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": [f"{s.schema}.*"]}
    source["exclude"] = [f"{s.schema}.audit_*"]
    cfg = write_config(tmp_path, source)

    rc, doc = _discover(cfg)
    [listing] = doc["sources"]
    got = {t["name"].split(".", 1)[1]: t for t in listing["tables"]}
    assert rc == EXIT_REFUSED, doc  # keyless is selected and a start would stop on it
    assert sorted(got) == ["by_index", "events", "keyless", "orders"]  # no audit_log (excluded), no partition
    orders = got["orders"]
    assert (orders["key"], orders["key_kind"], orders["replica_identity"]) == (["id"], "primary key", "default")
    assert orders["rows"] == 500 and orders["size_bytes"] > 8192 and orders["refused"] is None
    assert orders["published"] is None and "does not exist yet" in listing["where"]
    assert (got["by_index"]["key"], got["by_index"]["key_kind"]) == (["a"], "replica identity index")
    assert got["events"]["partitioned"] and got["events"]["key"] == ["id", "at"]
    assert "no primary key and no REPLICA IDENTITY FULL" in got["keyless"]["refused"]
    assert _objects(s) == (0, 0)  # nothing created

    # --all: every table, the excluded one and the partition included, saying why they are not taken.
    s.execute("create publication changelake_" + s.name + f" for table {s.schema}.orders")
    rc, doc = _discover(cfg, "--all")
    mine = {t["name"].split(".", 1)[1]: t for t in doc["sources"][0]["tables"] if t["name"].startswith(s.schema)}
    assert not mine["audit_log"]["selected"] and mine["audit_log"]["refused"] is None
    assert mine["events_2020"]["partition_of"] == f"{s.schema}.events" and not mine["events_2020"]["selected"]
    assert (mine["orders"]["published"], mine["by_index"]["published"]) == (True, False)

    # Fixed, the selection is clean: exit 0, and the human table names every table.
    s.execute("alter table keyless add column id serial primary key")
    p = ingest(cfg, "discover")
    assert p.returncode == 0, p.stdout + p.stderr
    head, *rows = [line.split() for line in p.stdout.splitlines()[1:]]
    assert head[:4] == ["table", "selected", "key", "identity"]
    assert [r[0] for r in rows] == [f"{s.schema}.{t}" for t in ("by_index", "events", "keyless", "orders")]
    assert all(r[-1] == "ok" for r in rows), p.stdout
    assert _objects(s) == (0, 1)


def test_discover_a_missing_named_table_and_a_user_publication(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table a (id int primary key); create table b (id int primary key)", ["a"])
    s.execute(f"create publication pub_{s.suffix} for table {s.schema}.a")
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "publication": f"pub_{s.suffix}"}
    source |= {"create_publication": False, "tables": [f"{s.schema}.*", f"{s.schema}.gone"]}
    cfg = write_config(tmp_path, source)
    rc, doc = _discover(cfg)
    got = {t["name"]: t for t in doc["sources"][0]["tables"]}
    assert rc == EXIT_REFUSED
    assert "does not exist" in got[f"{s.schema}.gone"]["refused"]
    assert got[f"{s.schema}.a"]["published"] is True and not got[f"{s.schema}.a"]["notes"]
    assert got[f"{s.schema}.b"]["published"] is False
    assert "does not publish it" in got[f"{s.schema}.b"]["notes"][0]


def test_discover_mongodb_collections() -> None:
    with mongo_java_server() as uri:
        client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        db = client[f"cl_{secrets.token_hex(4)}"]
        db.products.insert_many([{"_id": i} for i in range(7)])
        db.audit.insert_one({"_id": 1})
        src = MongoSource(kind="mongodb", name="m", uri=uri, database=db.name, collections=["products", "later"])
        picked = discover_mongo(src, every=False)
        everything = discover_mongo(src, every=True)
        client.close()
    rows = {c.name: c for c in picked.candidates}
    assert sorted(rows) == [f"{db.name}.later", f"{db.name}.products"]
    assert rows[f"{db.name}.products"].rows == 7 and rows[f"{db.name}.products"].key == ("_id",)
    assert "does not exist yet" in rows[f"{db.name}.later"].notes[0]
    assert {c.name: c.selected for c in everything.candidates}[f"{db.name}.audit"] is False
