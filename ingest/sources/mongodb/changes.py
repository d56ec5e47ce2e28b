"""Change-stream documents -> ChangeEvents (pure, no I/O): positions, actions and Extended JSON.

The documents are those the MongoDB manual's "Change Events" page describes (pymongo decodes them
to dicts of BSON types). Positions follow DESIGN §2: `commit_lsn` is `clusterTime` packed as
`(seconds << 32) | increment`; `commit_index` counts the events of one transaction (same
`clusterTime`, `lsid` and `txnNumber`) from 0, in stream order, which is the resume tokens'
`txnOpIndex` order. Events of one applyOps entry without a transaction (batched deletes) share a
`clusterTime` too, and are numbered the same way, so no two events of a source share a position.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from bson import json_util
from bson.json_util import JSONMode, JSONOptions
from bson.timestamp import Timestamp

from ingest.errors import UnmappableEventError
from ingest.events import Action, ChangeEvent
from ingest.masking import SourceMasks, TableMask
from ingest.sources.mongodb import compat

log = logging.getLogger(__name__)

CANONICAL = JSONOptions(json_mode=JSONMode.CANONICAL, tz_aware=True, tzinfo=UTC)
UPDATE_DESCRIPTION_PREFIX = "mongodb.updateDescription"  # message_prefix of an update's description
RENAME_PREFIX = "mongodb.rename"  # message_prefix of a rename's target namespace
INCREMENT_BITS = 32
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RESUME_TOKEN_TIMESTAMP_TYPE = "82"  # KeyString type byte of a BSON Timestamp: a v1 token's first field
RESUME_TOKEN_TIMESTAMP_HEX = 16  # the Timestamp after it: 8 bytes big-endian, (seconds << 32) | increment


class OperationType(StrEnum):
    """The change-event `operationType`s a stream without `showExpandedEvents` delivers."""

    INSERT = "insert"
    UPDATE = "update"
    REPLACE = "replace"
    DELETE = "delete"
    DROP = "drop"
    RENAME = "rename"
    DROP_DATABASE = "dropDatabase"
    INVALIDATE = "invalidate"


ROW_ACTIONS = {
    OperationType.INSERT: Action.INSERT,
    OperationType.UPDATE: Action.UPDATE,
    OperationType.REPLACE: Action.UPDATE,
    OperationType.DELETE: Action.DELETE,
}
# Events about one collection: skipped when it is outside the source's selection. dropDatabase and
# invalidate end the stream and are always kept.
OUT_OF_SCOPE_SKIPPED = frozenset({*ROW_ACTIONS, OperationType.DROP, OperationType.RENAME})


def ext_json(value: Any) -> str:
    """Canonical Extended JSON v2 of a BSON value, compact: every BSON type survives the trip."""
    return json_util.dumps(value, json_options=CANONICAL, separators=(",", ":"))


def from_ext_json(text: str) -> Any:
    """The BSON value of a canonical Extended JSON text (inverse of `ext_json`)."""
    return json_util.loads(text, json_options=CANONICAL)


def pack_cluster_time(ts: Timestamp) -> int:
    """A cluster time as a bronze position: `(seconds << 32) | increment`."""
    return (ts.time << INCREMENT_BITS) | ts.inc


def unpack_cluster_time(position: int) -> Timestamp:
    """The cluster time of a packed position (inverse of `pack_cluster_time`)."""
    return Timestamp(position >> INCREMENT_BITS, position & 0xFFFFFFFF)


def resume_token_position(token: Mapping[str, Any] | None) -> int | None:
    """The packed cluster time a resume token stands for, or None if the token is not decodable.

    A resume token is opaque to clients, but its `_data` (MongoDB >= 4.2, a hex KeyString) starts
    with the event's cluster time: type byte 0x82 then the Timestamp as 8 big-endian bytes. This
    is what lets an idle stream's post-batch resume token raise the writer's position.
    """
    data = token.get("_data") if token else None
    if not isinstance(data, str) or not data.upper().startswith(RESUME_TOKEN_TIMESTAMP_TYPE):
        return None
    digits = data[len(RESUME_TOKEN_TIMESTAMP_TYPE) : len(RESUME_TOKEN_TIMESTAMP_TYPE) + RESUME_TOKEN_TIMESTAMP_HEX]
    if len(digits) != RESUME_TOKEN_TIMESTAMP_HEX:
        return None
    try:
        return int(digits, 16)
    except ValueError:
        return None


def mask_value(mask: TableMask, value: Any) -> str | None:
    """A masked field's value: the hash of a string's text or of another value's canonical Extended JSON."""
    if value is None:
        return None
    return mask.mask_text(value if isinstance(value, str) else ext_json(value))


