"""Benchmark: freshness, the time from a source commit to the change committed in bronze, under steady load.

A continuous `changelake-ingest run` (its own process, the default `batch.max_seconds`) streams a
table while a load process makes `--rate` row changes per second (20-row updates). After
`--seconds`, ingest gets SIGTERM (it commits its last batch and exits 0) and bronze is read:
for each event, `ingested_at - commit_timestamp` (both stamped on this machine's clock:
Postgres's commit time, and the writer's clock when it builds the batch, just before the Delta
commit). The writer's own commit time is added from its log (`committed ... seconds=`, median),
so the figure is an upper bound of "visible in bronze". The first 5 s (start-up) are left out.
The goal is absolute (p50 <= 1.5 s at 2k changes/s, issue 12): there is no baseline tool that
commits to Delta to compare with in the same run.

Usage: .venv/bin/python bench/freshness.py [--rate 2000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.snapshot_lag import COMMIT_SECONDS, dsn, load, quantile, update_lags  # noqa: E402
from ingest.bronze.writer import BronzeWriter  # noqa: E402

WARMUP_S = 5.0
ROWS = 100_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    d = dsn()
    sfx = secrets.token_hex(3)
    schema, name = f"bench_fresh_{sfx}", f"bench_fresh_{sfx}"
    work = Path(tempfile.mkdtemp(prefix="changelake-fresh-"))
    conn = psycopg.connect(d, autocommit=True)
    try:
        conn.execute(f"create schema {schema}")
        conn.execute(f"create table {schema}.items (id bigint primary key, v text, n int not null default 0)")
        conn.execute(f"insert into {schema}.items select g, md5(g::text), 0 from generate_series(1, {ROWS}) g")
        cfg = work / "ingest.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "warehouse": str(work / "warehouse"),
                    "sources": [
                        {
                            "kind": "postgres",
                            "name": name,
                            "dsn": d,
                            "tables": [f"{schema}.items"],
                            "snapshot": {"initial": False},
                        }
                    ],
                }
            )
        )
        subprocess.run([sys.executable, "-m", "ingest", "-c", str(cfg), "setup"], cwd=ROOT, check=True)
        ctx = mp.get_context("spawn")
        stop, rate = ctx.Event(), ctx.Value("d", 0.0)
        gen = ctx.Process(target=load, args=(d, f"{schema}.items", ROWS, args.rate, stop, rate))
        proc = subprocess.Popen(
            [sys.executable, "-m", "ingest", "-c", str(cfg), "-v", "run"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        gen.start()
        time.sleep(args.seconds)
        stop.set()
        gen.join()
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise SystemExit(f"ingest exited {proc.returncode}: {err[-3000:]}")
        commit_s = [float(m) for m in COMMIT_SECONDS.findall(err)]
        events = update_lags(BronzeWriter(work / "warehouse"))
        first = min(at for at, _ in events)
        lags = sorted(lag for at, lag in events if (at - first).total_seconds() >= WARMUP_S)
        commit = statistics.median(commit_s) if commit_s else 0.0
        p50, p95, p99 = (quantile(lags, q) for q in (0.5, 0.95, 0.99))
        print(
            f"load {rate.value:,.0f} row changes/s for {args.seconds:.0f} s; {len(lags):,} events after "
            f"{WARMUP_S:.0f} s of warm-up; {len(commit_s)} batches, median commit {commit * 1000:.0f} ms"
        )
        print(
            f"source commit -> batch built: p50 {p50:.2f} s, p95 {p95:.2f} s, p99 {p99:.2f} s; "
            f"+ median commit = p50 {p50 + commit:.2f} s committed in bronze (goal <= 1.5 s)"
        )
    finally:
        conn.execute(f"drop schema if exists {schema} cascade")
        for (slot,) in conn.execute(
            "select slot_name from pg_replication_slots where slot_name like %s", (f"%{sfx}",)
        ).fetchall():
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"drop publication if exists changelake_{name}")
        conn.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
