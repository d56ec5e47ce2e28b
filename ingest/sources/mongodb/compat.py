"""Where ingest bends for servers that speak MongoDB's wire protocol without all of its semantics.

The test server, mongo-java-server (docs/mongodb.md, "What the tests can and cannot show"), is
one: its change events carry no `ns`, an update's `documentKey` may hold the update's operator
instead of the `_id`, its commands report no `operationTime`, and snapshot reads return no
`atClusterTime` (so `verify` reads without isolation, verify.py). MongoDB itself (a replica set
or a sharded cluster) never takes these branches.
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


_said_no_post_batch_token: set[str] = set()


def no_post_batch_token(source: str) -> bool:
    """A stream with nothing more whose token is still its last event's: a server with no post-batch tokens.

    MongoDB (4.0.7+) answers every getMore with a post-batch resume token past what it returned;
    without one, nothing says whether more events at the last clusterTime will come, so the
    clusterTime is taken as complete (said once per source). Returns True.
    """
    if source not in _said_no_post_batch_token:
        log.warning(
            "source=%s: the server sends no post-batch resume tokens; a clusterTime is taken as complete when "
            "the stream has nothing more (MongoDB itself always sends them)",
            source,
        )
        _said_no_post_batch_token.add(source)
    return True


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


def warn_no_verify_snapshot(source: str) -> None:
    """Say (once per verify run) that the server gave a snapshot read no `atClusterTime`.

    verify then reads each collection without isolation and keeps a pass only if the cluster time
    did not move while it read (mongodb/verify.py); a collection written all the time is reported
    not verified.
    """
    log.warning(
        "source=%s: the server returned no atClusterTime for a snapshot read; verify reads each collection "
        "without isolation and keeps a pass only if no write happened while it read",
        source,
    )
