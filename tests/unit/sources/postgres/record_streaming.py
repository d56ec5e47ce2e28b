"""Record one workload's pgoutput bytes as protocol 2 streams it and as protocol 1 sends it, into a fixture.

Run once, by hand: `.venv/bin/python tests/unit/sources/postgres/record_streaming.py [DSN]`
(default DSN: `bash scripts/pg.sh dsn`). Two slots exist before the workload; each is read with
`pg_logical_slot_get_binary_changes` in a session whose `logical_decoding_work_mem` is the
minimum (64 kB), so the large transactions are streamed (protocol 2) or spilled (protocol 1).
The workload: a large transaction with a savepoint rolled back inside it (a small transaction of
another session commits while it runs), and a large transaction that aborts.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[4]
FIXTURE = Path(__file__).with_name("fixtures") / "pgoutput_v2_streaming.json"
ROWS = 600  # with their decoding overhead, past 64 kB


def changes(conn: psycopg.Connection[Any], slot: str, pub: str, proto: str) -> list[dict[str, str]]:
    opts = ["proto_version", proto, "publication_names", pub, "messages", "true"]
    if proto == "2":
        opts += ["streaming", "on"]
    conn.execute("set logical_decoding_work_mem = '64kB'")
    rows = conn.execute(
        "select lsn::text, xid::text, data from pg_logical_slot_get_binary_changes(%s, null, null"
        + ", %s" * len(opts)
        + ")",
        [slot, *opts],
    ).fetchall()
    return [{"lsn": lsn, "data": bytes(data).hex()} for lsn, _, data in rows]


def main(dsn: str) -> None:
    s = f"st_{secrets.token_hex(3)}"
    pub, slot1, slot2 = f"{s}_pub", f"{s}_v1", f"{s}_v2"
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        a.execute(f"create schema {s}")
        a.execute(f"create table {s}.items (id int primary key, name text, qty int)")
        a.execute(f"create publication {pub} for table {s}.items")
        for slot in (slot1, slot2):
            a.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            pad = "x" * 20
            with a.transaction():
                a.execute(f"insert into {s}.items select g, %s || g, g from generate_series(1, {ROWS}) g", (pad,))
                b.execute(f"insert into {s}.items values (-1, 'beside', 1)")  # commits while the large one runs
                a.execute("savepoint sp")
                a.execute(f"update {s}.items set qty = qty + 1000 where id <= {ROWS // 2}")
                a.execute(f"insert into {s}.items select g, 'gone', 0 from generate_series({ROWS + 1}, {2 * ROWS}) g")
                a.execute("rollback to savepoint sp")
                a.execute(f"update {s}.items set qty = qty + 1 where id % 3 = 0")
                a.execute(f"delete from {s}.items where id % 7 = 0")
                a.execute("select pg_logical_emit_message(true, 'changelake.test', 'inside')")
            try:
                with a.transaction():
                    a.execute(f"insert into {s}.items select g, 'aborted', 0 from generate_series(-1600, -1000) g")
                    raise RuntimeError("abort")
            except RuntimeError:
                pass
            b.execute(f"update {s}.items set name = 'after' where id = -1")
            b.execute(f"truncate {s}.items")
            out = {
                "server_version": a.execute("show server_version").fetchone()[0],  # type: ignore[index]
                "v1": changes(a, slot1, pub, "1"),
                "v2": changes(a, slot2, pub, "2"),
            }
        finally:
            for slot in (slot1, slot2):
                a.execute("select pg_drop_replication_slot(%s)", (slot,))
            a.execute(f"drop publication {pub}")
            a.execute(f"drop schema {s} cascade")
    FIXTURE.write_text(json.dumps(out, indent=0) + "\n")
    kinds = {k: "".join(chr(int(c["data"][:2], 16)) for c in out[k]) for k in ("v1", "v2")}
    print({k: (len(v), sorted(set(v))) for k, v in kinds.items()})


if __name__ == "__main__":
    default = subprocess.check_output(["bash", str(ROOT / "scripts/pg.sh"), "dsn"], text=True).strip()
    main(sys.argv[1] if len(sys.argv) > 1 else default)
