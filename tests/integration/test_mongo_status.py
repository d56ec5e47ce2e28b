"""`status --json` and the run's metrics for a MongoDB source (mongo-java-server): no slot, cluster-time positions."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from pymongo import MongoClient

from tests.helpers.ingest_process import (
    free_port,
    ingest,
    key,
    scrape,
    start_run,
    status_json,
    stop,
    wait_for,
    write_config,
)
from tests.mongo.server import mongo_java_server

pytestmark = pytest.mark.integration


def test_a_mongodb_source_status_and_metrics(tmp_path: Path) -> None:
    with mongo_java_server() as uri:
        name = f"m_{secrets.token_hex(4)}"
        client: MongoClient[dict[str, object]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        db = client[f"cl_{name[2:]}"]
        db.products.insert_one({"_id": 1, "name": "first"})
        source = {
            "kind": "mongodb",
            "name": name,
            "uri": uri,
            "database": db.name,
            "collections": ["products"],
            "max_await_seconds": 0.3,
        }
        cfg = write_config(tmp_path, source, alerts={"max_position_age_seconds": 600})
        port = free_port()
        proc = start_run(cfg, "--metrics-port", str(port))
        events = key("changelake_events_total", source=name, writer="stream")
        try:
            wait_for(lambda: events in scrape(port), proc, 60, "events series")
            db.products.insert_many([{"_id": i, "name": f"p{i}"} for i in range(2, 12)])
            wait_for(lambda: scrape(port).get(events, 0) >= 10, proc, 60, "10 events")
            got = scrape(port)
        finally:
            rc, err = stop(proc)
        assert rc == 0, err
        assert got[key("changelake_freshness_seconds", source=name)] < 60
        assert got[key("changelake_writer_durable_position", source=name, writer="stream")] > 0
        assert got.get(key("changelake_wal_bytes_total", source=name), 0) == 0  # cluster times are not bytes
        assert not any(k.startswith("changelake_slot_") and f'source="{name}"' in k for k in got)

        rc, doc = status_json(cfg)
        one = doc["sources"][0]
        assert (rc, doc["state"], one["kind"], one["reachable"], one["slot"]) == (0, "healthy", "mongodb", True, None)
        assert "stream" in [w["writer_id"] for w in one["writers"]]
        assert one["safe_bound_text"].startswith("clusterTime "), one
        client.close()
    rc, doc = status_json(cfg)  # the server is gone
    assert (rc, doc["sources"][0]["state"], doc["sources"][0]["reachable"]) == (5, "unreachable", False), doc
    assert ingest(cfg, "status").returncode == 0  # the human status keeps exit 0
