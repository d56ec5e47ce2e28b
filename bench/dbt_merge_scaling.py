"""Benchmark: does the incremental silver run cost follow the batch, not the history.

Issue 3 measured sequin_events and consumer_records; issue 15 adds record_history (silver's SCD2
history, one row per version), timed per model from run_results.json with its own ratio line.

For each history size H (default 1M and 10M events), in its own fresh warehouse:
  1. a Spark subprocess writes synthetic bronze (wal_events, stream_positions, source_relations) by
     path into tables created by ingest's BronzeWriter (schemas, partitioning and properties of
     ingest/bronze/schemas.py): H events of source 'bench' over --tables tables, ~H/3 distinct keys,
     insert/update/delete mix, transactions of 1..6 events, heartbeat messages;
  2. `dbt run --select silver` builds silver from that history (timed, not the measured step); the
     resulting silver is copied aside;
  3. a Spark subprocess appends the same batch shape (--batch events above the history, touching new
     and existing keys of only --touched-tables tables, plus a re-delivered page of duplicates) and
     raises the writer's position;
  4. the MEASURED step: `dbt run --select silver`, incremental. It is repeated --repeat times per size,
     interleaved across sizes (silver put back from the copy before each repeat), because other
     processes on the machine make single timings noisy;
  5. checks: after the first incremental run a Spark subprocess verifies silver (event count, gapless
     seq, one row per key, every batch-touched key holds its last batch event); every run is checked
     against the expected row counts and max seq from the Delta log statistics.

Prints the history build time, the incremental run times (wall clock of the dbt process and dbt's
per-model execution_time from run_results.json), the ratio incremental(largest H)/incremental(smallest
H) (goal <= 1.3) and, for the fastest incremental run of each size: what the MERGE rewrote (Delta log),
the slowest dbt statements with the Spark time and rows their scans read (Spark event log), and the
slowest Spark SQL executions.

Only one Spark/dbt process runs at a time. Usage:
  .venv/bin/python bench/dbt_merge_scaling.py [--history 1000000 10000000] [--batch 100000]
      [--tables 10] [--touched-tables 2] [--repeat 2] [--workdir DIR] [--keep] [--no-event-log]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DBT = Path(sys.executable).with_name("dbt")

SOURCE = "bench"
SCHEMA = "public"
# Transactions: every block of 16 events holds 5 transactions of 1, 2, 3, 4 and 6 events.
BLOCK = 16
TXNS_PER_BLOCK = 5
TXN_OF = [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4]
INDEX_OF = [0, 0, 1, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
LSN0 = 0x16_0000_0000
LSN_STEP = 4096  # commit LSNs of consecutive transactions
COMMIT_TS0_US = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z
DUPLICATES = 1000  # the batch's last events are appended twice (a re-delivered page)
ROWS_PER_FILE = 250_000


# ---------------------------------------------------------------------------------------------
# Shape of the generated data (pure arithmetic, shared by the generator and the checks)


def txn_of(g: int) -> int:
    return (g // BLOCK) * TXNS_PER_BLOCK + TXN_OF[g % BLOCK]


def lsn_of_txn(txn: int) -> int:
    return LSN0 + txn * LSN_STEP


def batch_start(history: int) -> int:
    """Global event number of the batch's first event: the next block, so a new transaction."""
    return math.ceil(history / BLOCK) * BLOCK


def messages_in(n: int) -> int:
    """Heartbeat messages among local events 0..n-1 (i % 1000 == 500 and not an insert slot)."""
    return sum(1 for i in range(500, n, 1000) if i % 3 != 0)


def inserts_in(n: int) -> int:
    return (n + 2) // 3


def expected(history: int, batch: int) -> dict[str, int]:
    return {
        "history_events": history - messages_in(history),
        "history_keys": inserts_in(history),
        "events": history - messages_in(history) + batch - messages_in(batch),
        "keys": inserts_in(history) + inserts_in(batch),
    }


