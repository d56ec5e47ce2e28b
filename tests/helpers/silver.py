"""dbt on real bronze, and silver compared with the source: what the tests that run dbt share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.helpers import engine
from tests.helpers.delta_rows import exists, read
from tests.helpers.pg import ROOT

DBT = Path(sys.executable).with_name("dbt")


# dbt's unit tests read fixtures, not the warehouse: the dbt flow's first build runs them (and the
# cluster flow's), other builds leave them out rather than run the same checks again.
NO_UNIT_TESTS = ("--exclude-resource-type", "unit_test")


def dbt_process(warehouse: Path, *args: str, project: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run dbt on `warehouse` (the project at `project`, a copy of this one for generated models).

    On the suite's warm engine when the test asked for it (fixture `engine`), else the local target.
    """
    target, target_env = engine.current.dbt_args(warehouse) if engine.current else ([], {})
    env = dict(
        os.environ,
        PWD=str(ROOT),  # profiles.yml finds dbt_log4j2.properties through it
        CHANGELAKE_WAREHOUSE=str(warehouse),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(warehouse.parent / "dbt-target"),
        DBT_LOG_PATH=str(warehouse.parent / "dbt-logs"),
        **target_env,
    )
    return subprocess.run(
        [str(DBT), *args, *target, "--project-dir", str(project)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def dbt(warehouse: Path, *args: str, project: Path = ROOT) -> str:
    """dbt_process that must succeed; its standard output."""
    r = dbt_process(warehouse, *args, project=project)
    assert r.returncode == 0, f"dbt {' '.join(args)} failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def silver(warehouse: Path, table: str) -> list[Any]:
    return read(warehouse / "dbt" / "silver.db" / table)


def live_records(warehouse: Path, source: str, table: str) -> dict[str, Any]:
    """The table's live (not deleted) consumer_records, their `record` parsed, by `record_pk`."""
    recs = [r for r in silver(warehouse, "consumer_records") if r.source == source and r.table_name == table]
    return {r.record_pk: json.loads(r.record) for r in recs if not r.deleted}


def source_rows(s: Any, table: str, pk: list[str]) -> dict[str, dict[str, Any]]:
    """The table's rows as `record` holds them, by `record_pk`.

    Values come from `row_to_json`, except that a `numeric` column is the exact decimal text (bronze
    writes numeric as a string, docs/bronze.md), decided by the column's type, not its name.
    """
    numeric = {
        str(r[0])
        for r in s.conn.execute(
            "select column_name from information_schema.columns "
            "where table_schema = %s and table_name = %s and data_type = 'numeric'",
            (s.schema, table),
        ).fetchall()
    }
    cur = s.conn.execute(f"select row_to_json(t)::text from {s.schema}.{table} t")
    out = {}
    for (text,) in cur.fetchall():
        row = json.loads(text, parse_float=Decimal)
        for name, value in row.items():
            if name in numeric and value is not None:
                row[name] = str(value)
            elif isinstance(value, Decimal):
                row[name] = float(value)
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
