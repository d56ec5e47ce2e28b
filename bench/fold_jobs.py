"""Diagnostic: what one compiled fold costs Spark, job by job, on a warehouse it already ran on.

Takes a compiled model (e.g. `<target>/compiled/changelake/models/silver/consumer_records.sql`)
and the warehouse it was compiled against, names its tables by path (no metastore needed), and runs
the query as dbt's materialization does (a temporary view, then a select of it) in one warm PySpark
session with the local target's settings. Prints, per run, the wall time, the Spark jobs and stages
it took, and the file scans and exchanges of its plan. `--share CTE` keeps Spark from inlining that
CTE at each reference (a non-deterministic filter: Spark then computes it once and reuses it);
`--conf key=value` adds a Spark setting. The first run pays the JVM's warm-up: compare the others.

  .venv/bin/python bench/fold_jobs.py COMPILED.sql WAREHOUSE [--share new_events ...] [--conf k=v ...]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path


def by_path(sql: str, warehouse: Path) -> str:
    """silver.x / bronze.x as delta.`<path>`: the warehouse's metastore may be gone or elsewhere."""
    sql = re.sub(r"`?silver`?\.`?([a-z_]+)`?", lambda m: f"delta.`{warehouse}/dbt/silver.db/{m[1]}`", sql)
    return re.sub(r"`?bronze`?\.`?([a-z_]+)`?", lambda m: f"delta.`{warehouse}/bronze/{m[1]}`", sql)


def shared(sql: str, name: str) -> str:
    """The query with CTE `name` renamed `name__src` and `name` a non-deterministic filter of it."""
    m = re.search(rf"\n\s*{name} as \(", sql)
    if m is None:
        raise SystemExit(f"no CTE named {name}")
    start = m.end() - 1
    depth = 0
    for end in range(start, len(sql)):
        depth += {"(": 1, ")": -1}.get(sql[end], 0)
        if depth == 0:
            break
    source = f"\n{name}__src as {sql[start : end + 1]}"
    return f"{sql[: m.start()]}{source},\n{name} as (select * from {name}__src where rand() >= 0){sql[end + 1 :]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("compiled", type=Path)
    ap.add_argument("warehouse", type=Path)
    ap.add_argument("--share", action="append", default=[])
    ap.add_argument("--conf", action="append", default=[])
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    sql = by_path(args.compiled.read_text(), args.warehouse.resolve())
    for name in args.share:
        sql = shared(sql, name)

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName("changelake-fold-jobs")
        .master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    for setting in args.conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    tracker = spark.sparkContext.statusTracker()
    spark.sql(f"create or replace temporary view fold as {sql}")
    times = []
    for run in range(args.runs):
        spark.sparkContext.setJobGroup(f"run{run}", "fold")
        t0 = time.perf_counter()
        rows = len(spark.sql("select * from fold").collect())
        times.append(time.perf_counter() - t0)
        jobs = tracker.getJobIdsForGroup(f"run{run}")
        stages = sum(len(info.stageIds) for j in jobs if (info := tracker.getJobInfo(j)) is not None)
        print(f"run {run}: {times[-1]:.2f} s, {len(jobs)} jobs, {stages} stages, {rows} rows", flush=True)
    plan = spark.sql("select * from fold")._jdf.queryExecution().executedPlan().toString()
    warm = times[1:] or times
    print(
        f"warm mean {sum(warm) / len(warm):.2f} s; plan: {plan.count('FileScan')} file scans, "
        f"{plan.count('Exchange')} exchanges ({plan.count('BroadcastExchange')} broadcast, "
        f"{plan.count('ReusedExchange')} reused); shared {args.share or 'none'}; conf {args.conf or 'none'}"
    )
    spark.stop()


if __name__ == "__main__":
    main()
