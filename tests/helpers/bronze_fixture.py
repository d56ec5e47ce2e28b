"""Write fake bronze rows by path (docs/bronze.md) to exercise the dbt models without ingest.

Usage: python tests/helpers/bronze_fixture.py WAREHOUSE PHASE   (PHASE 1 creates, 2 and 3 append)
Bronze is written the way ingest writes it (delta-rs, ingest's schemas). Phase 1 writes two
customers and an order flow with a re-delivered duplicate, a heartbeat and a
second writer holding the safe bound back; phase 2 raises the bound and adds a PK change, TOAST,
insert->delete->insert and a truncate; phase 3 adds nothing to wal_events but raises positions.
For local dbt development; the integration tests use real ingest output, and
tests/unit/test_bronze_fixture.py holds the tables it writes to the contract.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

import pyarrow as pa
from deltalake import write_deltalake

from ingest.bronze.schemas import COLUMN_STRUCT, SOURCE_RELATIONS, STREAM_POSITIONS, WAL_EVENTS
from ingest.bronze.writer import BronzeWriter

NOW = dt.datetime(2026, 1, 1, 12, 0, 0)
SOURCE = "shop"


def ev(
    lsn: int,
    idx: int,
    action: str,
    table: str | None,
    pk: dict | None,
    record: dict | None,
    *,
    old_pk: dict | None = None,
    old: dict | None = None,
    toast: list[str] | None = None,
    truncated: list[str] | None = None,
) -> tuple:
    """One wal_events row; JSON in the contract's compact encoding."""

    def js(value: dict | None) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"))

    ts = NOW + dt.timedelta(seconds=lsn)
    return (
        SOURCE,
        "postgres",
        lsn,
        idx,
        lsn + 1,
        1000 + lsn,
        ts,
        action,
        None if table is None else "public",
        table,
        None if table is None else 16384,
        js(pk),
        js(old_pk),
        js(record),
        js(old),
        toast or [],
        truncated,
        None,
        "changelake.heartbeat" if action == "message" else None,
        "{}" if action == "message" else None,
        False if action == "message" else None,
        "stream",
        NOW + dt.timedelta(seconds=lsn + 5),
    )


def customer(i: int, name: str, email: str = "x@example.com") -> dict:
    return {"id": i, "name": name, "email": email, "created_at": "2026-01-01 00:00:00+00"}


def order(i: int, amount: str, status: str, note: str | None = "n") -> dict:
    rec = {"id": i, "customer_id": 1, "amount": amount, "status": status, "updated_at": "2026-01-01 10:00:00.5+00"}
    if note is not None:
        rec["note"] = note
    return rec


PHASES = {
    1: [
        ev(100, 0, "insert", "customers", {"id": 1}, customer(1, "Ada")),
        ev(100, 1, "insert", "customers", {"id": 2}, customer(2, "Bob")),
        ev(110, 0, "message", None, None, None),
        ev(120, 0, "insert", "orders", {"id": 10}, order(10, "12.50", "new", "big text")),
        ev(
            120,
            1,
            "update",
            "orders",
            {"id": 10},
            order(10, "12.50", "paid", "big text"),
            old={"id": 10, "customer_id": 1, "amount": "12.50", "status": "new"},
        ),
        ev(120, 2, "update", "orders", {"id": 10}, order(10, "13.00", "paid", "big text")),
        # re-delivered duplicate of the first update
        ev(
            120,
            1,
            "update",
            "orders",
            {"id": 10},
            order(10, "12.50", "paid", "big text"),
            old={"id": 10, "customer_id": 1, "amount": "12.50", "status": "new"},
        ),
        ev(130, 0, "update", "customers", {"id": 2}, customer(2, "Bob", "bob@example.com")),
        ev(130, 1, "delete", "customers", {"id": 2}, None, old={"id": 2}),
        # above the safe bound in phase 1 (the snapshot writer is at 140)
        ev(150, 0, "insert", "customers", {"id": 3}, customer(3, "Cy")),
    ],
    2: [
        # unchanged TOAST: note carried forward from the stored row
        ev(160, 0, "update", "orders", {"id": 10}, order(10, "14.00", "shipped", None), toast=["note"]),
        # TOAST without any previous value: flagged for re-read
        ev(160, 1, "update", "orders", {"id": 11}, order(11, "1.00", "new", None), toast=["note"]),
        # insert -> delete -> insert in one transaction: present
        ev(170, 0, "insert", "customers", {"id": 4}, customer(4, "Dee")),
        ev(170, 1, "delete", "customers", {"id": 4}, None, old={"id": 4}),
        ev(170, 2, "insert", "customers", {"id": 4}, customer(4, "Dee 2")),
        # primary-key change 1 -> 5
        ev(180, 0, "update", "customers", {"id": 5}, customer(5, "Ada"), old_pk={"id": 1}, old={"id": 1}),
        # truncate orders, then a new order
        ev(190, 0, "truncate", "orders", None, None, truncated=["public.orders"]),
        ev(190, 1, "insert", "orders", {"id": 12}, order(12, "2.00", "new")),
        ev(200, 0, "message", None, None, None),
    ],
    3: [],
}
POSITIONS = {
    1: [("stream", "stream", 160, 161), ("snapshot:public.orders", "snapshot", 140, 141)],
    2: [("stream", "stream", 200, 201), ("snapshot:public.orders", "snapshot", 200, 200)],
    3: [("stream", "stream", 210, 211)],
}


