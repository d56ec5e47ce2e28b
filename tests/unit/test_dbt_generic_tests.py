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
    return (
        Environment(extensions=["jinja2.ext.do"])
        .from_string(text + f"{{{{ test_{name}(**arguments) }}}}")
        .render(arguments=arguments)
    )


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


def rules_sql(**arguments: object) -> str:
    return generic_test_sql("changelake_rules", model=WRAPPED, **arguments)


def test_changelake_rules_return_each_key_held_twice_or_by_a_row_breaking_a_rule() -> None:
    sql = rules_sql(not_null=["n"], accepted_values={"name": ["a", "b"]}, unique=["id"])
    rows = [(1, "a", 1), (2, "b", 2), (2, "a", 3), (3, "c", 4), (4, None, None), (5, "b", 5)]
    # id 2: two rows; id 3: a value not accepted; id 4: n null (a null name is accepted).
    assert failing_rows(sql, rows) == [(2, 2, ""), (3, 1, "name not accepted"), (4, 1, "n is null")]
    assert failing_rows(sql, [(1, "a", 1), (2, None, 2)]) == []


def test_changelake_rules_name_every_rule_a_row_breaks_and_apply_conditions() -> None:
    sql = rules_sql(not_null=["n"], not_null_when={"name": "id > 1"}, accepted_values={"n": [1, 2]}, unique=["id"])
    rows = [(1, None, 1), (2, None, None), (3, "c", 3)]
    # id 1: name may be null there (the condition does not hold); id 2 breaks two rules.
    assert failing_rows(sql, rows) == [(2, 1, "n is null, name is null"), (3, 1, "n not accepted")]


def test_changelake_rules_without_a_key_return_each_row_breaking_a_rule() -> None:
    sql = rules_sql(not_null=["id"], accepted_values={"name": ["a"]})
    rows = [(1, "a", 1), (None, "a", 2), (3, "z", 3), (3, "a", 3)]
    assert failing_rows(sql, rows) == [("id is null", None, "a", 2), ("name not accepted", 3, "z", 3)]
