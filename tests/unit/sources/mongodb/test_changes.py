"""ChangeMapper over manual-shaped change events: every operationType, transactions, positions, JSON."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

import bson
import pytest
from bson import (
    Binary,
    Code,
    DBRef,
    Decimal128,
    Int64,
    MaxKey,
    MinKey,
    ObjectId,
    Regex,
)
from bson.timestamp import Timestamp

from ingest.errors import UnmappableEventError
from ingest.events import Action
from ingest.sources.mongodb.changes import (
    RENAME_PREFIX,
    UPDATE_DESCRIPTION_PREFIX,
    ChangeMapper,
    Namespace,
    ext_json,
    from_ext_json,
    pack_cluster_time,
    record_key,
    resume_token_position,
    unpack_cluster_time,
)
from tests.unit.sources.mongodb.documents import (
    DB,
    LSID,
    OID,
    OTHER_LSID,
    T0,
    delete,
    event,
    in_txn,
    insert,
    replace,
    token,
    update,
)

DB_SCOPE = Namespace(DB, None)


def mapper(known: tuple[str, ...] = ("orders",)) -> ChangeMapper:
    return ChangeMapper(DB_SCOPE, known)


def test_cluster_time_packs_seconds_high_and_increment_low() -> None:
    assert pack_cluster_time(Timestamp(1, 0)) == 1 << 32
    assert pack_cluster_time(Timestamp(T0, 7)) == (T0 << 32) | 7
    assert unpack_cluster_time((T0 << 32) | 7) == Timestamp(T0, 7)
    # Order of packed positions is the order of cluster times (seconds first, then increment).
    assert pack_cluster_time(Timestamp(T0, 0xFFFFFFFF)) < pack_cluster_time(Timestamp(T0 + 1, 0))


def test_resume_token_position_reads_the_cluster_time_prefix() -> None:
    assert resume_token_position(token(T0, 5)) == (T0 << 32) | 5
    assert resume_token_position({"_data": "82" + "65F0A1B2" + "00000001"}) == (0x65F0A1B2 << 32) | 1
    # Not decodable: a v0 (BinData) token, a foreign format, a truncated one, no token.
    assert resume_token_position({"_data": Binary(b"\x82abc")}) is None
    assert resume_token_position({"_data": "6b02a05d0000000c"}) is None
    assert resume_token_position({"_data": "8265F0"}) is None
    assert resume_token_position(None) is None


def test_insert_maps_to_insert_with_canonical_key_and_document() -> None:
    doc = {"_id": OID, "qty": 3, "price": Decimal128("19.99")}
    ev = mapper().feed(insert(T0, 1, doc)).event
    assert ev is not None
    assert ev.action == Action.INSERT
    assert (ev.commit_lsn, ev.commit_index) == ((T0 << 32) | 1, 0)
    assert ev.xid == ev.commit_lsn
    assert (ev.table_schema, ev.table_name) == (DB, "orders")
    assert ev.record_pk == '{"_id":{"$oid":"64f0a1b2c3d4e5f601234567"}}'
    assert json.loads(ev.record or "") == {
        "_id": {"$oid": "64f0a1b2c3d4e5f601234567"},
        "qty": {"$numberInt": "3"},
        "price": {"$numberDecimal": "19.99"},
    }
    assert ev.old_record is None and ev.message_prefix is None
    assert ev.commit_ts_us == T0 * 1_000_000 + 123_000  # wallTime, to the millisecond


def test_commit_time_falls_back_to_cluster_time_seconds_without_wall_time() -> None:
    doc = insert(T0, 1, {"_id": 1})
    del doc["wallTime"]
    ev = mapper().feed(doc).event
    assert ev is not None and ev.commit_ts_us == T0 * 1_000_000


def test_update_keeps_post_image_and_update_description() -> None:
    doc = {"_id": 7, "status": "shipped", "items": [1]}
    description = {
        "updatedFields": {"status": "shipped", "items.0": 1},
        "removedFields": ["note"],
        "truncatedArrays": [{"field": "items", "newSize": 1}],
    }
    ev = mapper().feed(update(T0, 2, doc, 7, updateDescription=description)).event
    assert ev is not None and ev.action == Action.UPDATE
    assert json.loads(ev.record or "")["status"] == "shipped"
    assert ev.old_record is None  # no pre-image asked for
    assert ev.message_prefix == UPDATE_DESCRIPTION_PREFIX
    assert json.loads(ev.message_content or "") == {
        "updatedFields": {"status": "shipped", "items.0": {"$numberInt": "1"}},
        "removedFields": ["note"],
        "truncatedArrays": [{"field": "items", "newSize": {"$numberInt": "1"}}],
    }


def test_update_with_pre_image_puts_it_in_old_record() -> None:
    before = {"_id": 7, "status": "new", "note": "x"}
    after = {"_id": 7, "status": "shipped"}
    ev = mapper().feed(update(T0, 2, after, 7, fullDocumentBeforeChange=before)).event
    assert ev is not None
    assert from_ext_json(ev.old_record or "") == before
    assert from_ext_json(ev.record or "") == after


def test_update_whose_lookup_found_nothing_has_no_record() -> None:
    """updateLookup returns null when the document was deleted since: the later delete decides."""
    ev = mapper().feed(update(T0, 2, None, 7)).event
    assert ev is not None and ev.action == Action.UPDATE and ev.record is None
    assert ev.record_pk == '{"_id":{"$numberInt":"7"}}'


def test_replace_is_an_update_with_the_whole_document_and_no_description() -> None:
    ev = mapper().feed(replace(T0, 3, {"_id": "k", "a": True})).event
    assert ev is not None and ev.action == Action.UPDATE
    assert from_ext_json(ev.record or "") == {"_id": "k", "a": True}
    assert ev.message_prefix is None and ev.message_content is None


def test_delete_keeps_the_key_as_old_record_or_the_pre_image() -> None:
    ev = mapper().feed(delete(T0, 4, OID)).event
    assert ev is not None and ev.action == Action.DELETE and ev.record is None
    assert ev.old_record == ev.record_pk == record_key(OID)
    before = {"_id": OID, "qty": Int64(5)}
    ev2 = mapper().feed(delete(T0, 5, OID, fullDocumentBeforeChange=before)).event
    assert ev2 is not None and from_ext_json(ev2.old_record or "") == before


def test_transaction_events_share_commit_lsn_and_count_from_zero() -> None:
    m = mapper()
    txn = in_txn(LSID, 3)
    docs = [
        insert(T0, 10, {"_id": 1}, **txn, txnOpIndex=0),
        update(T0, 10, {"_id": 1, "v": 2}, 1, **txn),
        delete(T0, 10, 1, **txn),
        insert(T0, 10, {"_id": 1, "v": 3}, **txn),  # insert -> delete -> insert of one key: four events
        insert(T0, 11, {"_id": 2}),  # next event, outside a transaction
        insert(T0, 12, {"_id": 3}, **in_txn(LSID, 4)),  # the session's next transaction
        insert(T0, 12, {"_id": 4}, **in_txn(LSID, 4)),
    ]
    positions = [ev.position for d in docs if (ev := m.feed(d).event) is not None]
    lsn = T0 << 32
    assert positions == [
        (lsn | 10, 0),
        (lsn | 10, 1),
        (lsn | 10, 2),
        (lsn | 10, 3),
        (lsn | 11, 0),
        (lsn | 12, 0),
        (lsn | 12, 1),
    ]
    assert len(set(positions)) == len(positions)


def test_two_transactions_at_one_cluster_time_get_distinct_positions() -> None:
    """D3: two sessions' transactions sharing a clusterTime (sharded, or 8.0+) both got (T, 0): silver kept one."""
    m = mapper()
    a = m.feed(insert(T0, 10, {"_id": 1}, **in_txn(LSID, 1))).event
    b = m.feed(insert(T0, 10, {"_id": 2}, **in_txn(OTHER_LSID, 1))).event
    c = m.feed(insert(T0, 10, {"_id": 3}, **in_txn(LSID, 2))).event
    assert a is not None and b is not None and c is not None
    assert [e.position for e in (a, b, c)] == [(T0 << 32 | 10, 0), (T0 << 32 | 10, 1), (T0 << 32 | 10, 2)]