def mask_document(doc: Mapping[str, Any], mask: TableMask | None, collection: str) -> Mapping[str, Any]:
    """`doc` without its excluded top-level fields and with its masked ones masked (masking.py), in order.

    SourceError if a field is named like a rule's name except for case (TableMask.check_fields):
    the rule would not cover it. `collection`: its qualified name, for that error.
    """
    if mask is None:
        return doc
    mask.check_fields(collection, doc)
    return {k: mask_value(mask, v) if k in mask.mask else v for k, v in doc.items() if k not in mask.exclude}


def _mask_updated_fields(fields: Mapping[str, Any], mask: TableMask | None, collection: str) -> Mapping[str, Any]:
    """An update's `updatedFields` (dotted paths) with the rules of each path's top-level field."""
    if mask is None:
        return fields
    mask.check_fields(collection, (path.split(".", 1)[0] for path in fields))
    out = {}
    for path, value in fields.items():
        top = path.split(".", 1)[0]
        if top not in mask.exclude:
            out[path] = mask_value(mask, value) if top in mask.mask else value
    return out


def record_key(document_id: Any) -> str:
    """`record_pk` of a document: `{"_id": <canonical Extended JSON>}` (shard-key fields left out)."""
    return ext_json({"_id": document_id})


@dataclass(frozen=True, slots=True)
class Namespace:
    """A database and collection (`ns` of a change event); `coll` is None for database events."""

    db: str
    coll: str | None

    @property
    def qualified(self) -> str:
        """`db.coll`, as `truncated_tables` lists it."""
        return f"{self.db}.{self.coll}"


@dataclass(frozen=True, slots=True)
class MappedChange:
    """What one change-stream document means for bronze and for the stream.

    `event` is None for an operationType ingest does not store (logged). `invalidated`: the
    stream is closed and must be reopened with `startAfter` this event's token. `renamed_to`:
    a rename's target namespace (to be snapshotted if it is in scope).
    """

    event: ChangeEvent | None
    token: Mapping[str, Any]
    invalidated: bool = False
    renamed_to: Namespace | None = None