def event_sql(
    g0: int, *, first: int = 0, history_keys: int | None, tables: int, touched: list[int], ingested_us: int
) -> str:
    """SELECT over the view `range_events` (spark.range) producing wal_events rows.

    Row `id` is the phase's local event number i = first + id and the global event number g0 + i.

    History (history_keys None): event i inserts key i/3 when i % 3 == 0, otherwise updates (90%) or
    deletes (10%) an already inserted key, uniformly; key k lives in table t<k % tables>.
    Batch: inserts new keys of the touched tables only; updates/deletes hit batch-new keys (half) and
    history keys of the touched tables (half).
    """
    g = f"({g0} + i)"
    txn = f"(({g} div {BLOCK}) * {TXNS_PER_BLOCK} + element_at(array({', '.join(map(str, TXN_OF))}), "
    txn += f"cast(pmod({g}, {BLOCK}) + 1 as int)))"
    idx = f"element_at(array({', '.join(map(str, INDEX_OF))}), cast(pmod({g}, {BLOCK}) + 1 as int))"
    action = (
        "case when i % 1000 = 500 and i % 3 != 0 then 'message' "
        "when i % 3 = 0 then 'insert' "
        f"when pmod(hash({g}, 1), 100) < 10 then 'delete' else 'update' end"
    )
    if history_keys is None:
        key = f"case when i % 3 = 0 then i div 3 else pmod(hash({g}, 2), i div 3 + 1) end"
    else:
        m = len(touched)
        touched_arr = f"array({', '.join(map(str, touched))})"
        base = math.ceil(history_keys / tables)

        def new_key(j: str) -> str:
            return f"({tables} * ({base} + ({j}) div {m}) + element_at({touched_arr}, cast(pmod({j}, {m}) + 1 as int)))"

        old_key = (
            f"({tables} * pmod(hash({g}, 2), {history_keys // tables}) "
            f"+ element_at({touched_arr}, cast(pmod(hash({g}, 3), {m}) + 1 as int)))"
        )
        key = (
            f"case when i % 3 = 0 then {new_key('i div 3')} "
            f"when pmod(hash({g}, 5), 2) = 0 then {new_key(f'pmod(hash({g}, 4), i div 3 + 1)')} "
            f"else {old_key} end"
        )
    status = f"element_at(array('new', 'paid', 'shipped', 'done', 'void'), cast(pmod(hash({g}, 6), 5) + 1 as int))"
    amount = f"cast(cast(pmod(hash({g}, 7), 10000000) as decimal(12, 0)) / 100 as decimal(12, 2))"
    note = f"repeat('x', pmod(hash({g}, 8), 40))"
    return f"""
        with numbered as (
            select id + {first} as i from range_events
        ),
        base as (
            select i, {txn} as txn, {idx} as commit_index, {action} as action, {key} as k, {g} as g
            from numbered
        )
        select
            '{SOURCE}' as source,
            'postgres' as source_kind,
            {LSN0} + txn * {LSN_STEP} as commit_lsn,
            commit_index,
            {LSN0} + txn * {LSN_STEP} + 56 as end_lsn,
            1000 + txn as xid,
            timestamp_micros({COMMIT_TS0_US} + txn * 10000) as commit_timestamp,
            action,
            case when action != 'message' then '{SCHEMA}' end as table_schema,
            case when action != 'message' then concat('t', k % {tables}) end as table_name,
            case when action != 'message' then 16384 + k % {tables} end as relation_id,
            case when action != 'message' then concat('{{"id":', k, '}}') end as record_pk,
            cast(null as string) as old_record_pk,
            case when action in ('insert', 'update') then concat(
                '{{"id":', k, ',"status":"', {status}, '","amount":"', {amount},
                '","note":"', {note}, '","rev":', g, '}}') end as record,
            case when action = 'delete' then concat('{{"id":', k, '}}') end as old_record,
            cast(null as array<string>) as unchanged_toast,
            cast(null as array<string>) as truncated_tables,
            cast(null as int) as truncate_options,
            case when action = 'message' then 'changelake.heartbeat' end as message_prefix,
            case when action = 'message' then concat('{{"g":', g, '}}') end as message_content,
            case when action = 'message' then false end as message_transactional,
            'stream' as writer_id,
            timestamp_micros({ingested_us}) as ingested_at
        from base
    """


# ---------------------------------------------------------------------------------------------
# Spark subprocess steps (python bench/dbt_merge_scaling.py _step ...)


