"""A MongoDB source's collections with their estimated sizes, read without writing anything."""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from ingest.config import MongoSource
from ingest.discover import Candidate, Listing
from ingest.sources.mongodb.source import collections, connect, unmatched_patterns, user_collections


def discover_mongo(src: MongoSource, every: bool) -> Listing:
    """The collections `src` selects (`every`: all of the database's, each saying whether it is selected).

    A collection the selection leaves out says why (no entry matches it, or an `exclude` entry
    does); a pattern that matches nothing yet is a note of the source.
    """
    client = connect(src)
    try:
        present = user_collections(client, src)
        wanted = collections(client, src)
        out = [
            Candidate(
                f"{src.database}.{c}",
                selected=True,
                key=("_id",),
                key_kind="_id",
                notes=("does not exist yet: captured once it is created",),
            )
            for c in sorted(set(wanted) - set(present))
        ]
        out += [_candidate(client, src, c, c in wanted) for c in present if every or c in wanted]
    finally:
        client.close()
    notes = tuple(
        f"collections pattern {p} matches no collection yet: one created later is captured from its first event"
        for p in unmatched_patterns(src, present)
    )
    return Listing(src.name, src.kind, f"database {src.database}", tuple(out), notes=notes)


def _left_out(src: MongoSource, name: str) -> tuple[str, ...]:
    """Why the selection leaves collection `name` out, as discover's note."""
    by = [e.text for e in src.selection.exclude if e.matches((name,))]
    if by:
        return (f"excluded by exclude: {', '.join(by)}: not captured",)
    return ("not matched by collections: not captured",)


def _candidate(client: MongoClient[dict[str, Any]], src: MongoSource, name: str, selected: bool) -> Candidate:
    db = client[src.database]
    try:
        size: int | None = int(db.command("collStats", name).get("storageSize", 0)) or None
    except OperationFailure:  # a server (or role) without collStats: the size is not known
        size = None
    return Candidate(
        f"{src.database}.{name}",
        selected=selected,
        key=("_id",),
        key_kind="_id",
        rows=db[name].estimated_document_count(),
        size_bytes=size,
        notes=() if selected else _left_out(src, name),
    )
