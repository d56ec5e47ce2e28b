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
    Row,
    Rows,
    Status,
    TableResult,
    compare,
    differing_columns,
    exit_code,
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
    assert differing_columns('{"a":1.0}', '{"a":1}') == []


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