def _spark() -> Any:
    """A local Spark with Delta: the generator of this benchmark's synthetic bronze, and silver's reader.

    Ingest writes bronze with delta-rs; only this synthetic, throwaway warehouse gets its millions
    of generated rows from Spark (spark.range), into tables the BronzeWriter created.
    """
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.appName("changelake-bench")
        .master("local[2]")
        .config("spark.driver.memory", "3g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )


def _append_events(spark: Any, path: str, sql: str, n: int) -> None:
    spark.range(n).createOrReplaceTempView("range_events")
    df = spark.sql(sql)
    target = spark.read.format("delta").load(path).schema
    df = df.select(*[df[f.name].cast(f.dataType).alias(f.name) for f in target.fields])
    df.write.format("delta").mode("append").option("maxRecordsPerFile", ROWS_PER_FILE).save(path)


def step_history(wh: Path, history: int, tables: int) -> None:
    from ingest.bronze.schemas import WAL_EVENTS_TABLE
    from ingest.bronze.writer import BronzeWriter
    from ingest.events import ColumnShape, RelationShape, WriterKind, WriterPosition

    spark = _spark()
    writer = BronzeWriter(wh)
    writer.ensure_tables()
    now_us = int(time.time() * 1e6)
    sql = event_sql(0, history_keys=None, tables=tables, touched=[], ingested_us=now_us - 3_600_000_000)
    _append_events(spark, writer.path(WAL_EVENTS_TABLE), sql, history)
    columns = (
        ColumnShape("id", 20, "bigint", -1, True, 1, "int"),
        ColumnShape("status", 25, "text", -1, False, None, "text"),
        ColumnShape("amount", 1700, "numeric(12,2)", 786438, False, None, "numeric"),
        ColumnShape("note", 25, "text", -1, False, None, "text"),
        ColumnShape("rev", 20, "bigint", -1, False, None, "int"),
    )
    writer.append_relations(
        SOURCE,
        [RelationShape(16384 + t, SCHEMA, f"t{t}", "d", columns, LSN0) for t in range(tables)],
    )
    last = lsn_of_txn(txn_of(history - 1))
    writer.raise_position(WriterPosition(SOURCE, "stream", WriterKind.STREAM, last, last + 56), _started_at())
    spark.stop()


def _started_at() -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(COMMIT_TS0_US / 1e6, UTC)


def step_batch(wh: Path, history: int, batch: int, tables: int, touched: list[int]) -> None:
    from ingest.bronze.schemas import WAL_EVENTS_TABLE
    from ingest.bronze.writer import BronzeWriter
    from ingest.events import WriterKind, WriterPosition

    spark = _spark()
    writer = BronzeWriter(wh)
    path = writer.path(WAL_EVENTS_TABLE)
    g0 = batch_start(history)
    now_us = int(time.time() * 1e6)
    sql = event_sql(g0, history_keys=inserts_in(history), tables=tables, touched=touched, ingested_us=now_us)
    _append_events(spark, path, sql, batch)
    # A re-delivered page: the batch's last events again, appended later (silver must keep one copy).
    dup = min(DUPLICATES, batch)
    sql = event_sql(
        g0,
        first=batch - dup,
        history_keys=inserts_in(history),
        tables=tables,
        touched=touched,
        ingested_us=now_us + 60_000_000,
    )
    _append_events(spark, path, sql, dup)
    last = lsn_of_txn(txn_of(g0 + batch - 1))
    writer.raise_position(WriterPosition(SOURCE, "stream", WriterKind.STREAM, last, last + 56), _started_at())
    spark.stop()


def step_verify(wh: Path, history: int, batch: int) -> None:
    from pyspark.sql import functions as F

    spark = _spark()
    silver = wh / "dbt" / "silver.db"
    want = expected(history, batch)
    n_events, n_keys = want["events"], want["keys"]
    problems: list[str] = []
    ev = spark.read.format("delta").load(str(silver / "sequin_events"))
    row = ev.agg(
        F.count("*").alias("n"),
        F.max("seq").alias("max_seq"),
        F.countDistinct("commit_lsn", "commit_index").alias("keys"),
    ).collect()[0]
    if row.n != n_events:
        problems.append(f"sequin_events has {row.n} rows, expected {n_events}")
    if row.max_seq != row.n or row.keys != row.n:
        problems.append(f"sequin_events: max(seq) {row.max_seq}, distinct positions {row.keys}, rows {row.n}")
    cr = spark.read.format("delta").load(str(silver / "consumer_records"))
    row2 = cr.agg(
        F.count("*").alias("n"),
        F.countDistinct("table_schema", "table_name", "record_pk").alias("keys"),
        F.max("seq").alias("max_seq"),
        F.sum(F.col("deleted").cast("int")).alias("deleted"),
    ).collect()[0]
    if row2.n != n_keys or row2.keys != n_keys:
        problems.append(f"consumer_records has {row2.n} rows / {row2.keys} keys, expected {n_keys}")
    if row2.max_seq != row.max_seq:
        problems.append(f"consumer_records max(seq) {row2.max_seq} != sequin_events max(seq) {row.max_seq}")
    # Every key the batch touched holds the batch's last event for it.
    first_lsn = lsn_of_txn(txn_of(batch_start(history)))
    bronze = spark.read.format("delta").load(str(wh / "bronze" / "wal_events"))
    last = (
        bronze.where((F.col("commit_lsn") >= first_lsn) & F.col("action").isin("insert", "update", "delete"))
        .groupBy("table_name", "record_pk")
        .agg(F.max(F.struct("commit_lsn", "commit_index", "action", "record")).alias("e"))
    )
    joined = last.join(cr.where(F.col("source") == SOURCE), ["table_name", "record_pk"], "left")
    bad = joined.where(
        F.col("seq").isNull()
        | (F.col("commit_lsn") != F.col("e.commit_lsn"))
        | (F.col("commit_index") != F.col("e.commit_index"))
        | (F.col("deleted") != (F.col("e.action") == "delete"))
        | ((F.col("e.action") != "delete") & (F.col("record") != F.col("e.record")))
    )
    checked = joined.count()
    n_bad = bad.count()
    if n_bad:
        problems.append(f"{n_bad} of {checked} batch-touched keys do not hold their last batch event")
    # record_history: its current versions are the live consumer_records rows (DESIGN §6 history).
    rh = spark.read.format("delta").load(str(silver / "record_history"))
    current = rh.where(F.col("is_current"))
    live = cr.where(~F.col("deleted"))
    n_versions, n_current = rh.count(), current.count()
    if n_current != live.count():
        problems.append(f"record_history has {n_current} current versions, consumer_records {live.count()} live rows")
    keys = ["source", "table_schema", "table_name", "record_pk"]
    differing = (
        current.join(live, keys, "full_outer")
        .where(
            ~F.coalesce(current["record"] == live["record"], F.lit(False))
            | ~F.coalesce(current["valid_from_lsn"] == live["commit_lsn"], F.lit(False))
            | ~F.coalesce(current["valid_from_index"] == live["commit_index"], F.lit(False))
        )
        .count()
    )
    if differing:
        problems.append(f"{differing} current record_history versions differ from consumer_records")
    # What the incremental models pay to find where they stand: the stored max per source.
    lookups = {
        "sequin_events max position per source": (
            f"select source, max(seq), max_by(commit_lsn, seq), max_by(commit_index, seq) "
            f"from delta.`{silver / 'sequin_events'}` group by source"
        ),
        "consumer_records max seq per source": (
            f"select source, max(seq) from delta.`{silver / 'consumer_records'}` group by source"
        ),
        "record_history max seq and lsn per source": (
            f"select source, greatest(max(valid_from_seq), max(valid_to_seq)), "
            f"greatest(max(valid_from_lsn), max(valid_to_lsn)) "
            f"from delta.`{silver / 'record_history'}` group by source"
        ),
    }
    lookup_secs = {}
    for name, q in lookups.items():
        spark.sql(q).collect()  # warm up (JIT, Delta log cache)
        t0 = time.monotonic()
        spark.sql(q).collect()
        lookup_secs[name] = time.monotonic() - t0
    out = {
        "lookups": lookup_secs,
        "sequin_events": row.n,
        "consumer_records": row2.n,
        "deleted": row2.deleted,
        "record_history": n_versions,
        "current_versions": n_current,
        "checked_keys": checked,
        "problems": problems,
        "merge": last_commit(silver / "consumer_records"),
        "append": last_commit(silver / "sequin_events"),
    }
    print("VERIFY " + json.dumps(out))
    spark.stop()


def last_commit(table: Path) -> dict[str, Any]:
    """Operation, metrics and touched partitions of a Delta table's last commit (from its log)."""
    log = table / "_delta_log"
    versions = sorted(log.glob("*.json"))
    added: dict[str, int] = defaultdict(int)
    removed: dict[str, int] = defaultdict(int)
    info: dict[str, Any] = {}
    for line in versions[-1].read_text().splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        for kind, bucket in (("add", added), ("remove", removed)):
            if kind in action:
                part = action[kind].get("partitionValues", {})
                bucket[part.get("table_name") or part.get("source") or "-"] += 1
    total_files = sum(1 for _ in table.rglob("*.parquet"))
    return {
        "version": int(versions[-1].stem),
        "operation": info.get("operation"),
        "metrics": info.get("operationMetrics", {}),
        "files_added_by_partition": dict(added),
        "files_removed_by_partition": dict(removed),
        "parquet_files_on_disk": total_files,
    }


# ---------------------------------------------------------------------------------------------
# Driver


def run_step(*args: str) -> tuple[float, str]:
    t0 = time.monotonic()
    r = subprocess.run([PY, __file__, "_step", *args], cwd=ROOT, capture_output=True, text=True)
    secs = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"step {args} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
    return secs, r.stdout


def run_dbt(wh: Path, work: Path, label: str, event_log: bool) -> dict[str, Any]:
    target, logs = work / f"target-{label}", work / f"logs-{label}"
    env = dict(
        os.environ,
        CHANGELAKE_WAREHOUSE=str(wh),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(target),
        DBT_LOG_PATH=str(logs),
    )
    events_dir = work / f"eventlog-{label}"
    if event_log:
        events_dir.mkdir(parents=True, exist_ok=True)
        env["PYSPARK_SUBMIT_ARGS"] = (
            f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{events_dir}"
            " --conf spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false pyspark-shell"
        )
    cmd = [str(DBT), "run", "--select", "silver", "--project-dir", str(ROOT)]
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"dbt ({label}) failed after {wall:.0f}s:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}")
    results = json.loads((target / "run_results.json").read_text())
    models = {res["unique_id"].split(".")[-1]: res["execution_time"] for res in results["results"]}
    return {
        "wall": wall,
        "dbt_elapsed": results.get("elapsed_time"),
        "models": models,
        "statements": dbt_statements(logs / "dbt.log"),
        "spark": spark_executions(events_dir) if event_log else [],
    }


