"""Every common Postgres type round-trips into `record` JSON per docs/bronze.md's mapping."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from ingest import cli
from ingest.bronze.schemas import SOURCE_RELATIONS
from ingest.gold import model_name
from tests.helpers import bronze_fixture
from tests.helpers.delta_rows import read
from tests.helpers.pg import ROOT, bronze_events, capture_once, prepare
from tests.helpers.silver import dbt

pytestmark = pytest.mark.integration

TYPES_SQL = """
create type mood as enum ('sad', 'ok', 'happy');
create domain posint as integer check (value > 0);
create domain amount as numeric(12, 2);
create type pair as (n int, label text, at timestamptz, ok bool, amt numeric(6, 2), r int4range, inner_tags text[]);
create type wrap as (p pair, note text);
create table typed (
    id bigint primary key,
    c_int2 int2, c_int4 int4, c_int8 int8,
    c_numeric numeric(12, 3), c_numeric_free numeric,
    c_float4 float4, c_float8 float8,
    c_text text, c_varchar varchar(10), c_char char(3),
    c_bool bool, c_date date, c_time time, c_timestamp timestamp, c_timestamptz timestamptz,
    c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb, c_bytea bytea,
    c_int_array int[], c_text_array text[], c_int_matrix int[][],
    c_enum mood, c_domain posint, c_amount amount, c_amount_array amount[],
    c_ts_array timestamptz[], c_numeric_array numeric(6, 2)[], c_bool_array bool[], c_uuid_array uuid[],
    c_jsonb_array jsonb[], c_int4range int4range, c_tstzrange tstzrange, c_daterange daterange, c_numrange numrange,
    c_range_array int4range[], c_pair pair, c_pair_array pair[], c_wrap wrap
)
"""

ROWS = [
    # id 1: ordinary values
    """insert into typed values (1, 1, 2, 9007199254740993, 12.340, 1e-20, 1.5, 2.25, 'héllo "q" \\ x',
       'vc', 'ab', true, '2024-02-29', '13:14:15.5', '2024-01-02 03:04:05.123456',
       '2024-01-02 03:04:05+02', '1 day 2 hours', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
       '{"a": [1, 2]}', '{"b": null}', '\\x00ff10', '{1,NULL,3}', '{"a,b","c\\"d",NULL,"NULL"}',
       '{{1,2},{3,4}}', 'happy', 7, 1.5, '{2.25}', '{"2024-01-02 03:04:05+02",infinity,NULL}', '{1.5,NaN,NULL}',
       '{t,f,NULL}', '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', array['{"k": [1]}'::jsonb, 'null', NULL],
       '[1,10)', '[2024-01-01 00:00+00,2024-02-01 00:00+00)', '[2024-01-01,infinity)', '(1.5,2.25]',
       '{"[1,3)",empty,NULL}',
       row(1, E'a "b", (c) \\\\ d', '2024-01-02 03:04:05+02', true, 1.5, '[1,10)', '{x,"y z"}'),
       array[row(2, '', null, false, null, 'empty', null)::pair, null],
       row(row(3, 'q', null, null, null, null, null)::pair, E'n,1\ttab'))""",
    # id 2: special values; a composite whose fields are all NULL, an empty array of composites
    """insert into typed (id, c_numeric_free, c_float4, c_float8, c_timestamp, c_timestamptz, c_date, c_json, c_jsonb,
       c_int_array, c_int4range, c_tstzrange, c_pair, c_pair_array)
       values (2, 'NaN', 'NaN', '-Infinity', 'infinity', '-infinity', 'infinity', 'null', 'null', '{}', 'empty',
       '(,2024-01-01 00:00+00]', row(null, null, null, null, null, null, null), '{}')""",
    # id 3: all NULL
    "insert into typed (id) values (3)",
    # id 4: float infinity and extremes; array elements with braces, a backslash, empty and spaced; an unbounded range
    # a composite's text 'NULL' (not NULL), infinity and NaN fields, an unbounded range field, an empty array field
    """insert into typed (id, c_float8, c_int8, c_int2, c_text_array, c_int4range, c_pair)
       values (4, 'Infinity', -9223372036854775808, -32768, '{"{x}","\\\\z",""," sp "}', '[5,)',
       row(-5, 'NULL', 'infinity', false, 'NaN', '(,5]', '{}'))""",
]

EXPECTED = {
    1: {
        "c_int2": 1,
        "c_int4": 2,
        "c_int8": 9007199254740993,
        "c_numeric": "12.340",
        "c_numeric_free": "0.00000000000000000001",
        "c_float4": 1.5,
        "c_float8": 2.25,
        "c_text": 'héllo "q" \\ x',
        "c_varchar": "vc",
        "c_char": "ab ",
        "c_bool": True,
        "c_date": "2024-02-29",
        "c_time": "13:14:15.5",
        "c_timestamp": "2024-01-02 03:04:05.123456",
        "c_timestamptz": "2024-01-02 01:04:05+00",
        "c_interval": "P1DT2H",
        "c_uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "c_json": '{"a": [1, 2]}',
        "c_jsonb": '{"b": null}',
        "c_bytea": "\\x00ff10",
        "c_int_array": [1, None, 3],
        "c_text_array": ["a,b", 'c"d', None, "NULL"],
        "c_int_matrix": [[1, 2], [3, 4]],
        "c_enum": "happy",
        "c_domain": 7,
        "c_amount": "1.50",
        "c_amount_array": ["2.25"],
        "c_numeric_array": ["1.50", "NaN", None],
        "c_jsonb_array": ['{"k": [1]}', "null", None],
        "c_int4range": "[1,10)",
        "c_tstzrange": '["2024-01-01 00:00:00+00","2024-02-01 00:00:00+00")',
        "c_range_array": ["[1,3)", "empty", None],
        # composites: Postgres' text (record_out), as bronze writes any type it does not map
        "c_pair": '(1,"a ""b"", (c) \\\\ d","2024-01-02 01:04:05+00",t,1.50,"[1,10)","{x,""y z""}")',
        "c_pair_array": ['(2,"",,f,,empty,)', None],
        "c_wrap": '("(3,q,,,,,)","n,1\ttab")',
    },
    2: {
        "c_numeric_free": "NaN",
        "c_float4": "NaN",
        "c_float8": "-Infinity",
        "c_timestamp": "infinity",
        "c_timestamptz": "-infinity",
        "c_date": "infinity",
        "c_json": "null",
        "c_jsonb": "null",
        "c_int_array": [],
        "c_int4range": "empty",
        "c_tstzrange": '(,"2024-01-01 00:00:00+00"]',
        "c_pair": "(,,,,,,)",
        "c_pair_array": [],
    },
    4: {
        "c_float8": "Infinity",
        "c_int8": -9223372036854775808,
        "c_int2": -32768,
        "c_text_array": ["{x}", "\\z", "", " sp "],
        "c_int4range": "[5,)",
        "c_pair": '(-5,NULL,infinity,f,NaN,"(,6)",{})',
    },
}


TYPE_NAMES = {
    "id": "bigint",
    "c_int2": "smallint",
    "c_int4": "integer",
    "c_int8": "bigint",
    "c_numeric": "numeric(12,3)",
    "c_numeric_free": "numeric",
    "c_float4": "real",
    "c_float8": "double precision",
    "c_text": "text",
    "c_varchar": "character varying(10)",
    "c_char": "character(3)",
    "c_bool": "boolean",
    "c_date": "date",
    "c_time": "time without time zone",
    "c_timestamp": "timestamp without time zone",
    "c_timestamptz": "timestamp with time zone",
    "c_interval": "interval",
    "c_uuid": "uuid",
    "c_json": "json",
    "c_jsonb": "jsonb",
    "c_bytea": "bytea",
    "c_int_array": "integer[]",
    "c_text_array": "text[]",
    "c_int_matrix": "integer[]",
    "c_enum": "mood",
    "c_domain": "integer",
    "c_amount": "numeric(12,2)",
    "c_amount_array": "amount[]",
    "c_ts_array": "timestamp with time zone[]",
    "c_numeric_array": "numeric(6,2)[]",
    "c_bool_array": "boolean[]",
    "c_uuid_array": "uuid[]",
    "c_jsonb_array": "jsonb[]",
    "c_int4range": "int4range",
    "c_tstzrange": "tstzrange",
    "c_daterange": "daterange",
    "c_numrange": "numrange",
    "c_range_array": "int4range[]",
    "c_pair": "pair",
    "c_pair_array": "pair[]",
    "c_wrap": "wrap",
}
PAIR_FIELDS = [
    ("n", "integer"),
    ("label", "text"),
    ("at", "timestamp with time zone"),
    ("ok", "boolean"),
    ("amt", "numeric(6,2)"),
    ("r", "int4range"),
    ("inner_tags", "text[]"),
]


def test_type_matrix_round_trips(warehouse: Any, make_source: Any) -> None:
    s = make_source(TYPES_SQL, ["typed"])
    prepare(s.config())
    for sql in ROWS:
        s.execute(sql)
    capture_once(warehouse, s.config())
    records = {json.loads(e.record_pk)["id"]: json.loads(e.record) for e in bronze_events(warehouse, s.name)}
    assert set(records) == {1, 2, 3, 4}
    for rid, expected in EXPECTED.items():
        got = {k: records[rid][k] for k in expected}
        assert got == expected, f"row {rid}"
    # a SQL NULL is JSON null in every column, distinct from the json value 'null' of row 2
    assert all(v is None for k, v in records[3].items() if k != "id")
    assert records[2]["c_json"] == "null" and records[3]["c_json"] is None


def test_source_relations_record_types_and_key(warehouse: Any, make_source: Any) -> None:
    s = make_source(TYPES_SQL, ["typed"])
    prepare(s.config())
    s.execute(ROWS[2])
    capture_once(warehouse, s.config())
    rel = read(warehouse / "bronze" / "source_relations", f"source = '{s.name}'")
    assert len(rel) == 1
    cols = {c.name: c for c in rel[0].columns}
    assert cols["id"].pk_position == 1 and cols["c_int2"].pk_position is None
    assert cols["c_numeric"].json_kind == "numeric" and cols["c_domain"].json_kind == "int"
    assert cols["c_int_matrix"].json_kind == "array"
    # the real type with its modifier, a domain's base type (W8: was format_type(oid, NULL), so 'numeric')
    assert {name: c.type_name.removeprefix(f"{s.schema}.") for name, c in cols.items()} == TYPE_NAMES
    assert cols["c_numeric"].type_modifier == (12 << 16 | 3) + 4
    # a composite's fields in order (an array's: its element's), one level: wrap's field p is named, not opened
    fields = {
        name: c.fields and [(f.name, f.type_name.removeprefix(f"{s.schema}.")) for f in c.fields]
        for name, c in cols.items()
    }
    assert fields["c_pair"] == fields["c_pair_array"] == PAIR_FIELDS
    assert fields["c_wrap"] == [("p", "pair"), ("note", "text")]
    assert all(f is None for name, f in fields.items() if name not in {"c_pair", "c_pair_array", "c_wrap"})
    # read back, the fields are the catalog's: the first start records the table's membership alone (a row of the
    # same shape), the second nothing (a shape read back without its fields would be recorded again at each start)
    for _ in range(2):
        capture_once(warehouse, s.config(snapshot={"initial": False}), snapshots=True)
    rows = read(warehouse / "bronze" / "source_relations", f"source = '{s.name}'")
    assert [r.shape_hash for r in rows] == [rel[0].shape_hash] * 2


@pytest.mark.usefixtures("engine")
def test_the_dbt_fixture_writes_what_ingest_writes(warehouse: Any, make_source: Any) -> None:
    """tests/helpers/bronze_fixture.py's shape of orders is the one real bronze records (W8, T7)."""
    (fixture_orders,) = [r[5] for r in bronze_fixture.relations() if r[3] == "orders" and len(r[5]) == 6]
    s = make_source(
        "create table orders (id bigint primary key, customer_id bigint, amount numeric(12, 2), "
        "status text, updated_at timestamptz, note text)",
        ["orders"],
    )
    prepare(s.config())
    s.execute("insert into orders (id) values (1)")
    capture_once(warehouse, s.config())
    (rel,) = read(warehouse / "bronze" / "source_relations", f"source = '{s.name}'")
    real = [
        (c.name, c.type_oid, c.type_name, c.type_modifier, c.is_key, c.pk_position, c.json_kind) for c in rel.columns
    ]
    # The fixture leaves attnum out, as bronze written before ingest recorded it; ingest records it now.
    assert real == [tuple(c)[:7] for c in fixture_orders]
    assert [c.attnum for c in rel.columns] == [1, 2, 3, 4, 5, 6]


