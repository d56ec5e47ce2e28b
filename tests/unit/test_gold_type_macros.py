"""The Postgres gold type macros: arrays, ranges and composites render as Spark SQL, their patterns split values right.

Rendered with Jinja alone (the macros need nothing of dbt but a compiler error and `re`), parsed as
Spark SQL by sqlfluff; the regular expressions the SQL hands to Spark are applied here with Python's
`re` (they use nothing whose meaning differs from Java's). tests/integration/test_pg_types.py runs
them in Spark on values a real PostgreSQL wrote.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlfluff
from jinja2 import Environment

from tests.helpers.pg import ROOT

MACROS = ("json_text_to_spark_type", "spark_type_for_pg_type")


class CompilerError(Exception):
    pass


def raise_compiler_error(message: str) -> None:
    raise CompilerError(message)


def render(call: str, **values: Any) -> str:
    text = "".join((ROOT / "macros" / f"{m}.sql").read_text() for m in MACROS)
    env = Environment()
    env.globals.update(
        exceptions=type("Exceptions", (), {"raise_compiler_error": staticmethod(raise_compiler_error)}),
        modules=type("Modules", (), {"re": re}),
    )
    return env.from_string(text + call).render(**values)


def cast(spark_type: str) -> str:
    """json_text_to_spark_type of the column `v`, as a select sqlfluff parses."""
    sql = render("select {{ json_text_to_spark_type('v', spark_type) }} as x from t", spark_type=spark_type)
    tree = sqlfluff.parse(sql, dialect="sparksql")
    assert "unparsable" not in str(tree), tree
    return sql


def spark_string(literal: str) -> str:
    """The value of a Spark SQL string literal's body (backslash escapes; the default, not escapedStringLiterals)."""
    return re.sub(r"\\(.)", r"\1", literal)


def patterns(sql: str, function: str) -> list[str]:
    """The regular expressions `sql` passes to `function` (regexp_extract, rlike), in order."""
    if function == "rlike":
        found = re.findall(r"rlike '((?:[^'\\]|\\.)*)'", sql)
    else:
        found = re.findall(rf"{function}\(.*?, '((?:[^'\\]|\\.)*)', 1\)", sql)
    return [spark_string(p) for p in found]


RANGE_INT = "struct<lower:int,upper:int,lower_inc:boolean,upper_inc:boolean,empty:boolean>"
RANGE_TS = "struct<lower:timestamp,upper:timestamp,lower_inc:boolean,upper_inc:boolean,empty:boolean>"


@pytest.mark.parametrize(
    ("text", "lower", "upper"),
    [
        ("[1,10)", "1", "10"),
        ("[5,)", "5", ""),
        ("(,)", "", ""),
        ("(,-3]", "", "-3"),
        ('["2024-01-01 00:00:00+00","2024-02-01 00:00:00.5+00")', "2024-01-01 00:00:00+00", "2024-02-01 00:00:00.5+00"),
        ('[-infinity,"2024-01-01 00:00:00+00")', "-infinity", "2024-01-01 00:00:00+00"),
        ("[2024-01-01,infinity)", "2024-01-01", "infinity"),
        ("(1.5,2.25]", "1.5", "2.25"),
    ],
)
def test_range_bounds_are_split_from_postgres_text(text: str, lower: str, upper: str) -> None:
    """Postgres quotes a bound with a space (a timestamp) and writes nothing for an unbounded side."""
    sql = cast(RANGE_TS)
    lower_pattern, upper_pattern = dict.fromkeys(patterns(sql, "regexp_extract"))  # each bound's cast repeats it
    found = [m.group(1) if (m := re.search(p, text)) else "" for p in (lower_pattern, upper_pattern)]
    assert found == [lower, upper]
    assert "startswith(v, '[')" in sql and "endswith(v, ']')" in sql and "when v = 'empty'" in sql


def test_a_null_range_is_null_and_not_a_struct_of_nulls() -> None:
    """named_struct of null bounds is a non-null struct: the null check comes first."""
    sql = cast(RANGE_INT)
    assert sql.index("when v is null then null") < sql.index("when v = 'empty'")
    assert "cast(null as int)" in sql


@pytest.mark.parametrize(
    ("text", "multi_dimensional"),
    [("[[1,2],[3,4]]", True), ("[ [1]]", True), ("[1,null,3]", False), ('["[x","{y}"]', False), ("[]", False)],
)
def test_a_multi_dimensional_array_is_told_from_a_one_dimensional_one(text: str, multi_dimensional: bool) -> None:
    """An array of arrays starts `[[`; a one-dimensional array's elements are scalars (a string element is quoted)."""
    (pattern,) = patterns(cast("array<int>"), "rlike")
    assert bool(re.search(pattern, text)) is multi_dimensional


def test_array_elements_are_cast_as_scalars_are() -> None:
    sql = cast("array<decimal(12,2)>")
    assert "from_json(v, 'array<string>')" in sql
    assert "cl_element -> case when cl_element = 'NaN' then null else cast(cl_element as decimal(12,2)) end" in sql
    timestamps = cast("array<timestamp>")
    assert "when cl_element in ('infinity', '-infinity') then null" in timestamps
    ranges = cast(f"array<{RANGE_INT}>")
    assert "cl_element = 'empty'" in ranges


