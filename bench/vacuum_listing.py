"""Benchmark: VACUUM of every silver and gold table on the warm engine, Spark's listing default against the project's.

docs/masking.md's last step vacuums every silver and gold Delta table with a retention of 0. Delta
lists a table's files in `spark.sql.sources.parallelPartitionDiscovery.parallelism` tasks, 10000
by default, whatever the table's size; scripts/cluster.sh and profiles.yml set it to the local
cores. On a warehouse that a warm engine serves (`make demo` with CHANGELAKE_KEEP_ENGINE=1, or
`make engine-up` after a build), this runs, in one session each, VACUUM ... RETAIN 0 HOURS of every
table under <warehouse>/dbt/silver.db and gold.db: first with the parallelism set back to Spark's
default (the baseline), then with the engine's own setting, alternating --rounds times. A second
vacuum of the same table finds nothing to delete, so both pay the listing and nothing else after
the first pass (the first pass is not measured). Prints the seconds per pass and the ratio.

Usage: .venv/bin/python bench/vacuum_listing.py [--warehouse warehouse] [--port 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pyhive import hive

SPARK_DEFAULT = 10000


def vacuum_all(port: int, tables: list[Path], parallelism: int | None) -> float:
    """Seconds to vacuum every table once, in one session (the listing parallelism set when given)."""
    conn = hive.connect(host="127.0.0.1", port=port, username="changelake")
    try:
        cur = conn.cursor()
        cur.execute("set spark.databricks.delta.retentionDurationCheck.enabled = false")
        if parallelism is not None:
            cur.execute(f"set spark.sql.sources.parallelPartitionDiscovery.parallelism = {parallelism}")
        t0 = time.monotonic()
        for table in tables:
            cur.execute(f"vacuum delta.`{table}` retain 0 hours")
            cur.fetchall()
        return time.monotonic() - t0
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warehouse", type=Path, default=Path("warehouse"))
    ap.add_argument("--port", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dbt = args.warehouse / "dbt"
    tables = sorted(p.parent.resolve() for schema in ("silver", "gold") for p in dbt.glob(f"{schema}.db/*/_delta_log"))
    if not tables:
        raise SystemExit(f"no Delta table under {dbt}/silver.db or gold.db: build silver and gold first")
    print(f"{len(tables)} silver and gold tables under {dbt}")
    vacuum_all(args.port, tables, None)  # deletes what there is to delete: the passes below only list
    default, engine = [], []
    for r in range(args.rounds):
        default.append(vacuum_all(args.port, tables, SPARK_DEFAULT))
        engine.append(vacuum_all(args.port, tables, None))
        print(f"  round {r + 1}: Spark's default {default[-1]:.1f}s, the engine's setting {engine[-1]:.1f}s")
    d, e = statistics.median(default), statistics.median(engine)
    print(f"vacuum of {len(tables)} tables: {e:.1f}s with the engine's setting, {d:.1f}s with Spark's default")
    print(f"ratio: {e / d:.2f}x")


if __name__ == "__main__":
    main()
