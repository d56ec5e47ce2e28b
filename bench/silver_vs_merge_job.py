"""Benchmark: silver by dbt against a hand-written Spark MERGE job, on the same warehouse and batch.

The baseline is the job a data engineer writes instead of changelake's dbt project, in one PySpark
process: read the new bronze events (above what the job stored, at or below the safe bound), keep
one copy per event key (source, commit_lsn, commit_index), append them to an event log with a
gapless per-source seq, and MERGE the last change per key into a current-state table with soft
deletes (partitions pruned to the touched tables). At the end of the first round the job's current
state is compared with consumer_records key for key (live keys and their records): the two do the
same work, or the ratio means nothing.

Steps, each in a fresh process (JVM start included, as a scheduled job pays it):
  1. synthetic bronze: --history events (bench/dbt_merge_scaling.py's generator: ingest's bronze
     tables, heartbeats, transactions of 1-6 events), then `dbt build` and the baseline job load it
     (not measured); then the --batch events (and a re-delivered page) are appended. The warehouse
     is copied aside.
  2. MEASURED, per round (the copy put back before each of the first three):
     - the baseline job taking the batch;
     - `dbt run --select silver` taking the batch;
     - `dbt build --exclude-resource-type unit_test` taking the batch (what ops/scheduled_job.sh
       runs), then the same build with nothing new, then the baseline job with nothing new.
Prints each time and the ratios to the baseline (the issue's targets: build <= 1.5x, silver run
<= 1.0x, the build with nothing new <= 0.5x the job with nothing new). Each measured dbt
invocation's run_results.json (per-node timings) is kept in <workdir>/run_results/.

Only one Spark/dbt process runs at a time; run it alone on a quiet machine. Usage:
  .venv/bin/python bench/silver_vs_merge_job.py [--history 1000000] [--batch 100000] [--tables 10]
      [--touched-tables 2] [--rounds 3] [--workdir DIR] [--keep] [--target local|engine]
With --target engine the measured dbt commands run on the warm engine a schedule uses (make
engine-up; ops/scheduled_job.sh finds it). --engine-state says what that engine has seen before
the measured command (untimed):
  - steady (the default): it has served the rounds before this one, as a long-lived engine under a
    schedule has. It is started on the warehouse as it was before the batch, one `dbt build` with
    var changelake_full_tests (every model and whole-table test, so every table's Delta log is
    read) runs on it, then the batch is appended to bronze while it runs (step 1's generator
    again, the same events), then the measured command runs;
  - fresh: it was started on the warehouse with the batch just before, and warmed up on scratch
    tables only (scripts/engine_warmup.py): every table's first read in the measured command
    pays its Delta log and metastore lookups (figures before 2026-11-27 noon were taken so).
The job still starts its own JVM each time, as a scheduled spark-submit does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DBT = Path(sys.executable).with_name("dbt")
CHANGES = ("insert", "update", "delete", "truncate")


# ---------------------------------------------------------------------------------------------
# The baseline job (python bench/silver_vs_merge_job.py _job WAREHOUSE)


def baseline_job(wh: Path) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.appName("changelake-baseline")
        .master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    events_path, current_path = str(wh / "baseline" / "events"), str(wh / "baseline" / "current")
    bronze = spark.read.format("delta").load(str(wh / "bronze" / "wal_events"))
    safe = (
        spark.read.format("delta")
        .load(str(wh / "bronze" / "stream_positions"))
        .groupBy("source", "writer_id")
        .agg(F.max("durable_lsn").alias("durable_lsn"))
        .groupBy("source")
        .agg(F.min("durable_lsn").alias("safe_lsn"))
    )
    new = (
        bronze.where(F.col("action").isin(*CHANGES))
        .join(safe, "source")
        .where(F.col("commit_lsn") <= F.col("safe_lsn"))
    )
    stored_any = DeltaTable.isDeltaTable(spark, events_path)
    if stored_any:
        stored = (
            spark.read.format("delta")
            .load(events_path)
            .groupBy("source")
            .agg(F.max("seq").alias("max_seq"), F.max(F.struct("commit_lsn", "commit_index")).alias("max_pos"))
        )
        new = new.join(stored, "source", "left").where(
            F.col("max_pos").isNull()
            | (F.col("commit_lsn") > F.col("max_pos.commit_lsn"))
            | (
                (F.col("commit_lsn") == F.col("max_pos.commit_lsn"))
                & (F.col("commit_index") > F.col("max_pos.commit_index"))
            )
        )
    else:
        new = new.withColumn("max_seq", F.lit(None).cast("bigint"))
    first_copy = Window.partitionBy("source", "commit_lsn", "commit_index").orderBy("ingested_at")
    in_order = Window.partitionBy("source").orderBy("commit_lsn", "commit_index")
    new = (
        new.withColumn("copy", F.row_number().over(first_copy))
        .where("copy = 1")
        .withColumn("seq", F.coalesce(F.col("max_seq"), F.lit(0)) + F.row_number().over(in_order))
        .select(*bronze.columns, "seq")
        # Eager and cut from its sources: appending to the event log below would otherwise make
        # Spark recompute the batch against the log that now holds it (and find it empty).
        .localCheckpoint()
    )
    count = new.count()
    if count == 0:
        print(json.dumps({"new_events": 0}))
        spark.stop()
        return
    new.write.format("delta").mode("append").partitionBy("source").save(events_path)
    last_first = Window.partitionBy("source", "table_schema", "table_name", "record_pk").orderBy(
        F.col("commit_lsn").desc(), F.col("commit_index").desc()
    )
    changes = (
        new.where(F.col("action") != "truncate")
        .withColumn("rank", F.row_number().over(last_first))
        .where("rank = 1")
        .select(
            "source",
            "table_schema",
            "table_name",
            "record_pk",
            F.when(F.col("action") == "delete", F.lit(None).cast("string")).otherwise(F.col("record")).alias("record"),
            (F.col("action") == "delete").alias("deleted"),
            "commit_lsn",
            "commit_index",
            "seq",
            F.col("commit_timestamp").alias("updated_at"),
        )
    )
    if not DeltaTable.isDeltaTable(spark, current_path):
        changes.write.format("delta").partitionBy("source", "table_schema", "table_name").save(current_path)
    else:
        touched = [tuple(r) for r in changes.select("source", "table_schema", "table_name").distinct().collect()]
        pruned = " or ".join(
            f"(t.source = '{s}' and t.table_schema = '{schema}' and t.table_name = '{name}')"
            for s, schema, name in touched
        )
        (
            DeltaTable.forPath(spark, current_path)
            .alias("t")
            .merge(
                changes.alias("c"),
                f"({pruned}) and t.source = c.source and t.table_schema = c.table_schema "
                "and t.table_name = c.table_name and t.record_pk = c.record_pk",
            )
            .whenMatchedUpdateAll(
                "c.commit_lsn > t.commit_lsn or (c.commit_lsn = t.commit_lsn and c.commit_index > t.commit_index)"
            )
            .whenNotMatchedInsertAll()
            .execute()
        )
    print(json.dumps({"new_events": count}))
    spark.stop()


def compare(wh: Path) -> None:
    """The job's live keys and records equal consumer_records' (python ... _compare WAREHOUSE)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    def live(path: Path) -> dict[tuple[str, str, str, str], str]:
        # delta-rs's query engine honours deletion vectors (consumer_records has them).
        sql = "select source, table_schema, table_name, record_pk, record from t where not deleted"
        rows = pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute(sql).read_all())
        return {
            (r["source"], r["table_schema"], r["table_name"], r["record_pk"]): r["record"] for r in rows.to_pylist()
        }

    job, dbt = live(wh / "baseline" / "current"), live(wh / "dbt" / "silver.db" / "consumer_records")
    if job != dbt:
        missing, extra = dbt.keys() - job.keys(), job.keys() - dbt.keys()
        differ = [k for k in dbt.keys() & job.keys() if dbt[k] != job[k]]
        raise SystemExit(
            f"baseline differs from consumer_records: {len(missing)} missing, {len(extra)} extra, {len(differ)} differ"
        )
    print(json.dumps({"live_keys": len(job)}))


