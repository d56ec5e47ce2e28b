"""Benchmark: the Python side of ingest alone (decode -> events -> Arrow) vs `pg_recvlogical`, same WAL.

This is the ceiling of what `changelake-ingest run` can reach on one core, whatever the bronze
writer does. One slot is read by `pg_recvlogical` (pgoutput, to /dev/null); a second slot
over the same WAL is peeked with `pg_logical_slot_peek_binary_changes` (untimed), and the timed part
decodes the pgoutput messages and builds the ChangeEvents with their JSON records
(`ChangeBuilder.feed_payload`: the compiled row decoder where it applies, as in production; with
`--python`, the pure Python path) and turns them into the Arrow table the bronze writer commits.

Usage: .venv/bin/python bench/decode_ceiling.py [--rows 500000]
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.bronze.writer import _events_to_arrow  # noqa: E402
from ingest.events import ChangeEvent  # noqa: E402
from ingest.sources.postgres.changes import ChangeBuilder  # noqa: E402
from ingest.sources.postgres.values import TYPE_CATALOG_SQL, TypeCatalog  # noqa: E402


class BenchCatalog:
    """The catalog the change builder asks: the table's key is `id`; types from pg_type."""

    def __init__(self, types: TypeCatalog) -> None:
        self.types = types

    def record_key(self, relation_id: int) -> list[str]:
        return ["id"]

    def encoder(self, type_oid: int) -> Callable[[bytes], str]:
        return self.types.column_encoder(type_oid)

    def json_kind(self, type_oid: int) -> str:
        return self.types.json_kind(type_oid)

    def type_name(self, type_oid: int) -> str:
        return str(type_oid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--python", action="store_true", help="the pure Python decoder (no compiled row decoder)")
    args = ap.parse_args()
    dsn = subprocess.run(
        ["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    sfx = secrets.token_hex(3)
    schema, pub, slots = f"ceiling_{sfx}", f"ceiling_{sfx}", (f"ceiling_recv_{sfx}", f"ceiling_py_{sfx}")
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute(f"create schema {schema}")
        conn.execute(
            f"create table {schema}.events (id bigint primary key, account int, kind text, "
            "amount numeric(12,2), at timestamptz)"
        )
        conn.execute(f"create publication {pub} for table {schema}.events")
        for slot in slots:
            conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        half = args.rows // 2
        for lo in range(1, half + 1, 10_000):
            hi = min(lo + 9_999, half)
            conn.execute(
                f"insert into {schema}.events select g, g %% 1000, 'k' || (g %% 7), g * 0.01, now() "
                "from generate_series(%s::bigint, %s::bigint) g",
                (lo, hi),
            )
            conn.execute(f"update {schema}.events set amount = amount + 1 where id between %s and %s", (lo, hi))
        end_lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        changes = 2 * half

        recv = shutil.which("pg_recvlogical") or next(Path("/usr/lib/postgresql").glob("*/bin/pg_recvlogical"))
        t = time.monotonic()
        subprocess.run(
            [str(recv), "-d", dsn, "--slot", slots[0], "--start", "--endpos", end_lsn, "--no-loop"]
            + ["-o", "proto_version=1", "-o", f"publication_names={pub}", "-f", "/dev/null"],
            check=True,
        )
        recv_rate = changes / (time.monotonic() - t)

        payloads = [
            bytes(r[0])
            for r in conn.execute(
                "select data from pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, null, "
                "'proto_version', '1', 'publication_names', %s)",
                (slots[1], end_lsn, pub),
            ).fetchall()
        ]
        with conn.cursor() as cur:
            cur.execute(TYPE_CATALOG_SQL)
            types = TypeCatalog.from_rows(cur.fetchall())
        best = float("inf")
        for _ in range(3):
            builder = ChangeBuilder(BenchCatalog(types), use_native=not args.python)
            t = time.process_time()
            events: list[ChangeEvent] = []
            for p in payloads:
                out = builder.feed_payload(p)
                if isinstance(out, ChangeEvent):
                    events.append(out)
                    if len(events) == 200_000:  # the bronze writer's batch size
                        _events_to_arrow("bench", "postgres", "stream", events, {})
                        events = []
            _events_to_arrow("bench", "postgres", "stream", events, {})
            best = min(best, time.process_time() - t)
        py_rate = changes / best
        print(f"{changes:,} row changes ({len(payloads):,} pgoutput messages)")
        print(f"pg_recvlogical (pgoutput -> /dev/null):        {recv_rate:9,.0f} changes/s (wall)")
        print(f"python decode + events + Arrow, one core:      {py_rate:9,.0f} changes/s (CPU time, best of 3)")
        print(f"ceiling ratio python / pg_recvlogical: {py_rate / recv_rate:.2f}")
    finally:
        for slot in slots:
            conn.execute(
                "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s", (slot,)
            )
        conn.execute(f"drop publication if exists {pub}")
        conn.execute(f"drop schema if exists {schema} cascade")
        conn.close()


if __name__ == "__main__":
    main()