def test_batched_writes_without_a_transaction_get_distinct_indexes() -> None:
    """Batched multi-deletes (6.1+) share one applyOps clusterTime with no lsid: no position may repeat."""
    m = mapper()
    evs = [m.feed(delete(T0, 20, k, op_index=k)).event for k in range(3)]
    assert [e.commit_index for e in evs if e is not None] == [0, 1, 2]


def test_drop_tombstones_the_collection_like_a_truncate() -> None:
    ev = mapper().feed(event("drop", T0, 30)).event
    assert ev is not None and ev.action == Action.TRUNCATE
    assert ev.truncated_tables == ("shop.orders",)
    assert (ev.table_schema, ev.table_name) == (DB, "orders")
    assert ev.record is None and ev.record_pk is None


def test_rename_tombstones_the_old_name_and_reports_the_new_one() -> None:
    m = mapper(("orders",))
    mapped = m.feed(event("rename", T0, 31, "orders", to={"db": DB, "coll": "orders_2024"}))
    assert mapped.event is not None and mapped.event.action == Action.TRUNCATE
    assert mapped.event.truncated_tables == ("shop.orders",)
    assert mapped.event.message_prefix == RENAME_PREFIX
    assert json.loads(mapped.event.message_content or "") == {"to": {"db": DB, "coll": "orders_2024"}}
    assert mapped.renamed_to == Namespace(DB, "orders_2024")
    assert "orders" not in m.known


def test_drop_database_tombstones_every_collection_known() -> None:
    m = mapper(("orders", "customers"))
    m.feed(insert(T0, 1, {"_id": 1}, coll="audit"))
    ev = m.feed(event("dropDatabase", T0, 40, coll=None, ns={"db": DB})).event
    assert ev is not None and ev.action == Action.TRUNCATE
    assert ev.truncated_tables == ("shop.audit", "shop.customers", "shop.orders")


