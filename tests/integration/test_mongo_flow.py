"""MongoDB change streams and snapshots -> bronze -> `dbt build`, over the real wire protocol.

Backends: mongo-java-server (a third-party MongoDB fake started from its jars, always) and a real
replica set when MONGODB_URI is set (skipped otherwise). What the fake does not model
(transactions, invalidate, post-batch tokens, snapshot reads...) is covered by
tests/unit/sources/mongodb and listed in docs/mongodb.md.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import bson
import pytest
import yaml
from bson import Decimal128, Int64, ObjectId, json_util

from ingest import cli
from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.events import WriterKind
from ingest.gold import model_name
from ingest.gold_mongodb import previous_columns
from ingest.progress import Progress
from ingest.sources.mongodb.capture import MongoCapture
from ingest.sources.mongodb.changes import from_ext_json, record_key
from ingest.sources.mongodb.stream import parse_stored_token
from ingest.sources.mongodb.verify import verify_collections
from tests.helpers import engine
from tests.helpers.delta_rows import read
from tests.helpers.pg import ROOT, bronze_events
from tests.helpers.silver import NO_UNIT_TESTS, dbt, silver

pytestmark = pytest.mark.integration


def source(uri: str, db: Any, **extra: Any) -> MongoSource:
    return MongoSource(
        kind="mongodb",
        name=f"m_{db.name[3:]}",
        uri=uri,
        database=db.name,
        collections=["products"],
        max_await_seconds=0.3,
        **extra,
    )


def capture_once(warehouse: Path, src: MongoSource) -> MongoCapture:
    cap = MongoCapture(
        src,
        BatchConfig(max_events=1000, max_seconds=5),
        BronzeWriter(warehouse),
        Progress(src.name, enabled=False),
    )
    cap.run(once=True, should_stop=lambda: False)
    return cap


def product(i: int) -> dict[str, Any]:
    return {
        "_id": ObjectId(f"{i:024x}"),
        "name": f"p{i}",
        "price": Decimal128(f"{i}.99"),
        "qty": i,
        "views": Int64(1 << 40 | i),
        "in_stock": i % 2 == 0,
        "added_at": datetime(2024, 1, i, 12, 0, 0, 123000, tzinfo=UTC),
        "tags": ["a", {"n": i}],
        "blob": bson.Binary(bytes([i, 0, 255])),
    }


def same_bson(a: Any, b: Any) -> bool:
    return bson.encode(a) == bson.encode(b)


def writers(warehouse: Path, name: str) -> dict[str, Any]:
    return {p.writer_id: p for p, _ in BronzeWriter(warehouse).positions(name)}


def test_snapshot_then_stream_into_bronze(warehouse: Path, mongo_uri: str, mongo_db: Any) -> None:
    coll = mongo_db.products
    coll.insert_many([product(i) for i in range(1, 8)])
    src = source(mongo_uri, mongo_db, snapshot_page_size=3)

    # First run: the stream registers, the snapshot reads 7 documents in _id order, 3 per page.
    cap = capture_once(warehouse, src)
    assert cap.snapshots_done == [f"{mongo_db.name}.products"]
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{src.name}'", "page_number, row_index")
    assert [(p.page_number, p.row_index, p.last_page) for p in pages] == [
        (0, 0, False),
        (0, 1, False),
        (0, 2, False),
        (1, 0, False),
        (1, 1, False),
        (1, 2, False),
        (2, 0, True),
    ]
    assert all(p.snapshot_xmin is None and p.snapshot_xip is None and p.source_kind == "mongodb" for p in pages)
    assert all(p.high_watermark_lsn > 0 for p in pages)
    assert [p.record_pk for p in pages] == [record_key(product(i)["_id"]) for i in range(1, 8)]
    assert all(same_bson(from_ext_json(p.record), product(i)) for p, i in zip(pages, range(1, 8), strict=True))
    assert [from_ext_json(p.key_text[0]) for p in pages] == [product(i)["_id"] for i in range(1, 8)]
    rows = writers(warehouse, src.name)
    assert list(rows) == ["stream"]  # the snapshot's row is removed when its last page is durable
    assert rows["stream"].writer_kind == WriterKind.STREAM
    assert bronze_events(warehouse, src.name) == []  # the pre-existing documents are not events

    # Changes while streaming: insert, update, replace, delete.
    coll.insert_one(product(8))
    coll.update_one({"_id": product(2)["_id"]}, {"$set": {"qty": 20}, "$unset": {"blob": ""}})
    coll.replace_one({"_id": product(3)["_id"]}, {"name": "replaced", "qty": 30})
    coll.delete_one({"_id": product(4)["_id"]})
    capture_once(warehouse, src)
    events = bronze_events(warehouse, src.name)
    assert [e.action for e in events] == ["insert", "update", "update", "delete"]
    assert [e.record_pk for e in events] == [record_key(product(i)["_id"]) for i in (8, 2, 3, 4)]
    assert all(
        e.source_kind == "mongodb" and e.table_schema == mongo_db.name and e.table_name == "products" for e in events
    )
    positions = [(e.commit_lsn, e.commit_index) for e in events]
    assert positions == sorted(positions) and len(set(positions)) == 4
    assert same_bson(from_ext_json(events[0].record), product(8))
    assert from_ext_json(events[1].record)["qty"] == 20 and "blob" not in from_ext_json(events[1].record)
    assert from_ext_json(events[2].record) == {"_id": product(3)["_id"], "name": "replaced", "qty": 30}
    assert events[3].record is None and events[3].old_record == record_key(product(4)["_id"])
    assert all(e.commit_lsn > pages[-1].high_watermark_lsn for e in events)  # later than the snapshot
    stream = writers(warehouse, src.name)["stream"]
    assert stream.durable_lsn == events[-1].commit_lsn
    stored = parse_stored_token(stream.resume_token)
    assert stored is not None and stored[0] == "resumeAfter"

    # A run with nothing new resumes after the token and writes nothing; then one more change.
    capture_once(warehouse, src)
    assert len(bronze_events(warehouse, src.name)) == 4
    coll.update_one({"_id": product(5)["_id"]}, {"$inc": {"qty": 1}})
    capture_once(warehouse, src)
    events = bronze_events(warehouse, src.name)
    assert [e.action for e in events] == ["insert", "update", "update", "delete", "update"]
    assert from_ext_json(events[-1].record)["qty"] == 6

    # Dropping the collection tombstones it like a truncate.
    coll.drop()
    capture_once(warehouse, src)
    last = bronze_events(warehouse, src.name)[-1]
    assert last.action == "truncate" and last.truncated_tables == [f"{mongo_db.name}.products"]


CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True, tzinfo=UTC)


def ext_json(value: Any) -> Any:
    """A BSON value as canonical Extended JSON, parsed (what silver's record holds)."""
    return json.loads(json_util.dumps(value, json_options=CANONICAL))


def generated_gold_rows(
    warehouse: Path, tmp_path: Path, src: MongoSource, capsys: pytest.CaptureFixture[str]
) -> tuple[str, dict[str, str], list[Any]]:
    """`gold generate --depth 2` for the source into a copy of the dbt project, one `dbt build` of the
    model (its contract and tests) and of a table copying the view; (printed lines, fields, rows)."""
    project = tmp_path / "project"  # a copy: the generated models stay out of the tree
    for part in ("models", "macros", "tests/dbt"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("generated"))
    shutil.copy(ROOT / "dbt_project.yml", project)
    out = project / "models" / "gold" / "generated"
    config = tmp_path / "changelake.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [src.model_dump()]}))
    generate = ["-c", str(config), "gold", "generate", "--out", str(out), "--source", src.name, "--depth", "2"]
    assert cli.main(generate) == 0
    printed = capsys.readouterr().out
    model = model_name(src.name, src.database, "products")
    fields = dict(previous_columns((out / f"{model}.sql").read_text()))
    # a table over the view, so that delta-rs reads the typed values Spark computed
    copy = f"{model}_rows"
    (project / "models" / "gold" / f"{copy}.sql").write_text(
        f"{{{{ config(materialized='table') }}}}\nselect * from {{{{ ref('{model}') }}}}\n"
    )
    built = dbt(warehouse, "build", *NO_UNIT_TESTS, "--select", "path:models/gold/generated", copy, project=project)
    assert f"OK created sql view model gold.{model}" in built and "PASS unique_" in built, built
    assert cli.main([*generate, "--check"]) == 0  # nothing changed since: the files are current
    capsys.readouterr()
    return printed, fields, read(warehouse / "dbt" / "gold.db" / copy)


@pytest.mark.usefixtures("engine")
def test_stream_to_dbt_consumer_records_equal_the_collection(
    warehouse: Path, mongo_uri: str, mongo_db: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coll = mongo_db.products
    coll.insert_one({"_id": ObjectId(), "placeholder": True})  # the collection exists before the stream
    src = source(mongo_uri, mongo_db)
    coll.delete_many({})
    seeded = {i: product(i) for i in (9, 10)}  # before the first run: they arrive by the snapshot
    coll.insert_many(list(seeded.values()))
    capture_once(warehouse, src)
    live = {i: product(i) for i in range(1, 9)}
    # for typed gold: a nested document (an int and a double at dims.w) and a field of two types
    live[1].update(dims={"w": 1.5, "unit": "cm"}, code="A-1")
    live[6].update(dims={"w": 2}, code=6)
    for doc in live.values():
        coll.insert_one(doc)
    coll.update_one({"_id": seeded[10]["_id"]}, {"$set": {"qty": 1000}})  # a streamed change over a page row
    live.update({9: seeded[9], 10: coll.find_one({"_id": seeded[10]["_id"]})})
    for i in (2, 5):
        coll.update_one({"_id": live[i]["_id"]}, {"$set": {"qty": i * 10, "price": Decimal128("0.50")}})
        live[i] = coll.find_one({"_id": live[i]["_id"]})
    coll.replace_one({"_id": live[3]["_id"]}, {"name": "p3 v2", "qty": 33})
    live[3] = coll.find_one({"_id": live[3]["_id"]})
    for i in (4, 7):
        coll.delete_one({"_id": live[i]["_id"]})
        gone = live.pop(i)
        assert gone
    capture_once(warehouse, src)

    dbt(
        warehouse,
        "build",
        *NO_UNIT_TESTS,
        "--vars",
        json.dumps(
            {
                "changelake_demo": True,
                "changelake_mongodb_demo_source": src.name,
                "changelake_mongodb_demo_database": mongo_db.name,
            }
        ),
    )
    recs = [r for r in silver(warehouse, "consumer_records") if r.source == src.name]
    current = {r.record_pk: r.record for r in recs if not r.deleted}
    assert set(current) == {record_key(d["_id"]) for d in live.values()}
    for d in live.values():
        assert same_bson(from_ext_json(current[record_key(d["_id"])]), d)  # every BSON type survives
    assert {r.record_pk for r in recs if r.deleted} == {record_key(product(i)["_id"]) for i in (4, 7)}
    assert {r.table_schema for r in recs} == {mongo_db.name}
    origins = {r.record_pk: r.origin for r in recs}
    assert origins[record_key(seeded[9]["_id"])] == "snapshot"
    assert origins[record_key(seeded[10]["_id"])] == "stream"

    events = [r for r in silver(warehouse, "sequin_events") if r.source == src.name]
    assert len(events) == len(bronze_events(warehouse, src.name)) == 8 + 1 + 2 + 1 + 2
    assert sorted(r.seq for r in events) == list(range(1, 15))

    gold = {r["_id"]: r for r in read(warehouse / "dbt" / "gold.db" / "shop__products")}
    p1 = gold[str(product(1)["_id"])]
    assert (p1.name, str(p1.price), p1.qty, p1.views, p1.in_stock) == ("p1", "1.99", 1, 1 << 40 | 1, False)
    # compare instants (whatever zone the reader gives the timestamp)
    assert p1.added_at.timestamp() == datetime(2024, 1, 1, 12, 0, 0, 123000, tzinfo=UTC).timestamp()
    assert json.loads(p1.tags) == ["a", {"n": {"$numberInt": "1"}}]
    p2 = gold[str(product(2)["_id"])]
    assert (p2.qty, str(p2.price)) == (20, "0.50")
    assert gold[str(product(3)["_id"])].price is None  # replaced without a price
    assert set(gold) == {str(d["_id"]) for d in live.values()}

    # consumer_records with a deletion vector: Spark rewrites one live row unchanged (its old copy is
    # marked deleted in a vector); a reader that ignored the vector would count that document twice.
    cr = warehouse / "dbt" / "silver.db" / "consumer_records"
    assert engine.current is not None
    where = f"source = '{src.name}' and record_pk = '{record_key(live[1]['_id'])}'"
    engine.current.sql(f"update delta.`{cr}` set record = record where {where}")
    assert any(cr.rglob("deletion_vector_*")), "Spark wrote no deletion vector"
    ((spark_count,),) = engine.current.sql(
        f"select count(*) from delta.`{cr}` where source = '{src.name}' and not deleted"
    )
    assert spark_count == 8

    # Typed gold generated from every live document in silver, as delta-rs reads consumer_records
    # (deletion vectors applied): the same 8 documents Spark sees, each value typed as its BSON type.
    printed, fields, rows = generated_gold_rows(warehouse, tmp_path, src, capsys)
    model = model_name(src.name, mongo_db.name, "products")
    assert f"{model}: new model, 12 columns ({src.name} {mongo_db.name}.products, 8 documents, depth 2)" in printed
    assert f"{model}: field code has int in 1 document, string in 1 document -> json" in printed
    assert fields == {
        "_id": "objectid",
        "name": "string",
        "price": "decimal(38,2)",
        "qty": "int",
        "views": "bigint",
        "in_stock": "boolean",
        "added_at": "timestamp",
        "tags": "json",
        "blob": "json",
        "dims.w": "double",
        "dims.unit": "string",
        "code": "json",
    }
    by_id = {r["_id"]: r for r in rows}
    assert set(by_id) == {str(d["_id"]) for d in live.values()} and len(rows) == 8
    for d in live.values():
        r = by_id[str(d["_id"])]
        expected = {
            "name": d.get("name"),
            "price": d["price"].to_decimal() if "price" in d else None,
            "qty": d.get("qty"),
            "views": d.get("views"),
            "in_stock": d.get("in_stock"),
            "added_at": d["added_at"].timestamp() if "added_at" in d else None,
            "tags": ext_json(d["tags"]) if "tags" in d else None,
            "blob": ext_json(d["blob"]) if "blob" in d else None,
            "dims__w": d.get("dims", {}).get("w"),
            "dims__unit": d.get("dims", {}).get("unit"),
            "code": d.get("code") if isinstance(d.get("code"), str) else ext_json(d.get("code")),
        }
        got = {
            **{k: r[k] for k in ("name", "price", "qty", "views", "in_stock", "dims__w", "dims__unit")},
            "added_at": r["added_at"].timestamp() if r["added_at"] else None,
            "tags": json.loads(r["tags"]) if r["tags"] else None,
            "blob": json.loads(r["blob"]) if r["blob"] else None,
            "code": r["code"] if r["code"] is None or not r["code"].startswith("{") else json.loads(r["code"]),
        }
        assert got == expected, d["_id"]
        assert isinstance(r["price"], Decimal | None) and isinstance(r["dims__w"], float | None)
        assert r["_cl_record_pk"] == record_key(d["_id"]) and same_bson(from_ext_json(r["_cl_record"]), d)

    # verify (issue 18) finds the silver this real dbt build made equal to the collection.
    (v,) = verify_collections(src, BronzeWriter(warehouse), [f"{mongo_db.name}.products"], 30.0, 1000, 100, False)
    assert coll.count_documents({}) == len(live) == 8
    assert (v.status, v.source_rows, v.silver_rows, v.skipped_keys, v.mismatches) == ("equal", 8, 8, 0, 0), v


def test_transaction_events_share_a_commit_lsn_in_order(
    warehouse: Path, mongo_uri: str, mongo_db: Any, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.params["mongo_uri"] == "mongo-java-server":
        pytest.skip("mongo-java-server has no sessions or transactions (unit-tested in tests/unit/sources/mongodb)")
    coll = mongo_db.products
    coll.insert_one(product(1))
    src = source(mongo_uri, mongo_db)
    capture_once(warehouse, src)
    with coll.database.client.start_session() as session, session.start_transaction():
        coll.insert_one(product(2), session=session)
        coll.update_one({"_id": product(1)["_id"]}, {"$set": {"qty": 7}}, session=session)
        coll.delete_one({"_id": product(2)["_id"]}, session=session)
        coll.insert_one(product(2), session=session)  # insert -> delete -> insert: the row is present
    capture_once(warehouse, src)
    events = bronze_events(warehouse, src.name)
    assert [e.action for e in events] == ["insert", "update", "delete", "insert"]
    assert len({e.commit_lsn for e in events}) == 1
    assert [e.commit_index for e in events] == [0, 1, 2, 3]
