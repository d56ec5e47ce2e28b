"""Where ingest bends for servers that speak MongoDB's wire protocol without all of its semantics.

The test server, mongo-java-server (docs/mongodb.md, "What the tests can and cannot show"), is
one: its change events carry no `ns`, an update's `documentKey` may hold the update's operator
instead of the `_id`, its commands report no `operationTime`, and snapshot reads return no
`atClusterTime`. MongoDB itself (a replica set or a sharded cluster) never takes these branches.
Each fallback is named here so the product code shows where, and only where, it bends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient

log = logging.getLogger(__name__)


def key_from_full_document(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """An event's `{"_id": ...}` taken from its full document, when `documentKey` has no `_id`."""
    full = doc.get("fullDocument")
    if isinstance(full, Mapping) and "_id" in full:
        return {"_id": full["_id"]}
    return None


def newest_oplog_time(client: MongoClient[dict[str, Any]]) -> Timestamp | None:
    """The newest oplog entry's time, for a server whose commands report no `operationTime`."""
    newest = client.local["oplog.rs"].find_one({}, sort=[("$natural", -1)], projection={"ts": 1})
    if newest is not None and isinstance(newest.get("ts"), Timestamp):
        ts: Timestamp = newest["ts"]
        return ts
    return None


def warn_no_snapshot_time(source: str) -> None:
    """Say (once per snapshot) that a snapshot read came without `atClusterTime`.

    The page is then placed at the server's cluster time after the read: a high watermark, not a
    snapshot time, exact only if no write races the read.
    """
    log.warning(
        "source=%s: the server returned no atClusterTime for a snapshot read; using its cluster time "
        "after the read (not a consistent snapshot: a write racing the read may be ordered wrongly)",
        source,
    )
