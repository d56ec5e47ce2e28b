"""Shared helpers of the tests that run dbt on real bronze and compare silver with the source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.delta_rows import exists, read
from tests.helpers.pg import ROOT

DBT = Path(sys.executable).with_name("dbt")


def dbt(warehouse: Path, *args: str) -> str:
    env = dict(
        os.environ,
        PWD=str(ROOT),  # profiles.yml finds dbt_log4j2.properties through it
        CHANGELAKE_WAREHOUSE=str(warehouse),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(warehouse.parent / "dbt-target"),
        DBT_LOG_PATH=str(warehouse.parent / "dbt-logs"),
    )
    r = subprocess.run(
        [str(DBT), *args, "--project-dir", str(ROOT)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    assert r.returncode == 0, f"dbt {' '.join(args)} failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def silver(warehouse: Path, table: str) -> list[Any]:
    return read(warehouse / "dbt" / "silver.db" / table)


def source_rows(s: Any, table: str, pk: list[str]) -> dict[str, dict[str, Any]]:
    cur = s.conn.execute(f"select row_to_json(t)::text from {s.schema}.{table} t")
    out = {}
    for (text,) in cur.fetchall():
        row = json.loads(text)
        if "balance" in row and row["balance"] is not None:
            row["balance"] = f"{row['balance']:.2f}"  # numeric is a string in `record` (exact)
        out[json.dumps({k: row[k] for k in pk}, separators=(",", ":"))] = row
    return out


def frozen(rows: list[Any]) -> set[str]:
    return {json.dumps(r.asDict(recursive=True), default=str, sort_keys=True) for r in rows}


def snapshot_rows(warehouse: Path, source: str) -> list[Any]:
    """The source's bronze.snapshot_pages record rows (marker rows left out)."""
    path = warehouse / "bronze" / "snapshot_pages"
    if not exists(path):
        return []
    return read(path, f"source = '{source}' and record_pk is not null")
