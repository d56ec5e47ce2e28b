"""Which MongoDB rule changes re-snapshot a collection (ingest/sources/mongodb/rules.py)."""

from __future__ import annotations

from ingest.masking import MaskWith, SourceMasks, TableMask
from ingest.sources.mongodb.rules import newly_ruled, rules_now


def test_rules_now_lists_the_collections_with_rules() -> None:
    masks = SourceMasks(
        {
            "users": TableMask(frozenset({"ssn"}), frozenset({"phone", "email"}), MaskWith.NULL, None),
            "orders": TableMask(frozenset(), frozenset(), MaskWith.NULL, None),
        }
    )
    assert rules_now(masks, ["users", "orders", "users"]) == {"users": {"exclude": ["ssn"], "mask": ["email", "phone"]}}


def test_a_field_newly_masked_or_excluded_asks_for_a_snapshot() -> None:
    before = {"users": {"exclude": ["ssn"], "mask": ["email"]}}
    now = {
        "users": {"exclude": ["ssn", "dob"], "mask": ["email", "phone"]},
        "orders": {"exclude": [], "mask": ["card"]},
    }
    assert newly_ruled(before, now) == {"users": ["dob", "phone"], "orders": ["card"]}


def test_unruling_or_moving_between_lists_asks_for_nothing() -> None:
    before = {"users": {"exclude": ["ssn"], "mask": ["email"]}}
    assert newly_ruled(before, {"users": {"exclude": ["ssn", "email"], "mask": []}}) == {}
    assert newly_ruled(before, {}) == {}
    assert newly_ruled(before, before) == {}
