"""A filtered snapshot's query filter: parsed from Extended JSON, joined with each page's `_id` range."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from bson import Int64, ObjectId
from pymongo.errors import OperationFailure

from ingest.config import MongoSource
from ingest.errors import ConfigError
from ingest.sources.mongodb.adapter import MongoAdapter
from ingest.sources.mongodb.filters import page_filter, parse_filter
from ingest.sources.mongodb.snapshot import filter_failed

OID = "65a1b2c3d4e5f60718293a4b"


def test_extended_json_values_become_their_bson_types_in_order() -> None:
    text = {"status": "open", "_id": {"$gte": {"$oid": OID}}, "at": {"$lt": {"$date": "2024-01-15T00:00:00Z"}}}
    where = parse_filter(json.dumps({**text, "n": {"$numberLong": "7"}}))
    assert list(where) == ["status", "_id", "at", "n"]
    assert where["_id"] == {"$gte": ObjectId(OID)}
    assert where["at"]["$lt"].replace(tzinfo=UTC) == datetime(2024, 1, 15, tzinfo=UTC)
    assert where["n"] == Int64(7) and isinstance(where["n"], Int64)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"status": "open"', "is not Extended JSON"),
        ("status = 'open'", "is not Extended JSON"),
        ('{"_id": {"$oid": "xyz"}}', "is not Extended JSON"),
        ('[{"status": "open"}]', "is a JSON array, not a query filter"),
        ("null", "is a JSON null, not a query filter"),
        ("3", "is a JSON number, not a query filter"),
    ],
)
def test_what_is_not_one_json_object_is_refused(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_filter(text)
    assert why in str(e.value) and "nothing was queued" in str(e.value)


def test_a_page_joins_the_filter_with_its_id_range() -> None:
    where = {"status": "open", "_id": {"$gte": 4}}
    assert page_filter(None, None) == {}
    assert page_filter(None, 9) == {"_id": {"$gt": 9}}  # an unfiltered page: the shape it always had
    assert page_filter(where, None) == where
    # joined by $and: the filter's own _id condition narrows the range, never replaces it
    assert page_filter(where, 9) == {"$and": [where, {"_id": {"$gt": 9}}]}


def test_only_a_failure_that_is_not_transient_is_the_filters() -> None:
    assert filter_failed(OperationFailure("can't $divide by zero", 16608))
    assert filter_failed(OperationFailure("unknown operator: $bogus", 2))
    assert not filter_failed(OperationFailure("snapshot too old", 239))
    assert not filter_failed(OperationFailure("interrupted due to repl state change", 11602))


def test_a_mongodb_source_refuses_a_sql_predicate_before_reaching_the_server() -> None:
    """The SQL predicate a Postgres table takes is not a filter here: refused, and no server is asked."""
    src = MongoSource(kind="mongodb", name="m", uri="mongodb://127.0.0.1:1", database="d")
    with pytest.raises(ConfigError, match="is not Extended JSON"):
        MongoAdapter(src).request_snapshot(None, "d.c", "x > 1")  # type: ignore[arg-type]
