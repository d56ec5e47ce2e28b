"""A filtered snapshot's query filter (`snapshot <collection> --where`): its text, its check, each page's find.

The filter is a MongoDB query filter written as Extended JSON (bson.json_util: `{"$oid": ...}`,
`{"$date": ...}`, `{"$numberLong": ...}` ...). The writer row keeps it as the text the user gave,
and every page parses it again, so a resumed snapshot reads with the filter it was requested with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import json_util
from bson.errors import BSONError
from pymongo import MongoClient
from pymongo.errors import ExecutionTimeout, OperationFailure

from ingest.errors import ConfigError

SNAPSHOT_READ_CONCERN = {"level": "snapshot"}
FILTER_CHECK_TIMEOUT_MS = 2_000  # a check still running then (a selective filter, a large collection) passes
JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def parse_filter(text: str) -> dict[str, Any]:
    """The query filter `text` holds; ConfigError if it is not one Extended JSON object."""
    try:
        value = json_util.loads(text)
    except (ValueError, TypeError, BSONError) as e:  # json.JSONDecodeError is a ValueError; a bad $oid a BSONError
        raise ConfigError(f"--where {text!r} is not Extended JSON ({e}); nothing was queued") from None
    if not isinstance(value, Mapping):
        kind = JSON_KINDS.get(type(value), type(value).__name__)
        raise ConfigError(
            f"--where {text!r} is a JSON {kind}, not a query filter: give one object such as "
            '\'{"status": "open"}\'; nothing was queued'
        )
    return dict(value)


def server_message(e: OperationFailure) -> str:
    """The server's own message of a refused command (pymongo's text appends the whole reply)."""
    return str((e.details or {}).get("errmsg") or e)


def page_filter(where: Mapping[str, Any] | None, after: Any) -> dict[str, Any]:
    """A page's `find` filter: the documents after `_id` `after` (None: from the first) the filter selects.

    The two are joined by `$and`, so a filter's own `_id` condition narrows the page's range
    instead of replacing it.
    """
    page: dict[str, Any] = {"_id": {"$gt": after}} if after is not None else {}
    if where is None:
        return page
    return {"$and": [dict(where), page]} if page else dict(where)


def filter_problem(client: MongoClient[dict[str, Any]], db: str, coll: str, where: Mapping[str, Any]) -> str | None:
    """What the server says is wrong with `where` as a page's filter, or None.

    The first page's own `find` (the filter, `_id` order, `readConcern: snapshot`) with `limit: 1`:
    the server parses the filter (an unknown operator, a wrong operand) and runs it on documents
    until one matches, so a filter a page could not run fails here. Still running after
    FILTER_CHECK_TIMEOUT_MS it passes: it ran without error so far.
    """
    try:
        reply = client[db].command(
            "find",
            coll,
            filter=page_filter(where, None),
            sort={"_id": 1},
            limit=1,
            batchSize=1,
            maxTimeMS=FILTER_CHECK_TIMEOUT_MS,
            readConcern=SNAPSHOT_READ_CONCERN,
        )
    except ExecutionTimeout:
        return None
    except OperationFailure as e:
        return server_message(e)
    cursor_id = reply["cursor"].get("id")
    if cursor_id:
        client[db].command("killCursors", coll, cursors=[cursor_id])
    return None