# The gold struct of a built-in range whose bounds are `bound` (docs/dbt.md "Gold types").
def _range(bound: str) -> str:
    return f"struct<lower:{bound},upper:{bound},lower_inc:boolean,upper_inc:boolean,empty:boolean>"


def _bounds(lower: Any, upper: Any, lower_inc: bool, upper_inc: bool, empty: bool = False) -> dict[str, Any]:
    return {"lower": lower, "upper": upper, "lower_inc": lower_inc, "upper_inc": upper_inc, "empty": empty}


EMPTY = _bounds(None, None, False, False, True)
PAIR = "struct<n:int,label:string,at:timestamp,ok:boolean,amt:decimal(6,2),r:" + _range("int") + ",inner_tags:string>"


def _pair(n: Any, label: Any, at: Any, ok: Any, amt: Any, r: Any, inner_tags: Any) -> dict[str, Any]:
    return {"n": n, "label": label, "at": at, "ok": ok, "amt": amt, "r": r, "inner_tags": inner_tags}


# Gold (typed_current_state via the generated models) of each row of ROWS, per column: the Spark type and
# each row's value as Spark prints it (cast to string; arrays and structs as the JSON Spark writes, decoded,
# numbers with a fraction as their text); rows not listed are null. docs/dbt.md "Gold types".
GOLD: dict[str, tuple[str, dict[int, Any]]] = {
    "c_int2": ("int", {1: "1", 4: "-32768"}),
    "c_int4": ("int", {1: "2"}),
    "c_int8": ("bigint", {1: "9007199254740993", 4: "-9223372036854775808"}),
    "c_numeric": ("decimal(12,3)", {1: "12.340"}),
    "c_numeric_free": ("string", {1: "0.00000000000000000001", 2: "NaN"}),  # unbounded: exact text
    "c_float4": ("double", {1: "1.5", 2: "NaN"}),
    "c_float8": ("double", {1: "2.25", 2: "-Infinity", 4: "Infinity"}),
    "c_text": ("string", {1: 'héllo "q" \\ x'}),
    "c_varchar": ("string", {1: "vc"}),
    "c_char": ("string", {1: "ab "}),
    "c_bool": ("boolean", {1: "true"}),
    "c_date": ("date", {1: "2024-02-29"}),  # 'infinity' -> null
    "c_time": ("string", {1: "13:14:15.5"}),
    "c_timestamp": ("timestamp_ntz", {1: "2024-01-02 03:04:05.123456"}),  # 'infinity' -> null
    "c_timestamptz": ("timestamp", {1: "2024-01-02 01:04:05"}),  # UTC; '-infinity' -> null
    "c_interval": ("string", {1: "P1DT2H"}),
    "c_uuid": ("string", {1: "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}),
    "c_json": ("string", {1: '{"a": [1, 2]}', 2: "null"}),  # the json value null, not SQL NULL
    "c_jsonb": ("string", {1: '{"b": null}', 2: "null"}),
    "c_bytea": ("string", {1: "\\x00ff10"}),
    "c_int_array": ("array<int>", {1: [1, None, 3], 2: []}),
    "c_text_array": ("array<string>", {1: ["a,b", 'c"d', None, "NULL"], 4: ["{x}", "\\z", "", " sp "]}),
    "c_int_matrix": ("array<int>", {}),  # multi-dimensional: null (silver keeps [[1,2],[3,4]])
    "c_enum": ("string", {1: "happy"}),
    "c_domain": ("int", {1: "7"}),
    "c_amount": ("decimal(12,2)", {1: "1.50"}),  # a domain over numeric(12,2)
    "c_amount_array": ("array<string>", {1: ["2.25"]}),  # an array of a domain: the domain's name, a string
    "c_ts_array": ("array<timestamp>", {1: ["2024-01-02T01:04:05.000Z", None, None]}),  # infinity -> null
    "c_numeric_array": ("array<decimal(6,2)>", {1: ["1.50", None, None]}),  # NaN -> null
    "c_bool_array": ("array<boolean>", {1: [True, False, None]}),
    "c_uuid_array": ("array<string>", {1: ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]}),
    "c_jsonb_array": ("array<string>", {1: ['{"k": [1]}', "null", None]}),
    "c_int4range": ("struct", {1: _bounds(1, 10, True, False), 2: EMPTY, 4: _bounds(5, None, True, False)}),
    "c_tstzrange": (
        "struct",
        {
            1: _bounds("2024-01-01T00:00:00.000Z", "2024-02-01T00:00:00.000Z", True, False),
            2: _bounds(None, "2024-01-01T00:00:00.000Z", False, True),
        },
    ),
    "c_daterange": ("struct", {1: _bounds("2024-01-01", None, True, False)}),  # infinity: null, as unbounded
    "c_numrange": ("struct", {1: _bounds("1.5", "2.25", False, True)}),  # unbounded numeric: exact text
    "c_range_array": ("array", {1: [_bounds(1, 3, True, False), EMPTY, None]}),
    # A composite is a struct of its fields, each cast as a column of its type: quotes, commas, parentheses and a
    # backslash unescaped; an empty field is NULL, "" the empty string, NULL the text; infinity and NaN null as for
    # a column. A field that is an array or a composite is its Postgres text.
    "c_pair": (
        "struct",
        {
            1: _pair(
                1, 'a "b", (c) \\ d', "2024-01-02T01:04:05.000Z", True, "1.50", _bounds(1, 10, True, False), '{x,"y z"}'
            ),
            2: _pair(None, None, None, None, None, None, None),
            4: _pair(-5, "NULL", None, False, None, _bounds(None, 6, False, False), "{}"),
        },
    ),
    "c_pair_array": ("array", {1: [_pair(2, "", None, False, None, EMPTY, None), None], 2: []}),
    "c_wrap": ("struct", {1: {"p": "(3,q,,,,,)", "note": "n,1\ttab"}}),
}
# Range columns' full Spark types (GOLD abbreviates them).
GOLD_TYPES = {
    "c_int4range": _range("int"),
    "c_tstzrange": _range("timestamp"),
    "c_daterange": _range("date"),
    "c_numrange": _range("string"),
    "c_range_array": f"array<{_range('int')}>",
    "c_pair": PAIR,
    "c_pair_array": f"array<{PAIR}>",
    "c_wrap": "struct<p:string,note:string>",
}
# Column names that broke or injected into gold SQL before S1 was fixed, and two that differ by case only.
ODD_SQL = '''
;
create table "Odd ""table""" (
    id int primary key, "it's" text, "back`tick" text, "two words" text, "x"") as y, (select 1) as ""z" text,
    "'], 1 as pwned --" text, "{{ 7 * 7 }}" text, "A" int, "a" int, "_cl_seq" text
);
comment on table typed is 'Every type of the matrix {{ oops }}';
comment on column typed.c_numeric is 'An exact amount';
'''
ODD_ROW = '''insert into "Odd ""table""" values (1, 'q''s', 'b`t', 'w w', 'sql', 'inj', 'braces', 1, 2, 'mine')'''
ODD_GOLD = {
    "id": "1",
    "it's": "q's",
    "back`tick": "b`t",
    "two words": "w w",
    'x") as y, (select 1) as "z': "sql",
    "'], 1 as pwned --": "inj",
    "{{ 7 * 7 }}": "braces",
    "A": "1",
    "a__2": "2",
    "_cl_seq__2": "mine",
}


def _spark_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _gold_value(column: str, complex_type: bool) -> str:
    """A gold column's value as a string: cast, or for an array or struct the JSON of {"v": value} (nulls kept)."""
    c = f"`{column.replace('`', '``')}`"
    if complex_type:
        return f"if({c} is null, null, to_json(named_struct('v', {c}), map('ignoreNullFields', 'false')))"
    return f"cast({c} as string)"


def _gold_rows(
    warehouse: Path, project: Path, models: dict[str, list[str]], complex_columns: frozenset[str] = frozenset()
) -> dict[str, list[dict[str, Any]]]:
    """Every row of each gold model: {column: [Spark type, value as a string]} (one dbt show for all).

    `complex_columns` (arrays, structs) come as the JSON of {"v": value} (_gold_value).
    """
    selects = []
    for model, columns in models.items():
        pairs = ", ".join(
            f"{_spark_str(c)}, array(typeof(`{c.replace('`', '``')}`), {_gold_value(c, c in complex_columns)})"
            for c in columns
        )
        selects.append(
            "select '" + model + "' as model, to_json(map({% raw %}" + pairs + "{% endraw %})) as row_json "
            "from {{ ref('" + model + "') }}"
        )
    query = " union all ".join(selects)
    out = dbt(
        warehouse,
        "show",
        "--inline",
        query,
        "--limit",
        "100",
        "--output",
        "json",
        "--log-format",
        "json",
        project=project,
    )
    for line in out.splitlines():
        data = json.loads(line).get("data", {})
        if "preview" in data:
            rows: dict[str, list[dict[str, Any]]] = {m: [] for m in models}
            for r in json.loads(data["preview"]):
                rows[r["model"]].append(json.loads(r["row_json"]))
            return rows
    raise AssertionError(f"no dbt show output in:\n{out[-3000:]}")


@pytest.mark.usefixtures("engine")
def test_gold_is_typed_and_quoted_for_every_column(
    warehouse: Path, make_source: Any, tmp_path: Path, capsys: Any
) -> None:
    """The types matrix and columns named with quotes, backticks, spaces and SQL, through ingest ->
    silver -> `changelake-ingest gold generate` -> gold views (W8, S1; docs/dbt.md "Generated gold")."""
    s = make_source(TYPES_SQL + ODD_SQL, ["typed", 'Odd "table"'])
    prepare(s.config())
    for sql in [*ROWS, ODD_ROW]:
        s.execute(sql)
    capture_once(warehouse, s.config())
    project = tmp_path / "project"  # a copy of the dbt project: the generated models stay out of the tree
    for part in ("models", "macros", "tests/dbt"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("generated"))
    shutil.copy(ROOT / "dbt_project.yml", project)
    dbt(warehouse, "run", "--select", "silver", project=project)

    out = project / "models" / "gold" / "generated"
    config = tmp_path / "changelake.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [s.config().model_dump()]}))
    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    typed, odd = f"{s.name}__{s.schema}__typed", model_name(s.name, s.schema, 'Odd "table"')
    assert f"{typed}: new model, 41 columns" in printed and f"{odd}: new model, 10 columns" in printed, printed
    typed_yml = yaml.safe_load((out / f"{typed}.yml").read_text())["models"][0]
    assert typed_yml["description"] == "Every type of the matrix ({ oops }}"  # the source's comment, made inert
    docs = {c["name"]: c for c in typed_yml["columns"]}
    assert docs["c_numeric"]["description"] == "An exact amount (numeric(12,3) as decimal(12,3))"
    assert docs["id"]["data_tests"] == ["not_null", "unique"]
    assert docs["_cl_record_pk"]["data_tests"] == ["unique", "not_null"]
    assert docs["c_int_array"]["data_type"] == "array<int>"
    assert "(integer[] as array<int>; a multi-dimensional value is null here" in docs["c_int_array"]["description"]
    assert docs["c_int4range"]["data_type"] == GOLD_TYPES["c_int4range"]
    assert docs["c_pair"]["data_type"] == GOLD_TYPES["c_pair"]
    assert (
        "a composite: a field that is itself a composite or an array is its Postgres text"
        in docs["c_wrap"]["description"]
    )
    dbt(warehouse, "build", "--select", "path:models/gold/generated", project=project)  # with the yml's tests

    types = {c: GOLD_TYPES.get(c, t) for c, (t, _) in GOLD.items()}
    complex_columns = frozenset(c for c, t in types.items() if t.startswith(("array<", "struct<")))
    gold = _gold_rows(warehouse, project, {typed: ["id", *GOLD], odd: list(ODD_GOLD)}, complex_columns)
    got = {int(r["id"][1]): r for r in gold[typed]}
    assert set(got) == {1, 2, 3, 4}
    for column, (_, values) in GOLD.items():
        for rid, row in got.items():
            spark_type, value = row[column]
            if column in complex_columns and value is not None:
                value = json.loads(value, parse_float=str)["v"]
            assert [spark_type, value] == [types[column], values.get(rid)], f"{column}, row {rid}"
    (odd_row,) = gold[odd]
    assert {c: v[1] for c, v in odd_row.items()} == ODD_GOLD


def test_a_shape_recorded_before_w8_is_recorded_again_with_its_modifier(warehouse: Path, make_source: Any) -> None:
    """Bronze written before the W8 fix says `numeric`: the next start records the table's shape again
    as the catalog names it (table_columns, latest by first_seen_lsn, then types it decimal(12,3)); so
    for bronze written before composites' fields were recorded."""
    s = make_source(TYPES_SQL, ["typed"])
    prepare(s.config())
    s.execute(ROWS[2])
    capture_once(warehouse, s.config())
    path = str(warehouse / "bronze" / "source_relations")
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    for r in rows:  # what ingest wrote before the fix: format_type(oid, NULL); no fields
        r["columns"] = [
            {**c, "fields": None, **({"type_name": "numeric"} if c["name"] == "c_numeric" else {})}
            for c in r["columns"]
        ]
    write_deltalake(path, pa.Table.from_pylist(rows, SOURCE_RELATIONS), mode="overwrite", partition_by=["source"])
    capture_once(warehouse, s.config(snapshot={"initial": False}), snapshots=True)  # a start, as `run` does it
    rel = sorted(
        read(warehouse / "bronze" / "source_relations", f"source = '{s.name}'"), key=lambda r: r.first_seen_lsn
    )
    assert [{c.name: c.type_name for c in r.columns}["c_numeric"] for r in rel] == ["numeric", "numeric(12,3)"]
    assert [len({c.name: c.fields for c in r.columns}["c_pair"] or []) for r in rel] == [0, len(PAIR_FIELDS)]