@pytest.mark.parametrize(
    "spark_type",
    [
        "array<array<int>>",
        "array<int) as x, (select secret from t>",
        "struct<lower:int,upper:bigint,lower_inc:boolean,upper_inc:boolean,empty:boolean>",
        "struct<`a b`:int>",
        "struct<a:array<int>>",
        "struct<a:int,b:struct<c:int>>",
        "struct<a:int) as x, (select secret from t>",
        "struct<>",
        "variant",
        "map<string,int>",
    ],
)
def test_other_types_are_refused(spark_type: str) -> None:
    """Only the types spark_type_for_pg_type gives reach the SQL: a type is spliced into casts."""
    with pytest.raises(CompilerError, match="unknown Spark type"):
        cast(spark_type)


def test_the_type_mapping_renders_as_one_expression() -> None:
    sql = render("select {{ spark_type_for_pg_type('type_name') }} as spark_type from t")
    tree = sqlfluff.parse(sql, dialect="sparksql")
    assert "unparsable" not in str(tree), tree
    element = r"regexp_replace(type_name, '\\[\\]$', '')"  # the type name without its []
    assert "concat('array<', case" in sql and element in sql
    assert f"when {element} = 'int4range'\n                then '{RANGE_INT}'" in sql


def composite_fields(pattern: str, text: str) -> list[str | None]:
    """Postgres' composite text split as the composite's SQL splits it: `pattern` over `,` + the text inside the
    parentheses, then an empty field NULL, a quoted one unquoted (`""` a quote, a doubled backslash one)."""
    found = re.findall(pattern, "," + text[1:-1])
    return [None if f == "" else f[1:-1].replace('""', '"').replace("\\\\", "\\") if f[:1] == '"' else f for f in found]


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ('(1,"a b",)', ["1", "a b", None]),
        ("(,)", [None, None]),
        ("()", [None]),  # a composite of one field, NULL
        ('("",x)', ["", "x"]),  # the empty string is quoted, NULL is not
        ("(NULL,5)", ["NULL", "5"]),  # the text NULL
        (
            '(1,"a ""b"", (c) \\\\ d","2024-01-02 01:04:05+00",t)',
            ["1", 'a "b", (c) \\ d', "2024-01-02 01:04:05+00", "t"],
        ),
        ('("\\\\""","(,)","""")', ['\\"', "(,)", '"']),
        ('("(3,q,,)","{x,""y z""}")', ["(3,q,,)", '{x,"y z"}']),  # a nested composite, an array: their text
        ('("line\nbreak",2)', ["line\nbreak", "2"]),
    ],
)
def test_composite_fields_are_split_from_postgres_text(text: str, fields: list[str | None]) -> None:
    """record_out quotes a field with a comma, quote, parenthesis, backslash or space, or an empty one, doubling `"`
    and `\\` in it; it writes nothing for NULL."""
    sql = cast("struct<a:int,b:string>")
    (pattern,) = re.findall(r"concat\(',', substr\(v, 2, length\(v\) - 2\)\),\s*'([^']*)'", sql)
    assert composite_fields(spark_string(pattern), text) == fields
    assert "replace(substr(cl_field, 2, length(cl_field) - 2), '\"\"', '\"'), '\\\\\\\\', '\\\\'" in sql


def test_composite_fields_are_cast_as_columns_are() -> None:
    """Each field by its place, cast as a column of its type; a NULL composite is null, not a struct of nulls."""
    sql = cast(f"struct<n:int,at:timestamp,amt:decimal(6,2),r:{RANGE_INT},note:string>")
    assert sql.index("when v is null then null") < sql.index("named_struct")
    assert "'n', cast(get(cl_fields, 0) as int)" in sql
    assert "when get(cl_fields, 1) in ('infinity', '-infinity') then null" in sql
    assert "when get(cl_fields, 2) = 'NaN' then null else cast(get(cl_fields, 2) as decimal(6,2))" in sql
    assert "when get(cl_fields, 3) = 'empty'" in sql
    assert "'note', get(cl_fields, 4)" in sql
    assert "cl_element -> case\n            when cl_element is null then null" in cast("array<struct<a:int>>")


def test_a_composite_column_is_typed_from_its_fields() -> None:
    """With the column's fields (array<struct<name, type_name>>) the mapping builds struct<...> from each field."""
    sql = render("select {{ spark_type_for_pg_type('type_name', 'fields') }} as spark_type from t")
    tree = sqlfluff.parse(sql, dialect="sparksql")
    assert "unparsable" not in str(tree), tree
    assert "when cl_field.type_name like '%[]' then 'string'" in sql  # an array field: its Postgres text
    assert "when cl_field.type_name in ('smallint', 'integer', 'int2', 'int4') then 'int'" in sql
    assert "then if(type_name like '%[]', concat('array<', concat(" in sql
    names = patterns(sql, "rlike")
    assert "^[A-Za-z_][A-Za-z0-9_]*$" in names
    assert "fields" not in render("select {{ spark_type_for_pg_type('type_name') }} as spark_type from t")
