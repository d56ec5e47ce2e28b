"""Benchmark: replication lag when a snapshot completes, (a) snapshot-then-stream vs (b) stream-while-snapshotting.

A table of N rows (default 1M) under a steady write load (default 2k row changes/s, 20-row updates
at 100 transactions/s, from a separate process). Each mode gets its own slot, created before the
snapshot starts, and its own warehouse:
  (a) the classic order: the snapshot runs alone while the slot accumulates WAL; the stream starts
      only after the snapshot completed;
  (b) changelake's order (DESIGN §5): the stream runs from the start and the snapshot runs beside it.
For each: the slot's lag (bytes, `pg_current_wal_lsn() - confirmed_flush_lsn`) at the moment the
snapshot completes, the seconds the stream then needs to catch up to that moment's WAL position, and
the time from start to that point (bronze holds a consistent image: every page plus every change
up to past the last watermark, so one `dbt build` yields a consistent consumer_records). Prints
both and the ratios (b)/(a). Goal: lag ratio <= 0.1.

Usage: .venv/bin/python bench/snapshot_lag.py [--rows 1000000] [--rate 2000] [--page-rows 10000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.bronze.writer import BronzeWriter  # noqa: E402
from ingest.config import BatchConfig, PostgresSource, SnapshotSettings  # noqa: E402
from ingest.events import lsn_to_int  # noqa: E402
from ingest.progress import Progress  # noqa: E402
from ingest.sources.postgres.admin import prepare_source  # noqa: E402
from ingest.sources.postgres.capture import PostgresCapture  # noqa: E402
from ingest.sources.postgres.snapshot import Snapshotter  # noqa: E402


def dsn() -> str:
    return (
        os.environ.get("CHANGELAKE_PG_DSN")
        or subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True
        ).stdout.split()[-1]
    )


def load(dsn_: str, table: str, rows: int, rate: int, stop: Any, done: Any) -> None:
    """`rate` row changes per second as 20-row updates, until `stop` is set."""
    per_txn = 20
    txn_per_s = rate / per_txn
    rnd = random.Random(7)
    n = 0
    with psycopg.connect(dsn_, autocommit=True) as c:
        t0 = time.monotonic()
        while not stop.is_set():
            ids = [rnd.randint(1, rows) for _ in range(per_txn)]
            c.execute(f"update {table} set n = n + 1 where id = any(%s)", (ids,))
            n += 1
            ahead = n / txn_per_s - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    done.value = n * per_txn / (time.monotonic() - t0)


def create_items(d: str, schema: str, rows: int) -> None:
    """`schema`.items: `rows` rows of (id bigint key, an md5 text, an int), vacuumed and analyzed."""
    with psycopg.connect(d, autocommit=True) as c:
        c.execute(f"create schema {schema}")
        c.execute(f"create table {schema}.items (id bigint primary key, v text, n int not null default 0)")
        c.execute(f"insert into {schema}.items select g, md5(g::text), 0 from generate_series(1, {rows}) g")
        c.execute(f"vacuum analyze {schema}.items")


def slot_lag(conn: psycopg.Connection[Any], slot: str) -> tuple[int, int, int]:
    row = conn.execute(
        "select pg_current_wal_lsn()::text, confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s",
        (slot,),
    ).fetchone()
    assert row is not None
    cur, flushed = lsn_to_int(row[0]), lsn_to_int(row[1])
    return cur, flushed, cur - flushed


def run_mode(mode: str, d: str, schema: str, table: str, page_rows: int) -> dict[str, float]:
    name = f"bench_{mode}_{secrets.token_hex(3)}"
    src = PostgresSource(
        kind="postgres",
        name=name,
        dsn=d,
        tables=[f"{schema}.{table}"],
        snapshot=SnapshotSettings(page_rows=page_rows),
        heartbeat_seconds=1,
    )
    prepare_source(src).close()  # the slot exists from here: it retains every change from now on
    wh = Path(tempfile.mkdtemp(prefix=f"snaplag-{mode}-"))
    writer = BronzeWriter(wh)
    writer.ensure_tables()
    conn = psycopg.connect(d, autocommit=True)
    stop_stream = threading.Event()
    out: dict[str, float] = {}
    thread: threading.Thread | None = None
    t0 = time.monotonic()
    try:
        if mode == "a":
            snap = Snapshotter(src, writer)
            snap.request([src.tables[0]], lambda: slot_lag(conn, src.slot_name)[0])
            snap.run(lambda: False)
        cap = PostgresCapture(src, BatchConfig(), writer, Progress(name, enabled=False), snapshots=(mode == "b"))
        thread = threading.Thread(target=cap.run, args=(False, stop_stream.is_set), daemon=True)
        thread.start()
        if mode == "b":
            while not cap.snapshotter.completed:
                if not thread.is_alive():
                    raise SystemExit("stream stopped before the snapshot completed")
                time.sleep(0.05)
        t_done = time.monotonic()
        target, _, lag = slot_lag(conn, src.slot_name)
        out["snapshot_s"] = t_done - t0
        out["lag_bytes"] = lag
        while slot_lag(conn, src.slot_name)[1] < target:
            if not thread.is_alive():
                raise SystemExit("stream stopped before catching up")
            time.sleep(0.05)
        t_caught = time.monotonic()
        out["catch_up_s"] = t_caught - t_done
        out["consistent_s"] = t_caught - t0
    finally:
        stop_stream.set()
        if thread is not None:
            thread.join(timeout=120)  # its last batch commits before the warehouse is removed
        conn.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = %s "
            "and active_pid is not null",
            (src.slot_name,),
        )
        time.sleep(0.5)
        conn.execute("select pg_drop_replication_slot(%s)", (src.slot_name,))
        conn.execute(f"drop publication if exists {src.publication_name}")
        conn.close()
        shutil.rmtree(wh, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=2000, help="row changes per second during the run")
    ap.add_argument("--page-rows", type=int, default=10_000)
    args = ap.parse_args()
    d = dsn()
    schema = f"bench_snap_{secrets.token_hex(3)}"
    create_items(d, schema, args.rows)
    results = {}
    try:
        for mode in ("a", "b"):
            ctx = mp.get_context("spawn")
            stop, rate = ctx.Event(), ctx.Value("d", 0.0)
            gen = ctx.Process(target=load, args=(d, f"{schema}.items", args.rows, args.rate, stop, rate))
            gen.start()
            time.sleep(2)
            try:
                results[mode] = run_mode(mode, d, schema, "items", args.page_rows)
            finally:
                stop.set()
                gen.join()
            results[mode]["load_rate"] = rate.value
    finally:
        with psycopg.connect(d, autocommit=True) as c:
            c.execute(f"drop schema {schema} cascade")
    print(f"table {args.rows:,} rows, load {args.rate:,} row changes/s, pages of {args.page_rows:,} rows")
    for mode, label in (("a", "(a) snapshot, then stream"), ("b", "(b) stream while snapshotting")):
        r = results[mode]
        print(
            f"{label:32s} snapshot done {r['snapshot_s']:7.1f} s | lag then {r['lag_bytes'] / 1e6:8.1f} MB, "
            f"caught up {r['catch_up_s']:6.1f} s later | consistent bronze after {r['consistent_s']:7.1f} s "
            f"| load achieved {r['load_rate']:,.0f}/s"
        )
    a, b = results["a"], results["b"]
    print(
        f"lag ratio (b)/(a): bytes {b['lag_bytes'] / max(a['lag_bytes'], 1):.3f}, "
        f"seconds {b['catch_up_s'] / max(a['catch_up_s'], 1e-9):.3f} (goal <= 0.1)"
    )
    print(f"time to consistent ratio (b)/(a): {b['consistent_s'] / a['consistent_s']:.2f}")
    print(
        f"snapshot throughput while streaming (b): {args.rows / b['snapshot_s']:,.0f} rows/s "
        f"(alone (a): {args.rows / a['snapshot_s']:,.0f} rows/s; goal >= 50,000)"
    )


if __name__ == "__main__":
    main()
