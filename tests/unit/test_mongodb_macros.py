"""The MongoDB gold macros render names as escaped literals and identifiers, and refuse unknown types.

Rendered with Jinja alone (the macros need nothing of dbt but ref(), a compiler error and `re`),
then parsed as Spark SQL by sqlfluff: a hostile name must stay inside its literal or identifier.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlfluff
from jinja2 import Environment

from tests.helpers.pg import ROOT

MACROS = ("sql_literal", "spark_identifier", "mongodb_field_to_spark_type", "mongodb_typed_current_state")


class CompilerError(Exception):
    pass


def raise_compiler_error(message: str) -> None:
    raise CompilerError(message)


def render(source: str, database: str, collection: str, fields: list[list[str]]) -> str:
    text = "".join((ROOT / "macros" / f"{m}.sql").read_text() for m in MACROS)
    env = Environment()
    env.globals.update(
        ref=lambda name: f"silver.{name}",
        exceptions=type("Exceptions", (), {"raise_compiler_error": staticmethod(raise_compiler_error)}),
        modules=type("Modules", (), {"re": re}),
    )
    call = "{{ mongodb_typed_current_state(source, database, collection, fields) }}"
    return env.from_string(text + call).render(source=source, database=database, collection=collection, fields=fields)


def parsed(sql: str) -> Any:
    tree = sqlfluff.parse(sql, dialect="sparksql")
    assert "unparsable" not in str(tree), tree
    return tree


def test_hostile_names_are_escaped_in_the_typed_model() -> None:
    """Source, database, collection and field names were spliced into quotes and backticks as they were.

    A quote in a collection or field name broke the model, and a var() could inject SQL.
    """
    evil = "x' or 1=1 --"
    sql = render("shop'; drop table t; --", "db\\", evil, [["_id", "objectid"], ["a`b c", "int"], ["qty", "bigint"]])
    parsed(sql)
    assert "source = 'shop\\'; drop table t; --'" in sql
    assert "table_schema = 'db\\\\'" in sql and "table_name = 'x\\' or 1=1 --'" in sql
    assert "as `a``b c`" in sql and "'$[\\'a`b c\\'].$numberInt'" in sql
    assert "get_json_object(record, '$._id.$oid') as `_id`" in sql


@pytest.mark.parametrize(
    ("field", "spark_type", "refusal"),
    [
        ("qty", "int) as qty, (select secret from t", "unknown type"),
        ("qty", "date", "unknown type"),
        ("it's", "string", "cannot address the field"),
        ("a]b", "string", "cannot address the field"),
    ],
)
def test_unknown_types_and_unaddressable_fields_are_refused(field: str, spark_type: str, refusal: str) -> None:
    """spark_type was spliced into cast(... as <type>) unchecked."""
    with pytest.raises(CompilerError, match=refusal):
        render("s", "d", "c", [[field, spark_type]])


def test_the_demo_model_still_renders() -> None:
    fields = [["_id", "objectid"], ["name", "string"], ["price", "decimal(12,2)"], ["qty", "int"]]
    fields += [["views", "bigint"], ["in_stock", "boolean"], ["added_at", "timestamp"], ["tags", "json"]]
    sql = render("shop_docs", "shop", "products", fields)
    parsed(sql)
    assert "as decimal(12,2)) as `price`" in sql and "'$.added_at.$date.$numberLong'" in sql
