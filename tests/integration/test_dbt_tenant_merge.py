"""A tenant merge end to end: tenant schemas on real PostgreSQL -> bronze -> silver -> one merged gold model.

The merged model's rows must be the union of the tenants' tables as they are now, each with its
tenant value, under the model's enforced contract (docs/dbt.md, "Tenant merges").
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest import cli
from ingest.config import PostgresSource
from tests.helpers.pg import ROOT, capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

TENANTS = ("acme", "beta", "gamma")
ORDERS_SQL = "create table {schema}.orders (id int primary key, amount numeric(12, 2), note text)"


def _spark_str(value: str | None) -> str:
    if value is None:
        return "cast(null as string)"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expected_rows_test(model: str, rows: list[tuple[str, int, str | None, str | None]]) -> str:
    """A singular dbt test failing with every row the model has and `rows` lacks, or the other way round."""
    values = ",\n        ".join(
        f"({_spark_str(t)}, {i}, cast({_spark_str(a)} as decimal(12,2)), {_spark_str(n)})" for t, i, a, n in rows
    )
    return f"""
with

expected as (
    select * from values
        {values}
    as expected (tenant, id, amount, note)
),

got as (
    select tenant, id, amount, note from {{{{ ref('{model}') }}}}
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


def test_tenant_schemas_become_one_typed_gold_model(
    warehouse: Path, make_source: Any, tmp_path: Path, capsys: Any
) -> None:
    """Three tenants (the same key in each) and a fourth of another shape: gold generate names the odd one; with it
    excluded, the merged model holds exactly the three tenants' current rows, tenant by tenant."""
    s = make_source("select 1", [])
    prefix = f"ten_{s.suffix}_"
    schemas = [f"{prefix}{t}" for t in (*TENANTS, "odd")]
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

        with psycopg.connect(s.dsn) as conn:
            rows = [
                (tenant, int(r[0]), r[1], r[2])
                for tenant in TENANTS
                for r in conn.execute(f"select id, amount::text, note from {prefix}{tenant}.orders").fetchall()
            ]
        assert len(rows) == 9
        (project / "tests" / "dbt" / "assert_tenant_merge_rows.sql").write_text(expected_rows_test(model, rows))
        built = dbt(
            warehouse,
            "build",
            *NO_UNIT_TESTS,
            "--indirect-selection",
            "empty",
            "--select",
            f"+{model}",
            f"path:models/gold/generated/{model}.yml",
            "assert_tenant_merge_rows",
            project=project,
        )
        # the row check and the model's own tests ran (a selection that missed them would pass too)
        assert "PASS assert_tenant_merge_rows" in built and "PASS changelake_unique_combination_of_columns" in built
        assert f"OK created sql view model gold.{model}" in built, built
    finally:
        for schema in schemas:
            s.execute(f"drop schema if exists {schema} cascade")