_LOG_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) +\[\w+ *\] \[[^\]]*\]: (.*)$")


def dbt_statements(log: Path) -> list[dict[str, Any]]:
    """Every statement dbt ran (node, first SQL line, start/end as seconds of the day, duration)."""
    out: list[dict[str, Any]] = []
    node, sql, begun = "", "", 0.0
    for raw in log.read_text(errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw)
        m = _LOG_LINE.match(line)
        if m is None:
            if node and not sql:
                text = line.strip()
                if text and not text.startswith(("/*", "--")):
                    sql = text
            continue
        at = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        msg = m.group(4)
        on = re.match(r"On ([^:]+): (.*)", msg)
        if on and on.group(2) not in ("ROLLBACK", "Close"):
            node, begun = on.group(1).split(".")[-1], at
            text = re.sub(r"^/\*.*?\*/\s*", "", on.group(2)).strip()
            sql = "" if text.startswith("--") else text
            continue
        done = re.match(r"SQL status: \S+ in ([\d.]+) seconds", msg)
        if done and node:
            out.append({"seconds": float(done.group(1)), "node": node, "sql": sql[:100], "start": begun, "end": at})
            node, sql = "", ""
    return out


def spark_executions(events_dir: Path) -> list[dict[str, Any]]:
    """Per SQL execution of the Spark event log: duration, description and its scans' metrics."""
    files = [
        p
        for p in events_dir.rglob("*")
        if p.is_file() and not p.name.startswith(".") and not p.name.startswith("appstatus")
    ]
    if not files:
        return []
    plans: dict[int, dict[str, Any]] = {}
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    desc: dict[int, str] = {}
    root: dict[int, int] = {}
    acc: dict[int, int] = defaultdict(int)
    for line in files[0].read_text(errors="replace").splitlines():
        e = json.loads(line)
        kind = e.get("Event", "")
        if kind.endswith("SparkListenerSQLExecutionStart"):
            xid = e["executionId"]
            start[xid], desc[xid], plans[xid] = e["time"], e.get("description", ""), e["sparkPlanInfo"]
            root[xid] = e.get("rootExecutionId", xid)
        elif kind.endswith("SparkListenerSQLAdaptiveExecutionUpdate"):
            plans[e["executionId"]] = e["sparkPlanInfo"]
        elif kind.endswith("SparkListenerSQLExecutionEnd"):
            end[e["executionId"]] = e["time"]
        elif kind.endswith("SparkListenerDriverAccumUpdates"):
            for aid, value in e["accumUpdates"]:
                acc[aid] += int(value)
        elif kind == "SparkListenerTaskEnd":
            for a in e.get("Task Info", {}).get("Accumulables", []):
                if isinstance(a.get("Update"), int | str) and str(a["Update"]).lstrip("-").isdigit():
                    acc[a["ID"]] += int(a["Update"])
    out = []
    for xid, plan in plans.items():
        scans: list[dict[str, Any]] = []
        _collect_scans(plan, acc, scans)
        begun = datetime.fromtimestamp(start[xid] / 1000)
        out.append(
            {
                "id": xid,
                "root": root.get(xid, xid),
                "start": begun.hour * 3600 + begun.minute * 60 + begun.second + begun.microsecond / 1e6,
                "seconds": (end.get(xid, start[xid]) - start[xid]) / 1000,
                "description": " ".join(desc.get(xid, "").split())[:150],
                "scans": scans,
            }
        )
    return out


