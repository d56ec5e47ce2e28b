"""Record real pgoutput v1 bytes from the project PostgreSQL into fixtures/pgoutput_v1.json.

Run once, by hand: `.venv/bin/python tests/unit/sources/postgres/record_fixtures.py [DSN]`
(default DSN: `bash scripts/pg.sh dsn`). Each step runs its statements, then reads the slot with
`pg_logical_slot_get_binary_changes` so the rows of a step are exactly its transactions. Names
carry a random suffix; the slot, publication, origin and schema are dropped at the end.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from ingest.sources.postgres.values import TYPE_CATALOG_SQL  # noqa: E402

FIXTURE = Path(__file__).with_name("fixtures") / "pgoutput_v1.json"

SESSION_SQL = ["set timezone = 'UTC'", "set datestyle = 'ISO'", "set intervalstyle = 'iso_8601'"]

TOAST_BODY_LEN = 12_000  # > TOAST_TUPLE_THRESHOLD (~2 kB) with storage external: stored out of line


def setup_sql(s: str) -> list[str]:
    """Tables created (and rows loaded) before the slot exists, so none of it is decoded."""
    return [
        f"create schema {s}",
        f"create type {s}.mood as enum ('sad', 'ok', 'happy')",
        f"create domain {s}.posint as integer check (value > 0)",
        f"""create table {s}.kinds (
            id int8 primary key, i2 int2, i4 int4, o oid, f4 float4, f8 float8,
            n numeric(12, 3), nn numeric, b bool, t text, vc varchar(10), ch char(3), u uuid,
            j json, jb jsonb, by bytea, d date, tm time, ttz timetz, ts timestamp,
            tstz timestamptz, iv interval, m {s}.mood, dom {s}.posint, ia int4[], ta text[],
            ma int4[], ba bool[], fa float8[], na numeric[], ja jsonb[], ma_mood {s}.mood[],
            pt point, boxes box[], iv2 int2vector
        )""",
        f"create table {s}.items (id int primary key, name text)",
        f"create table {s}.full_items (id int primary key, name text, qty int)",
        f"alter table {s}.full_items replica identity full",
        f"create table {s}.docs (id int primary key, title text, body text)",
        f"alter table {s}.docs alter column body set storage external",
        f"create table {s}.parent (id serial primary key, label text)",
        f"create table {s}.child (id int primary key, parent_id int references {s}.parent)",
        f"insert into {s}.items values (1, 'one'), (2, 'two'), (3, 'three')",
        f"insert into {s}.full_items values (1, 'apple', 5), (2, 'pear', 7)",
        f"insert into {s}.docs values (1, 'first', repeat('0123456789abcdef', {TOAST_BODY_LEN // 16}))",
        f"insert into {s}.parent (label) values ('p1')",
        f"insert into {s}.child values (1, 1)",
        f"create publication {s}_pub for tables in schema {s}",
    ]


def steps(s: str, origin: str) -> list[dict[str, Any]]:
    """The recorded steps: name, statements (one transaction unless `autocommit`)."""
    kinds_row = (
        f"insert into {s}.kinds values (1, -32768, 2147483647, 4294967295, 'NaN', '-Infinity', "
        "12.340, 'NaN', true, E'h\\u00e9llo \"q\" \\\\ \\n tab\\t', 'var', 'ab', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": [1, null]}', '{\"b\": null}', "
        "'\\x000aff', '2024-02-29', '23:59:59.5', '12:00:00+05:30', 'infinity', "
        "'2024-01-02 03:04:05.678+00', '1 year 2 mons 3 days 04:05:06', 'happy', 7, "
        "'[0:2]={1,NULL,3}', "
        "ARRAY['plain', 'with space', 'quo\"te', 'back\\slash', 'NULL', '', 'com,ma', "
        "'br{ace}', NULL], "
        "'{{1,2},{3,4}}', '{t,f,NULL}', '{NaN,Infinity,-Infinity,1.5}', '{1.10,NaN}', "
        "ARRAY['{\"k\": \"v\"}'::jsonb, 'null'::jsonb], '{sad,happy}', '(1.5,2)', "
        "ARRAY['((1,1),(0,0))'::box, '((3,3),(2,2))'::box], '1 2 3')"
    )
    return [
        {"name": "insert_kinds", "binary_too": True,
         "sql": [kinds_row, f"insert into {s}.kinds (id) values (2)"]},
        {"name": "update_plain", "sql": [f"update {s}.items set name = 'TWO' where id = 2"]},
        {"name": "update_key", "sql": [f"update {s}.items set id = 10 where id = 1"]},
        {"name": "update_full",
         "sql": [f"update {s}.full_items set qty = qty + 1, name = null where id = 1"]},
        {"name": "delete_key", "sql": [f"delete from {s}.items where id = 3"]},
        {"name": "delete_full", "sql": [f"delete from {s}.full_items where id = 2"]},
        {"name": "update_toast_unchanged",
         "sql": [f"update {s}.docs set title = 'renamed' where id = 1"]},
        {"name": "truncate_one", "sql": [f"truncate {s}.full_items"]},
        {"name": "truncate_cascade_restart",
         "sql": [f"truncate {s}.parent, {s}.items restart identity cascade"]},
        {"name": "message_transactional",
         "sql": [f"select pg_logical_emit_message(true, '{s}.tx', 'in a transaction')",
                 f"insert into {s}.items values (20, 'after message')"]},
        {"name": "message_nontransactional", "autocommit": True,
         "sql": [f"select pg_logical_emit_message(false, '{s}.nontx', "
                 "'\\x00ff01'::bytea)"]},
        {"name": "origin", "origin": origin,
         "sql": ["select pg_replication_origin_xact_setup('0/12345678', "
                 "'2024-01-01 00:00:00+00')",
                 f"insert into {s}.items values (30, 'from origin')"]},
    ]  # fmt: skip


def read_changes(conn: psycopg.Connection[Any], slot: str, pub: str, binary: bool) -> list[Any]:
    """Read (binary: peek) the slot's pending changes as (lsn text, xid, data) rows."""
    func = "pg_logical_slot_peek_binary_changes" if binary else "pg_logical_slot_get_binary_changes"
    opts = "'proto_version', '1', 'publication_names', %s, 'messages', 'true'"
    if binary:
        opts += ", 'binary', 'true'"
    sql = f"select lsn::text, xid::text::int8, data from {func}(%s, null, null, {opts})"
    return conn.execute(sql, (slot, pub)).fetchall()


