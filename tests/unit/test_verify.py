"""verify's comparison (ranges, bisection, skips), xid placement, exit codes and refusals (docs/verify.md).

The end-to-end behaviour against PostgreSQL, ingest and dbt is tests/integration/test_verify.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest import cli
from ingest.sources.postgres.verify import xid_visible
from ingest.verify import (
    EXIT_EQUAL,
    EXIT_MISMATCH,
    EXIT_NOT_VERIFIED,
    ColumnOrder,
    Row,
    Rows,
    Status,
    TableResult,
    compare,
    differing_columns,
    exit_code,
    in_column_order,
)


def rows(records: dict[int, str] | dict[int, str | None], batch: int = 7) -> Rows:
    items = [(f'{{"id":{k}}}', v) for k, v in sorted(records.items())]

    def scan() -> Iterator[list[Row]]:
        for i in range(0, len(items), batch):
            yield items[i : i + batch]

    return scan


def table(n: int) -> dict[int, str]:
    return {i: f'{{"id":{i},"v":"x{i}"}}' for i in range(n)}


def test_equal_sides_are_equal_in_one_pass_each() -> None:
    r = compare(TableResult("s", "a.t"), rows(table(95)), rows(table(95)), 95, set(), range_rows=10)
    assert (r.status, r.ranges, r.mismatched_ranges, r.source_rows, r.silver_rows) == (Status.EQUAL, 10, 0, 95, 95)


def test_mismatches_are_bisected_to_exactly_the_keys() -> None:
    src, sil = table(500), table(500)
    del sil[7]  # missing in silver
    sil[900] = '{"id":900,"v":"zombie"}'  # extra: resurrected in silver
    sil[42] = '{"id":42,"v":"other"}'  # different values
    sil[43] = '{"v": "x43", "id": 43}'  # the same values spelt otherwise: equal
    r = compare(TableResult("s", "a.t"), rows(src), rows(sil), 500, set(), range_rows=50)
    assert r.status is Status.MISMATCH
    assert (r.missing_keys, r.extra_keys, r.different_keys) == (['{"id":7}'], ['{"id":900}'], [('{"id":42}', ["v"])])
    assert 1 <= r.mismatched_ranges <= 4 and r.unresolved_ranges == 0  # keys may share a range


def test_skipped_keys_are_left_out_on_both_sides() -> None:
    src, sil = table(100), table(100)
    sil[5] = '{"id":5,"v":"newer"}'
    del sil[6]
    r = compare(TableResult("s", "a.t"), rows(src), rows(sil), 100, {'{"id":5}', '{"id":6}'}, range_rows=10)
    assert r.status is Status.EQUAL and r.mismatched_ranges == 0


def test_bisection_holds_at_most_bisect_rows_and_counts_the_rest_unresolved() -> None:
    src, sil = table(1000), table(1000)
    for i in range(0, 1000, 3):
        sil[i] = '{"changed":true}'
    r = compare(TableResult("s", "a.t"), rows(src), rows(sil), 1000, set(), range_rows=100, bisect_rows=250)
    assert r.status is Status.MISMATCH and r.mismatched_ranges == 10
    assert r.unresolved_ranges == 8  # two ranges of ~100 rows fit in 250
    assert 0 < r.different < 334


def test_max_keys_caps_the_lists_not_the_counts() -> None:
    src = table(50)
    r = compare(TableResult("s", "a.t"), rows(src), rows({}), 50, set(), range_rows=10, max_keys=3)
    assert r.missing == 50 and len(r.missing_keys) == 3


def test_differing_columns_include_columns_present_on_one_side() -> None:
    assert differing_columns('{"a":1,"b":2}', '{"a":1,"c":2}') == ["b", "c"]
    assert differing_columns('{"a":null}', "{}") == ["a"]


def test_differing_columns_compare_types_and_exact_numbers() -> None:
    """verify said "equal" for `true` against `1`: Python's True == 1 (and False == 0) made them one value.

    A JSON number has one type: the same value spelt otherwise (5 and 5.0, 1e2 and 100, as Spark
    re-spells a value it carried through a variant) is equal, compared exactly (as floats two
    different 20-digit numerics were one value). A boolean, a string or null is never a number.
    """
    assert differing_columns('{"flag":true,"n":5}', '{"flag":1,"n":5.0}') == ["flag"]
    assert differing_columns('{"flag":false}', '{"flag":0}') == ["flag"]
    assert differing_columns('{"n":5}', '{"n":"5"}') == ["n"]
    assert differing_columns('{"n":0}', '{"n":null}') == ["n"]
    assert differing_columns('{"j":{"a":[true,2]}}', '{"j":{"a":[1,2]}}') == ["j"]
    assert differing_columns('{"n":12345678901234567890.1}', '{"n":12345678901234567890.2}') == ["n"]
    assert differing_columns('{"a":1.0,"n":1e2,"j":{"x":1,"y":[2]}}', '{"n":100,"a":1,"j":{"y":[2.0],"x":1}}') == []


def test_a_boolean_silver_value_stored_as_a_number_is_a_mismatch() -> None:
    """The checksum saw `{"flag":1}` against `{"flag":true}`, and the bisection overruled it as spelling."""
    src, sil = table(30), table(30)
    src[1], sil[1] = '{"id":1,"flag":true,"n":5}', '{"id":1,"flag":1,"n":5.0}'
    r = compare(TableResult("s", "a.t"), rows(src), rows(sil), 30, set(), range_rows=10)
    assert r.status is Status.MISMATCH and r.different_keys == [('{"id":1}', ["flag"])]


def test_a_mismatching_range_that_bisects_to_no_key_is_never_equal() -> None:
    """A range whose checksums differ but whose bisection named no key was reported equal.

    Here silver holds one key twice (two live rows): the counts differ, the bisection's per-key
    view sees one record, equal to the source's.
    """
    src = table(30)
    items = [(f'{{"id":{k}}}', v) for k, v in sorted(src.items())]
    doubled = [*items, items[4]]
    r = compare(TableResult("s", "a.t"), rows(src), lambda: iter([doubled]), 30, set(), range_rows=10)
    assert r.status is Status.MISMATCH and r.mismatched_ranges == 1 and r.unresolved_ranges == 1
    assert "no key" in (r.reason or "") and "no key" in r.line(str)


def test_silver_records_in_another_key_order_checksum_equal() -> None:
    """Silver moves a carried-forward TOAST value's key to the end of its record.

    Every range of such a table mismatched on its checksum and was read twice to bisect (and past
    the bisection budget reported as a mismatch naming no key). Re-encoded in the table's column
    order, silver's records hash as the source's.
    """
    src = {i: f'{{"id":{i},"big":"{"x" * i}","v":"x{i}"}}' for i in range(40)}
    sil = {i: f'{{"id":{i},"v":"x{i}","big":"{"x" * i}"}}' for i in range(40)}
    sil[7] = '{"id":7,"v":"x7", "big" : "xxxxxxx"}'  # whitespace too
    ordered = in_column_order(rows(sil), ["id", "big", "v"])
    r = compare(TableResult("s", "a.t"), rows(src), ordered, 40, set(), range_rows=10, bisect_rows=5)
    assert (r.status, r.mismatched_ranges, r.unresolved_ranges) == (Status.EQUAL, 0, 0), r
    # Only the order is changed: a different value still differs, an unknown key stays.
    odd = {**sil, 3: '{"id":3,"v":"changed","big":"xxx"}', 4: '{"extra":1,"id":4,"v":"x4","big":"xxxx"}'}
    r = compare(TableResult("s", "a.t"), rows(src), in_column_order(rows(odd), ["id", "big", "v"]), 40, set())
    assert r.different_keys == [('{"id":3}', ["v"]), ('{"id":4}', ["extra"])] and r.mismatched_ranges == 1


def test_column_order_leaves_what_it_cannot_parse_alone() -> None:
    order = ColumnOrder(["id", "big", "v"])
    assert order.apply('{"id":1,"big":"a","v":"b"}') == '{"id":1,"big":"a","v":"b"}'
    assert order.apply('{"v":{"big":[1,"}"]},"id":1}') == '{"id":1,"v":{"big":[1,"}"]}}'
    assert order.apply('{"v":1,"id":') == '{"v":1,"id":'  # not JSON: compared as it is
    assert order.apply("[1]") == "[1]"


def test_a_null_silver_record_differs_in_every_column() -> None:
    """A MongoDB update looked up after its document's delete leaves a live NULL record until the delete is folded.

    The bisection compared it with json.loads(None) and failed with a TypeError.
    """
    sil: dict[int, str | None] = {**table(20), 3: None}
    r = compare(TableResult("s", "a.t"), rows(table(20)), rows(sil), 20, set(), range_rows=10)
    assert r.status is Status.MISMATCH and r.different_keys == [('{"id":3}', ["id", "v"])]


def test_xid_visibility_widens_pgoutput_32_bit_xids() -> None:
    epoch = 3 << 32
    xmin, xmax, xip = epoch + 100, epoch + 110, frozenset({epoch + 105})
    assert xid_visible(99, xmin, xmax, xip)
    assert xid_visible(104, xmin, xmax, xip)
    assert not xid_visible(105, xmin, xmax, xip)  # in progress when the snapshot was taken
    assert not xid_visible(110, xmin, xmax, xip)  # began after it
    # across a 32-bit wrap: xmax just past it, the xid just before it
    wrap = 4 << 32
    assert xid_visible((1 << 32) - 5, wrap - 2, wrap + 3, frozenset())
    assert not xid_visible(4, wrap - 2, wrap + 3, frozenset())


def test_exit_codes_mismatch_over_not_verified_over_equal() -> None:
    equal, bad, unknown = TableResult("s", "a.t"), TableResult("s", "a.u"), TableResult("s", "a.v")
    bad.status = Status.MISMATCH
    unknown.not_verified("silver behind")
    assert exit_code([equal]) == EXIT_EQUAL == 0
    assert exit_code([equal, unknown]) == EXIT_NOT_VERIFIED
    assert exit_code([unknown, bad, equal]) == EXIT_MISMATCH
    # no clash with status --json (3, 4, 5) or every command's (1, 2, 75)
    assert {EXIT_MISMATCH, EXIT_NOT_VERIFIED}.isdisjoint({1, 2, 3, 4, 5, 75})


MONGO = """
warehouse: {wh}
sources:
  - name: docs
    kind: mongodb
    uri: mongodb://127.0.0.1:1
    database: app
