"""`remask` rewrites bronze rows to what ingest writes under today's rules (ingest/remask.py).

The values are checked against ingest's own encoders: a row encoded without the rule and then
re-masked must equal the same row encoded with the rule (rows.encode_record with the type's
encoder, and with TableMask.encoder for the masked column; mongodb.changes.mask_document). The
bronze rewrite runs on real delta-rs tables made by BronzeWriter: the table's rows change in one
commit per bronze table, other rows stay as they were, the old files are deleted, the tables stay
append-only, and a second run commits nothing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE, WAL_EVENTS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.events import Action, ChangeEvent, SnapshotPage, SnapshotRow
from ingest.masking import MaskWith, TableMask, mask_hash
from ingest.remask import (
    RuledTable,
    pg_fragment_mask,
    pg_value_text,
    purge_old_files,
    remask_mongo_record,
    remask_mongo_update,
    remask_pg_record,
    rewrite_bronze,
)
from ingest.sources.postgres.rows import encode_record, json_keys
from ingest.sources.postgres.values import TypeCatalog

SALT = b"unit-salt-0123456789abcdef"
HASH = TableMask(frozenset({"ssn"}), frozenset({"secret"}), MaskWith.HASH, SALT)
NULL = TableMask(frozenset({"ssn"}), frozenset({"secret"}), MaskWith.NULL, None)
# (type OID, the server's text output) of values a masked column may hold
VALUES = {
    "text": (25, 'mail-é@example.org "quoted" \\ back'),
    "int": (20, "-9223372036854775808"),
    "numeric": (1700, "1.50"),
    "float": (701, "1.5e-07"),
    "float_nan": (701, "NaN"),
    "bool": (16, "f"),
    "jsonb": (3802, '{"a": [1, 2.50], "b": null}'),
    "timestamptz": (1184, "2026-11-27 18:00:00.5+00"),
    "bytea": (17, "\\x00ff"),
    "text_array": (1009, '{"a,b","",NULL,"NULL",plain,"x\\"y","s p",{}}'.replace(",{}", "")),
    "int_array_2d": (1007, "{{1,2},{3,NULL}}"),
    "bool_array": (1000, "{t,f}"),
}


def _encode(names: list[str], oids: list[int], values: list[bytes | None], mask: TableMask | None) -> str:
    """A row as ingest encodes it (rows.encode_record): excluded columns left out, masked ones hashed."""
    types = TypeCatalog()
    keep = [i for i, n in enumerate(names) if mask is None or n not in mask.exclude]
    encoders = [
        mask.encoder() if mask is not None and names[i] in mask.mask else types.column_encoder(oids[i]) for i in keep
    ]
    kept = [names[i] for i in keep]
    record, _toast = encode_record("public.t", json_keys(kept), encoders, kept, [values[i] for i in keep])
    return record


@pytest.mark.parametrize("mask", [HASH, NULL], ids=["hash", "null"])
@pytest.mark.parametrize("kind", [*sorted(VALUES), "null_value"])
def test_a_postgres_record_is_rewritten_as_ingest_writes_it_under_the_rule(kind: str, mask: TableMask) -> None:
    oid, text = VALUES.get(kind, (25, None))
    value = None if text is None else text.encode()
    names, oids = ["id", "secret", "ssn", "n"], [23, oid, 25, 1700]
    row: list[bytes | None] = [b"7", value, b"123-45-6789", b"2.0"]
    plain = _encode(names, oids, row, None)
    masked = _encode(names, oids, row, mask)
    rewrite = pg_fragment_mask(mask)
    assert remask_pg_record(plain, mask, rewrite) == masked
    assert remask_pg_record(masked, mask, rewrite) == masked  # idempotent: the same text object back
    if text is not None:  # the value's text is recovered exactly from its bronze JSON
        fragment = _encode(["v"], [oid], [value], None)[len('{"v":') : -1]
        assert pg_value_text(fragment) == text


def test_a_record_without_ruled_columns_is_returned_as_it_is() -> None:
    text = '{"id":1,"other":"x"}'
    assert remask_pg_record(text, HASH, pg_fragment_mask(HASH)) is text


def test_a_mongodb_document_and_update_are_rewritten_as_ingest_writes_them() -> None:
    pytest.importorskip("bson")
    from bson import ObjectId

    from ingest.sources.mongodb.changes import ext_json, mask_document

    doc = {"_id": ObjectId(), "secret": {"nested": [1, "x"]}, "ssn": "123", "name": "ann", "n": 2.5}
    for mask in (HASH, NULL):
        masked = ext_json(mask_document(doc, mask, "db.c"))
        assert remask_mongo_record(ext_json(doc), mask) == masked
        assert remask_mongo_record(masked, mask) == masked
    update = {"updatedFields": {"secret": "s3", "secret.x": 4, "ssn": "9", "name": "b"}, "removedFields": ["z"],
              "truncatedArrays": []}  # fmt: skip
    out = json.loads(remask_mongo_update(ext_json(update), HASH))
    assert out["updatedFields"] == {
        "secret": mask_hash(SALT, b"s3"),
        "secret.x": mask_hash(SALT, b'{"$numberInt":"4"}'),
        "name": "b",
    }
    assert out["removedFields"] == ["z"]


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_bronze_is_rewritten_in_place_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    secrets = [uuid.uuid4().hex for _ in range(4)]
    ssn = uuid.uuid4().hex

    def rec(i: int, secret: str | None) -> str:
        return json.dumps({"id": i, "secret": secret, "ssn": ssn, "n": i}, separators=(",", ":"))

    ts = 1_795_000_000_000_000
    events = [
        ChangeEvent(100, 0, 7, ts, Action.INSERT, "public", "t", 1, '{"id":1}', record=rec(1, secrets[0])),
        ChangeEvent(100, 1, 7, ts, Action.INSERT, "public", "t", 1, '{"id":2}', record=rec(2, None)),
        ChangeEvent(
            200, 0, 8, ts, Action.UPDATE, "public", "t", 1, '{"id":1}', record='{"id":1,"n":5}',
            old_record=rec(1, secrets[1]), unchanged_toast=("secret", "ssn"),
        ),
        ChangeEvent(200, 1, 8, ts, Action.DELETE, "public", "t", 1, '{"id":2}', old_record='{"id":2}'),
        # another table of the source, and the same table of another source: not ruled, kept as they are
        ChangeEvent(300, 0, 9, ts, Action.INSERT, "public", "u", 2, '{"id":1}', record=rec(1, secrets[2])),
    ]  # fmt: skip
    writer.append_events("shop", "postgres", "stream", events)
    writer.append_events("other", "postgres", "stream", [events[0]._replace(table_name="t")])
    rows = (SnapshotRow('{"id":3}', rec(3, secrets[3]), ("3",)), SnapshotRow('{"id":4}', rec(4, None), ("4",)))
    writer.append_page("shop", "postgres", "snap-1", SnapshotPage("s1", "public", "t", 0, True, rows, 150, ts))
    wal, pages = (str(tmp_path / "bronze" / t.name) for t in (WAL_EVENTS_TABLE, SNAPSHOT_PAGES_TABLE))

    table = RuledTable("shop", "postgres", "public", "t", HASH)
    done = rewrite_bronze(wal, WAL_EVENTS_TABLE, [table]) + rewrite_bronze(pages, SNAPSHOT_PAGES_TABLE, [table])
    assert [(r.bronze, r.rows, r.changed) for r in done] == [("wal_events", 4, 3), ("snapshot_pages", 2, 2)]
    purge_old_files(wal)
    purge_old_files(pages)

    def h(s: str) -> str:
        return mask_hash(SALT, s.encode())

    def masked(i: int, secret: str | None) -> str:
        return json.dumps({"id": i, "secret": secret and h(secret), "n": i}, separators=(",", ":"))

    got = {
        (r["source"], r["table_name"], r["commit_lsn"], r["commit_index"]): (
            r["record"], r["old_record"], r["unchanged_toast"]
        )
        for r in DeltaTable(wal).to_pyarrow_table().to_pylist()
    }  # fmt: skip
    assert got == {
        ("shop", "t", 100, 0): (masked(1, secrets[0]), None, None),
        ("shop", "t", 100, 1): (masked(2, None), None, None),
        ("shop", "t", 200, 0): ('{"id":1,"n":5}', masked(1, secrets[1]), ["secret"]),
        ("shop", "t", 200, 1): (None, '{"id":2}', None),
        ("shop", "u", 300, 0): (rec(1, secrets[2]), None, None),
        ("other", "t", 100, 0): (rec(1, secrets[0]), None, None),
    }
    records = sorted(r["record"] for r in DeltaTable(pages).to_pyarrow_table().to_pylist())
    assert records == [masked(3, secrets[3]), masked(4, None)]
    for uri in (wal, pages):  # still append-only, on the protocol Spark reads
        dt = DeltaTable(uri)
        assert dt.metadata().configuration["delta.appendOnly"] == "true"
        assert dt.protocol().min_writer_version == 2
    # No file holds the rewritten plain values any more; the rows no rule covers still hold theirs.
    files = _files(tmp_path / "bronze")
    for secret in (secrets[1], secrets[3]):
        assert not [name for name, data in files.items() if secret.encode() in data]
    # Table u has no rule: its row still reads as written (not a byte search: a codec may split it).
    assert any(secrets[2] in (r["record"] or "") for r in DeltaTable(wal).to_pyarrow_table().to_pylist())

    versions = {uri: DeltaTable(uri).version() for uri in (wal, pages)}
    again = rewrite_bronze(wal, WAL_EVENTS_TABLE, [table]) + rewrite_bronze(pages, SNAPSHOT_PAGES_TABLE, [table])
    assert [r.changed for r in again] == [0, 0]
    assert purge_old_files(wal) == [] and purge_old_files(pages) == []
    assert {uri: DeltaTable(uri).version() for uri in (wal, pages)} == versions
    assert _files(tmp_path / "bronze") == files


def test_an_append_by_ingest_during_the_rewrite_fails_its_commit(tmp_path: Path) -> None:
    """A running ingest (a MongoDB source has no slot to ask) is caught by Delta's commit conflict check."""
    from ingest.remask import RemaskError, _rewrite

    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    plain = uuid.uuid4().hex
    record = json.dumps({"id": 1, "secret": plain}, separators=(",", ":"))
    event = ChangeEvent(100, 0, 7, 1_795_000_000_000_000, Action.INSERT, "public", "t", 1, '{"id":1}', record=record)
    writer.append_events("shop", "postgres", "stream", [event])
    wal = str(tmp_path / "bronze" / "wal_events")
    DeltaTable(wal).alter.set_table_properties({"delta.appendOnly": "false"})  # as rewrite_bronze does
    read_at = DeltaTable(wal)  # the rewrite's read ...
    writer.append_events("shop", "postgres", "stream", [event._replace(commit_lsn=200)])  # ... then ingest appends
    with pytest.raises(RemaskError, match="changed the table meanwhile; stop `changelake-ingest run`"):
        _rewrite(read_at, RuledTable("shop", "postgres", "public", "t", HASH), WAL_EVENTS_TABLE)
    assert [r["record"] for r in DeltaTable(wal).to_pyarrow_table().to_pylist()] == [record, record]
