"""One change log per run (model record_changes), folded by both consumer_records and record_history.

The folds read the batch only when it was computed in the same invocation for their incremental
run; a full build, a run that did not select record_changes, or a fold behind the other derives its
changes itself or keeps the batch rows above its own position. Each case is checked against the
source and against the other fold.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.pg import capture_once, prepare
from tests.helpers.silver import dbt, silver, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

TABLES = """
create table items (id int primary key, n int);
create table tags (id int primary key, label text);
"""
KEYS = {"items": ["id"], "tags": ["id"]}
# What dbt prints for snapshot_rows_placed when no page became usable (macro changelake_request_skip).
NO_PAGE = "skipped: no snapshot page became usable"


def compiled(warehouse: Path, model: str) -> str:
    models = warehouse.parent / "dbt-target" / "compiled" / "changelake" / "models" / "silver"
    return (models / f"{model}.sql").read_text()


def reads_batch(warehouse: Path, model: str) -> bool:
    """Whether the last compiled `model` folded the change batch rather than sequin_events."""
    text = compiled(warehouse, model)
    batch = "from silver.record_changes as change_batch" in text
    assert batch != ("from silver.sequin_events" in text), text
    return batch


def check_silver(warehouse: Path, s: Any) -> None:
    """consumer_records is the source; record_history's open versions are consumer_records' live
    rows, one per key, and no version is stored twice."""
    records = [r for r in silver(warehouse, "consumer_records") if r.source == s.name]
    for table, pk in KEYS.items():
        live = {r.record_pk: json.loads(r.record) for r in records if r.table_name == table and not r.deleted}
        assert live == source_rows(s, table, pk), f"{table} differs"
    history = [r for r in silver(warehouse, "record_history") if r.source == s.name]
    versions = Counter((r.table_name, r.record_pk, r.valid_from_lsn, r.valid_from_index) for r in history)
    assert [v for v, n in versions.items() if n > 1] == []
    current = {(r.table_name, r.record_pk): r.record for r in history if r.is_current}
    assert current == {(r.table_name, r.record_pk): r.record for r in records if not r.deleted}


def test_both_folds_read_one_batch_and_a_lagging_fold_catches_up(warehouse: Path, make_source: Any) -> None:
    s = make_source(TABLES, list(KEYS))
    prepare(s.config())
    s.execute("insert into items select g, 0 from generate_series(1, 6) g")
    s.execute("insert into tags values (1, 'a'), (2, 'b')")
    capture_once(warehouse, s.config(snapshot={"initial": False}))
    # A second source, snapshotted once and idle afterwards: its pages are placed by the first run,
    # and no later run finds a page that became usable (snapshot_rows_placed runs no statement).
    notes = make_source("create table notes (id int primary key, body text)", ["notes"])
    notes.execute("insert into notes select g, 'n' || g from generate_series(1, 5) g")
    prepare(notes.config())
    capture_once(warehouse, notes.config(), snapshots=True)
    out = dbt(warehouse, "run", "--select", "silver")
    assert NO_PAGE not in out, out
    placed = [r for r in silver(warehouse, "snapshot_rows_placed") if r.source == notes.name]
    assert len([r for r in placed if r.record is not None]) == 5  # and the snapshot's completion row
    note_records = {
        r.record_pk: json.loads(r.record) for r in silver(warehouse, "consumer_records") if r.source == notes.name
    }
    assert note_records == source_rows(notes, "notes", ["id"])
    # The first build of each fold reads sequin_events itself; the batch was computed for no fold.
    assert not reads_batch(warehouse, "consumer_records") and not reads_batch(warehouse, "record_history")
    assert silver(warehouse, "record_changes") == []
    check_silver(warehouse, s)

    # A run without record_changes: the batch left from the last invocation is not read (it may
    # lack what is new); consumer_records derives its changes itself. record_history is left out
    # too, so it lags behind consumer_records.
    s.execute("update items set n = 1 where id <= 2")
    s.execute("update items set id = 60 where id = 6")
    s.execute("delete from items where id = 5")
    s.execute("truncate tags")
    s.execute("insert into tags values (3, 'c')")
    capture_once(warehouse, s.config(snapshot={"initial": False}))
    out = dbt(warehouse, "run", "--select", "silver", "--exclude", "record_history", "record_changes")
    assert NO_PAGE in out, out
    assert not reads_batch(warehouse, "consumer_records")
    # With a loader (a model skipped when nothing is new)
    # left out, nothing is marked loaded; marking this batch loaded made every later run skip it
    # for record_history, and it never reached the history. The next full run loads it (below).
    assert silver(warehouse, "loaded_bounds") == []
    records = [r for r in silver(warehouse, "consumer_records") if r.source == s.name]
    for table, pk in KEYS.items():
        live = {r.record_pk: json.loads(r.record) for r in records if r.table_name == table and not r.deleted}
        assert live == source_rows(s, table, pk), f"{table} differs"

    # Both folds read one batch, computed from the lower of their positions: it holds what
    # record_history has not folded (the round above) and what is new; consumer_records keeps
    # only the rows above its own position (folding them twice would store a closed version twice
    # in record_history, or tombstone again: check_silver looks). A key change is a delete of the
    # old key and an upsert of the new one; a truncate is one row per table, expanded by each fold.
    s.execute("update items set n = 2 where id = 1")
    s.execute("insert into tags values (4, 'd')")
    capture_once(warehouse, s.config(snapshot={"initial": False}))
    out = dbt(warehouse, "run", "--select", "silver")
    assert NO_PAGE in out, out
    assert reads_batch(warehouse, "consumer_records") and reads_batch(warehouse, "record_history")
    batch = [r for r in silver(warehouse, "record_changes") if r.source == s.name]
    kinds = Counter((r.table_name, r.change_kind) for r in batch)
    assert kinds == {
        ("items", "upsert"): 4,  # ids 1 and 2, the new key 60, then id 1 again
        ("items", "delete"): 2,  # the old key 6, and 5
        ("tags", "truncate"): 1,
        ("tags", "upsert"): 2,
    }, kinds
    assert {r.record_pk for r in batch if r.change_kind == "delete"} == {'{"id":6}', '{"id":5}'}
    check_silver(warehouse, s)
    history = [r for r in silver(warehouse, "record_history") if r.source == s.name]
    item_1 = [r for r in history if r.table_name == "items" and r.record_pk == '{"id":1}']
    assert sorted(json.loads(r.record)["n"] for r in item_1) == [0, 1, 2]
    ended = sorted(r.record_pk for r in history if r.table_name == "tags" and r.ended_by == "truncate")
    assert ended == ['{"id":1}', '{"id":2}']
