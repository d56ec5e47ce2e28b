"""Change-stream documents shaped as the MongoDB manual ("Change Events") and the driver spec show them.

Every document is what pymongo hands the capture: BSON types decoded, `_id` the resume token
(`_data` hex KeyString starting with the cluster time: 0x82, seconds, increment).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bson import Binary, Int64, ObjectId
from bson.timestamp import Timestamp

DB = "shop"
T0 = 1_700_000_000
# An lsid as the server reports it: the session UUID (binary subtype 4) and the user hash (subtype 0).
LSID = {"id": Binary(bytes(range(16)), 4), "uid": Binary(b"\x11" * 32, 0)}
OTHER_LSID = {"id": Binary(bytes(range(16, 32)), 4), "uid": Binary(b"\x11" * 32, 0)}


def token(t: int, i: int, op_index: int = 0) -> dict[str, str]:
    # v1 token: Timestamp (0x82 + 8 bytes), version, tokenType, txnOpIndex, fromInvalidate, uuid, documentKey
    return {"_data": f"82{t:08X}{i:08X}2B022C0100296E5A1004{op_index:04X}463C6B8F0B8D4E5A9D3F0A1B2C3D4E5F04"}


def event(op: str, t: int, i: int, coll: str | None = "orders", op_index: int = 0, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "_id": token(t, i, op_index),
        "operationType": op,
        "clusterTime": Timestamp(t, i),
        "wallTime": datetime.fromtimestamp(t, UTC).replace(microsecond=123000),
    }
    if coll is not None:
        doc["ns"] = {"db": DB, "coll": coll}
    doc.update(fields)
    return doc


def insert(t: int, i: int, doc: dict[str, Any], coll: str = "orders", **txn: Any) -> dict[str, Any]:
    return event("insert", t, i, coll, fullDocument=doc, documentKey={"_id": doc["_id"]}, **txn)


def update(t: int, i: int, doc: dict[str, Any] | None, key: Any, coll: str = "orders", **extra: Any) -> dict[str, Any]:
    extra.setdefault(
        "updateDescription",
        {"updatedFields": {"status": "shipped"}, "removedFields": ["note"], "truncatedArrays": []},
    )
    return event("update", t, i, coll, fullDocument=doc, documentKey={"_id": key}, **extra)


def replace(t: int, i: int, doc: dict[str, Any], coll: str = "orders", **extra: Any) -> dict[str, Any]:
    return event("replace", t, i, coll, fullDocument=doc, documentKey={"_id": doc["_id"]}, **extra)


def delete(t: int, i: int, key: Any, coll: str = "orders", **extra: Any) -> dict[str, Any]:
    return event("delete", t, i, coll, documentKey={"_id": key}, **extra)


def in_txn(lsid: dict[str, Any], txn_number: int) -> dict[str, Any]:
    return {"lsid": lsid, "txnNumber": Int64(txn_number)}


OID = ObjectId("64f0a1b2c3d4e5f601234567")
