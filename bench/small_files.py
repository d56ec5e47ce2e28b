"""Benchmark: a Spark read of bronze.wal_events after 10,000 small ingest commits vs the same rows in few files.

Ingest commits often (a batch per `batch.max_seconds` at low traffic), so bronze would collect one
small Parquet file and one JSON log entry per commit. The writer's upkeep (delta-rs checkpoints
every 100 commits, compaction of the source's partition every 100 commits of the process, vacuum
after the retention) is what keeps a reader's cost near that of the same rows in few files.

Table A: `--commits` appends of `--rows-per-commit` events through `BronzeWriter.append_events`
(the production path, app transactions and upkeep included). Table B: the same rows in one append.
With `--log-retention`, table A keeps its log entries for that long instead of the default
(15 minutes): what the default does to a table that has been written for longer than 15 minutes,
seen in a run shorter than that. Then, in one local Spark (as dbt's), each of the reads dbt does
is timed on both (best of `--repeat` after a warm-up): a full count, and sequin_events' incremental read (one source, a
position range). Prints the ratios A / B. `--no-upkeep` shows what the upkeep buys.

Usage: .venv/bin/python bench/small_files.py [--commits 10000] [--rows-per-commit 20] [--repeat 5]
       [--log-retention INTERVAL] [--file-retention INTERVAL] [--no-upkeep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.bronze import writer as writer_mod  # noqa: E402
from ingest.bronze.schemas import WAL_EVENTS_TABLE  # noqa: E402
from ingest.bronze.writer import BronzeWriter  # noqa: E402
from ingest.events import Action, ChangeEvent  # noqa: E402


def events(first_lsn: int, n: int) -> list[ChangeEvent]:
    return [
        ChangeEvent(
            first_lsn,
            i,
            first_lsn,
            1_700_000_000_000_000,
            Action.UPDATE,
            "public",
            "orders",
            16384,
            f'{{"id":{first_lsn * 100 + i}}}',
            None,
            f'{{"id":{first_lsn * 100 + i},"status":"paid","amount":"12.50","note":"some text"}}',
        )
        for i in range(n)
    ]


def spark_session():  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.appName("changelake-bench-small-files")
        .master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )


def best(spark, sql: str, repeat: int) -> float:  # type: ignore[no-untyped-def]
    spark.sql(sql).collect()  # warm-up (JIT, Delta log cache of this version)
    times = []
    for _ in range(repeat):
        spark.catalog.clearCache()
        t = time.perf_counter()
        spark.sql(sql).collect()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--rows-per-commit", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-upkeep", action="store_true", help="no compaction (checkpoints still come from delta-rs)")
    ap.add_argument(
        "--log-retention",
        help="delta.logRetentionDuration of the tables (e.g. 'interval 1 minute'), to see in minutes what the "
        "default retention does over its own span",
    )
    ap.add_argument(
        "--file-retention", help="delta.deletedFileRetentionDuration of table A (how long `remove` tombstones stay)"
    )
    args = ap.parse_args()
    if args.no_upkeep:
        writer_mod.COMPACT_EVERY_COMMITS = 1 << 62
    work = Path(tempfile.mkdtemp(prefix="changelake-smallfiles-"))
    try:
        small, few = BronzeWriter(work / "small"), BronzeWriter(work / "few")
        small.ensure_tables()
        few.ensure_tables()
        props = {}
        if args.log_retention:
            props["delta.logRetentionDuration"] = args.log_retention
        if args.file_retention:
            props["delta.deletedFileRetentionDuration"] = args.file_retention
        if props:
            small.tables.table(small.path(WAL_EVENTS_TABLE)).alter.set_table_properties(props)
        t = time.monotonic()
        everything: list[ChangeEvent] = []
        for c in range(args.commits):
            batch = events(1_000_000 + c, args.rows_per_commit)
            small.append_events("bench", "postgres", "stream", batch, {})
            everything += batch
        write_s = time.monotonic() - t
        few.append_events("bench", "postgres", "stream", everything, {})
        table_a, table_b = small.path(WAL_EVENTS_TABLE), few.path(WAL_EVENTS_TABLE)
        files_a = len(small.tables.table(table_a).file_uris())
        log_a = len(list((work / "small" / "bronze" / "wal_events" / "_delta_log").iterdir()))
        files_b = len(few.tables.table(table_b).file_uris())
        print(
            f"table A: {args.commits:,} commits of {args.rows_per_commit} events in {write_s:.1f} s "
            f"({args.commits / write_s:,.0f} commits/s), {files_a} live files, {log_a} files in _delta_log; "
            f"table B: 1 commit, {files_b} files"
        )

        spark = spark_session()
        spark.sparkContext.setLogLevel("ERROR")
        mid = 1_000_000 + args.commits // 2
        reads = {
            "count(*)": "select count(*) from delta.`{t}`",
            "incremental range": (
                "select action, count(*), max(struct(commit_lsn, commit_index)) from delta.`{t}` "
                f"where source = 'bench' and commit_lsn > {mid} and commit_lsn <= {mid + 500} group by action"
            ),
        }
        worst = 0.0
        for name, sql in reads.items():
            a = best(spark, sql.format(t=table_a), args.repeat)
            b = best(spark, sql.format(t=table_b), args.repeat)
            worst = max(worst, a / b)
            print(f"{name:18s}: A {a * 1000:7.0f} ms, B {b * 1000:7.0f} ms, ratio A/B {a / b:.2f}")
        print(f"worst ratio: {worst:.2f} (goal <= 1.5)")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
