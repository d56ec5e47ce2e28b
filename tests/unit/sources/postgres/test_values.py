"""JSON value mapping (docs/bronze.md) of recorded and synthetic pgoutput text values."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.sources.postgres.pgoutput import UNCHANGED_TOAST, Insert, Relation, Update, decode
from ingest.sources.postgres.rows import encode_key, encode_record, json_keys
from ingest.sources.postgres.values import (
    TYPE_CATALOG_SQL,
    TypeCatalog,
    ValueMappingError,
    parse_array_literal,
)
from tests.unit.sources.postgres.recorded import fixture, messages

INT4, INT8, TEXT, FLOAT8, NUMERIC, BOOL, TIMESTAMPTZ, BYTEA = 23, 20, 25, 701, 1700, 16, 1184, 17
INT4_ARRAY, TEXT_ARRAY = 1007, 1009

CATALOG = TypeCatalog.from_rows(fixture()["pg_type"])
BUILTIN = TypeCatalog()


def strict_loads(text: str) -> Any:
    """json.loads that rejects the non-standard NaN/Infinity literals."""

    def reject(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name} in {text!r}")

    return json.loads(text, parse_constant=reject)


def encoders_for(rel: Relation, catalog: TypeCatalog = CATALOG) -> list[Any]:
    """One encoder per column of `rel`."""
    return [catalog.column_encoder(c.type_oid) for c in rel.columns]


def columns_of(rel: Relation) -> tuple[tuple[str, ...], list[Any], list[str]]:
    """What ChangeBuilder passes encode_record for `rel`: its key prefixes, encoders and names."""
    names = [c.name for c in rel.columns]
    return json_keys(names), encoders_for(rel), names


TABLE = "s.t"


EXPECTED_KINDS_ROW = {
    "id": 1, "i2": -32768, "i4": 2147483647, "o": 4294967295, "f4": "NaN", "f8": "-Infinity",
    "n": "12.340", "nn": "NaN", "b": True, "t": 'héllo "q" \\ \n tab\t', "vc": "var",
    "ch": "ab ", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "j": '{"a": [1, null]}',
    "jb": '{"b": null}', "by": "\\x000aff", "d": "2024-02-29", "tm": "23:59:59.5",
    "ttz": "12:00:00+05:30", "ts": "infinity", "tstz": "2024-01-02 03:04:05.678+00",
    "iv": "P1Y2M3DT4H5M6S", "m": "happy", "dom": 7, "ia": [1, None, 3],
    "ta": ["plain", "with space", 'quo"te', "back\\slash", "NULL", "", "com,ma", "br{ace}", None],
    "ma": [[1, 2], [3, 4]], "ba": [True, False, None],
    "fa": ["NaN", "Infinity", "-Infinity", 1.5], "na": ["1.10", "NaN"],
    "ja": ['{"k": "v"}', "null"], "ma_mood": ["sad", "happy"], "pt": "(1.5,2)",
    "boxes": ["(1,1),(0,0)", "(3,3),(2,2)"], "iv2": "1 2 3",
}  # fmt: skip

EXPECTED_KINDS = {
    "id": "int", "i2": "int", "i4": "int", "o": "int", "f4": "float", "f8": "float",
    "n": "numeric", "nn": "numeric", "b": "bool", "t": "text", "vc": "text", "ch": "text",
    "u": "text", "j": "json", "jb": "json", "by": "bytea", "d": "temporal", "tm": "temporal",
    "ttz": "temporal", "ts": "temporal", "tstz": "temporal", "iv": "temporal", "m": "text",
    "dom": "int", "ia": "array", "ta": "array", "ma": "array", "ba": "array", "fa": "array",
    "na": "array", "ja": "array", "ma_mood": "array", "pt": "other", "boxes": "array",
    "iv2": "other",
}  # fmt: skip


def test_recorded_insert_maps_every_type() -> None:
    msgs = messages("insert_kinds")
    [rel] = [m for m in msgs if isinstance(m, Relation)]
    first, second = (m for m in msgs if isinstance(m, Insert))
    keys, encoders, names = columns_of(rel)
    record, unchanged = encode_record(TABLE, keys, encoders, names, first.new)
    assert unchanged is None
    assert strict_loads(record) == EXPECTED_KINDS_ROW
    assert list(strict_loads(record)) == [c.name for c in rel.columns]  # column order kept
    assert record.startswith('{"id":1,"i2":-32768,')  # compact
    assert '"t":"héllo \\"q\\" \\\\ \\n tab\\t"' in record  # non-ASCII kept, escapes standard
    assert {c.name: CATALOG.json_kind(c.type_oid) for c in rel.columns} == EXPECTED_KINDS
    nulls, _ = encode_record(TABLE, keys, encoders, names, second.new)
    assert strict_loads(nulls) == {"id": 2} | {c.name: None for c in rel.columns[1:]}
    assert encode_key(TABLE, keys, encoders, [0], first.new) == '{"id":1}'


def test_unchanged_toast_columns_are_absent_and_listed() -> None:
    msgs = messages("update_toast_unchanged")
    [rel] = [m for m in msgs if isinstance(m, Relation)]
    [update] = [m for m in msgs if isinstance(m, Update)]
    record, unchanged = encode_record(TABLE, *columns_of(rel), update.new)
    assert (record, unchanged) == ('{"id":1,"title":"renamed"}', ("body",))


def test_key_of_old_key_tuple_and_composite_key_order() -> None:
    msgs = messages("update_key")
    [rel] = [m for m in msgs if isinstance(m, Relation)]
    [update] = [m for m in msgs if isinstance(m, Update)]
    keys, encoders, names = columns_of(rel)
    assert update.old is not None
    assert encode_key(TABLE, keys, encoders, [0], update.old) == '{"id":1}'
    assert encode_key(TABLE, keys, encoders, [0], update.new) == '{"id":10}'
    assert encode_record(TABLE, keys, encoders, names, update.old)[0] == '{"id":1,"name":null}'
    assert encode_key(TABLE, keys, encoders, [1, 0], update.new) == '{"name":"one","id":10}'


def test_key_column_null_is_null_and_unchanged_toast_comes_from_the_old_tuple() -> None:
    """The NULL-key rule (issue 16): NULL is JSON null; an unchanged-TOAST key takes the old tuple's value.

    Without an old value (no old tuple, NULL or unchanged there) the key cannot be known.
    """
    keys, encoders = json_keys(["id", "n"]), [BUILTIN.column_encoder(INT4)] * 2
    assert encode_key(TABLE, keys, encoders, [0], (None, b"1")) == '{"id":null}'
    new = (UNCHANGED_TOAST, b"2")
    assert encode_key(TABLE, keys, encoders, [0, 1], new, (b"7", b"1")) == '{"id":7,"n":2}'
    for old in (None, (None, b"1"), (UNCHANGED_TOAST, b"1")):
        with pytest.raises(ValueMappingError, match=r'table s\.t: key column "id" is an unchanged TOAST value'):
            encode_key(TABLE, keys, encoders, [0], new, old)
    with pytest.raises(ValueMappingError, match=r"table s\.t: a row has 1 columns but the relation has 2"):
        encode_key(TABLE, keys, encoders, [0], new, (b"7",))


def test_record_width_mismatch_and_bad_value_name_the_problem() -> None:
    keys, names, encoders = json_keys(["id", "ok"]), ["id", "ok"], [BUILTIN.column_encoder(INT4)] * 2
    for encode in (
        lambda values: encode_record(TABLE, keys, encoders, names, values),
        lambda values: encode_key(TABLE, keys, encoders, [0], values),
    ):
        with pytest.raises(ValueMappingError, match="a row has 1 columns but the relation has 2"):
            encode((b"1",))
        with pytest.raises(ValueMappingError, match=r"table s\.t: a row has 3 .* Relation message was missed"):
            encode((b"1", b"2", b"3"))
    bools = [BUILTIN.column_encoder(INT4), BUILTIN.column_encoder(BOOL)]
    with pytest.raises(ValueMappingError, match="column \"ok\": boolean value 'x'"):
        encode_record(TABLE, keys, bools, names, (b"1", b"x"))
    texts = [BUILTIN.column_encoder(TEXT)] * 2
    with pytest.raises(ValueMappingError, match='column "ok"'):
        encode_record(TABLE, keys, texts, names, (b"1", b"\xff"))
    with pytest.raises(ValueMappingError, match=r'table s\.t, key column "ok"'):
        encode_key(TABLE, keys, texts, [1], (b"1", b"\xff"))


@pytest.mark.parametrize(
    ("oid", "text", "json_text"),
    [
        (FLOAT8, b"NaN", '"NaN"'),
        (FLOAT8, b"Infinity", '"Infinity"'),
        (FLOAT8, b"-Infinity", '"-Infinity"'),
        (FLOAT8, b"1e+308", "1e+308"),
        (FLOAT8, b"-0", "-0"),
        (700, b"1.5e-07", "1.5e-07"),
        (NUMERIC, b"NaN", '"NaN"'),
        (NUMERIC, b"Infinity", '"Infinity"'),
        (NUMERIC, b"12345678901234567890.000000000000000001", '"12345678901234567890.000000000000000001"'),
        (TIMESTAMPTZ, b"infinity", '"infinity"'),
        (TIMESTAMPTZ, b"-infinity", '"-infinity"'),
        (1082, b"-infinity", '"-infinity"'),
        (INT8, b"-9223372036854775808", "-9223372036854775808"),
        (BOOL, b"t", "true"),
        (BOOL, b"f", "false"),
        (BYTEA, b"\\x0a0b", '"\\\\x0a0b"'),
        (114, b'{"a":null}', '"{\\"a\\":null}"'),
        (99999, b"anything \x01", '"anything \\u0001"'),
    ],
)  # fmt: skip
def test_scalar_mapping(oid: int, text: bytes, json_text: str) -> None:
    assert BUILTIN.column_encoder(oid)(text) == json_text
    strict_loads(json_text)


def test_builtin_catalog_kinds_and_domains() -> None:
    assert [BUILTIN.json_kind(o) for o in (INT4, 1021, 3802, 2950, 99999)] == [
        "int", "array", "json", "text", "other",
    ]  # fmt: skip
    catalog = TypeCatalog.from_rows(
        [(5001, "d1", "d", INT4_ARRAY, 0, "A"), (5002, "d2", "d", 5001, 0, "A"),
         (5003, "_d2", "b", 0, 5002, "A"), (5004, "loop", "d", 5004, 0, "N")]
    )  # fmt: skip
    assert catalog.json_kind(5002) == "array"
    assert catalog.column_encoder(5002)(b"{1,2}") == "[1,2]"
    assert catalog.column_encoder(5003)(b'{"{1,2}",NULL}') == "[[1,2],null]"  # array of domain
    with pytest.raises(ValueMappingError, match="domain cycle"):
        catalog.json_kind(5004)
    assert TYPE_CATALOG_SQL.startswith("select t.oid::int8, t.typname::text")


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        ("{}", []),
        ("{{}}", [[]]),
        ("{1,2,3}", ["1", "2", "3"]),
        ("[0:2]={1,NULL,3}", ["1", None, "3"]),
        ("[1:2][-1:0]={{1,2},{3,4}}", [["1", "2"], ["3", "4"]]),
        ('{"NULL",null,NuLl,"",""}', ["NULL", None, None, "", ""]),
        ('{ a b , "c d" ,e\\ }', ["a b", "c d", "e "]),
        ('{"a\\"b","c\\\\d",e\\,f}', ['a"b', "c\\d", "e,f"]),
        ("{\\NULL}", ["NULL"]),
        ("  { { 1 } , { 2 } }  ", [["1"], ["2"]]),
    ],
)
def test_parse_array_literal(literal: str, expected: list[Any]) -> None:
    assert parse_array_literal(literal) == expected


@pytest.mark.parametrize(
    "literal", ["", "1,2", "{1,2", '{"a}', "{1,2}x", "{a{b}", "{,}", "{1,,2}", "[1:2]{1,2}", '{a"b"}']
)
def test_malformed_array_literal_raises(literal: str) -> None:
    with pytest.raises(ValueMappingError, match="array literal"):
        parse_array_literal(literal)


def test_box_array_uses_semicolon_delimiter_without_catalog() -> None:
    assert BUILTIN.column_encoder(1020)(b"{(1,1),(0,0);(3,3),(2,2)}") == ('["(1,1),(0,0)","(3,3),(2,2)"]')


# --- property: Postgres-quoted array literals round trip -------------------------------------

_NEEDS_QUOTES = set('{},"\\ \t\n\r\v\f')


def pg_quote(element: str | None) -> str:
    """Quote an element the way array_out does."""
    if element is None:
        return "NULL"
    if element == "" or element.upper() == "NULL" or _NEEDS_QUOTES & set(element):
        return '"' + element.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return element


def pg_literal(value: list[Any]) -> str:
    """array_out text of a nested list."""
    return "{" + ",".join(pg_literal(v) if isinstance(v, list) else pg_quote(v) for v in value) + "}"


def nested(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """Rectangular-or-not nested lists of uniform depth 1..3."""
    return st.integers(1, 3).flatmap(lambda depth: _nested(elements, depth))


def _nested(elements: st.SearchStrategy[Any], depth: int) -> st.SearchStrategy[list[Any]]:
    if depth == 1:
        return st.lists(elements, max_size=5)
    return st.lists(_nested(elements, depth - 1), min_size=1, max_size=3)


_ints = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
_texts = st.one_of(
    st.none(),
    st.sampled_from(["", "NULL", "null", " ", "a b", '"', "\\", "{", "}", ","]),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=8),
)


def _as_text(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_text(v) for v in value]
    return None if value is None else str(value)


@given(nested(_ints))
def test_int_array_round_trip(value: list[Any]) -> None:
    literal = pg_literal(_as_text(value))
    assert parse_array_literal(literal) == _as_text(value)
    assert strict_loads(BUILTIN.column_encoder(INT4_ARRAY)(literal.encode())) == value


@given(nested(_texts))
def test_text_array_round_trip(value: list[Any]) -> None:
    literal = pg_literal(value)
    assert parse_array_literal(literal) == value
    assert strict_loads(BUILTIN.column_encoder(TEXT_ARRAY)(literal.encode())) == value


@given(st.text(st.characters(exclude_categories=["Cs"])))
def test_string_escaping_matches_json_dumps(text: str) -> None:
    encoded = text.encode()
    assert BUILTIN.column_encoder(TEXT)(encoded) == json.dumps(text, ensure_ascii=False)


def test_json_keys_escape() -> None:
    assert json_keys(["id", 'we"ird']) == ('"id":', '"we\\"ird":')


def test_decoded_then_encoded_end_to_end() -> None:
    """Raw recorded bytes -> decode -> encode, as the stream adapter will do it."""
    step = next(s for s in fixture()["steps"] if s["name"] == "origin")
    rel = insert = None
    for change in step["changes"]:
        msg = decode(bytes.fromhex(change["data"]))
        if isinstance(msg, Relation):
            rel = msg
        elif isinstance(msg, Insert):
            insert = msg
    assert rel is not None and insert is not None
    assert encode_record(TABLE, *columns_of(rel), insert.new) == ('{"id":30,"name":"from origin"}', None)
