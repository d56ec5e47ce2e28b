"""Opening a MongoDB change stream where a writer left off, and the token stored to reopen it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo import MongoClient
from pymongo.change_stream import ChangeStream
from pymongo.errors import OperationFailure

from ingest.config import MongoSource
from ingest.sources.mongodb.changes import Namespace, ext_json, from_ext_json, unpack_cluster_time
from ingest.sources.mongodb.source import translate

RESUME_AFTER = "resumeAfter"
START_AFTER = "startAfter"


def stored_token(kind: str, token: Mapping[str, Any]) -> str:
    """The stream writer's `resume_token`: how to reopen, `{"resumeAfter"|"startAfter": <token>}`."""
    return ext_json({kind: token})


def parse_stored_token(text: str | None) -> tuple[str, Mapping[str, Any]] | None:
    """Inverse of `stored_token`; None for a writer row without one."""
    if not text:
        return None
    d = from_ext_json(text)
    for kind in (START_AFTER, RESUME_AFTER):
        if kind in d:
            return kind, d[kind]
    raise ValueError(f"not a stored resume token: {text[:200]}")


def open_stream(
    client: MongoClient[dict[str, Any]],
    src: MongoSource,
    scope: Namespace,
    stored: tuple[str, Mapping[str, Any]] | None,
    start: int,
) -> ChangeStream[Any]:
    """Watch `scope` from the stored token (resumeAfter/startAfter), else from position `start`.

    Post-images come from the pre- and post-images a collection records when `pre_post_images`
    is set, else from an `updateLookup`. A database-wide stream of listed collections (names, no
    pattern) filters on the server, keeping the events that end a stream (dropDatabase, invalidate).
    """
    kwargs: dict[str, Any] = {"max_await_time_ms": int(src.max_await_seconds * 1000)}
    if src.pre_post_images:
        kwargs.update(full_document="required", full_document_before_change="whenAvailable")
    else:
        kwargs["full_document"] = "updateLookup"
    if stored is None:
        kwargs["start_at_operation_time"] = unpack_cluster_time(start)
    elif stored[0] == START_AFTER:
        kwargs["start_after"] = stored[1]
    else:
        kwargs["resume_after"] = stored[1]
    db = client[scope.db]
    pipeline: list[dict[str, Any]] = []
    selection = src.selection
    if scope.coll is None and not selection.has_patterns:
        # Names only: the server filters. With patterns the stream carries every collection's
        # events, and the capture keeps those the selection matches (a collection created while
        # streaming included).
        colls = selection.named
        in_scope = [{"ns.coll": {"$in": colls}}, {"to.coll": {"$in": colls}}]
        pipeline = [{"$match": {"$or": [*in_scope, {"operationType": {"$in": ["dropDatabase", "invalidate"]}}]}}]
    try:
        if scope.coll is not None:
            return db[scope.coll].watch(pipeline, **kwargs)
        return db.watch(pipeline, **kwargs)
    except OperationFailure as e:
        raise translate(src, e) from e
