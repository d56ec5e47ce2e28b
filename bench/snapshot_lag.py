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

For (b) it also prints the stream's freshness while the snapshot ran (bench/freshness.py's
measure: bronze's `ingested_at - commit_timestamp` of the update events committed at the source
from the stream's first bronze commit (its start-up and backlog left out) until the snapshot
completed, plus the median seconds of the stream's bronze commits from its log; goal p50 <= 1.5 s)
and the peak RSS of the process that ran ingest during (b) (VmHWM, reset through
/proc/self/clear_refs when (b) starts, so (a)'s peak is not counted; the load generator is
another process; goal <= 600 MiB).
Pages and parallelism are the product's defaults (`snapshot.page_rows`, `snapshot.max_parallel`,
`snapshot.split_rows`) unless given.

Usage: .venv/bin/python bench/snapshot_lag.py [--rows 1000000] [--rate 2000] [--page-rows N] [--max-parallel N]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.bronze.schemas import WAL_EVENTS_TABLE  # noqa: E402
from ingest.bronze.writer import BronzeWriter  # noqa: E402
from ingest.config import BatchConfig, PostgresSource, SnapshotSettings  # noqa: E402
from ingest.events import lsn_to_int  # noqa: E402
from ingest.progress import Progress  # noqa: E402
from ingest.sources.postgres.admin import prepare_source  # noqa: E402
from ingest.sources.postgres.capture import PostgresCapture  # noqa: E402
from ingest.sources.postgres.snapshot import Snapshotter  # noqa: E402

COMMIT_LOGGER = "ingest.bronze.committer"  # logs "committed source=... events=N ... seconds=S" per batch


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


def _status_kib(field: str) -> int:
    """This process's `field` (VmRSS, VmHWM) from /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        found = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    assert found is not None, field
    return int(found.group(1))


def reset_peak_rss() -> None:
    """Make VmHWM start again from the current RSS (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# The committer's line for a batch with events; group 1 is its commit's seconds.
COMMIT_SECONDS = re.compile(r"committed source=\S+ events=[1-9]\d* .*seconds=([\d.]+)")


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile of sorted `xs` (nearest rank below), nan when empty."""
    return xs[int(q * (len(xs) - 1))] if xs else float("nan")


def update_lags(writer: BronzeWriter) -> list[tuple[datetime, float]]:
    """(commit_timestamp, ingested_at - commit_timestamp in seconds) of every update event in bronze.

    Both are this machine's clock: Postgres's commit time, and the writer's when it builds the
    batch, just before the Delta commit.
    """
    rows = writer.tables.query(
        "select commit_timestamp, ingested_at from t where action = 'update'",
        t=writer.path(WAL_EVENTS_TABLE),
    ).to_pylist()
    return [(r["commit_timestamp"], (r["ingested_at"] - r["commit_timestamp"]).total_seconds()) for r in rows]


class CommitSeconds(logging.Handler):
    """Collects the stream's bronze commit seconds (batches with events) and the first one's time from its log."""

    PATTERN = COMMIT_SECONDS

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []
        self.first_at: float | None = None  # epoch seconds

    def emit(self, record: logging.LogRecord) -> None:
        found = self.PATTERN.search(record.getMessage())
        if found:
            self.seconds.append(float(found.group(1)))
            if self.first_at is None:
                self.first_at = record.created


def stream_freshness(writer: BronzeWriter, since: float, until: float, commit_s: list[float]) -> dict[str, float]:
    """Freshness of the update events committed at the source between epoch seconds `since` and `until`.

    As bench/freshness.py: each event's `ingested_at - commit_timestamp` (both this machine's
    clock), plus the median commit seconds, an upper bound of "visible in bronze".
    """
    lags = sorted(lag for at, lag in update_lags(writer) if since <= at.timestamp() <= until)
    commit = statistics.median(commit_s) if commit_s else 0.0
    p50, p95 = quantile(lags, 0.5), quantile(lags, 0.95)
    return {"fresh_events": len(lags), "fresh_commit_s": commit, "fresh_p50": p50 + commit, "fresh_p95": p95 + commit}


def run_mode(mode: str, d: str, schema: str, table: str, settings: SnapshotSettings) -> dict[str, float]:
    name = f"bench_{mode}_{secrets.token_hex(3)}"
    src = PostgresSource(
        kind="postgres",
        name=name,
        dsn=d,
        tables=[f"{schema}.{table}"],
        snapshot=settings,
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
    commits = CommitSeconds()
    committer_log = logging.getLogger(COMMIT_LOGGER)
    level = committer_log.level
    if mode == "b":
        committer_log.addHandler(commits)
        committer_log.setLevel(logging.INFO)
        out["rss_start_mib"] = _status_kib("VmRSS") / 1024
        reset_peak_rss()
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
            # every range of a split table done (a range's task leaves `tasks` when it completes)
            while not cap.snapshotter.completed or cap.snapshotter.tasks:
                if not thread.is_alive():
                    raise SystemExit("stream stopped before the snapshot completed")
                time.sleep(0.05)
        t_done, wall_done = time.monotonic(), time.time()
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
        if mode == "b":
            out["peak_rss_mib"] = _status_kib("VmHWM") / 1024
    finally:
        stop_stream.set()
        if thread is not None:
            thread.join(timeout=120)  # its last batch commits before the warehouse is removed
        committer_log.removeHandler(commits)
        committer_log.setLevel(level)
        conn.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = %s "
            "and active_pid is not null",
            (src.slot_name,),
        )
        time.sleep(0.5)
        conn.execute("select pg_drop_replication_slot(%s)", (src.slot_name,))
        conn.execute(f"drop publication if exists {src.publication_name}")
        conn.close()
        if mode == "b" and "peak_rss_mib" in out:
            since = commits.first_at if commits.first_at is not None else wall_done
            out |= stream_freshness(writer, since, wall_done, commits.seconds)
        shutil.rmtree(wh, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=2000, help="row changes per second during the run")
    ap.add_argument("--page-rows", type=int, default=SnapshotSettings().page_rows)
    ap.add_argument("--max-parallel", type=int, default=SnapshotSettings().max_parallel)
    ap.add_argument("--split-rows", type=int, default=SnapshotSettings().split_rows)
    args = ap.parse_args()
    settings = SnapshotSettings(page_rows=args.page_rows, max_parallel=args.max_parallel, split_rows=args.split_rows)
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
                results[mode] = run_mode(mode, d, schema, "items", settings)
            finally:
                stop.set()
                gen.join()
            results[mode]["load_rate"] = rate.value
    finally:
        with psycopg.connect(d, autocommit=True) as c:
            c.execute(f"drop schema {schema} cascade")
    print(
        f"table {args.rows:,} rows, load {args.rate:,} row changes/s, pages of {args.page_rows:,} rows, "
        f"max_parallel {args.max_parallel} (key ranges above {args.split_rows:,} estimated rows)"
    )
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
    print(
        f"stream freshness during the snapshot (b), source commit -> bronze: p50 {b['fresh_p50']:.2f} s "
        f"(goal <= 1.5), p95 {b['fresh_p95']:.2f} s ({b['fresh_events']:,.0f} update events from the stream's "
        f"first commit to the snapshot's end; median stream commit {b['fresh_commit_s'] * 1000:.0f} ms "
        f"included)"
    )
    print(
        f"peak RSS of ingest during (b): {b['peak_rss_mib']:.0f} MiB (goal <= 600; RSS when (b) started "
        f"{b['rss_start_mib']:.0f} MiB, after (a) in the same process)"
    )


if __name__ == "__main__":
    main()
