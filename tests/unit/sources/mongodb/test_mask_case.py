"""A MongoDB field named like a rule except for case is refused before any of its document is written."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.errors import SourceError
from ingest.masking import MaskWith, SourceMasks, TableMask
from ingest.sources.mongodb.changes import ChangeMapper, Namespace, mask_document
from tests.unit.sources.mongodb.documents import DB, T0, insert, update

SECRET = "a@example.org"
MASKS = SourceMasks({"people": TableMask(frozenset(), frozenset({"Email"}), MaskWith.HASH, b"mongo-salt-0123456789")})
REFUSED = r"collection shop\.people: a document has field 'email', which mask_columns names only as 'Email'"


def _feed(doc: dict[str, Any]) -> None:
    ChangeMapper(Namespace(DB, None), ("people", "orders"), MASKS).feed(doc)


def test_an_insert_carrying_the_field_is_refused() -> None:
    """The rule `Email` matched nothing in documents carrying `email`, whose values landed as they were."""
    with pytest.raises(SourceError, match=REFUSED):
        _feed(insert(T0, 1, {"_id": 1, "email": SECRET}, coll="people"))


def test_an_update_is_refused_by_its_document_its_pre_image_or_its_updated_fields() -> None:
    plain = {"_id": 1, "n": 1}
    with pytest.raises(SourceError, match=REFUSED):
        _feed(update(T0, 1, {"_id": 1, "email": SECRET}, 1, coll="people"))
    with pytest.raises(SourceError, match=REFUSED):
        _feed(update(T0, 1, plain, 1, coll="people", fullDocumentBeforeChange={"_id": 1, "email": SECRET}))
    description = {"updatedFields": {"email.home": SECRET}, "removedFields": [], "truncatedArrays": []}
    with pytest.raises(SourceError, match=REFUSED):
        _feed(update(T0, 1, None, 1, coll="people", updateDescription=description))


def test_a_snapshot_row_is_refused_and_exact_names_and_other_collections_pass() -> None:
    with pytest.raises(SourceError, match=REFUSED):
        mask_document({"_id": 1, "email": SECRET}, MASKS.table("people"), "shop.people")
    assert SECRET not in str(mask_document({"_id": 1, "Email": SECRET}, MASKS.table("people"), "shop.people"))
    _feed(insert(T0, 1, {"_id": 1, "email": SECRET}, coll="orders"))  # no rules there
