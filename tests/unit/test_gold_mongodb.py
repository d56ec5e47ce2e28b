"""`gold generate` for MongoDB: field paths and BSON types from documents in canonical Extended JSON.

The documents are shaped as the MongoDB manual's canonical Extended JSON v2 (the form bronze and
silver hold, docs/bronze.md): hand-written in the manual's examples, and produced by pymongo's
json_util from BSON values. The end-to-end tests write a consumer_records Delta table with delta-rs.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp, json_util
from deltalake import write_deltalake
from jinja2 import Environment

from ingest import cli
from ingest.gold_mongodb import (
    CollectionShape,
    MongoColumn,
    bson_type,
    diff,
    model_of,
    previous_columns,
    render_sql,
    render_yml,
)

CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True, tzinfo=dt.UTC)


def canonical(doc: dict[str, Any]) -> dict[str, Any]:
    """A BSON document as silver holds it: canonical Extended JSON text, parsed."""
    parsed: dict[str, Any] = json.loads(json_util.dumps(doc, json_options=CANONICAL))
    return parsed


def shape(docs: list[dict[str, Any]], depth: int = 1) -> CollectionShape:
    s = CollectionShape("docs", "shop", "products", depth)
    for d in docs:
        s.observe(d)
    return s


def columns(docs: list[dict[str, Any]], depth: int = 1) -> dict[str, MongoColumn]:
    return {c.output_name: c for c in model_of(shape(docs, depth)).columns}


def types(docs: list[dict[str, Any]], depth: int = 1) -> dict[str, str]:
    return {name: c.spark_type for name, c in columns(docs, depth).items()}


def test_every_canonical_wrapper_of_the_manual_is_its_bson_type() -> None:
    # the MongoDB manual's "MongoDB Extended JSON (v2)" canonical examples
    manual = {
        "objectId": {"$oid": "5d505646cf6d4fe581014ab2"},
        "date": {"$date": {"$numberLong": "1565546054692"}},
        "decimal": {"$numberDecimal": "9823.1297"},
        "double": {"$numberDouble": "-Infinity"},
        "int": {"$numberInt": "10"},
        "long": {"$numberLong": "50"},
        "binData": {"$binary": {"base64": "yO2rw/c4TKO2jauSqRR4ow==", "subType": "04"}},
        "regex": {"$regularExpression": {"pattern": "^H", "options": "i"}},
        "timestamp": {"$timestamp": {"t": 1565545664, "i": 1}},
        "minKey": {"$minKey": 1},
        "maxKey": {"$maxKey": 1},
        "javascript": {"$code": "function() {}"},
        "symbol": {"$symbol": "sym"},
        "array": [{"$numberInt": "1"}],
        "null": None,
        "bool": True,
        "string": "x",
    }
    assert {bson_type(v): k for k, v in manual.items()} == {k: k for k in manual}
    # a DBRef is a document by convention, and so is any other $-keyed document
    assert bson_type({"$ref": "c", "$id": {"$oid": "5d505646cf6d4fe581014ab2"}}) == "object"
    assert bson_type({"a": {"$numberInt": "1"}}) == "object"
    # plain JSON numbers (relaxed form) are typed as the server stores them
    assert [bson_type(v) for v in (1, 2**31, 1.5, False)] == ["int", "long", "double", "bool"]


def test_one_type_per_field_maps_to_its_spark_type() -> None:
    docs = [
        canonical(
            {
                "_id": ObjectId("5d505646cf6d4fe581014ab2"),
                "name": "p1",
                "qty": 3,
                "views": Int64(1 << 40),
                "rating": 4.5,
                "price": Decimal128("12.99"),
                "in_stock": True,
                "added_at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                "tags": ["a", "b"],
                "blob": Binary(b"\x00\xff"),
                "pattern": Regex("^a", "i"),
                "ts": Timestamp(1565545664, 1),
                "code": Code("f()"),
                "lo": MinKey(),
                "hi": MaxKey(),
            }
        )
    ]
    assert types(docs) == {
        "_id": "objectid",
        "name": "string",
        "qty": "int",
        "views": "bigint",
        "rating": "double",
        "price": "decimal(38,2)",
        "in_stock": "boolean",
        "added_at": "timestamp",
        "tags": "json",
        "blob": "json",
        "pattern": "json",
        "ts": "json",
        "code": "json",
        "lo": "json",
        "hi": "json",
    }


def test_numbers_widen_and_null_or_absence_is_only_nullable() -> None:
    docs = [
        canonical({"a": 1, "b": 1, "c": Decimal128("1.5"), "d": None, "e": "x", "f": None}),
        canonical({"a": Int64(1 << 40), "b": 2.5, "c": 7, "e": None}),
        canonical({"a": 2, "b": Int64(3), "c": Decimal128("0.0001")}),  # e and f absent
    ]
    cols = columns(docs)
    assert {n: c.spark_type for n, c in cols.items()} == {
        "a": "bigint",  # int + long
        "b": "double",  # int + double + long
        "c": "decimal(38,4)",  # decimals and an int: the widest scale
        "d": "string",  # only ever null
        "e": "string",  # null beside string: a nullable string
        "f": "string",
    }
    assert not any(c.conflict for c in cols.values())
    assert cols["a"].seen == (("int", 2), ("long", 1))
    assert cols["e"].seen == (("null", 1), ("string", 1))


def test_decimals_that_do_not_fit_a_spark_decimal_stay_json() -> None:
    wide = Decimal128("123456789012345678901234567.1234567")  # 27 + 7 of Decimal128's 34 digits
    assert types([canonical({"x": wide}), canonical({"x": Decimal128("0.00000001")})]) == {"x": "decimal(38,8)"}
    big = Decimal128("1234567890123456789012345678901234")  # 34 integer digits beside a scale of 5: 39
    assert types([canonical({"x": big}), canonical({"x": Decimal128("0.00001")})]) == {"x": "json"}
    assert types([canonical({"x": Decimal128("1E+40")})]) == {"x": "json"}
    assert types([canonical({"x": Decimal128("NaN")}), canonical({"x": Decimal128("1")})]) == {"x": "json"}
    # a long (19 digits) beside a scale of 20 needs 39 digits
    cols = columns([canonical({"x": Int64(1)}), canonical({"x": Decimal128("0." + "0" * 19 + "1")})])
    assert (cols["x"].spark_type, cols["x"].conflict) == ("json", True)


def test_a_type_conflict_is_json_and_says_how_many_documents_hold_each_type() -> None:
    docs = [canonical({"sku": "A-1"}) for _ in range(12)] + [canonical({"sku": i}) for i in range(3)]
    docs.append(canonical({"sku": None}))
    model = model_of(shape(docs))
    (sku,) = model.columns
    assert (sku.spark_type, sku.conflict) == ("json", True)
    assert model.conflicts() == [
        "docs__shop__products: field sku has string in 12 documents, int in 3 documents, null in 1 document -> json"
    ]
    yml = yaml.safe_load(render_yml(model))["models"][0]
    assert "Type conflicts, read as JSON text: sku." in yml["description"]
    assert (
        yml["columns"][0]["description"]
        == "Field 'sku': a type conflict (int, null, string), read as its Extended JSON text."
    )
    assert yml["columns"][0]["data_type"] == "string"
    # the counts change with every write: the files carry none, so --check stays quiet
    assert "12" not in render_yml(model) + render_sql(model)


def test_nested_documents_are_flattened_to_the_depth() -> None:
    doc = canonical(
        {
            "_id": 1,
            "address": {"city": "Oslo", "geo": {"lat": 59.9, "lon": 10.7}, "zip": "0150"},
            "items": [{"sku": "a", "n": 1}],  # arrays stay json at any depth
            "meta": {},  # an empty document has no fields to flatten
        }
    )
    partial = canonical({"_id": 2, "address": None})
    assert types([doc, partial]) == {"_id": "int", "address": "json", "items": "json", "meta": "json"}
    assert types([doc, partial], depth=2) == {
        "_id": "int",
        "address__city": "string",
        "address__geo": "json",
        "address__zip": "string",
        "items": "json",
        "meta": "json",
    }
    deep = columns([doc, partial], depth=3)
    assert {n: c.spark_type for n, c in deep.items() if n.startswith("address")} == {
        "address__city": "string",
        "address__geo__lat": "double",
        "address__geo__lon": "double",
        "address__zip": "string",
    }
    assert deep["address__geo__lat"].path == ("address", "geo", "lat")
    # a document in some documents and a string in others is a conflict, not flattened
    mixed = columns([doc, canonical({"_id": 3, "address": "Oslo"})], depth=2)
    assert (mixed["address"].spark_type, mixed["address"].conflict) == ("json", True)
    assert mixed["address"].seen == (("object", 1), ("string", 1))


def test_columns_follow_the_documents_field_order_whatever_order_they_are_read_in() -> None:
    a = canonical({"_id": 1, "name": "x", "qty": 1})
    b = canonical({"_id": 2, "name": "y", "color": "red", "qty": 2})
    assert list(types([a, b])) == list(types([b, a])) == ["_id", "name", "color", "qty"]


def test_names_are_unique_ignoring_case_and_bookkeeping_and_unaddressable_fields_are_left_out() -> None:
    docs = [
        canonical({"a__b": 1, "a": {"b": 2}, "_cl_record": "x", "Name": "n", "name": "m", "it's": 1, "two words": "w"})
    ]
    model = model_of(shape(docs, depth=2))
    assert [(c.path, c.output_name) for c in model.columns] == [
        (("a__b",), "a__b"),
        (("a", "b"), "a__b__2"),
        (("_cl_record",), "_cl_record__2"),
        (("Name",), "Name"),
        (("name",), "name__2"),
        (("two words",), "two words"),
    ]
    assert model.unaddressable == ["it's"]
    yml = yaml.safe_load(render_yml(model))["models"][0]
    assert "Left in _cl_record (a JSON path cannot name them): it's." in yml["description"]
    assert {c["name"]: c.get("quote") for c in yml["columns"]}["two words"] is True


def test_the_model_files_round_trip_and_report_changes() -> None:
    docs = [canonical({"_id": ObjectId(), "qty": 1, "address": {"city": "Oslo"}, "odd": "{{ x }}"})]
    model = model_of(shape(docs, depth=2))
    sql = render_sql(model)
    assert sql.startswith("-- Generated by `changelake-ingest gold generate` from silver.consumer_records")
    assert "{{ config(materialized='view') }}" in sql and "changelake.mongodb_typed_current_state(" in sql
    assert '        [["address", "city"], "string", "address__city"],\n' in sql
    # names are inert for Jinja: the file renders to the same list the generator wrote
    rendered = (
        Environment()
        .from_string(sql.split("\n\n", 1)[1])
        .render(changelake={"mongodb_typed_current_state": lambda *a: json.dumps(a)})
    )
    assert json.loads(rendered.strip())[3] == [[list(c.path), c.spark_type, c.output_name] for c in model.columns]
    assert previous_columns(sql) == [("_id", "objectid"), ("qty", "int"), ("address.city", "string"), ("odd", "string")]

    yml = yaml.safe_load(render_yml(model))["models"][0]
    assert yml["name"] == "docs__shop__products" and yml["config"] == {"contract": {"enforced": True}}
    cols = {c["name"]: c for c in yml["columns"]}
    assert list(cols) == [
        "_id",
        "qty",
        "address__city",
        "odd",
        "_cl_record",
        "_cl_record_pk",
        "_cl_source",
        "_cl_commit_lsn",
        "_cl_commit_index",
        "_cl_seq",
        "_cl_updated_at",
    ]
    assert (cols["_id"]["data_type"], cols["_id"]["description"]) == ("string", "Field '_id' (objectId as objectid).")
    assert cols["_cl_record_pk"]["data_tests"] == ["unique", "not_null"]
    assert cols["_cl_updated_at"]["data_type"] == "timestamp" and cols["_cl_seq"]["data_type"] == "bigint"

    later = model_of(shape([*docs, canonical({"qty": Int64(5), "color": "red", "address": {"zip": "1"}})], depth=2))
    assert diff(previous_columns(sql), later.columns) == [
        "added color (string)",
        "added address.zip (string)",
        "retyped qty int -> bigint",
    ]
    assert diff(previous_columns(sql), model_of(shape([{"_id": 1}])).columns) == [
        "removed qty",
        "removed address.city",
        "removed odd",
        "retyped _id objectid -> int",
    ]


def test_a_backtick_in_a_name_drops_the_contract() -> None:
    model = model_of(shape([canonical({"a`b": 1})]))
    assert "config" not in yaml.safe_load(render_yml(model))["models"][0]


CONSUMER_RECORDS = pa.schema(
    [
        ("source", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("record_pk", pa.string()),
        ("record", pa.string()),
        ("deleted", pa.bool_()),
    ]
)


def write_consumer_records(path: Path, rows: list[tuple[str, str, dict[str, Any] | None, bool]]) -> None:
    """rows: (source, collection, document, deleted), all in database shop."""
    table = pa.Table.from_pylist(
        [
            {
                "source": src,
                "table_schema": "shop",
                "table_name": coll,
                "record_pk": str(i),
                "record": None if doc is None else json_util.dumps(doc, json_options=CANONICAL),
                "deleted": deleted,
            }
            for i, (src, coll, doc, deleted) in enumerate(rows)
        ],
        CONSUMER_RECORDS,
    )
    write_deltalake(str(path), table, mode="overwrite", partition_by=["source", "table_schema", "table_name"])


def mongo_config(tmp_path: Path, postgres: bool = False) -> Path:
    sources: list[dict[str, Any]] = [
        {"kind": "mongodb", "name": "docs", "uri": "mongodb://127.0.0.1:1", "database": "shop"},
        {"kind": "mongodb", "name": "empty", "uri": "mongodb://127.0.0.1:1", "database": "shop"},
    ]
    if postgres:
        sources.append(
            {"kind": "postgres", "name": "pg", "dsn": "postgresql://nobody@127.0.0.1:1/x", "tables": ["a.b"]}
        )
    cfg = tmp_path / "changelake.yml"
    cfg.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"), "sources": sources}))
    return cfg


def run(tmp_path: Path, capsys: Any, *extra: str, code: int = 0, postgres: bool = False) -> str:
    args = ["-c", str(mongo_config(tmp_path, postgres)), "gold", "generate", "--out", str(tmp_path / "gold")]
    assert cli.main([*args, *extra]) == code
    out: str = capsys.readouterr().out
    return out


def test_generate_reads_live_documents_of_the_mongodb_sources_from_consumer_records(
    tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "warehouse" / "dbt" / "silver.db" / "consumer_records"
    rows: list[tuple[str, str, dict[str, Any] | None, bool]] = [
        ("docs", "products", {"_id": 1, "name": "a", "qty": 1}, False),
        ("docs", "products", {"_id": 2, "name": "b", "qty": Int64(2), "dim": {"w": 1.5}}, False),
        ("docs", "products", {"_id": 3, "name": 3, "gone": True}, True),  # deleted: not counted
        ("docs", "orders", {"_id": ObjectId(), "total": Decimal128("9.50")}, False),
        ("docs", "orders", None, True),  # a tombstone has no record
        ("other", "products", {"_id": 9, "name": 9}, False),  # not a configured source
    ]
    write_consumer_records(path, rows)
    out = run(tmp_path, capsys, "--depth", "2")
    assert "source empty: no live document in" in out
    assert "docs__shop__products: new model, 4 columns (docs shop.products, 2 documents, depth 2)" in out
    assert "docs__shop__orders: new model, 2 columns (docs shop.orders, 1 document, depth 2)" in out
    assert "2 models in" in out and "2 written, 0 unchanged" in out
    sql = (tmp_path / "gold" / "docs__shop__products.sql").read_text()
    assert previous_columns(sql) == [("_id", "int"), ("name", "string"), ("qty", "bigint"), ("dim.w", "double")]
    assert "0 written, 2 unchanged" in run(tmp_path, capsys, "--depth", "2")
    assert "0 would be written, 2 unchanged" in run(tmp_path, capsys, "--depth", "2", "--check")

    # a new document with a conflicting type: --check names the model, a run rewrites it and says so
    rows.append(("docs", "products", {"_id": 4, "name": "d", "qty": "many"}, False))
    write_consumer_records(path, rows)
    assert (
        cli.main(
            [
                "-c",
                str(mongo_config(tmp_path)),
                "gold",
                "generate",
                "--out",
                str(tmp_path / "gold"),
                "--depth",
                "2",
                "--check",
            ]
        )
        == 2
    )
    assert "docs__shop__products: retyped qty bigint -> json" in capsys.readouterr().err
    out = run(tmp_path, capsys, "--depth", "2", "--source", "docs")
    assert (
        "docs__shop__products: field qty has int in 1 document, long in 1 document, string in 1 document -> json" in out
    )
    assert "docs__shop__products: retyped qty bigint -> json" in out and "1 written, 1 unchanged" in out
    # depth 1 keeps dim as JSON text
    out = run(tmp_path, capsys, "--source", "docs")
    assert "docs__shop__products: added dim (json); removed dim.w" in out


def test_generate_for_mongodb_sources_needs_no_table_columns_and_postgres_still_does(
    tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "warehouse" / "dbt" / "silver.db" / "consumer_records"
    write_consumer_records(path, [("docs", "products", {"_id": 1}, False)])
    assert "1 models in" in run(tmp_path, capsys, "--source", "docs", postgres=True)
    assert cli.main(["-c", str(mongo_config(tmp_path, True)), "gold", "generate", "--out", str(tmp_path / "g")]) == 2
    assert "no silver table_columns" in capsys.readouterr().err


def test_generate_without_consumer_records_says_what_to_run(tmp_path: Path, capsys: Any) -> None:
    assert cli.main(["-c", str(mongo_config(tmp_path)), "gold", "generate", "--out", str(tmp_path / "g")]) == 2
    assert "no silver consumer_records" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["-c", str(mongo_config(tmp_path)), "gold", "generate", "--depth", "x"])


def test_the_macro_reads_nested_paths_and_names_the_columns() -> None:
    from tests.unit.test_mongodb_macros import CompilerError, parsed, render

    fields: list[Any] = [
        ["qty", "int"],
        [["address", "city"], "string", "address__city"],
        [["a b", "c"], "bigint", "x"],
    ]
    sql = render("s", "d", "c", fields)
    parsed(sql)
    assert "get_json_object(record, '$.address.city') as `address__city`" in sql
    assert "get_json_object(record, '$[\\'a b\\'].c.$numberLong')" in sql and "as bigint) as `x`" in sql
    assert "get_json_object(record, '$.qty.$numberInt')" in sql  # the demo's [name, type] form is unchanged
    with pytest.raises(CompilerError, match="cannot address the field it's"):
        render("s", "d", "c", [[["a", "it's"], "string", "a__its"]])
