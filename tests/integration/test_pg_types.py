"""Every common Postgres type round-trips into `record` JSON per docs/bronze.md's mapping."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

TYPES_SQL = """
create type mood as enum ('sad', 'ok', 'happy');
create domain posint as integer check (value > 0);
create table typed (
    id bigint primary key,
    c_int2 int2, c_int4 int4, c_int8 int8,
    c_numeric numeric(12, 3), c_numeric_free numeric,
    c_float4 float4, c_float8 float8,
    c_text text, c_varchar varchar(10), c_char char(3),
    c_bool bool, c_date date, c_time time, c_timestamp timestamp, c_timestamptz timestamptz,
    c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb, c_bytea bytea,
    c_int_array int[], c_text_array text[], c_int_matrix int[][],
    c_enum mood, c_domain posint
)
"""

ROWS = [
    # id 1: ordinary values
    """insert into typed values (1, 1, 2, 9007199254740993, 12.340, 1e-20, 1.5, 2.25, 'héllo "q" \\ x',
       'vc', 'ab', true, '2024-02-29', '13:14:15.5', '2024-01-02 03:04:05.123456',
       '2024-01-02 03:04:05+02', '1 day 2 hours', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
       '{"a": [1, 2]}', '{"b": null}', '\\x00ff10', '{1,NULL,3}', '{"a,b","c\\"d",NULL,"NULL"}',
       '{{1,2},{3,4}}', 'happy', 7)""",
    # id 2: special values
    """insert into typed (id, c_numeric_free, c_float4, c_float8, c_timestamp, c_timestamptz, c_date, c_json, c_jsonb)
       values (2, 'NaN', 'NaN', '-Infinity', 'infinity', '-infinity', 'infinity', 'null', 'null')""",
    # id 3: all NULL
    "insert into typed (id) values (3)",
    # id 4: float infinity and extremes
    "insert into typed (id, c_float8, c_int8, c_int2) values (4, 'Infinity', -9223372036854775808, -32768)",
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
    },
    4: {"c_float8": "Infinity", "c_int8": -9223372036854775808, "c_int2": -32768},
}


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
    assert cols["c_numeric"].type_name == "numeric" and cols["c_numeric"].json_kind == "numeric"
    assert cols["c_domain"].json_kind == "int"
    assert cols["c_int_matrix"].json_kind == "array"
    assert cols["c_timestamptz"].type_name == "timestamp with time zone"