def wait_flushed(conn: psycopg.Connection[Any], timeout_s: float = 10.0) -> None:
    """Wait until WAL is flushed to the current insert position: decoding reads only flushed WAL,
    and nothing flushes a non-transactional message synchronously (no commit record follows)."""
    target = conn.execute("select pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + timeout_s
    while not conn.execute("select pg_current_wal_flush_lsn() >= %s", (target,)).fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:
            raise TimeoutError(f"WAL not flushed to {target} within {timeout_s} s")
        time.sleep(0.05)


def record(dsn: str) -> dict[str, Any]:
    """Create the objects, run every step, collect its rows and drop everything again."""
    suffix = secrets.token_hex(4)
    s = f"cl_fx_{suffix}"
    slot, pub, origin = f"{s}_slot", f"{s}_pub", f"{s}_origin"
    out: dict[str, Any] = {"schema": s, "publication": pub, "origin": origin, "steps": []}
    with psycopg.connect(dsn, autocommit=True) as admin, psycopg.connect(dsn) as work:
        for stmt in SESSION_SQL:
            admin.execute(stmt)
            work.execute(stmt)
        work.commit()
        try:
            setup = setup_sql(s)
            for stmt in setup:
                admin.execute(stmt)
            admin.execute("select pg_replication_origin_create(%s)", (origin,))
            out["server_version"] = admin.execute("show server_version").fetchone()[0]  # type: ignore[index]
            out["session_sql"] = SESSION_SQL
            out["setup_sql"] = setup
            admin.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            for step in steps(s, origin):
                if step.get("origin"):
                    work.execute("select pg_replication_origin_session_setup(%s)", (origin,))
                    work.commit()
                work.autocommit = bool(step.get("autocommit"))
                for stmt in step["sql"]:
                    work.execute(stmt)
                if not work.autocommit:
                    work.commit()
                work.autocommit = False
                if step.get("origin"):
                    work.execute("select pg_replication_origin_session_reset()")
                    work.commit()
                wait_flushed(admin)
                rec: dict[str, Any] = {k: v for k, v in step.items() if k != "binary_too"}
                if step.get("binary_too"):
                    rows = read_changes(admin, slot, pub, binary=True)
                    rec["binary_changes"] = [
                        {"lsn": lsn, "xid": xid, "data": bytes(data).hex()} for lsn, xid, data in rows
                    ]
                rows = read_changes(admin, slot, pub, binary=False)
                rec["changes"] = [{"lsn": lsn, "xid": xid, "data": bytes(data).hex()} for lsn, xid, data in rows]
                out["steps"].append(rec)
            type_rows = admin.execute(
                f"with cat as ({TYPE_CATALOG_SQL}) select cat.* from cat where cat.oid in ("
                " select a.atttypid from pg_attribute a join pg_class c on c.oid = a.attrelid"
                " join pg_namespace n on n.oid = c.relnamespace"
                " where n.nspname = %s and a.attnum > 0"
                " union select t.typelem from pg_type t where t.typnamespace = %s::regnamespace"
                " union select t.typbasetype from pg_type t where t.typnamespace = %s::regnamespace"
                ") order by 1",
                (s, s, s),
            ).fetchall()
            out["pg_type"] = [list(r) for r in type_rows]
        finally:
            work.rollback()
            admin.execute(
                "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s",
                (slot,),
            )
            admin.execute(f"drop publication if exists {pub}")
            admin.execute(
                "select pg_replication_origin_drop(roname) from pg_replication_origin where roname = %s",
                (origin,),
            )
            admin.execute(f"drop schema if exists {s} cascade")
    return out


def main() -> None:
    """Record and write the fixture file."""
    if len(sys.argv) > 1:
        dsn = sys.argv[1]
    else:
        dsn = subprocess.run(
            ["bash", str(ROOT / "scripts" / "pg.sh"), "dsn"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    data = record(dsn)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(data, indent=1) + "\n")
    n = sum(len(s["changes"]) for s in data["steps"])
    print(f"wrote {n} messages in {len(data['steps'])} steps to {FIXTURE}")


if __name__ == "__main__":
    main()
