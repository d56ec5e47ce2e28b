"""MongoDB collection patterns and exclusions: config, matching, and what the stream keeps (no server).

mongo-java-server delivers no events on a database-wide stream and no rename events: the loop is
fed change documents shaped as the MongoDB manual describes them (tests/unit/sources/mongodb/documents.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from ingest.config import MongoSource, parse_config
from ingest.errors import ConfigError
from ingest.events import Action
from ingest.ops.lineage import datasets
from ingest.sources.mongodb import capture
from ingest.sources.mongodb.adapter import MongoAdapter
from ingest.sources.mongodb.changes import ChangeMapper, Namespace, record_key
from ingest.sources.mongodb.source import collections, scope, selected, unmatched_patterns
from tests.unit.sources.mongodb.documents import T0, event, insert
from tests.unit.sources.mongodb.test_capture import run_loop

GOOD = """
sources:
  - name: docs
    kind: mongodb
    uri: mongodb://h
    database: shop
"""


def source(**extra: Any) -> MongoSource:
    base: dict[str, Any] = {"kind": "mongodb", "name": "m", "uri": "mongodb://h", "database": "shop"}
    return MongoSource(**{**base, **extra})


class FakeClient:
    """`client[db].list_collection_names()` over fixed names."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __getitem__(self, db: str) -> FakeClient:
        return self

    def list_collection_names(self) -> list[str]:
        return list(self.names)


# -- config ----------------------------------------------------------------------------------


def test_patterns_and_exclusions_parse() -> None:
    text = GOOD + '    collections: ["orders_*", products, "\\"odd*name\\""]\n    exclude: ["orders_tmp", "*_old"]\n'
    src = parse_config(text).source("docs")
    assert isinstance(src, MongoSource)
    assert src.exclude == ["orders_tmp", "*_old"]
    sel = src.selection
    assert sel.has_patterns and sel.named == ["products", "odd*name"]
    assert sel.matches(("orders_eu",)) and not sel.matches(("orders_tmp",)) and not sel.matches(("orders_eu_old",))
    assert sel.matches(("odd*name",)) and not sel.matches(("oddXname",))  # quoted: literal star
    assert not sel.matches(("Orders_eu",))  # case-exact


def test_no_collections_is_every_collection_less_the_exclusions() -> None:
    src = parse_config(GOOD + '    exclude: ["tmp_*"]\n').source("docs")
    assert isinstance(src, MongoSource)
    assert src.collections is None
    assert selected(src, "anything") and not selected(src, "tmp_1") and not selected(src, "system.views")


def test_columns_of_a_quoted_name_with_a_star() -> None:
    text = GOOD + '    collections: ["\\"odd*\\"", "orders_*"]\n    columns:\n      "odd*": {exclude_columns: [x]}\n'
    src = parse_config(text).source("docs")
    assert isinstance(src, MongoSource) and set(src.columns) == {"odd*"}