# ---------------------------------------------------------------------------------------------
# Driver


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    secs = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed after {secs:.0f}s:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return secs, r.stdout


def slowest_nodes(run_results: Path, n: int = 8) -> str:
    """The n slowest nodes of a dbt invocation (its run_results.json), as `name 12.3s` items."""
    results = json.loads(run_results.read_text())["results"]
    top = sorted(results, key=lambda r: r["execution_time"], reverse=True)[:n]
    return ", ".join(f"{r['unique_id'].split('.')[2]} {r['execution_time']:.1f}s" for r in top)


def keep_results(work: Path, name: str) -> None:
    """Keep the last dbt invocation's run_results.json as <work>/run_results/<name>.json (per-node timings)."""
    (work / "run_results").mkdir(exist_ok=True)
    shutil.copy(work / "target" / "run_results.json", work / "run_results" / f"{name}.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--tables", type=int, default=10)
    ap.add_argument("--touched-tables", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument(
        "--target",
        choices=("local", "engine"),
        default="local",
        help="where the measured dbt commands run: local (a Spark session in dbt's process, JVM start "
        "included) or engine (the warm engine a schedule uses, scripts/cluster.sh with "
        "CHANGELAKE_SPARK_LOCAL=1, started and warmed up before each measured command, not timed)",
    )
    ap.add_argument(
        "--engine-state",
        choices=("steady", "fresh"),
        default="steady",
        help="with --target engine: what the engine has seen before a measured command (see above)",
    )
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="changelake-vs-job-"))
    wh, saved, before = work / "warehouse", work / "warehouse-with-batch", work / "warehouse-before-batch"
    for path in (wh, saved, before):
        shutil.rmtree(path, ignore_errors=True)
    env = dict(
        os.environ,
        CHANGELAKE_WAREHOUSE=str(wh),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(work / "target"),
        DBT_LOG_PATH=str(work / "logs"),
    )
    step = [PY, str(ROOT / "bench" / "dbt_merge_scaling.py"), "_step"]
    job = [PY, __file__, "_job", str(wh)]
    project = ["--project-dir", str(ROOT)]
    # The warm engine on ports of its own, its PIDs and logs under the work directory.
    engine_env = dict(
        env,
        CHANGELAKE_SPARK_LOCAL="1",
        CHANGELAKE_STATE=str(work / "engine-state"),
        CHANGELAKE_THRIFT_PORT="10250",
        CHANGELAKE_THRIFT_UI_PORT="4250",
    )
    if args.target == "engine":
        env = dict(engine_env)
    # The measured commands' target; the history's first build (not measured) takes the profile's default, local.
    target = ["--target", "engine"] if args.target == "engine" else []
    history_build = [str(DBT), "--quiet", "build", "--exclude-resource-type", "unit_test", *project]
    build = [*history_build, *target]

    def engine(action: str) -> None:
        """Start (with its warm-up round) or stop the warm engine on the current warehouse; not timed."""
        if args.target == "engine":
            subprocess.run(
                ["bash", str(ROOT / "scripts" / "cluster.sh"), action], env=engine_env, check=True, capture_output=True
            )

    touched = ",".join(str(t) for t in range(args.touched_tables))
    print(
        f"history {args.history:,} events, batch {args.batch:,} over {args.touched_tables} of {args.tables} tables",
        f"(work directory {work})",
    )
    print(f"  measured on target {args.target}" + (f", {args.engine_state} engine" if args.target == "engine" else ""))
    secs, _ = timed([*step, "history", str(wh), str(args.history), str(args.tables)], env)
    print(f"  synthetic history: {secs:.0f}s")
    secs, _ = timed(history_build, env)
    print(f"  dbt build of the history: {secs:.0f}s")
    secs, _ = timed(job, env)
    print(f"  baseline job over the history: {secs:.0f}s")
    shutil.copytree(wh, before)
    batch_step = [*step, "batch", str(wh), str(args.history), str(args.batch), str(args.tables), touched]
    secs, _ = timed(batch_step, env)
    print(f"  synthetic batch: {secs:.0f}s")
    shutil.copytree(wh, saved)
    steady = args.target == "engine" and args.engine_state == "steady"
    full_tests_build = [*build, "--vars", "{changelake_full_tests: true}"]
    results: list[dict[str, float]] = []
    for n in range(args.rounds):
        r: dict[str, float] = {}

        def restore() -> None:
            engine("down")
            shutil.rmtree(wh)
            shutil.copytree(saved, wh)

        def ready() -> None:
            """The warehouse with the batch and the engine as --engine-state says (not timed)."""
            if not steady:
                restore()
                engine("up")
                return
            engine("down")
            shutil.rmtree(wh)
            shutil.copytree(before, wh)
            engine("up")
            timed(full_tests_build, env)  # the rounds before this one: every table read on the engine
            timed(batch_step, env)  # the batch lands in bronze while the engine runs, as ingest appends it

        restore()
        r["job"], out = timed(job, env)
        ready()
        r["silver_run"], _ = timed([str(DBT), "--quiet", "run", "--select", "silver", *project, *target], env)
        keep_results(work, f"silver_run_{n + 1}")
        ready()
        r["build"], _ = timed(build, env)
        keep_results(work, f"build_{n + 1}")
        # The job's batch again on the build's warehouse (restored before the build), so that both
        # have taken it before the rounds with nothing new; compared with what the build made once.
        timed(job, env)
        if n == 0:
            print("  the build's slowest nodes: " + slowest_nodes(work / "target" / "run_results.json"))
            _, out = timed([PY, __file__, "_compare", str(wh)], env)
            print(
                f"  baseline == consumer_records: {json.loads(out.strip().splitlines()[-1])['live_keys']:,} live keys"
            )
        r["build_nothing_new"], _ = timed(build, env)
        keep_results(work, f"build_nothing_new_{n + 1}")
        r["job_nothing_new"], out = timed(job, env)
        assert json.loads(out.strip().splitlines()[-1])["new_events"] == 0, out
        engine("down")
        results.append(r)
        print("  round " + str(n + 1) + ": " + ", ".join(f"{k} {v:.0f}s" for k, v in r.items()))
    # The median of the rounds (the figure; the best of them with one round), each ratio
    # taken between the medians.
    best = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print(f"median of {len(results)} round(s):")
    print(f"  baseline job: {best['job']:.0f}s; with nothing new {best['job_nothing_new']:.0f}s")
    print(
        f"  dbt run --select silver: {best['silver_run']:.0f}s = "
        f"{best['silver_run'] / best['job']:.2f}x the job (target <= 1.0)"
    )
    print(f"  dbt build: {best['build']:.0f}s = {best['build'] / best['job']:.2f}x the job (target <= 1.5)")
    print(
        f"  dbt build with nothing new: {best['build_nothing_new']:.0f}s = "
        f"{best['build_nothing_new'] / best['job_nothing_new']:.2f}x the job with nothing new (target <= 0.5)"
    )
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_job":
        baseline_job(Path(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "_compare":
        compare(Path(sys.argv[2]))
    else:
        main()
