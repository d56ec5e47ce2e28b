"""The key values a re-read asks for, and the condition that selects a keyless table's rows by them."""

from __future__ import annotations

from psycopg import sql

from ingest.sources.postgres.catalog import TableShape
from ingest.sources.postgres.pages import keyless_keys_sql
from ingest.sources.postgres.rereads import key_values


def test_key_values_keep_null_apart_from_its_text_and_numbers_as_written() -> None:
    """Regression: a NULL key column was read as the text 'null', and a float went through a Python float."""
    pk = '{"a":null,"b":"null","c":"","f":1E+300,"g":0.10,"n":"1.50","ok":true,"arr":[1, null]}'
    assert key_values(pk) == (None, "null", "", "1E+300", "0.10", "1.50", "true", "[1,null]")


def test_keyless_keys_select_by_output_text_is_null_and_skip_arrays() -> None:
    shape = TableShape(
        "s",
        "t",
        ("a", "b", "ok", "arr"),
        (23, 25, 16, 1007),
        (0, 1, 2, 3),
        ("integer", "text", "boolean", "integer[]"),
        keyless=True,
    )
    bound: list[str] = []

    def bind(value: str) -> sql.Composable:
        bound.append(value)
        return sql.SQL(f"${len(bound)}::text")

    cond = keyless_keys_sql(shape, [("1", None, "true", "[1]"), (None, "x", None, None)], bind).as_string(None)
    assert cond == (
        """((format('%s', "a") = $1::text and "b" is null and format('%s', "ok") = $2::text) or """
        """("a" is null and format('%s', "b") = $3::text and "ok" is null and "arr" is null))"""
    )
    assert bound == ["1", "t", "x"]
