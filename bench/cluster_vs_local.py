"""Benchmark: the same workload through local mode and through the standalone cluster of scripts/cluster.sh.

One throwaway schema (accounts + lines), two sources over it with their own slots, both created
before the workload so each sees the same committed changes. Local: `run --once` with a local[2]
driver, then `dbt build --target local` (dbt's in-process Spark session). Cluster: `cluster.sh up`
(its own state dir, warehouse and free ports), `run --once` with config/cluster.yml's Spark
settings, `dbt build --target cluster` through the Thrift server, `cluster.sh down`. Prints each
step's wall time, both totals and the ratio.

Usage: .venv/bin/python bench/cluster_vs_local.py [--rows 20000]
Run it alone (flock /tmp/changelake-heavy.lock ... on a shared machine): it times JVM starts.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DBT = str(Path(PY).with_name("dbt"))
CLUSTER_SH = str(ROOT / "scripts" / "cluster.sh")


def dsn() -> str:
    return (
        os.environ.get("CHANGELAKE_PG_DSN")
        or subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True
        ).stdout.split()[-1]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def timed(what: str, cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    secs = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    print(f"  {what:<34} {secs:7.1f} s", flush=True)
    return secs


def write_config(path: Path, warehouse: Path, spark: dict[str, object], name: str, d: str, tables: list[str]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "warehouse": str(warehouse),
                "spark": spark,
                "batch": {"max_events": 200_000, "max_seconds": 5},
                "sources": [{"kind": "postgres", "name": name, "dsn": d, "tables": tables}],
            }
        )
    )
    return path


def workload(conn: psycopg.Connection[tuple[object, ...]], schema: str, rows: int) -> None:
    """`rows` row changes: half inserts, 3/10 updates, the rest deletes, in transactions of 1k."""
    step = 1000
    n_ins, n_upd = rows // 2, rows * 3 // 10
    n_del = rows - n_ins - n_upd
    for lo in range(1, n_ins + 1, step):
        hi = min(lo + step - 1, n_ins)
        with conn.transaction():
            conn.execute(
                f"insert into {schema}.accounts select g, 'o' || g, g * 0.01 "
                "from generate_series(%s::int, %s::int) g where g %% 2 = 0",
                (lo, hi),
            )
            conn.execute(
                f"insert into {schema}.lines select g, 1, g %% 97 from generate_series(%s::int, %s::int) g "
                "where g %% 2 = 1",
                (lo, hi),
            )
    for lo in range(1, n_upd + 1, step):
        conn.execute(f"update {schema}.accounts set balance = balance + 1 where id between %s and %s",
                     (2 * lo, 2 * min(lo + step - 1, n_upd)))
    for lo in range(1, n_del + 1, step):
        conn.execute(f"delete from {schema}.lines where account_id between %s and %s",
                     (2 * lo - 1, 2 * min(lo + step - 1, n_del) - 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    args = ap.parse_args()
    d = dsn()
    suffix = secrets.token_hex(3)
    schema = f"bench_{suffix}"
    names = {"local": f"bench_local_{suffix}", "cluster": f"bench_cluster_{suffix}"}
    tables = [f"{schema}.accounts", f"{schema}.lines"]
    work = Path(tempfile.mkdtemp(prefix="changelake-bench-cluster-"))
    conn = psycopg.connect(d, autocommit=True)
    ports = {k: free_port() for k in ("MASTER", "MASTER_UI", "WORKER_UI", "THRIFT", "THRIFT_UI")}
    cluster_env = dict(
        os.environ,
        CHANGELAKE_STATE=str(work / "state"),
        CHANGELAKE_WAREHOUSE=str(work / "cluster-warehouse"),
        CHANGELAKE_PYTHON=PY,
        CHANGELAKE_SPARK_HOST="127.0.0.1",
        CHANGELAKE_SPARK_MASTER=f"spark://127.0.0.1:{ports['MASTER']}",
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(work / "dbt-target-cluster"),
        DBT_LOG_PATH=str(work / "dbt-logs-cluster"),
        **{f"CHANGELAKE_{k}_PORT": str(v) for k, v in ports.items()},
    )
    local_env = dict(
        os.environ,
        CHANGELAKE_WAREHOUSE=str(work / "local-warehouse"),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(work / "dbt-target-local"),
        DBT_LOG_PATH=str(work / "dbt-logs-local"),
    )
    try:
        conn.execute(f"create schema {schema}")
        conn.execute(f"create table {schema}.accounts (id int primary key, owner text, balance numeric(12, 2))")
        conn.execute(f"create table {schema}.lines (account_id int, line_no int, amount int, "
                     "primary key (account_id, line_no))")
        local_cfg = write_config(work / "local.yml", work / "local-warehouse",
                                 {"master": "local[2]", "conf": {"spark.driver.memory": "1g"}},
                                 names["local"], d, tables)
        cluster_spark = yaml.safe_load((ROOT / "config" / "cluster.yml").read_text())["spark"]
        cluster_cfg = write_config(work / "cluster.yml", work / "cluster-warehouse", cluster_spark,
                                   names["cluster"], d, tables)
        for cfg in (local_cfg, cluster_cfg):
            subprocess.run([PY, "-m", "ingest", "-c", str(cfg), "setup"], cwd=ROOT, check=True, capture_output=True)
        t = time.monotonic()
        workload(conn, schema, args.rows)
        print(f"workload: {args.rows:,} row changes in {time.monotonic() - t:.1f} s; each source reads all of them")

        print("local (ingest local[2], dbt method: session):")
        local_ingest = timed("ingest run --once", [PY, "-m", "ingest", "-c", str(local_cfg), "run", "--once"],
                             local_env)
        local_dbt = timed("dbt build --target local", [DBT, "build", "--target", "local", "--project-dir",
                                                       str(ROOT)], local_env)
        print("cluster (ingest on the master, dbt through the Thrift server):")
        try:
            up = timed("cluster.sh up", ["bash", CLUSTER_SH, "up"], cluster_env)
            cluster_ingest = timed("ingest run --once", [PY, "-m", "ingest", "-c", str(cluster_cfg), "run", "--once"],
                                   cluster_env)
            cluster_dbt = timed("dbt build --target cluster", [DBT, "build", "--target", "cluster", "--project-dir",
                                                               str(ROOT)], cluster_env)
        finally:
            subprocess.run(["bash", CLUSTER_SH, "down"], cwd=ROOT, env=cluster_env, capture_output=True)
        local_total = local_ingest + local_dbt
        cluster_work = cluster_ingest + cluster_dbt
        print(f"local   ingest + dbt build: {local_total:7.1f} s")
        print(f"cluster ingest + dbt build: {cluster_work:7.1f} s (+ {up:.1f} s cluster start, paid once)")
        print(f"ratio cluster / local: {cluster_work / local_total:.2f} "
              f"(ingest {cluster_ingest / local_ingest:.2f}, dbt build {cluster_dbt / local_dbt:.2f}); "
              f"with the cluster start: {(cluster_work + up) / local_total:.2f}")
    finally:
        for name in names.values():
            conn.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                         "where slot_name = %s and not active", (f"changelake_{name}",))
            conn.execute(f"drop publication if exists changelake_{name}")
        conn.execute(f"drop schema if exists {schema} cascade")
        conn.close()


if __name__ == "__main__":
    main()
