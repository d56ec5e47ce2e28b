"""Benchmark: `verify` of an N-row table while the source streams changes, vs reading both sides plainly.

A table of N rows (default 1M) is snapshotted into bronze and silver is built once (`dbt run` of
consumer_records and what it needs). Then a continuous `changelake-ingest run` streams a steady
write load (default 2k row changes/s: 20-row updates at 100 transactions/s from a separate
process) into bronze while, in this process:
  verify    `app.verify` of the table (snapshot, wait for bronze, changed keys, both sides read,
            checksummed and compared; the result row appended to bronze), best of --repeat;
  baseline  a plain `select *` of the table at the source (psycopg, every row fetched, a
            server-side cursor) plus a Spark scan of silver's partition of the table
            (`sum(length(record))` over consumer_records of the source and table, in a local[2]
            session as dbt's, after a warm-up), each best of --repeat.
Prints the times and the ratio verify / baseline. Goal (issue 18): <= 2.

Usage: .venv/bin/python bench/verify.py [--rows 1000000] [--rate 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.small_files import spark_session  # noqa: E402
from bench.snapshot_lag import dsn, load  # noqa: E402
from ingest.bronze.writer import BronzeWriter  # noqa: E402
from ingest.config import BatchConfig, load_config  # noqa: E402
from ingest.progress import Progress  # noqa: E402
from ingest.sources.postgres.admin import prepare_source  # noqa: E402
from ingest.sources.postgres.capture import PostgresCapture  # noqa: E402


def dbt_env(warehouse: Path) -> dict[str, str]:
    return dict(
        os.environ,
        PWD=str(ROOT),
        CHANGELAKE_WAREHOUSE=str(warehouse),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(warehouse.parent / "dbt-target"),
        DBT_LOG_PATH=str(warehouse.parent / "dbt-logs"),
    )


def plain_select(dsn_: str, table: str) -> float:
    t = time.perf_counter()
    with psycopg.connect(dsn_) as c, c.cursor(name="bench") as cur:
        cur.itersize = 5000
        cur.execute(f"select * from {table}")
        for _ in cur:
            pass
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    d = dsn()
    tmp = Path(tempfile.mkdtemp(prefix="changelake-bench-verify-"))
    suffix = f"{os.getpid()}"
    schema, name = f"bench_verify_{suffix}", f"bv_{suffix}"
    table = f"{schema}.items"
    admin = psycopg.connect(d, autocommit=True)
    run: subprocess.Popen[bytes] | None = None
    try:
        admin.execute(f"create schema {schema}")
        admin.execute(f"create table {table} (id bigint primary key, n int, name text, note text)")
        t = time.perf_counter()
        admin.execute(
            f"insert into {table} select g, 0, 'name ' || g, md5(g::text) from generate_series(1, {args.rows}) g"
        )
        admin.execute(f"analyze {table}")
        print(f"setup: {args.rows:,} rows inserted in {time.perf_counter() - t:.1f} s", flush=True)
        warehouse = tmp / "warehouse"
        cfg_path = tmp / "ingest.yml"
        cfg_path.write_text(
            yaml.safe_dump(
                {
                    "warehouse": str(warehouse),
                    "batch": {"max_seconds": 0.5},
                    "sources": [{"name": name, "kind": "postgres", "dsn": d, "tables": [table]}],
                }
            )
        )
        cfg = load_config(str(cfg_path))
        src = cfg.source(name)
        prepare_source(src).close()  # type: ignore[arg-type]
        t = time.perf_counter()
        PostgresCapture(
            src,  # type: ignore[arg-type]
            BatchConfig(max_events=100_000, max_seconds=5),
            BronzeWriter(warehouse),
            Progress(name, enabled=False),
            snapshots=True,
            page_rows=20_000,
        ).run(once=True, should_stop=lambda: False)
        print(f"setup: snapshot into bronze in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        subprocess.run(
            [str(Path(sys.executable).with_name("dbt")), "run", "--select", "+consumer_records",
             "--project-dir", str(ROOT)],
            env=dbt_env(warehouse), cwd=ROOT, check=True, capture_output=True, text=True,
        )  # fmt: skip
        print(f"setup: dbt run of silver in {time.perf_counter() - t:.1f} s", flush=True)

        run = subprocess.Popen(
            [sys.executable, "-m", "ingest", "-c", str(cfg_path), "run"], cwd=ROOT, stderr=subprocess.DEVNULL
        )
        stop, done = mp.Event(), mp.Value("d", 0.0)
        loader = mp.Process(target=load, args=(d, table, args.rows, args.rate, stop, done))
        loader.start()
        time.sleep(5)
        from ingest import app

        verify_s, results = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            result, _fmt = app.verify(cfg, [table], None, 120.0, 1000, 100, False)
            verify_s.append(time.perf_counter() - t)
            results.append(result.results[0])
        select_s = [plain_select(d, table) for _ in range(args.repeat)]
        spark = spark_session()  # type: ignore[no-untyped-call]
        silver = warehouse / "dbt" / "silver.db" / "consumer_records"
        scan = (
            f"select sum(length(record)) from delta.`{silver}` "
            f"where source = '{name}' and table_schema = '{schema}' and table_name = 'items'"
        )
        spark.sql(scan).collect()  # warm-up
        scan_s = []
        for _ in range(args.repeat):
            spark.catalog.clearCache()
            t = time.perf_counter()
            spark.sql(scan).collect()
            scan_s.append(time.perf_counter() - t)
        spark.stop()
        stop.set()
        loader.join()
        for r in results:
            print(
                f"verify: {r.status.value}, {r.source_rows:,} source rows, {r.silver_rows:,} silver rows, "
                f"{r.skipped_keys:,} keys skipped, {r.mismatches} mismatches, {r.ranges:,} ranges"
            )
        v, sel, sc = min(verify_s), min(select_s), min(scan_s)
        print(f"load: {done.value:,.0f} row changes/s while measuring")
        print(f"verify: {v:.2f} s (runs: {', '.join(f'{x:.2f}' for x in verify_s)})")
        print(f"plain select at the source: {sel:.2f} s; Spark scan of silver's partition: {sc:.2f} s")
        print(f"ratio verify / (select + scan) = {v / (sel + sc):.2f} (goal <= 2)")
    finally:
        if run is not None:
            run.terminate()
            run.wait(timeout=60)
        admin.execute(f"drop schema if exists {schema} cascade")
        admin.execute(f"drop publication if exists changelake_{name}")
        for (slot,) in admin.execute(
            "select slot_name from pg_replication_slots where slot_name like %s", (f"%{name}%",)
        ).fetchall():
            admin.execute("select pg_drop_replication_slot(%s)", (slot,))
        admin.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
