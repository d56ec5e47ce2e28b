"""A MongoDB source's collections with their estimated sizes, read without writing anything."""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from ingest.config import MongoSource
from ingest.discover import Candidate, Listing
from ingest.sources.mongodb.source import connect


def discover_mongo(src: MongoSource, every: bool) -> Listing:
    """The collections `src` captures (`every`: all of the database's, each saying whether it is captured)."""
    client = connect(src)
    try:
        db = client[src.database]
        present = sorted(n for n in db.list_collection_names() if not n.startswith("system."))
        wanted = set(present) if src.collections is None else set(src.collections)
        out = [
            Candidate(
                f"{src.database}.{c}",
                selected=True,
                key=("_id",),
                key_kind="_id",
                notes=("does not exist yet: captured once it is created",),
            )
            for c in sorted(wanted - set(present))
        ]
        out += [_candidate(client, src, c, c in wanted) for c in present if every or c in wanted]
    finally:
        client.close()
    return Listing(src.name, src.kind, f"database {src.database}", tuple(out))


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
    )
