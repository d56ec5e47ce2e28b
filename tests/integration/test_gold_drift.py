"""Generated gold behind the source's shape: the dbt test that says so.

`changelake-ingest gold generate` writes a model per table from silver.table_columns. When the
source gains, loses or retypes a column later, the model still builds but no longer says what the
source holds; `assert_generated_gold_matches_table_columns` (tests/dbt) reports each such column in
the build itself, until the models are generated again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from ingest import cli
from ingest.gold import model_name
from tests.helpers.pg import ROOT, capture_once, prepare
from tests.helpers.silver import dbt, dbt_process

TEST = "assert_generated_gold_matches_table_columns"


def drift_result(warehouse: Path, *vars_: str) -> tuple[str, int, str]:
    """Build table_columns and its tests; the drift test's status, failure count and dbt's output."""
    r = dbt_process(warehouse, "build", "--select", "table_columns", *vars_, project=warehouse.parent / "project")
    results = json.loads((warehouse.parent / "dbt-target" / "run_results.json").read_text())["results"]
    (mine,) = [x for x in results if x["unique_id"].endswith(f".{TEST}")]
    return mine["status"], int(mine["failures"] or 0), r.stdout


@pytest.mark.usefixtures("engine")
def test_generated_gold_behind_the_source_warns_until_generated_again(
    warehouse: Path, make_source: Any, tmp_path: Path
) -> None:
    s = make_source("create table items (id int primary key, name text, qty int, note text)", ["items"])
    prepare(s.config())
    s.execute("insert into items values (1, 'a', 2, 'x')")
    capture_once(warehouse, s.config())
    project = tmp_path / "project"  # a copy of the dbt project: the generated models stay out of the tree
    for part in ("models", "macros", "tests/dbt"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("generated", "demo"))
    shutil.copy(ROOT / "dbt_project.yml", project)
    dbt(warehouse, "run", "--select", "table_columns", project=project)
    config = tmp_path / "changelake.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [s.config().model_dump()]}))
    out = project / "models" / "gold" / "generated"
    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out), "--no-comments"]) == 0
    assert drift_result(warehouse)[:2] == ("pass", 0)

    # A column added, one dropped, one retyped at the source; the next change carries the new shape.
    s.execute("alter table items add column price numeric(8, 2)")
    s.execute("alter table items drop column note")
    s.execute("alter table items alter column qty type bigint")
    s.execute("insert into items values (2, 'b', 3, 1.50)")
    capture_once(warehouse, s.config())
    status, failures, printed = drift_result(warehouse, "--store-failures")
    assert (status, failures) == ("warn", 3), printed
    assert TEST in printed and "WARN 3" in printed, printed
    # The failing rows as the test stored them (Parquet: dbt-spark's default for stored failures).
    stored = pq.read_table(warehouse / "dbt" / "dbt_test__audit.db" / TEST).to_pylist()
    found = sorted((r["model_name"], r["column_name"], r["difference"], r["current_type"]) for r in stored)
    model = model_name(s.name, s.schema, "items")
    assert found == [
        (model, "note", "gone from the source", None),
        (model, "price", "new in the source", "decimal(8,2)"),
        (model, "qty", "retyped", "bigint"),
    ]

    # The scheduled build's choice: a warning by default, a failure when asked for.
    status, failures, _ = drift_result(warehouse, "--vars", "{changelake_gold_drift_severity: error}")
    assert (status, failures) == ("fail", 3)

    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out), "--no-comments"]) == 0
    assert drift_result(warehouse)[:2] == ("pass", 0)