def _collect_scans(node: dict[str, Any], acc: dict[int, int], scans: list[dict[str, Any]]) -> None:
    simple = node.get("simpleString", "")
    if node.get("nodeName", "").startswith("Scan") or "FileScan" in simple:
        metrics = {m["name"]: acc.get(m["accumulatorId"], 0) for m in node.get("metrics", [])}
        table = re.search(r"(?:FileScan \w+ |Scan \w+ )(\S+?)\[", simple)
        meta = node.get("metadata", {})
        scans.append(
            {
                "table": table.group(1) if table else (meta.get("Location", "")[-60:] or simple[:60]),
                "rows": metrics.get("number of output rows", 0),
                "files": metrics.get("number of files read", 0),
                "bytes": metrics.get("size of files read", 0),
                "partition_filters": meta.get("PartitionFilters", ""),
                "pushed_filters": meta.get("PushedFilters", ""),
            }
        )
    for child in node.get("children", []):
        _collect_scans(child, acc, scans)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--touched-tables", type=int, default=2)
    p.add_argument("--workdir", type=Path, help="parent of the warehouses (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the warehouses, logs and event logs")
    p.add_argument("--repeat", type=int, default=2, help="incremental runs per size (silver restored between)")
    p.add_argument("--no-event-log", action="store_true", help="no Spark event log for the incremental runs")
    args = p.parse_args()
    if args.touched_tables > args.tables or min(args.history) < 3 * args.tables:
        raise SystemExit("need --touched-tables <= --tables and every history >= 3 * tables")
    step = args.tables // args.touched_tables
    touched = sorted((3 + i * step) % args.tables for i in range(args.touched_tables))

    print("command: " + shlex.join([os.path.relpath(PY, ROOT), os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    print("measured step: `dbt run --select silver` (models only; tests excluded), one dbt process at a time")
    print(
        f"batch: {args.batch:,} events on tables {', '.join(f't{t}' for t in touched)} of {args.tables}"
        f" (+{min(DUPLICATES, args.batch):,} re-delivered duplicates); cores: {os.cpu_count()}"
    )
    sys.stdout.flush()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="changelake-merge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: dict[int, dict[str, Any]] = {}
    try:
        # Phase 1, per history size: bronze history, silver built from it, a copy of that silver
        # (to replay the same incremental run), then the batch appended to bronze.
        for history in args.history:
            hw = work / f"h{history}"
            if hw.exists():
                shutil.rmtree(hw)
            wh = hw / "warehouse"
            wh.mkdir(parents=True)
            r: dict[str, Any] = {"history": history, "wh": wh, "hw": hw, "incr": []}
            rows[history] = r
            r["gen_history"], _ = run_step("history", str(wh), str(history), str(args.tables))
            print(f"[H={history:,}] bronze history written in {r['gen_history']:.0f}s", flush=True)
            r["build"] = run_dbt(wh, hw, "history", event_log=False)
            print(f"[H={history:,}] history build: dbt run {r['build']['wall']:.0f}s", flush=True)
            want = expected(history, args.batch)
            quick_check(wh, want["history_events"], want["history_keys"], "history build")
            shutil.copytree(wh / "dbt" / "silver.db", hw / "silver-after-history")
            r["gen_batch"], _ = run_step(
                "batch", str(wh), str(history), str(args.batch), str(args.tables), ",".join(map(str, touched))
            )
            print(f"[H={history:,}] batch appended to bronze in {r['gen_batch']:.0f}s", flush=True)
        # Phase 2: the measured incremental runs, interleaved across sizes so that a change in the
        # machine's load (other processes) hits every size alike; silver is put back between repeats.
        for rep in range(args.repeat):
            for history in args.history:
                r = rows[history]
                wh, hw = r["wh"], r["hw"]
                if rep:
                    shutil.rmtree(wh / "dbt" / "silver.db")
                    shutil.copytree(hw / "silver-after-history", wh / "dbt" / "silver.db")
                run = run_dbt(wh, hw, f"incremental-{rep + 1}", event_log=not args.no_event_log)
                want = expected(history, args.batch)
                run["commits"] = quick_check(wh, want["events"], want["keys"], "incremental run")
                print(f"[H={history:,}] incremental run {rep + 1}: dbt run {run['wall']:.0f}s", flush=True)
                if rep == 0:
                    _, out = run_step("verify", str(wh), str(history), str(args.batch))
                    r["verify"] = json.loads(out.split("VERIFY ", 1)[1])
                    if r["verify"]["problems"]:
                        raise SystemExit(f"incremental run is wrong: {r['verify']['problems']}")
                elif merged(run) != merged(r["incr"][0]):
                    raise SystemExit(f"repeat {rep + 1} merged differently: {merged(run)} != {merged(r['incr'][0])}")
                r["incr"].append(run)
        for r in rows.values():
            report_one(r)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(list(rows.values()))


def delta_stats(table: Path) -> tuple[int, int | None]:
    """(rows, max seq) of a Delta table from the file statistics in its log (no Spark).

    A file is identified by its path and deletion vector (a MERGE on a table with deletion vectors
    removes a file and adds it back with a new one); the vector's rows are not counted.
    """
    active: dict[tuple[str, ...], dict[str, Any]] = {}

    def file_id(entry: dict[str, Any]) -> tuple[str, ...]:
        dv = entry.get("deletionVector") or {}
        return (entry["path"], dv.get("storageType", ""), dv.get("pathOrInlineDv", ""), str(dv.get("offset", "")))

    for version in sorted((table / "_delta_log").glob("*.json")):
        for line in version.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                stats = json.loads(action["add"].get("stats") or "{}")
                dv = action["add"].get("deletionVector") or {}
                stats["numRecords"] = stats.get("numRecords", 0) - dv.get("cardinality", 0)
                active[file_id(action["add"])] = stats
            elif "remove" in action:
                active.pop(file_id(action["remove"]), None)
    rows = sum(st.get("numRecords", 0) for st in active.values())
    seqs = [st["maxValues"]["seq"] for st in active.values() if "seq" in st.get("maxValues", {})]
    return rows, max(seqs, default=None)


def quick_check(wh: Path, events: int, keys: int, what: str) -> dict[str, Any]:
    """Row counts and max seq of silver against the generated data; returns the last MERGE's metrics."""
    silver = wh / "dbt" / "silver.db"
    n_events, max_seq = delta_stats(silver / "sequin_events")
    n_keys, max_seq_records = delta_stats(silver / "consumer_records")
    if (n_events, max_seq, n_keys, max_seq_records) != (events, events, keys, events):
        raise SystemExit(
            f"{what} is wrong: sequin_events {n_events} rows (max seq {max_seq}), expected {events};"
            f" consumer_records {n_keys} rows (max seq {max_seq_records}), expected {keys}"
        )
    return {
        "merge": last_commit(silver / "consumer_records"),
        "append": last_commit(silver / "sequin_events"),
        "history": last_commit(silver / "record_history"),
    }


def merged(run: dict[str, Any]) -> dict[str, Any]:
    m = run["commits"]["merge"]["metrics"]
    return {k: m.get(k) for k in ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated")}


def fastest(r: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return min(enumerate(r["incr"], 1), key=lambda x: x[1]["wall"])


def report_one(r: dict[str, Any]) -> None:
    h, v = r["history"], r["verify"]
    n, incr = fastest(r)
    print(f"\n--- H={h:,}: details of incremental run {n} (the fastest of {len(r['incr'])})")
    print(
        f"verified after run 1: sequin_events {v['sequin_events']:,} rows, consumer_records "
        f"{v['consumer_records']:,} rows ({v['deleted']:,} deleted), {v['checked_keys']:,} batch-touched keys "
        "hold their last batch event; repeats: same row counts, max seq and MERGE row counts"
    )
    print(
        f"record_history after run 1: {v.get('record_history', 0):,} versions, "
        f"{v.get('current_versions', 0):,} current (= the live consumer_records rows, same record and position)"
    )
    print(
        "stored-max lookups run alone (warm, in the verify session): "
        + ", ".join(f"{k} {secs:.1f}s" for k, secs in v.get("lookups", {}).items())
    )
    for name, c in (
        ("consumer_records MERGE", incr["commits"]["merge"]),
        ("sequin_events append", incr["commits"]["append"]),
        ("record_history MERGE", incr["commits"]["history"]),
    ):
        m = c["metrics"]
        keep = [
            "numSourceRows",
            "numTargetRowsInserted",
            "numTargetRowsUpdated",
            "numTargetRowsCopied",
            "numTargetFilesAdded",
            "numTargetFilesRemoved",
            "executionTimeMs",
            "scanTimeMs",
            "rewriteTimeMs",
            "numOutputRows",
            "numFiles",
        ]
        shown = ", ".join(f"{k}={m[k]}" for k in keep if k in m)
        print(f"{name} (v{c['version']} {c['operation']}): {shown}")
        print(
            f"  files added by partition {c['files_added_by_partition']}, "
            f"removed {c['files_removed_by_partition']}; {c['parquet_files_on_disk']} parquet files on disk"
        )
    print(
        "model times (run_results.json): "
        + ", ".join(f"{k} {secs:.1f}s" for k, secs in incr["models"].items())
        + f"; dbt elapsed {incr['dbt_elapsed'] or 0:.1f}s, process wall {incr['wall']:.1f}s"
    )
    statements = incr["statements"]
    print("slowest dbt statements: dbt's time (dbt.log), the time of their Spark executions and the rows their")
    print("scans read (event log; a SELECT run by a macro is lazy, so dbt's own time misses its Spark work):")
    for st in statements:
        st["scans"] = defaultdict(lambda: [0, 0])
        st["spark"] = 0.0
    for x in incr["spark"]:
        # dbt-spark's session cursor runs a SELECT lazily: its Spark work starts right after dbt logged
        # the statement as done, so an execution belongs to the last statement started before it.
        owner = max(
            (st for st in statements if st["start"] - 0.5 <= x["start"]), key=lambda st: st["start"], default=None
        )
        x["statement"] = f"{owner['node']}: {owner['sql'][:60]}" if owner else "?"
        if owner is not None and x["root"] == x["id"]:
            owner["spark"] += x["seconds"]
        x["scans"] = [sc for sc in x["scans"] if sc["table"].startswith("spark_catalog.")]
        for sc in x["scans"]:
            if owner is not None:
                owner["scans"][sc["table"].split(".")[-1]][0] += sc["rows"]
                owner["scans"][sc["table"].split(".")[-1]][1] += sc["files"]
    for st in sorted(statements, key=lambda st: -max(st["seconds"], st["spark"]))[:8]:
        print(f"  {st['seconds']:6.1f}s dbt {st['spark']:6.1f}s spark  {st['node']:17s} {st['sql'][:80]}")
        if st["scans"]:
            print("           read " + ", ".join(f"{t} {r:,} rows/{f} files" for t, (r, f) in st["scans"].items()))
    slow = sorted(incr["spark"], key=lambda x: -x["seconds"])[:8]
    if slow:
        print("slowest Spark SQL executions (event log) with their scans:")
    for x in slow:
        print(
            f"  {x['seconds']:7.1f}s  exec {x['id']} (root {x['root']}) in [{x['statement']}]: {x['description'][:70]}"
        )
        for sc in x["scans"]:
            print(
                f"           scan {sc['table'][-40:]:40s} rows={sc['rows']:>11,} files={sc['files']:>5} "
                f"bytes={sc['bytes']:>13,}"
            )
            if "dynamicpruning" in sc["partition_filters"]:
                print(f"             PartitionFilters {sc['partition_filters'][:140]}")
    sys.stdout.flush()


def report(rows: list[dict[str, Any]]) -> None:
    rows = [r for r in rows if r["incr"]]
    if not rows:
        return
    print("\n=== dbt merge scaling: `dbt run --select silver`, seconds (models: dbt's execution_time)")
    print(
        f"{'history':>12} {'gen bronze':>10} {'hist run':>9} {'incr runs (wall)':>22} {'best':>7} "
        f"{'sequin_events':>13} {'consumer_recs':>13} {'record_hist':>11} {'safe_bounds':>11} {'table_cols':>10}"
    )
    for r in rows:
        _, best = fastest(r)
        m = best["models"]
        runs = " ".join(f"{x['wall']:.1f}" for x in r["incr"])
        print(
            f"{r['history']:>12,} {r['gen_history']:>10.1f} {r['build']['wall']:>9.1f} {runs:>22} "
            f"{best['wall']:>7.1f} {m.get('sequin_events', 0):>13.1f} {m.get('consumer_records', 0):>13.1f} "
            f"{m.get('record_history', 0):>11.1f} {m.get('safe_bounds', 0):>11.1f} "
            f"{m.get('table_columns', 0):>10.1f}"
        )
    for r in rows:
        b = r["build"]["models"]
        print(
            f"history build H={r['history']:,}: sequin_events {b.get('sequin_events', 0):.1f}s, "
            f"consumer_records {b.get('consumer_records', 0):.1f}s, record_history {b.get('record_history', 0):.1f}s"
        )
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        _, a = fastest(lo)
        _, b = fastest(hi)

        def ratio(f: Any) -> str:
            return f"{f(b) / f(a):.2f}" if f(a) else "-"

        pairs = " ".join(f"{y['wall'] / x['wall']:.2f}" for x, y in zip(lo["incr"], hi["incr"], strict=True))
        print(
            f"\nratio incremental(H={hi['history']:,}) / incremental(H={lo['history']:,}), best runs:"
            f" wall {ratio(lambda x: x['wall'])}"
            f", sequin_events {ratio(lambda x: x['models'].get('sequin_events', 0))}"
            f", consumer_records {ratio(lambda x: x['models'].get('consumer_records', 0))}"
            f"   (goal <= 1.3); wall ratio per repeat: {pairs}"
        )
        hist_lo = [x["models"].get("record_history", 0) for x in lo["incr"]]
        hist_hi = [x["models"].get("record_history", 0) for x in hi["incr"]]
        per_repeat = " ".join(f"{y / x:.2f}" for x, y in zip(hist_lo, hist_hi, strict=True) if x)
        print(
            f"record_history incremental (issue 15): H={lo['history']:,} {min(hist_lo):.1f}s, "
            f"H={hi['history']:,} {min(hist_hi):.1f}s, ratio {min(hist_hi) / min(hist_lo):.2f} (best runs; "
            f"goal <= 1.3); per repeat: {per_repeat}"
        )


def step_main(argv: list[str]) -> None:
    kind, wh = argv[0], Path(argv[1])
    if kind == "history":
        step_history(wh, int(argv[2]), int(argv[3]))
    elif kind == "batch":
        step_batch(wh, int(argv[2]), int(argv[3]), int(argv[4]), [int(t) for t in argv[5].split(",")])
    elif kind == "verify":
        step_verify(wh, int(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"unknown step {kind}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_step":
        sys.path.insert(0, str(ROOT))
        step_main(sys.argv[2:])
    else:
        main()
