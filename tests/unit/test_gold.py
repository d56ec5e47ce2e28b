"""`changelake-ingest gold generate` (ingest/gold.py) on a table_columns Delta table written here.

The generated SQL running in dbt is tested in tests/integration/test_pg_types.py; here: names,
the files, the yml's tests and docs, and what a re-run after a schema change says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from ingest import cli
from ingest.errors import ConfigError
from ingest.gold import model_name, output_names, previous_columns, render_sql, tables_from_rows, write_models

SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("ordinal_position", pa.int32()),
        ("column_name", pa.string()),
        ("type_name", pa.string()),
        ("spark_type", pa.string()),
        ("pk_position", pa.int32()),
    ]
)


def row(table: str, pos: int, name: str, type_name: str, spark_type: str, pk: int | None = None) -> dict[str, Any]:
    return {
        "source": "shop",
        "table_schema": "public",
        "table_name": table,
        "ordinal_position": pos,
        "column_name": name,
        "type_name": type_name,
        "spark_type": spark_type,
        "pk_position": pk,
    }


ORDERS = [
    row("orders", 1, "id", "bigint", "bigint", 1),
    row("orders", 2, "amount", "numeric", "string"),
    row("orders", 3, "note", "text", "string"),
]
LINES = [
    row("lines", 1, "order_id", "bigint", "bigint", 1),
    row("lines", 2, "line_no", "integer", "int", 2),
]


def write_table_columns(path: Path, rows: list[dict[str, Any]]) -> None:
    write_deltalake(str(path), pa.Table.from_pylist(rows, SCHEMA), mode="overwrite")


def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "changelake.yml"
    src = {
        "kind": "postgres",
        "name": "shop",
        "dsn": "postgresql://nobody@127.0.0.1:1/none",
        "tables": ["public.orders"],
    }
    cfg.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"), "sources": [src]}))
    return cfg


def generate(tmp_path: Path, capsys: Any, *extra: str) -> str:
    args = ["-c", str(config(tmp_path)), "gold", "generate", "--out", str(tmp_path / "gold"), "--no-comments"]
    assert cli.main([*args, *extra]) == 0
    out: str = capsys.readouterr().out
    return out


def test_generate_writes_a_model_per_table_and_reports_a_schema_change(tmp_path: Path, capsys: Any) -> None:
    table_columns = tmp_path / "warehouse" / "dbt" / "silver.db" / "table_columns"
    write_table_columns(table_columns, ORDERS + LINES)
    out = generate(tmp_path, capsys)
    assert "shop__public__orders: new model, 3 columns (shop public.orders)" in out
    assert "shop__public__lines: new model, 2 columns" in out and "2 models" in out
    sql = (tmp_path / "gold" / "shop__public__orders.sql").read_text()
    assert "{{ config(materialized='view') }}" in sql
    assert '"shop",\n    "public",\n    "orders",' in sql and '["amount", "string", "amount"],' in sql
    lines = yaml.safe_load((tmp_path / "gold" / "shop__public__lines.yml").read_text())["models"][0]
    tests = {c["name"]: c.get("data_tests") for c in lines["columns"]}
    # a composite key: each column not null, the record key unique
    assert tests["order_id"] == tests["line_no"] == ["not_null"]
    assert tests["_cl_record_pk"] == ["unique", "not_null"]
    assert all(c["description"] for c in lines["columns"])

    assert "0 written, 2 unchanged" in generate(tmp_path, capsys)  # nothing changed: files untouched

    # the source table changed: amount got a precision, note was dropped, created_at added
    changed = [
        row("orders", 1, "id", "bigint", "bigint", 1),
        row("orders", 2, "amount", "numeric(12,2)", "decimal(12,2)"),
        row("orders", 4, "created_at", "timestamp with time zone", "timestamp"),
    ]
    write_table_columns(table_columns, changed + LINES)
    out = generate(tmp_path, capsys)
    assert (
        "shop__public__orders: added created_at (timestamp); removed note; retyped amount string -> decimal(12,2)"
    ) in out
    assert "1 written, 1 unchanged" in out
    assert previous_columns((tmp_path / "gold" / "shop__public__orders.sql").read_text()) == [
        ("id", "bigint"),
        ("amount", "decimal(12,2)"),
        ("created_at", "timestamp"),
    ]


def test_generate_without_table_columns_says_what_to_run(tmp_path: Path, capsys: Any) -> None:
    args = ["-c", str(config(tmp_path)), "gold", "generate", "--out", str(tmp_path / "gold")]
    assert cli.main(args) == 2
    assert "no silver table_columns" in capsys.readouterr().err


def test_generate_of_an_unknown_source_is_refused(tmp_path: Path, capsys: Any) -> None:
    write_table_columns(tmp_path / "warehouse" / "dbt" / "silver.db" / "table_columns", ORDERS)
    args = ["-c", str(config(tmp_path)), "gold", "generate", "--source", "nope", "--no-comments"]
    assert cli.main(args) == 2
    assert "no source named 'nope'" in capsys.readouterr().err


def test_model_names_are_identifiers_and_distinct() -> None:
    assert model_name("shop", "public", "orders") == "shop__public__orders"
    odd = {model_name("s", "public", n) for n in ('Odd "table"', "odd table", "Odd table", "odd_table")}
    assert len(odd) == 4 and all(n.replace("_", "a").isalnum() and n == n.lower() for n in odd)
    assert model_name("1src", "a", "b").startswith("t_")


def test_output_names_are_unique_ignoring_case_and_bookkeeping() -> None:
    assert output_names(["id", "A", "a", "_CL_SEQ", "a__2"]) == ["id", "A", "a__2", "_CL_SEQ__2", "a__2__2"]


def test_names_are_jinja_and_sql_inert_in_the_model() -> None:
    """A column name is a JSON/Jinja string literal in the file (S1): no Jinja or SQL outside it."""
    name = "x\"}} {{ run_query('drop table t') }} {% if 1 %}`'\\"
    (t,) = tables_from_rows([row("t", 1, name, "text", "string", 1)])
    sql = render_sql(t)
    assert previous_columns(sql) == [(name, "string")]
    from jinja2 import Environment

    captured: list[Any] = []

    def typed_current_state(*args: Any) -> str:
        captured.append(args)
        return ""

    env = Environment()
    env.globals["config"] = lambda **kw: ""
    env.globals["changelake"] = {"typed_current_state": typed_current_state}
    env.from_string(sql).render()
    assert captured == [("shop", "public", "t", [[name, "string", name]])]


def test_two_tables_on_one_model_name_are_refused(tmp_path: Path) -> None:
    tables = tables_from_rows(ORDERS)
    with pytest.raises(ConfigError, match="same model name"):
        write_models(tables + tables, tmp_path)


def test_array_and_range_columns_are_typed_and_say_what_gold_leaves_out(tmp_path: Path, capsys: Any) -> None:
    """table_columns built before arrays and ranges were typed says string; rebuilt, gold generate retypes them."""
    table_columns = tmp_path / "warehouse" / "dbt" / "silver.db" / "table_columns"
    before = [
        row("slots", 1, "id", "bigint", "bigint", 1),
        row("slots", 2, "tags", "text[]", "string"),
        row("slots", 3, "during", "tstzrange", "string"),
    ]
    write_table_columns(table_columns, before)
    generate(tmp_path, capsys)
    during = "struct<lower:timestamp,upper:timestamp,lower_inc:boolean,upper_inc:boolean,empty:boolean>"
    after = [before[0], {**before[1], "spark_type": "array<string>"}, {**before[2], "spark_type": during}]
    write_table_columns(table_columns, after)
    out = generate(tmp_path, capsys)
    assert f"retyped tags string -> array<string>; retyped during string -> {during}" in out
    model = yaml.safe_load((tmp_path / "gold" / "shop__public__slots.yml").read_text())["models"][0]
    docs = {c["name"]: c for c in model["columns"]}
    assert docs["tags"]["data_type"] == "array<string>" and docs["during"]["data_type"] == during
    assert docs["tags"]["description"] == (
        "Source column 'tags'. (text[] as array<string>; a multi-dimensional value is null here, silver keeps it)"
    )
    assert "; a range: lower and upper are null when unbounded or infinite)" in docs["during"]["description"]
    assert docs["id"]["description"] == "Source column 'id'. (bigint)"
