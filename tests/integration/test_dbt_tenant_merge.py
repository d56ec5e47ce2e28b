"""A tenant merge end to end: tenant schemas on real PostgreSQL -> bronze -> silver -> one merged gold model.

The merged model's rows must be the union of the tenants' tables as they are now, each with its
tenant value, under the model's enforced contract (docs/dbt.md, "Tenant merges"). When the
tenants move on (a column in each, a new tenant), the build's drift test says so until the model
is generated again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
import yaml

from ingest import cli
from ingest.config import PostgresSource
from tests.helpers.pg import ROOT, capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, dbt_process

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

TENANTS = ("acme", "beta", "gamma")
ORDERS_SQL = "create table {schema}.orders (id int primary key, amount numeric(12, 2), note text)"
DRIFT = "assert_generated_gold_matches_table_columns"


def _spark_str(value: str | None) -> str:
    if value is None:
        return "cast(null as string)"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expected_rows_test(model: str, rows: list[tuple[Any, ...]]) -> str:
    """A singular dbt test failing with every row the model has and `rows` lacks, or the other way round.

    Rows are (tenant, id, amount, note), or (..., region) once the tenants have that column.
    """
    names = "tenant, id, amount, note" + (", region" if rows and len(rows[0]) == 5 else "")
    values = ",\n        ".join(
        f"({_spark_str(t)}, {i}, cast({_spark_str(a)} as decimal(12,2)), "
        + ", ".join(_spark_str(x) for x in rest)
        + ")"
        for t, i, a, *rest in rows
    )
    return f"""
with

expected as (
    select * from values
        {values}
    as expected ({names})
),

got as (
    select {names} from {{{{ ref('{model}') }}}}
),

missing as (
    select 'missing' as side, * from (select * from expected except all select * from got)
),

extra as (
    select 'extra' as side, * from (select * from got except all select * from expected)
)