def test_invalidate_of_a_collection_stream_tombstones_it_and_says_reopen() -> None:
    m = ChangeMapper(Namespace(DB, "orders"))
    drop = m.feed(event("drop", T0, 50))
    inv = m.feed(event("invalidate", T0, 50, coll=None))
    assert drop.event is not None and not drop.invalidated
    assert inv.invalidated and inv.event is not None
    assert inv.event.truncated_tables == ("shop.orders",)
    assert inv.event.position == (drop.event.commit_lsn, 1)  # same clusterTime as the drop: next index
    assert inv.token == token(T0, 50)


def test_collection_stream_without_ns_uses_its_collection() -> None:
    """mongo-java-server sends no `ns`: a collection stream's events belong to its collection."""
    doc = insert(T0, 1, {"_id": 1})
    del doc["ns"]
    ev = ChangeMapper(Namespace(DB, "items")).feed(doc).event
    assert ev is not None and (ev.table_schema, ev.table_name) == (DB, "items")


def test_unknown_operation_type_is_skipped_but_counted(caplog: pytest.LogCaptureFixture) -> None:
    m = mapper()
    skipped = m.feed(event("createIndexes", T0, 60))
    assert skipped.event is None
    assert "createIndexes" in caplog.text


def test_event_without_cluster_time_is_refused() -> None:
    doc = insert(T0, 1, {"_id": 1})
    del doc["clusterTime"]
    with pytest.raises(UnmappableEventError, match="clusterTime"):
        mapper().feed(doc)


EVERY_TYPE = {
    "_id": ObjectId("64f0a1b2c3d4e5f601234567"),
    "int32": 42,
    "int64": Int64(1 << 40),
    "double": 1.5,
    "nan": float("nan"),
    "decimal": Decimal128("1234567890.123456789012345678"),
    "string": "héllo \u2603",
    "bool": False,
    "null": None,
    "date": datetime(2024, 2, 29, 23, 59, 59, 999000, tzinfo=UTC),
    "old_date": datetime(1901, 1, 1, tzinfo=UTC),
    "binary": Binary(b"\x00\xffbytes", 0),
    "uuid": Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 4),
    "timestamp": Timestamp(T0, 9),
    "regex": Regex("^a.*z$", "im"),
    "min": MinKey(),
    "max": MaxKey(),
    "code": Code("function () { return 1; }"),
    "ref": DBRef("customers", ObjectId("64f0a1b2c3d4e5f601234568")),
    "nested": {"a": {"b": [1, {"c": Int64(2)}]}, "empty": {}},
    "array": [1, "two", 3.0, None, [Decimal128("4")]],
}


def test_every_bson_type_round_trips_through_canonical_extended_json() -> None:
    ev = mapper().feed(insert(T0, 1, EVERY_TYPE)).event
    assert ev is not None and ev.record is not None
    back = from_ext_json(ev.record)
    nan = back.pop("nan")
    assert nan != nan  # NaN survives as {"$numberDouble": "NaN"}
    expected = {k: v for k, v in EVERY_TYPE.items() if k != "nan"}
    assert bson.encode(back) == bson.encode(expected)  # byte-identical BSON: every type and value kept
    assert list(back) == [k for k in EVERY_TYPE if k != "nan"]  # field order kept
    assert isinstance(back["int64"], Int64) and isinstance(back["int32"], int)
    assert isinstance(back["decimal"], Decimal128)
    assert back["date"].tzinfo is not None


def test_canonical_json_spells_each_type_explicitly() -> None:
    text = ext_json(EVERY_TYPE)
    for marker in (
        '"int32":{"$numberInt":"42"}',
        '"int64":{"$numberLong":"1099511627776"}',
        '"double":{"$numberDouble":"1.5"}',
        '"nan":{"$numberDouble":"NaN"}',
        '"decimal":{"$numberDecimal":"1234567890.123456789012345678"}',
        '"date":{"$date":{"$numberLong":"1709251199999"}}',
        '"old_date":{"$date":{"$numberLong":"-2177452800000"}}',
        '"binary":{"$binary":{"base64":"AP9ieXRlcw==","subType":"00"}}',
        '"uuid":{"$binary":{"base64":"EjRWeBI0VngSNFZ4EjRWeA==","subType":"04"}}',
        f'"timestamp":{{"$timestamp":{{"t":{T0},"i":9}}}}',
        '"regex":{"$regularExpression":{"pattern":"^a.*z$","options":"im"}}',
        '"min":{"$minKey":1}',
        '"max":{"$maxKey":1}',
    ):
        assert marker in text, marker
    assert not re.search(r":\s\S", text)  # compact


def test_record_key_is_stable_text_for_equal_ids() -> None:
    assert record_key(Int64(5)) != record_key(5)  # different BSON types are different keys
    assert record_key({"a": 1, "b": 2}) == '{"_id":{"a":{"$numberInt":"1"},"b":{"$numberInt":"2"}}}'
    assert record_key(OID) == record_key(ObjectId(str(OID)))
