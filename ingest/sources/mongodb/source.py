"""The MongoDB connection of a source: client, scope, cluster time, and errors a user can act on."""

from __future__ import annotations

import logging
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from ingest.capture.retry import is_transient
from ingest.config import MongoSource
from ingest.errors import SourceError, SourceUnavailableError
from ingest.sources.mongodb import compat
from ingest.sources.mongodb.changes import Namespace

log = logging.getLogger(__name__)

SERVER_SELECTION_TIMEOUT_MS = 10_000
APP_NAME = "changelake-ingest"
# Server error codes (src/mongo/base/error_codes.yml)
CHANGE_STREAM_FATAL_ERROR = 280
CHANGE_STREAM_HISTORY_LOST = 286
CHANGE_STREAM_NOT_SUPPORTED = 40573  # "$changeStream stage is only supported on replica sets"
# Collections MongoDB keeps for itself (system.views, system.profile, ...): never captured.
SYSTEM_PREFIX = "system."
HISTORY_LOST_CODES = frozenset({CHANGE_STREAM_FATAL_ERROR, CHANGE_STREAM_HISTORY_LOST})


class StreamHistoryLostError(SourceError):
    """The stored resume token (or start time) is no longer in the oplog; a re-snapshot is required."""


def connect(src: MongoSource) -> MongoClient[dict[str, Any]]:
    """A client for `src` (tz-aware datetimes, so dates keep their instant); fails fast if unreachable."""
    client: MongoClient[dict[str, Any]] = MongoClient(
        src.uri, tz_aware=True, appname=APP_NAME, serverSelectionTimeoutMS=SERVER_SELECTION_TIMEOUT_MS
    )
    try:
        client.admin.command("ping")
    except PyMongoError as e:
        client.close()
        error = SourceUnavailableError if is_transient(e) else SourceError
        raise error(f"sources.{src.name}: cannot reach MongoDB: {type(e).__name__}: {e}") from None
    return client


def scope(src: MongoSource) -> Namespace:
    """What the stream watches: the collection when the selection is one literal name, else the database."""
    selection = src.selection
    if not selection.has_patterns and len(selection.named) == 1:
        return Namespace(src.database, selection.named[0])
    return Namespace(src.database, None)


def selected(src: MongoSource, coll: str) -> bool:
    """Whether collection `coll` of the source's database is in its selection (system collections never are)."""
    return not coll.startswith(SYSTEM_PREFIX) and src.selection.matches((coll,))


def collections(client: MongoClient[dict[str, Any]], src: MongoSource) -> list[str]:
    """The source's collections now: its named ones (existing or not), then what its patterns match.

    Patterns (and no `collections` at all: every collection) are resolved against the
    database's `list_collection_names()`; a source of names only does not list them.
    """
    selection = src.selection
    if not selection.has_patterns:
        return selection.named
    return selection.resolve((n,) for n in user_collections(client, src))


def user_collections(client: MongoClient[dict[str, Any]], src: MongoSource) -> list[str]:
    """Every non-system collection of the source's database, sorted."""
    return sorted(n for n in client[src.database].list_collection_names() if not n.startswith(SYSTEM_PREFIX))


def unmatched_patterns(src: MongoSource, present: list[str]) -> list[str]:
    """The `collections` patterns that match none of `present` (not an error: a collection may come later)."""
    if src.collections is None:
        return []
    return [
        s.text
        for s in src.selection.include
        if s.is_pattern and not any(s.matches((c,)) and selected(src, c) for c in present)
    ]


def log_selection(src: MongoSource, present: list[str]) -> None:
    """Log what the selection resolves to at start, and each pattern that matches nothing yet."""
    for pattern in unmatched_patterns(src, present):
        log.warning(
            "source=%s: collections pattern %r matches no collection of %s yet (captured once one is created)",
            src.name,
            pattern,
            src.database,
        )


def cluster_time(client: MongoClient[dict[str, Any]]) -> Timestamp:
    """The server's current cluster time: a command's `operationTime`, else the newest oplog entry.

    Replica sets and mongos report `operationTime` on every command. A server that does not (the
    test server mongo-java-server) is asked for the newest entry of its oplog instead.
    """
    reply = client.admin.command("ping")
    op_time = reply.get("operationTime")
    if isinstance(op_time, Timestamp):
        return op_time
    newest = compat.newest_oplog_time(client)
    if newest is not None:
        return newest
    raise SourceError(
        "MongoDB reports no cluster time and has no oplog: change streams need a replica set or a sharded "
        "cluster (a standalone mongod can be converted to a one-member replica set, see docs/mongodb.md)"
    )


def translate(src: MongoSource, e: OperationFailure) -> SourceError:
    """A change-stream failure as an error that says what to do."""
    if e.code in HISTORY_LOST_CODES:
        return StreamHistoryLostError(
            f"sources.{src.name}: the stream's resume point is no longer in the oplog (code {e.code}: "
            f"{e.details.get('codeName', '') if e.details else ''}); ingest was stopped for longer than the "
            "oplog window, so changes were lost. Re-snapshot: set `on_history_lost: resnapshot` on the "
            "source and run `changelake-ingest run` once (it tombstones the source's collections at the "
            "current cluster time, restarts the stream there and snapshots every collection), or enlarge "
            "the oplog (replSetResizeOplog) so this does not recur; see docs/mongodb.md"
        )
    if e.code == CHANGE_STREAM_NOT_SUPPORTED:
        return SourceError(
            f"sources.{src.name}: the server does not support change streams (code {e.code}): MongoDB must "
            "run as a replica set or sharded cluster with majority read concern enabled"
        )
    return SourceError(f"sources.{src.name}: MongoDB change stream failed (code {e.code}): {e}")