def test_columns_may_name_a_collection_a_pattern_matches() -> None:
    text = GOOD + '    collections: ["orders_*"]\n    columns:\n      orders_eu: {mask_columns: [email]}\n'
    src = parse_config(text.replace("uri: mongodb://h", "uri: mongodb://h\n    mask_with: 'null'")).source("docs")
    assert isinstance(src, MongoSource)
    assert set(src.columns) == {"orders_eu"}


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (
            '    collections: ["orders_*"]\n    columns:\n      products: {exclude_columns: [x]}\n',
            r"sources\.0: .*columns: products is not one of the source's collections \(nor matched by them\)",
        ),
        (
            '    collections: ["orders_*"]\n    exclude: [orders_eu]\n'
            "    columns:\n      orders_eu: {exclude_columns: [x]}\n",
            r"columns: orders_eu is not one of",
        ),
        ("    collections: [orders]\n    exclude: [orders]\n", r"exclude: orders is listed and also excluded"),
        (
            '    collections: ["orders_*"]\n    columns:\n      "orders_*": {exclude_columns: [x]}\n',
            r"columns: orders_\* is a pattern; column rules name collections",
        ),
        (
            '    collections: [{name: "orders_*", exclude_columns: [x]}]\n',
            r"columns: orders_\* is a pattern",
        ),
        ('    collections: ["system.*"]\n', r"sources\.0\.collections: .*not a capturable"),
        ('    collections: ["a$*"]\n', r"sources\.0\.collections: .*not a capturable"),
        ('    collections: ["\\"\\""]\n', r"sources\.0\.collections: .*empty name part"),
        ('    exclude: ["\\"a\\"b\\""]\n', r"sources\.0\.exclude: .*double quote"),
        ("    exclude: [system.views]\n", r"sources\.0\.exclude: .*not a capturable"),
    ],
)
def test_errors_name_the_key(extra: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_config(GOOD + extra)


# -- matching against the database -------------------------------------------------------------


def test_scope_is_the_database_for_a_pattern() -> None:
    assert scope(source(collections=["orders_*"])).coll is None
    assert scope(source(collections=['"orders*"'])).coll == "orders*"  # one literal name
    assert scope(source(collections=["orders"], exclude=["tmp_*"])).coll == "orders"


def test_collections_resolve_against_the_database() -> None:
    client = FakeClient(["orders_us", "orders_eu", "orders_tmp", "products", "system.views", "Orders_x"])
    src = source(collections=["orders_*", "later"], exclude=["orders_tmp"])
    assert collections(client, src) == ["later", "orders_eu", "orders_us"]  # type: ignore[arg-type]
    assert collections(client, source(exclude=["orders_*"])) == ["Orders_x", "products"]  # type: ignore[arg-type]
    # Names only: the database is not listed (a client that cannot list is not asked).
    assert collections(None, source(collections=["b", "a"])) == ["b", "a"]  # type: ignore[arg-type]


def test_a_pattern_matching_nothing_is_reported_not_refused() -> None:
    src = source(collections=["orders_*", "events_*"], exclude=["events_tmp"])
    assert unmatched_patterns(src, ["orders_eu", "events_tmp"]) == ["events_*"]
    assert unmatched_patterns(source(), []) == []


def test_the_adapter_captures_what_the_selection_matches() -> None:
    adapter = MongoAdapter(source(collections=["orders_*"], exclude=["orders_tmp"]))
    assert adapter.captures("shop.orders_new") and not adapter.captures("shop.orders_tmp")
    assert not adapter.captures("shop.products") and not adapter.captures("other.orders_eu")


def test_lineage_names_collections_or_the_database() -> None:
    named = datasets(source(collections=["a", "b"]), "/w").inputs
    assert [d.name for d in named] == ["shop.a", "shop.b"]
    assert [d.name for d in datasets(source(collections=["orders_*"]), "/w").inputs] == ["shop"]
    assert [d.name for d in datasets(source(), "/w").inputs] == ["shop"]


# -- what the stream keeps ---------------------------------------------------------------------


def mapper() -> ChangeMapper:
    src = source(collections=["orders_*"], exclude=["orders_tmp"])
    return ChangeMapper(Namespace("shop", None), ["orders_eu"], None, lambda c: selected(src, c))


def test_events_of_collections_outside_the_selection_are_skipped_and_counted() -> None:
    m = mapper()
    assert m.feed(insert(T0, 1, {"_id": 1}, coll="products")).event is None
    assert m.feed(insert(T0, 2, {"_id": 1}, coll="orders_tmp")).event is None
    assert m.feed(event("drop", T0, 3, "products")).event is None
    kept = m.feed(insert(T0, 4, {"_id": 1}, coll="orders_new"))
    assert kept.event is not None and kept.event.table_name == "orders_new"
    assert m.skipped == {"products": 2, "orders_tmp": 1}
    assert m.known == {"orders_eu", "orders_new"}  # what a dropDatabase tombstones


def test_renames_across_the_selection() -> None:
    m = mapper()
    into = m.feed(event("rename", T0, 1, "staging", to={"db": "shop", "coll": "orders_x"}))
    assert into.renamed_to == Namespace("shop", "orders_x")
    out = m.feed(event("rename", T0, 2, "orders_eu", to={"db": "shop", "coll": "archive"}))
    assert out.event is not None and out.event.action == Action.TRUNCATE
    assert out.event.truncated_tables == ("shop.orders_eu",)  # leaving the selection: tombstoned as before
    assert m.feed(event("rename", T0, 3, "a", to={"db": "shop", "coll": "b"})).event is None
    across = m.feed(event("rename", T0, 4, "staging", to={"db": "other", "coll": "orders_y"}))
    assert across.event is None  # into another database: not this source's


def test_a_collection_created_while_streaming_is_kept_from_its_first_insert(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database-wide stream of a pattern: the new collection's inserts carry whole documents, no snapshot."""
    monkeypatch.setattr(capture, "collections", lambda client, src: ["orders_eu"])
    src = source(collections=["orders_*"], exclude=["orders_tmp"])
    script = [
        insert(T0, 1, {"_id": 1}, coll="orders_eu"),
        insert(T0, 2, {"_id": 1, "v": "first"}, coll="orders_new"),
        insert(T0, 3, {"_id": 9}, coll="products"),
        insert(T0, 4, {"_id": 2}, coll="orders_new"),
        insert(T0, 5, {"_id": 3}, coll="orders_tmp"),
    ]
    cap, c = run_loop(script, src=src)
    kept = [(e.table_name, e.record_pk) for b in c.batches for e in b.events]
    assert kept == [("orders_eu", record_key(1)), ("orders_new", record_key(1)), ("orders_new", record_key(2))]
    assert cap._snapshots.empty()
    # The skipped events still move the stored position (their tokens are the stream's).
    assert c.batches[-1].durable_lsn == (T0 << 32) | 5


def test_a_collection_renamed_into_the_selection_is_snapshotted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "collections", lambda client, src: [])
    src = source(collections=["orders_*"])
    requested: list[str] = []
    monkeypatch.setattr(capture, "request_snapshot", lambda src, client, writer, coll: requested.append(coll))
    script = [event("rename", T0, 7, "tmp.agg_out.1", to={"db": "shop", "coll": "orders_2026"})]
    run_loop(script, src=src)
    assert requested == ["orders_2026"]


def test_skipped_events_are_counted_for_the_run_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "collections", lambda client, src: [])
    src = source(collections=["orders_*"])
    script = [insert(T0, 1, {"_id": 1}, coll="products"), insert(T0, 2, {"_id": 2}, coll="products")]
    cap, _ = run_loop(script, src=src)
    assert cap.out_of_scope == 2


def test_a_collection_renamed_into_the_selection_is_known_to_a_drop_database() -> None:
    m = mapper()
    m.feed(event("rename", T0, 1, "staging", to={"db": "shop", "coll": "orders_x"}))
    dropped = m.feed(event("dropDatabase", T0, 2, None, ns={"db": "shop"}))
    assert dropped.event is not None
    assert dropped.event.truncated_tables == ("shop.orders_eu", "shop.orders_x")
