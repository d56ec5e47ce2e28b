"""Benchmark: generated gold as views or as tables (issue 15), on a local Spark with Delta.

A consumer_records-like Delta table (partitioned by source, table_schema, table_name, as silver's
is) holds --tables tables of --rows records each (record JSON with an id, a decimal, a timestamp,
two strings and an int). For each table the gold SELECT that typed_current_state generates
(from_json into map<string, string>, casts, filtered to the table and to live records) is
materialized two ways, each timed over all tables as one `dbt build` of gold would do it:
  - table: `create or replace table ... using delta as <select>` (every run rewrites every table);
  - view: `create or replace view ... as <select>` (a run only re-creates the definition).
Then reading one table's gold: a full scan (count and a hash of every column) and a lookup of one
id, from the view and from the table. Each figure is the best of --repeat runs after a warm-up.

Usage: .venv/bin/python bench/gold_materialization.py [--tables 20] [--rows 50000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def spark_session(warehouse: Path) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.appName("changelake-bench-gold")
        .master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )


def gold_select(table: str) -> str:
    """What typed_current_state renders for a table of the synthetic shape."""
    return f"""
        select
            cast(v['id'] as bigint) as `id`,
            case when v['amount'] = 'NaN' then null else cast(v['amount'] as decimal(12,2)) end as `amount`,
            case when v['created_at'] in ('infinity', '-infinity') then null
                else cast(regexp_replace(v['created_at'], '([+-][0-9]{{2}})$', '$1:00') as timestamp) end
                as `created_at`,
            v['name'] as `name`, v['status'] as `status`, cast(v['qty'] as int) as `qty`,
            record_pk as _cl_record_pk, source as _cl_source, commit_lsn as _cl_commit_lsn, seq as _cl_seq
        from (select *, from_json(record, 'map<string, string>') as v from silver.consumer_records
              where source = 'bench' and table_schema = 'public' and table_name = '{table}' and not deleted)
    """


def timed(spark: Any, statements: list[str], repeat: int) -> float:
    for s in statements:  # warm-up
        spark.sql(s).collect()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s in statements:
            spark.sql(s).collect()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="changelake-bench-gold-"))
    try:
        spark = spark_session(work)
        spark.sparkContext.setLogLevel("ERROR")  # `create or replace table` logs each table id change
        spark.sql("create database silver")
        spark.sql("create database gold")
        t0 = time.perf_counter()
        spark.sql(f"""
            create table silver.consumer_records using delta
            partitioned by (source, table_schema, table_name) as
            select 'bench' as source, 'public' as table_schema, concat('t', cast(id % {args.tables} as string))
                as table_name, concat('{{"id":', id, '}}') as record_pk,
                to_json(named_struct('id', id, 'amount', format_number(id % 100000 / 100.0, 2),
                    'created_at', '2026-01-01 10:00:00.5+00', 'name', concat('name ', id),
                    'status', 'paid', 'qty', id % 7)) as record,
                id % 50 = 0 as deleted, id * 100 as commit_lsn, 0 as commit_index, id as seq
            from range({args.tables * args.rows})
        """)
        print(f"consumer_records: {args.tables} tables x {args.rows} rows in {time.perf_counter() - t0:.1f} s")
        tables = [f"t{i}" for i in range(args.tables)]
        build_table = timed(
            spark,
            [f"create or replace table gold.{t}_tbl using delta as {gold_select(t)}" for t in tables],
            args.repeat,
        )
        build_view = timed(
            spark, [f"create or replace view gold.{t}_v as {gold_select(t)}" for t in tables], args.repeat
        )
        scan = "select count(*), sum(hash(*)) from gold.{}"
        scan_table = timed(spark, [scan.format("t0_tbl")], args.repeat)
        scan_view = timed(spark, [scan.format("t0_v")], args.repeat)
        look = "select * from gold.{} where id = 12340"
        look_table = timed(spark, [look.format("t0_tbl")], args.repeat)
        look_view = timed(spark, [look.format("t0_v")], args.repeat)
        print(
            f"build all {args.tables} gold models: table {build_table:.2f} s, view {build_view:.2f} s, "
            f"ratio view/table {build_view / build_table:.3f}"
        )
        print(
            f"full scan of one model: table {scan_table:.2f} s, view {scan_view:.2f} s, "
            f"ratio view/table {scan_view / scan_table:.2f}"
        )
        print(
            f"lookup of one id: table {look_table:.2f} s, view {look_view:.2f} s, "
            f"ratio view/table {look_view / look_table:.2f}"
        )
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