def relations() -> list[tuple]:
    # As ingest records them: format_type(oid, typmod) with the column's typmod (numeric(12,2) is
    # (12 << 16 | 2) + 4), json_kind per docs/bronze.md; test_pg_types holds orders to real bronze.
    def col(name: str, oid: int, type_name: str, json_kind: str, pk: int | None = None, typmod: int = -1) -> tuple:
        # no attnum and no fields, as older bronze
        return (name, oid, type_name, typmod, pk is not None, pk, json_kind, None, None)

    customers = [
        col("id", 20, "bigint", "int", 1),
        col("name", 25, "text", "text"),
        col("email", 25, "text", "text"),
        col("created_at", 1184, "timestamp with time zone", "temporal"),
    ]
    orders = [
        col("id", 20, "bigint", "int", 1),
        col("customer_id", 20, "bigint", "int"),
        col("amount", 1700, "numeric(12,2)", "numeric", typmod=(12 << 16 | 2) + 4),
        col("status", 25, "text", "text"),
        col("updated_at", 1184, "timestamp with time zone", "temporal"),
        col("note", 25, "text", "text"),
    ]
    return [
        (SOURCE, 16384, "public", "customers", "d", customers, "h1", 100, NOW, "rel:16400"),
        (SOURCE, 16385, "public", "orders", "d", orders[:-1], "h2", 120, NOW, "rel:16401"),
        (SOURCE, 16385, "public", "orders", "d", orders, "h3", 160, NOW, None),  # met by the stream
    ]


def table(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)


def main() -> None:
    write(sys.argv[1].rstrip("/"), int(sys.argv[2]))


def write(warehouse: str, phase: int) -> None:
    """Write phase 1, 2 or 3 of the fake bronze under `warehouse`."""
    writer = BronzeWriter(warehouse)
    writer.ensure_tables()
    bronze = f"{warehouse}/bronze"
    if PHASES[phase]:
        write_deltalake(f"{bronze}/wal_events", table(WAL_EVENTS, PHASES[phase]), mode="append")
    positions = [(SOURCE, w, k, d, a, None, NOW, NOW + dt.timedelta(seconds=d)) for w, k, d, a in POSITIONS[phase]]
    # positions are one row per live writer: rewrite the table (a retired writer's row disappears)
    write_deltalake(f"{bronze}/stream_positions", table(STREAM_POSITIONS, positions), mode="overwrite")
    if phase == 1:
        names = COLUMN_STRUCT.names
        rels = [(*r[:5], [dict(zip(names, c, strict=True)) for c in r[5]], *r[6:]) for r in relations()]
        write_deltalake(f"{bronze}/source_relations", table(SOURCE_RELATIONS, rels), mode="append")


if __name__ == "__main__":
    main()