"""
BOTH = (
    MONGO
    + """
  - name: shop
    kind: postgres
    dsn: postgresql://nobody@127.0.0.1:1/x
    tables: [public.orders]
"""
)


def test_a_mongodb_source_is_verified_by_collection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(MONGO.format(wh=tmp_path / "wh"))
    # A collection of another database is no table of the source: a config error naming .collections.
    assert cli.main(["-c", str(cfg), "verify", "other.things"]) == cli.EXIT_USER_ERROR
    assert "sources.<n>.tables, or .collections" in capsys.readouterr().err
    # One of its own goes to the MongoDB verify, which says why it cannot compare yet (exit 7).
    assert cli.main(["-c", str(cfg), "verify", "app.things", "--json"]) == EXIT_NOT_VERIFIED
    doc = json.loads(capsys.readouterr().out)
    (table,) = doc["tables"]
    assert (table["source"], table["table"], table["status"]) == ("docs", "app.things", "not_verified")
    assert "bronze does not exist yet" in table["reason"] and table["attempts"] == 1


def test_each_source_verifies_its_own_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(BOTH.format(wh=tmp_path / "wh"))
    # Named tables go to the source that captures them, each through its adapter (no server is
    # reached: bronze does not exist yet).
    assert cli.main(["-c", str(cfg), "verify", "app.things", "public.orders", "--json"]) == EXIT_NOT_VERIFIED
    doc = json.loads(capsys.readouterr().out)
    assert [(t["source"], t["table"], t["status"]) for t in doc["tables"]] == [
        ("docs", "app.things", "not_verified"),
        ("shop", "public.orders", "not_verified"),
    ]


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(MONGO.format(wh=tmp_path / "wh"))
    assert cli.main(["-c", str(cfg), "verify", "--range-rows", "0"]) == cli.EXIT_USER_ERROR
    assert "--range-rows must be at least 1" in capsys.readouterr().err
