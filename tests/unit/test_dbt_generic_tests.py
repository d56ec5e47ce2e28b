"""The project's generic data tests return exactly the failing rows.

A generic test passes when its query returns no row, so a query that can never return one is a
check that cannot fail. Rendered with Jinja alone (dbt turns `{% test name %}` into a macro
`test_name`) and run by SQLite, with Spark's `concat_ws` (nulls skipped) as a function.
"""

from __future__ import annotations

import re
import sqlite3

from jinja2 import Environment

from tests.helpers.pg import ROOT

# What dbt passes as `model` when the test has a `where` config (spark__get_where_subquery).
WRAPPED = "(select * from t where true) dbt_subquery"


def generic_test_sql(name: str, **arguments: object) -> str:
    text = (ROOT / "macros" / "generic_tests" / f"test_{name}.sql").read_text()
    text = re.sub(r"\{%\s*test\s+(\w+)", r"{% macro test_\1", text).replace("endtest", "endmacro")
    return Environment().from_string(text + f"{{{{ test_{name}(**arguments) }}}}").render(arguments=arguments)


def concat_ws(separator: str, *values: str | None) -> str:
    return separator.join(v for v in values if v is not None)


def failing_rows(sql: str, rows: list[tuple[int | None, str | None, int | None]]) -> list[tuple[object, ...]]:
    db = sqlite3.connect(":memory:")
    db.create_function("concat_ws", -1, concat_ws)
    db.execute("create table t (id integer, name text, n integer)")
    db.executemany("insert into t values (?, ?, ?)", rows)
    return sorted(db.execute(sql).fetchall())


def test_columns_not_null_returns_each_row_with_a_null_and_names_its_null_columns() -> None:
    sql = generic_test_sql("columns_not_null", model=WRAPPED, column_names=["id", "name", "n"])
    rows = [(1, "a", 1), (2, None, 2), (3, None, None), (None, "d", 4)]
    assert failing_rows(sql, rows) == [
        ("id", None, "d", 4),
        ("name", 2, None, 2),
        ("name, n", 3, None, None),
    ]
    assert failing_rows(sql, [(1, "a", 1), (2, "b", 2)]) == []


def test_columns_not_null_checks_only_the_columns_it_names() -> None:
    sql = generic_test_sql("columns_not_null", model=WRAPPED, column_names=["id"])
    assert failing_rows(sql, [(1, None, None), (None, "b", 2)]) == [("id", None, "b", 2)]