class ChangeMapper:
    """Maps change-stream documents of one source to ChangeEvents, in stream order.

    Responsibilities: positions (packed clusterTime, index within a transaction), actions,
    canonical Extended JSON of keys and documents, tombstoning events for drop / rename /
    dropDatabase / invalidate, and the set of collections seen (what a dropDatabase tombstones).
    State: the previous event's clusterTime, so feed documents in stream order, starting at a
    clusterTime boundary (the stream resumes only from tokens stored at one).
    """

    def __init__(
        self,
        scope: Namespace,
        known_collections: Sequence[str] = (),
        masks: SourceMasks | None = None,
        selected: Callable[[str], bool] | None = None,
    ) -> None:
        """Map the events of a stream watching `scope` (a collection, or a database if coll is None).

        `known_collections` are the in-scope collections at start (a dropDatabase tombstones
        them and every collection seen since). `masks`: the fields each collection excludes and
        masks (the document, its pre-image and an update's updatedFields alike). `selected`: whether
        a collection of the database is captured (None: every one); the row and drop events of the
        others are skipped and counted in `skipped`, and a rename is kept when either name is captured.
        """
        self.scope = scope
        self.masks = masks or SourceMasks({})
        self.known: set[str] = set(known_collections)
        self.selected = selected
        self.skipped: dict[str, int] = {}  # events of collections outside the selection, by collection
        self._lsn: int | None = None  # the clusterTime of the previous event
        self._index = 0

    def _position(self, doc: Mapping[str, Any]) -> tuple[int, int]:
        cluster_time = doc.get("clusterTime")
        if not isinstance(cluster_time, Timestamp):
            raise UnmappableEventError(
                f"a change event without a clusterTime (resume token {ext_json(doc.get('_id'))}): its position "
                "cannot be known. MongoDB always sends one; check what serves this URI"
            )
        lsn = pack_cluster_time(cluster_time)
        # The index counts every event at one clusterTime, whatever session or transaction it belongs
        # to: several transactions can share a clusterTime (sharded clusters; any deployment from
        # 8.0), and an index restarting per transaction gave two of their events one position, of
        # which silver kept one (review finding D3). The stream delivers the events of one
        # clusterTime in oplog order, and resumes only from tokens stored once a clusterTime is
        # complete, so the numbering is the same on every replay.
        self._index = self._index + 1 if lsn == self._lsn else 0
        self._lsn = lsn
        return lsn, self._index

    def _namespace(self, doc: Mapping[str, Any]) -> Namespace:
        ns = doc.get("ns")
        if isinstance(ns, Mapping) and ns.get("db"):
            return Namespace(str(ns["db"]), str(ns["coll"]) if ns.get("coll") is not None else None)
        return self.scope  # a collection stream's own namespace (a server that sends no `ns`: compat.py)

    def feed(self, doc: Mapping[str, Any]) -> MappedChange:
        """Map one change-stream document (as pymongo returns it)."""
        token = doc["_id"]
        lsn, index = self._position(doc)
        op = doc.get("operationType")
        ts_us = _commit_ts_us(doc, lsn)
        ns = self._namespace(doc)
        base = {"commit_lsn": lsn, "commit_index": index, "xid": lsn, "commit_ts_us": ts_us}
        if op in OUT_OF_SCOPE_SKIPPED and not self._captures(ns, doc if op == OperationType.RENAME else None):
            self._skip(ns)
            return MappedChange(None, token)
        if op in ROW_ACTIONS:
            if ns.coll is not None:
                self.known.add(ns.coll)
            return MappedChange(self._row_event(doc, OperationType(op), ns, base), token)
        if op == OperationType.DROP:
            return MappedChange(self._tombstone(base, ns, [ns]), token)
        if op == OperationType.RENAME:
            to = doc.get("to") or {}
            target = Namespace(str(to.get("db", ns.db)), str(to["coll"])) if to.get("coll") else None
            event = self._tombstone(base, ns, [ns], RENAME_PREFIX, ext_json({"to": to}) if to else None)
            self.known.discard(ns.coll or "")
            if target is not None and target.db == self.scope.db and target.coll and self._captures(target, None):
                self.known.add(target.coll)  # captured under its new name: a dropDatabase tombstones it
            return MappedChange(event, token, renamed_to=target)
        if op == OperationType.DROP_DATABASE:
            dropped = [Namespace(ns.db, c) for c in sorted(self.known)]
            return MappedChange(self._tombstone(base, ns, dropped) if dropped else None, token)
        if op == OperationType.INVALIDATE:
            if self.scope.coll is not None:
                gone = [self.scope]
            else:
                gone = [Namespace(self.scope.db, c) for c in sorted(self.known)]
            return MappedChange(self._tombstone(base, self.scope, gone) if gone else None, token, invalidated=True)
        log.warning("skipped change event operationType=%s clusterTime=%d index=%d", op, lsn, index)
        return MappedChange(None, token)

    def _captures(self, ns: Namespace, rename: Mapping[str, Any] | None) -> bool:
        """Whether an event on `ns` (a rename: on its source or its target) concerns a captured collection."""
        if self.selected is None or ns.coll is None:
            return True
        to = (rename or {}).get("to") or {}
        names = [ns.coll] + ([str(to["coll"])] if to.get("coll") and to.get("db", ns.db) == ns.db else [])
        return any(self.selected(n) for n in names)

    def _skip(self, ns: Namespace) -> None:
        coll = ns.coll or ""
        if coll not in self.skipped:
            log.info("collection %s is outside the source's selection: its change events are skipped", ns.qualified)
        self.skipped[coll] = self.skipped.get(coll, 0) + 1

    def _row_event(self, doc: Mapping[str, Any], op: OperationType, ns: Namespace, base: dict[str, Any]) -> ChangeEvent:
        key = doc.get("documentKey") or {}
        full = doc.get("fullDocument")
        if "_id" not in key:
            key = compat.key_from_full_document(doc) or key
        if "_id" not in key:
            ts = unpack_cluster_time(base["commit_lsn"])
            raise UnmappableEventError(
                f"{op} event on {ns.qualified} at clusterTime {ts.time}.{ts.inc} has no documentKey._id and no "
                "fullDocument, so it cannot be keyed (the document was probably deleted before the event was "
                "read, on a server that does not put the _id in documentKey: MongoDB itself always does). Nothing "
                "from it on is acknowledged, and ingest will not skip it silently. Recover by capturing the "
                "database as a new source (a new `name`: it starts at the current cluster time and snapshots every "
                "collection), then retire this source's rows"
            )
        before = doc.get("fullDocumentBeforeChange")
        action = ROW_ACTIONS[op]
        mask = self.masks.table(ns.coll) if ns.coll is not None else None
        if mask is not None:
            full = mask_document(full, mask, ns.qualified) if full is not None else None
            before = mask_document(before, mask, ns.qualified) if before is not None else None
        record = ext_json(full) if full is not None and action != Action.DELETE else None
        if before is not None:
            old_record: str | None = ext_json(before)
        elif action == Action.DELETE:
            old_record = ext_json({"_id": key["_id"]})  # like a Postgres delete's key-only old tuple
        else:
            old_record = None
        prefix = content = None
        description = doc.get("updateDescription")
        if op == OperationType.UPDATE and description is not None:
            prefix = UPDATE_DESCRIPTION_PREFIX
            content = ext_json(
                {
                    "updatedFields": _mask_updated_fields(description.get("updatedFields", {}), mask, ns.qualified),
                    "removedFields": description.get("removedFields", []),
                    "truncatedArrays": description.get("truncatedArrays", []),
                }
            )
        return ChangeEvent(
            **base,
            action=action,
            table_schema=ns.db,
            table_name=ns.coll,
            record_pk=record_key(key["_id"]),
            record=record,
            old_record=old_record,
            message_prefix=prefix,
            message_content=content,
        )

    @staticmethod
    def _tombstone(
        base: dict[str, Any],
        ns: Namespace,
        tables: Sequence[Namespace],
        prefix: str | None = None,
        content: str | None = None,
    ) -> ChangeEvent:
        first = tables[0] if tables else ns
        return ChangeEvent(
            **base,
            action=Action.TRUNCATE,
            table_schema=first.db,
            table_name=first.coll,
            truncated_tables=tuple(t.qualified for t in tables),
            message_prefix=prefix,
            message_content=content,
        )


def _commit_ts_us(doc: Mapping[str, Any], lsn: int) -> int:
    """`wallTime` (MongoDB >= 6.0) in epoch microseconds, else the clusterTime's seconds."""
    wall = doc.get("wallTime")
    if isinstance(wall, datetime):
        wall = wall if wall.tzinfo else wall.replace(tzinfo=UTC)
        return (wall - EPOCH) // timedelta(microseconds=1)
    return (lsn >> INCREMENT_BITS) * 1_000_000
