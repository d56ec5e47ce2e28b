"""Benchmark: peak RSS of `run --once` over one transaction that updates wide rows (2,000 x 1 MiB).

Batches are bounded by `batch.max_bytes` as well as by count: a bulk update of wide rows must go
to bronze in pages of bounded size, not as one batch holding every row (200 rows of 1 MB took
1.24 GB before the byte budget). The table is filled first, outside the captured stream (the slot
is created after it, and the initial snapshot is off); then one transaction sets every row's value
to a new 1 MiB text, and `changelake-ingest run --once` streams it into bronze. The peak RSS is the
kernel's for that process (`wait4`), the same figure `/usr/bin/time -v` prints. The values are
repetitive, so the server compresses them (TOAST) and the WAL stays small, but pgoutput sends each
one whole: ingest receives, decodes and writes every byte.

The repeated values compress to a few KiB each in the server's TOAST, so its decoder holds far
less than its logical_decoding_work_mem (64 MiB) and neither streams nor spills the transaction.
`--random-values` gives every row one incompressible value instead (random hex, the same for each
row and changed by the update): the server holds the whole 2 GiB, so it streams the transaction
while decoding it (protocol 2) or spills it to its disk (protocol 1), and the WAL takes 2 GiB per
phase. With `--no-streaming` the source sets `streaming: false` (pgoutput protocol 1: the server spills the
transaction and sends it at its commit); by default ingest receives it streamed (protocol 2) while
the walsender decodes it, holds it until its commit, and writes it then.

Usage: .venv/bin/python bench/wide_rows_rss.py [--rows 2000] [--row-mib 1] [--max-bytes N]
         [--no-streaming] [--random-values]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import yaml
from deltalake import DeltaTable, QueryBuilder

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MD5_CHARS = 32
FILL_ROWS_PER_TXN = 100


def dsn() -> str:
    return (
        os.environ.get("CHANGELAKE_PG_DSN")
        or subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True
        ).stdout.split()[-1]
    )


def run_once(cfg: Path) -> tuple[float, int]:
    """`run --once`: wall seconds and peak RSS in KiB of that process (os.wait4's rusage)."""
    t = time.monotonic()
    proc = subprocess.Popen([PY, "-m", "ingest", "-c", str(cfg), "run", "--once"], cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"ingest run --once failed ({proc.returncode})")
    return time.monotonic() - t, usage.ru_maxrss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--row-mib", type=float, default=1.0, help="width of each row's new value, MiB")
    ap.add_argument("--max-bytes", type=int, default=None, help="batch.max_bytes (default: ingest's)")
    ap.add_argument("--no-streaming", action="store_true", help="streaming: false (pgoutput protocol 1)")
    ap.add_argument("--random-values", action="store_true", help="incompressible values (the server streams/spills)")
    args = ap.parse_args()
    d = dsn()
    suffix = secrets.token_hex(3)
    schema = name = f"bench_{suffix}"
    repeats = int(args.row_mib * (1 << 20)) // MD5_CHARS
    work = Path(tempfile.mkdtemp(prefix="changelake-bench-"))
    conn = psycopg.connect(d, autocommit=True)
    try:
        conn.execute(f"create schema {schema}")
        conn.execute(f"create table {schema}.wide (id int primary key, v text)")
        width = int(args.row_mib * (1 << 20))
        for lo in range(1, args.rows + 1, FILL_ROWS_PER_TXN):
            hi = min(lo + FILL_ROWS_PER_TXN - 1, args.rows)
            if args.random_values:
                conn.execute(
                    f"insert into {schema}.wide select g, %s from generate_series(%s::int, %s::int) g",
                    (secrets.token_hex(width // 2), lo, hi),
                )
            else:
                conn.execute(
                    f"insert into {schema}.wide select g, repeat(md5(g::text), %s) "
                    "from generate_series(%s::int, %s::int) g",
                    (repeats, lo, hi),
                )
        batch: dict[str, float | int] = {"max_seconds": 1}
        if args.max_bytes is not None:
            batch["max_bytes"] = args.max_bytes
        source = {
            "kind": "postgres",
            "name": name,
            "dsn": d,
            "tables": [f"{schema}.wide"],
            "snapshot": {"initial": False},
        }
        if args.no_streaming:
            source["streaming"] = False
        cfg = work / "ingest.yml"
        cfg.write_text(yaml.safe_dump({"warehouse": str(work / "warehouse"), "batch": batch, "sources": [source]}))
        subprocess.run([PY, "-m", "ingest", "-c", str(cfg), "setup"], cwd=ROOT, check=True, capture_output=True)
        t = time.monotonic()
        if args.random_values:
            conn.execute(f"update {schema}.wide set v = %s", (secrets.token_hex(width // 2),))
        else:
            conn.execute(f"update {schema}.wide set v = repeat(md5(id::text || 'u'), %s)", (repeats,))
        print(f"one transaction updating {args.rows:,} rows of {args.row_mib:g} MiB: {time.monotonic() - t:.1f} s")

        secs, peak_kib = run_once(cfg)
        table = str(work / "warehouse" / "bronze" / "wal_events")
        query = f"select count(*) as n from t where source = '{name}' and action = 'update'"
        got = pa.table(QueryBuilder().register("t", DeltaTable(table)).execute(query).read_all()).to_pylist()[0]["n"]
        if got != args.rows:
            raise SystemExit(f"bronze holds {got} updates, expected {args.rows}")
        mib = args.rows * args.row_mib
        print(f"changelake-ingest run --once: {secs:.1f} s ({mib / secs:,.0f} MiB/s of values), {got:,} updates")
        stats = conn.execute(
            "select coalesce(sum(stream_txns), 0), coalesce(sum(stream_bytes), 0), coalesce(sum(spill_bytes), 0) "
            "from pg_stat_replication_slots where slot_name like %s",
            (f"%{suffix}%",),
        ).fetchone()
        print(f"server slot stats: stream_txns {stats[0]}, stream_bytes {stats[1]:,}, spill_bytes {stats[2]:,}")
        protocol = "protocol 1, streaming: false" if args.no_streaming else "protocol 2, streamed"
        print(f"peak RSS: {peak_kib / 1024:.0f} MiB (goal <= 600 MiB; {protocol})")
    finally:
        conn.execute(
            "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name like %s",
            (f"%{suffix}%",),
        )
        conn.execute(f"drop publication if exists changelake_{name}")
        conn.execute(f"drop schema if exists {schema} cascade")
        conn.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
