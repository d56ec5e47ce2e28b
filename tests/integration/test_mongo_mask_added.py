"""A mask added to a MongoDB collection's config later: the collection is re-snapshotted masked, once."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.masking import mask_hash
from ingest.progress import Progress
from ingest.sources.mongodb.capture import MongoCapture
from tests.helpers.delta_rows import read
from tests.mongo.server import mongo_java_server

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "z" * 22


def _once(warehouse: Path, src: MongoSource) -> None:
    cap = MongoCapture(
        src, BatchConfig(max_events=1000, max_seconds=5), BronzeWriter(warehouse), Progress(src.name, False)
    )
    cap.run(once=True, should_stop=lambda: False)


def _pages(warehouse: Path, source: str) -> list[Any]:
    return read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}' and row_index >= 0", "ingested_at")


def test_a_mask_added_later_re_snapshots_the_collection_masked(
    warehouse: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A MongoDB mask added to the config later re-masked nothing: untouched documents kept their plain values."""
    monkeypatch.setenv(SALT_ENV, SALT)
    alice, bob = (f"mail-{secrets.token_hex(6)}@example.org" for _ in range(2))
    with mongo_java_server() as uri:
        client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
        db = client[f"cl_{secrets.token_hex(4)}"]
        db.users.insert_many([{"_id": 1, "email": alice}, {"_id": 2, "email": bob}])
        db.other.insert_one({"_id": 1, "email": "not-ruled"})
        base = {
            "kind": "mongodb",
            "name": f"m_{db.name[3:]}",
            "uri": uri,
            "database": db.name,
            "max_await_seconds": 0.3,
        }
        plain = MongoSource(**base, collections=["users", "other"])
        _once(warehouse, plain)
        assert len(_pages(warehouse, plain.name)) == 3

        masked = MongoSource(
            **base,
            collections=["users", "other"],
            columns={"users": {"mask_columns": ["email"]}},
            mask_salt_env=SALT_ENV,
        )
        _once(warehouse, masked)
        assert "users: field email became masked" in caplog.text and "re-snapshotting it" in caplog.text
        pages = _pages(warehouse, plain.name)
        latest = sorted(json.loads(p.record)["email"] for p in pages[3:])
        assert latest == sorted(mask_hash(SALT.encode(), m.encode()) for m in (alice, bob))
        assert {p.table_name for p in pages[3:]} == {"users"}, "only the collection whose rules changed"

        _once(warehouse, masked)  # the rules are recorded: no second re-snapshot
        assert len(_pages(warehouse, plain.name)) == 5
        client.close()