select * from missing
union all
select * from extra
"""


def drift_result(warehouse: Path, project: Path) -> tuple[str, int, list[tuple[Any, ...]]]:
    """Build table_columns and run the drift test as an error, its failing rows stored: status, failures, rows.

    The rows are (model, table schema, table, column, difference, current type), sorted.
    """
    vars_ = "{changelake_gold_drift_severity: error}"
    r = dbt_process(
        warehouse, "build", "--select", "table_columns", DRIFT, "--vars", vars_, "--store-failures", project=project
    )
    results = json.loads((warehouse.parent / "dbt-target" / "run_results.json").read_text())["results"]
    (mine,) = [x for x in results if x["unique_id"].endswith(f".{DRIFT}")]
    assert mine["status"] in ("pass", "fail"), r.stdout[-6000:]
    # the failing rows as the test stored them (Parquet: dbt-spark's default for stored failures)
    stored = pq.read_table(warehouse / "dbt" / "dbt_test__audit.db" / DRIFT).to_pylist()
    keys = ("model_name", "table_schema", "table_name", "column_name", "difference", "current_type")
    rows = sorted((tuple(x[k] for k in keys) for x in stored), key=str)
    return mine["status"], int(mine["failures"] or 0), rows


def test_tenant_schemas_become_one_typed_gold_model(
    warehouse: Path, make_source: Any, tmp_path: Path, capsys: Any
) -> None:
    """Three tenants (the same key in each) and a fourth of another shape: gold generate names the odd one; with it
    excluded, the merged model holds exactly the three tenants' current rows, tenant by tenant. Then a column in
    every tenant and a new tenant: the drift test names each until gold generate runs again."""
    s = make_source("select 1", [])
    prefix = f"ten_{s.suffix}_"
    schemas = [f"{prefix}{t}" for t in (*TENANTS, "odd")]
    later = f"{prefix}delta"  # a tenant created after the model was generated
    try:
        for schema in schemas:
            s.execute(f"create schema {schema}")
            s.execute(ORDERS_SQL.format(schema=schema))
        s.execute(f"alter table {prefix}odd.orders add column placed_at timestamptz")
        for n, tenant in enumerate(TENANTS):
            s.execute(
                f"insert into {prefix}{tenant}.orders values (1, %s, 'first'), (2, 2.25, %s), (3, null, null)",
                (10 + n, f"it's {tenant}"),
            )
        s.execute(f"insert into {prefix}odd.orders values (1, 1, 'x', now())")
        merge = {"pattern": f"{prefix}*.orders", "merge_as": "orders", "tenant_column": "tenant"}
        src = PostgresSource.model_validate({"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": [merge]})
        prepare(src)
        assert sorted(src.tables) == sorted(f"{schema}.orders" for schema in schemas)
        # streamed after the snapshot: an update, a delete, a new row, one tenant at a time
        s.execute(f"update {prefix}acme.orders set note = 'changed' where id = 1")
        s.execute(f"delete from {prefix}beta.orders where id = 2")
        s.execute(f"insert into {prefix}gamma.orders values (4, 4.5, 'new')")
        capture_once(warehouse, src, snapshots=True)

        # A copy of the dbt project with silver only (gold here is what the generator writes) and no
        # singular tests but this one's: the generated models stay out of the tree, and less to parse.
        project = tmp_path / "project"
        for part in ("models/bronze", "models/silver", "macros", "tests/dbt/fixtures"):
            shutil.copytree(ROOT / part, project / part)
        shutil.copy(ROOT / "dbt_project.yml", project)
        shutil.copy(ROOT / "tests" / "dbt" / f"{DRIFT}.sql", project / "tests" / "dbt")
        dbt(warehouse, "run", "--select", "table_columns", project=project)

        out = project / "models" / "gold" / "generated"
        config = tmp_path / "changelake.yml"
        doc = {"warehouse": str(warehouse), "sources": [src.model_dump()]}
        config.write_text(yaml.safe_dump(doc))
        generate = ["-c", str(config), "gold", "generate", "--out", str(out), "--no-comments"]
        assert cli.main(generate) == 2
        err = capsys.readouterr().err
        assert f"tenant 'odd' ({prefix}odd.orders) has placed_at (timestamp) that {prefix}acme.orders lacks" in err
        assert not out.exists()

        doc["sources"][0]["exclude"] = [f"{prefix}odd.orders"]
        config.write_text(yaml.safe_dump(doc))
        assert cli.main(generate) == 0
        model = f"{s.name}__orders"
        assert f"{model}: new model, 3 tenants of {prefix}*.orders, 3 columns" in capsys.readouterr().out

        def current_rows(tenants: list[str], *extra: str) -> list[tuple[Any, ...]]:
            cols = ", ".join(("id", "amount::text", "note", *extra))
            with psycopg.connect(s.dsn) as conn:
                return [
                    (tenant, int(r[0]), *r[1:])
                    for tenant in tenants
                    for r in conn.execute(f"select {cols} from {prefix}{tenant}.orders").fetchall()
                ]

        def build() -> str:
            return dbt(
                warehouse,
                "build",
                *NO_UNIT_TESTS,
                "--indirect-selection",
                "empty",
                "--select",
                f"+{model}",
                f"path:models/gold/generated/{model}.yml",
                "assert_tenant_merge_rows",
                DRIFT,
                project=project,
            )

        rows = current_rows(list(TENANTS))
        assert len(rows) == 9
        (project / "tests" / "dbt" / "assert_tenant_merge_rows.sql").write_text(expected_rows_test(model, rows))
        built = build()
        # the row check and the model's own tests ran (a selection that missed them would pass too)
        assert "PASS assert_tenant_merge_rows" in built and "PASS changelake_unique_combination_of_columns" in built
        assert f"OK created sql view model gold.{model}" in built, built
        # up to date: odd matches the pattern but is excluded (the model's merge line says so), no new tenant
        assert f"PASS {DRIFT}" in built, built

        # The tenants move on: a column in every one (and a row carrying it), and a new tenant of that shape.
        for tenant in TENANTS:
            s.execute(f"alter table {prefix}{tenant}.orders add column region text")
            s.execute(f"insert into {prefix}{tenant}.orders values (10, 1.5, 'later', %s)", (f"{tenant}-eu",))
        s.execute(f"create schema {later}")
        s.execute(ORDERS_SQL.format(schema=later))
        s.execute(f"alter table {later}.orders add column region text")
        s.execute(f"insert into {later}.orders values (1, 7, 'd', 'delta-eu')")
        capture_once(warehouse, src, snapshots=True)
        status, failures, drift = drift_result(warehouse, project)
        added = [(model, f"{prefix}{t}", "orders", "region", "new in the source", "string") for t in TENANTS]
        new_tenant = (model, later, "orders", None, "a tenant the model does not union", None)
        assert (status, failures) == ("fail", 4), drift
        assert drift == sorted([*added, new_tenant], key=str)

        assert cli.main(generate) == 0
        generate_output = capsys.readouterr().out
        assert f"{model}: added region (string); tenant delta added" in generate_output, generate_output
        rows = current_rows([*TENANTS, "delta"], "region")
        assert len(rows) == 9 + 3 + 1 and ("delta", 1, "7.00", "d", "delta-eu") in rows
        (project / "tests" / "dbt" / "assert_tenant_merge_rows.sql").write_text(expected_rows_test(model, rows))
        built = build()
        assert "PASS assert_tenant_merge_rows" in built and f"PASS {DRIFT}" in built, built
        assert f"OK created sql view model gold.{model}" in built, built
    finally:
        for schema in (*schemas, later):
            s.execute(f"drop schema if exists {schema} cascade")
