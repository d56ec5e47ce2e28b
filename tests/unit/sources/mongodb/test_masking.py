"""ChangeMapper and the snapshot's document rule with excluded and masked fields (issue 17)."""

from __future__ import annotations

import json

from bson import Int64

from ingest.events import Action
from ingest.masking import MaskWith, SourceMasks, TableMask, mask_hash
from ingest.sources.mongodb.changes import ChangeMapper, Namespace, ext_json, mask_document
from tests.unit.sources.mongodb.documents import DB, T0, delete, insert, update

SALT = b"mongo-salt-0123456789"
MASKS = SourceMasks({"people": TableMask(frozenset({"ssn"}), frozenset({"email", "card"}), MaskWith.HASH, SALT)})
DOC = {"_id": 1, "name": "a", "ssn": "123-45-6789", "email": "a@example.org", "card": Int64(4111), "n": None}


def _mapper() -> ChangeMapper:
    return ChangeMapper(Namespace(DB, None), ("people", "orders"), MASKS)


def _no_plaintext(*texts: str | None) -> None:
    for text in texts:
        if text is not None:
            assert "123-45-6789" not in text and "a@example.org" not in text and "4111" not in text


def test_insert_record_drops_excluded_and_hashes_masked_fields() -> None:
    ev = _mapper().feed(insert(T0, 1, DOC, coll="people")).event
    assert ev is not None and ev.action is Action.INSERT
    record = json.loads(ev.record or "")
    assert list(record) == ["_id", "name", "email", "card", "n"]  # field order kept, ssn gone
    assert record["email"] == mask_hash(SALT, b"a@example.org")  # a string: its text, as Postgres hashes it
    assert record["card"] == mask_hash(SALT, ext_json(Int64(4111)).encode())
    assert record["n"] is None
    assert ev.record_pk == '{"_id":{"$numberInt":"1"}}'
    _no_plaintext(ev.record)


def test_update_pre_image_and_updated_fields_are_masked_too() -> None:
    doc = update(
        T0,
        1,
        DOC,
        1,
        coll="people",
        fullDocumentBeforeChange=DOC,
        updateDescription={
            "updatedFields": {"ssn": "123-45-6789", "email": "a@example.org", "card.x": Int64(4111), "name": "b"},
            "removedFields": ["ssn"],
            "truncatedArrays": [],
        },
    )
    ev = _mapper().feed(doc).event
    assert ev is not None
    before = json.loads(ev.old_record or "")
    assert "ssn" not in before and before["email"] == mask_hash(SALT, b"a@example.org")
    fields = json.loads(ev.message_content or "")["updatedFields"]
    assert fields == {
        "email": mask_hash(SALT, b"a@example.org"),
        "card.x": mask_hash(SALT, ext_json(Int64(4111)).encode()),
        "name": "b",
    }
    _no_plaintext(ev.record, ev.old_record, ev.message_content)


def test_delete_keeps_the_key_and_other_collections_are_untouched() -> None:
    m = _mapper()
    ev = m.feed(delete(T0, 1, 1, coll="people", fullDocumentBeforeChange=DOC)).event
    assert ev is not None and "ssn" not in json.loads(ev.old_record or "")
    _no_plaintext(ev.old_record)
    other = m.feed(insert(T0, 2, DOC, coll="orders")).event
    assert other is not None and json.loads(other.record or "")["ssn"] == "123-45-6789"


def test_snapshot_rows_follow_the_same_rule() -> None:
    mask = MASKS.table("people")
    snapshot_row = ext_json(mask_document(DOC, mask, "db.people"))
    assert snapshot_row == _mapper().feed(insert(T0, 1, DOC, coll="people")).event.record  # type: ignore[union-attr]
    assert mask_document(DOC, None, "db.people") is DOC


def test_mask_with_null() -> None:
    masks = SourceMasks({"people": TableMask(frozenset(), frozenset({"email"}), MaskWith.NULL, None)})
    ev = ChangeMapper(Namespace(DB, None), (), masks).feed(insert(T0, 1, DOC, coll="people")).event
    assert ev is not None and json.loads(ev.record or "")["email"] is None
