"""MongoDB collection patterns and exclusions, end to end: `run` and `discover` over the wire protocol.

Backends: mongo-java-server (always) and a real replica set when MONGODB_URI is set (skipped
otherwise). A pattern makes the stream watch the database; mongo-java-server delivers no events on
a database-wide stream (docs/mongodb.md), so there a collection created while `run` streams is
captured by the next start's snapshot, while on MongoDB its events arrive from its first insert.
The stream's filtering of such events is pinned over manual-shaped events in
tests/unit/sources/mongodb/test_selection.py.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake.exceptions import TableNotFoundError
from pymongo import MongoClient

from ingest.config import MongoSource
from ingest.sources.mongodb.changes import record_key
from ingest.sources.mongodb.discover import discover_mongo
from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import ingest, start_run, stop, wait_for, write_config
from tests.mongo.server import mongo_java_server

pytestmark = pytest.mark.integration
LIVE_URI_ENV = "MONGODB_URI"
FAKE = "mongo-java-server"


@pytest.fixture(scope="module", params=[FAKE, "live"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    if request.param == "live":
        uri = os.environ.get(LIVE_URI_ENV)
        if not uri:
            pytest.skip(f"live MongoDB tests need {LIVE_URI_ENV} (a replica set URI); none is set")
        yield request.param, uri
    else:
        with mongo_java_server() as uri:
            yield request.param, uri


def rows(warehouse: Path, table: str, source: str) -> dict[str, list[str]]:
    """record_pk of each collection's rows in bronze `table` (wal_events or snapshot_pages), in order."""
    try:
        got = read(warehouse / "bronze" / table, f"source = '{source}' and record_pk is not null", "record_pk")
    except TableNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for r in got:
        out.setdefault(r.table_name, []).append(r.record_pk)
    return out


def keys(*ids: int) -> list[str]:
    return sorted(record_key(i) for i in ids)


def test_patterns_capture_matches_and_skip_the_rest(tmp_path: Path, backend: tuple[str, str]) -> None:
    kind, uri = backend
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    db = client[f"cl_{secrets.token_hex(4)}"]
    name = f"m_{db.name[3:]}"
    warehouse = tmp_path / "warehouse"
    try:
        db.orders_eu.insert_many([{"_id": i, "region": "eu"} for i in (1, 2, 3)])
        db.orders_us.insert_many([{"_id": i, "region": "us"} for i in (1, 2)])
        db.orders_tmp.insert_many([{"_id": i} for i in (1, 2)])
        db.products.insert_many([{"_id": i} for i in (1, 2)])
        source = {
            "kind": "mongodb",
            "name": name,
            "uri": uri,
            "database": db.name,
            "collections": ["orders_*", "later_*"],
            "exclude": ["orders_tmp"],
            "max_await_seconds": 0.3,
        }
        cfg = write_config(tmp_path, source)

        # discover: what the selection takes and what it leaves out, and why.
        listing = discover_mongo(MongoSource.model_validate(source), every=True)
        by_name = {c.name.split(".", 1)[1]: c for c in listing.candidates}
        assert sorted(by_name) == ["orders_eu", "orders_tmp", "orders_us", "products"]
        assert by_name["orders_eu"].selected and by_name["orders_us"].selected
        assert (
            not by_name["orders_tmp"].selected and "excluded by exclude: orders_tmp" in by_name["orders_tmp"].notes[0]
        )
        assert not by_name["products"].selected and "not matched" in by_name["products"].notes[0]
        assert any("later_*" in n for n in listing.notes)  # a pattern matching nothing: a note, not an error

        proc = start_run(cfg)
        try:
            wait_for(
                lambda: set(rows(warehouse, "snapshot_pages", name)) == {"orders_eu", "orders_us"},
                proc,
                90,
                "snapshots of orders_eu and orders_us",
            )
            # While streaming: a new matching collection, and writes to the excluded and unmatched ones.
            db.orders_asia.insert_one({"_id": 1, "first": True})
            db.orders_asia.insert_many([{"_id": 2}, {"_id": 3}])
            db.orders_tmp.insert_one({"_id": 3})
            db.products.insert_one({"_id": 3})
            db.orders_eu.insert_one({"_id": 4, "region": "eu"})
            if kind != FAKE:
                wait_for(
                    lambda: rows(warehouse, "wal_events", name).get("orders_asia") == keys(1, 2, 3),
                    proc,
                    60,
                    "orders_asia's three inserts in bronze",
                )
        finally:
            rc, err = stop(proc)
        assert rc == 0, err
        assert "matches no collection" in err and "later_*" in err  # logged at start

        snap = rows(warehouse, "snapshot_pages", name)
        assert snap == {"orders_eu": keys(1, 2, 3), "orders_us": keys(1, 2)}
        events = rows(warehouse, "wal_events", name)
        if kind != FAKE:
            # From its first insert, by the stream: no snapshot needed.
            assert events["orders_asia"] == keys(1, 2, 3) and events["orders_eu"] == keys(4)

        # The next start resolves the selection again: orders_asia (never snapshotted) is snapshotted,
        # which is how the fake, whose database-wide stream is silent, captures it.
        once = ingest(cfg, "run", "--once")
        assert once.returncode == 0, once.stderr
        snap = rows(warehouse, "snapshot_pages", name)
        assert snap["orders_asia"] == keys(1, 2, 3)
        events = rows(warehouse, "wal_events", name)
        for out_of_scope in ("orders_tmp", "products"):
            assert out_of_scope not in snap and out_of_scope not in events, out_of_scope
    finally:
        client.drop_database(db.name)
        client.close()
