"""Benchmark: snapshot throughput while streaming, against `COPY table TO STDOUT` read by one client.

A table of N rows (default 2M: id bigint key, an md5 text, an int) under a steady write load
(default 2k row changes/s from a separate process, bench/snapshot_lag.py's). In the same run:
  - COPY: `psql -c "copy <table> to stdout" > /dev/null`, one client reading every row into nothing;
  - snapshot: a fresh source's stream starts and snapshots the table beside it (`snapshot.max_parallel`
    from --max-parallel, key ranges when the table is larger than --split-rows), until every
    snapshot writer retired.
Prints both rows/s and the ratio snapshot/COPY (the goal: >= 0.5). With --phases, also the
snapshot's time in each phase of a page, summed over its threads (what remains costly): the page
read (its COPY and encoding apart) and the page's bronze write (its Arrow table and its Delta
commit apart; bronze serializes commits to one table, so the threads' commits queue).

Usage: .venv/bin/python bench/snapshot_throughput.py [--rows 2000000] [--rate 2000] [--max-parallel 2] [--phases]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from snapshot_lag import create_items, dsn, load  # noqa: E402

from ingest.bronze import writer as bronze_writer  # noqa: E402
from ingest.bronze.writer import BronzeWriter  # noqa: E402
from ingest.config import BatchConfig, PostgresSource, SnapshotSettings  # noqa: E402
from ingest.events import WriterKind  # noqa: E402
from ingest.progress import Progress  # noqa: E402
from ingest.sources.postgres.admin import prepare_source  # noqa: E402
from ingest.sources.postgres.capture import PostgresCapture  # noqa: E402
from ingest.sources.postgres.pages import PageReader  # noqa: E402
from tests.helpers.pg import drop_slot  # noqa: E402

# (owner, attribute, label): the page's phases --phases times; a label's indent is its parent's share.
PHASES = [
    (PageReader, "read_page", "page read"),
    (PageReader, "_copy", "  COPY received and encoded"),
    (BronzeWriter, "append_page", "page written to bronze"),
    (bronze_writer, "_page_to_arrow", "  Arrow table"),
    (BronzeWriter, "_append", "  Delta append (all bronze tables)"),
]


def time_phases() -> dict[str, list[float]]:
    """Wrap each of PHASES to sum its seconds and count its calls (over every thread): label -> [s, calls]."""
    spent: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    lock = threading.Lock()
    for owner, name, label in PHASES:
        real = getattr(owner, name)

        def timed(*args: object, _real: object = real, _label: str = label, **kwargs: object) -> object:
            t0 = time.perf_counter()
            try:
                return _real(*args, **kwargs)  # type: ignore[operator]
            finally:
                with lock:
                    spent[_label][0] += time.perf_counter() - t0
                    spent[_label][1] += 1

        setattr(owner, name, timed)
    return spent


def copy_seconds(d: str, table: str) -> float:
    """Seconds psql takes to COPY the whole table to /dev/null."""
    t0 = time.monotonic()
    with open("/dev/null", "wb") as null:
        subprocess.run(["psql", d, "-qAt", "-c", f"copy {table} to stdout"], stdout=null, check=True)
    return time.monotonic() - t0


def snapshot_seconds(d: str, table: str, settings: SnapshotSettings) -> float:
    """Seconds from a fresh source's start until its snapshot of `table` completed, stream running."""
    src = PostgresSource(
        kind="postgres", name=f"bench_tp_{secrets.token_hex(3)}", dsn=d, tables=[table], snapshot=settings
    )
    prepare_source(src).close()
    wh = Path(tempfile.mkdtemp(prefix="snaptp-"))
    writer = BronzeWriter(wh)
    stop = threading.Event()
    cap = PostgresCapture(src, BatchConfig(), writer, Progress(src.name, enabled=False), snapshots=True)
    t0 = time.monotonic()
    thread = threading.Thread(target=cap.run, args=(False, stop.is_set), daemon=True)
    thread.start()
    try:
        while True:
            time.sleep(0.1)
            if not thread.is_alive():
                raise SystemExit("the run stopped before the snapshot completed")
            if not cap.snapshotter.completed:
                continue
            running = [p for p, _ in writer.positions(src.name) if p.writer_kind is WriterKind.SNAPSHOT]
            if not running:
                return time.monotonic() - t0
    finally:
        stop.set()
        thread.join(timeout=120)
        with psycopg.connect(d, autocommit=True) as c:
            drop_slot(c, src.slot_name)
            c.execute(f"drop publication if exists {src.publication_name}")
        shutil.rmtree(wh, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rate", type=int, default=2000, help="row changes per second during the snapshot")
    ap.add_argument("--page-rows", type=int, default=SnapshotSettings().page_rows)
    ap.add_argument("--max-parallel", type=int, default=SnapshotSettings().max_parallel)
    ap.add_argument("--split-rows", type=int, default=SnapshotSettings().split_rows)
    ap.add_argument("--phases", action="store_true", help="also print the time of each phase of a page")
    args = ap.parse_args()
    spent = time_phases() if args.phases else {}
    d = dsn()
    schema = f"bench_tp_{secrets.token_hex(3)}"
    table = f"{schema}.items"
    create_items(d, schema, args.rows)
    settings = SnapshotSettings(page_rows=args.page_rows, max_parallel=args.max_parallel, split_rows=args.split_rows)
    try:
        copy_seconds(d, table)  # warm the table into the page cache for both
        copy_s = copy_seconds(d, table)
        ctx = mp.get_context("spawn")
        stop, rate = ctx.Event(), ctx.Value("d", 0.0)
        gen = ctx.Process(target=load, args=(d, table, args.rows, args.rate, stop, rate))
        gen.start()
        time.sleep(2)
        try:
            snap_s = snapshot_seconds(d, table, settings)
        finally:
            stop.set()
            gen.join()
    finally:
        with psycopg.connect(d, autocommit=True) as c:
            c.execute(f"drop schema {schema} cascade")
    copy_rate, snap_rate = args.rows / copy_s, args.rows / snap_s
    print(
        f"table {args.rows:,} rows, pages of {args.page_rows:,} rows, max_parallel {args.max_parallel}, "
        f"load {rate.value:,.0f} row changes/s during the snapshot"
    )
    print(f"COPY to /dev/null (psql, one client): {copy_s:6.1f} s, {copy_rate:,.0f} rows/s")
    print(f"snapshot while streaming:             {snap_s:6.1f} s, {snap_rate:,.0f} rows/s")
    print(f"ratio snapshot/COPY: {snap_rate / copy_rate:.2f} (goal >= 0.5)")
    for _, _, label in PHASES if spent else []:
        seconds, calls = spent[label]
        print(f"{label:36s} {seconds:6.2f} s in {calls:4.0f} calls, {1000 * seconds / max(calls, 1):6.1f} ms each")


if __name__ == "__main__":
    main()
