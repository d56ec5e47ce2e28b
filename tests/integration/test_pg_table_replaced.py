"""A configured table replaced under its name (drop/recreate, create-fill-drop-rename) on a real server.

The new table is another relation (another OID) that was never in the publication: bronze must
end the old table's records where the replacement is met and bring the new table's rows in by a
snapshot, or silver keeps the old rows and never gets the new ones.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.bronze_fold import live_records, table_rows
from tests.helpers.capture_thread import ContinuousCapture
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


def assert_bronze_matches_source(warehouse: Path, s: Any, table: str = "rt") -> None:
    qualified = f"{s.schema}.{table}"
    assert live_records(warehouse, s.name).get(qualified, {}) == table_rows(s.conn, qualified)


def swap_in_new_table(s: Any) -> None:
    """The migration pattern: build the new table beside the old one, then swap the names in one transaction."""
    s.execute("create table rt_new (id int primary key, v text)")
    s.execute("insert into rt_new values (10, 'x'), (11, 'y')")
    with s.conn.transaction():
        s.execute("drop table rt")
        s.execute("alter table rt_new rename to rt")


def drop_and_recreate(s: Any) -> None:
    s.execute("drop table rt")
    s.execute("create table rt (id int primary key, v text)")
    s.execute("insert into rt values (10, 'x'), (11, 'y')")


@pytest.mark.parametrize("replace", [swap_in_new_table, drop_and_recreate], ids=["swap-rename", "drop-recreate"])
def test_a_table_replaced_between_runs_is_tombstoned_and_snapshotted(
    warehouse: Path, make_source: Any, replace: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The replaced table was re-added to the publication silently and never snapshotted (its name had one).

    Silver kept the old table's rows 1-3 and got only the rows changed after the restart (13).
    """
    s = make_source("create table rt (id int primary key, v text)", ["rt"])
    src = s.config()
    prepare(src)
    s.execute("insert into rt values (1, 'a'), (2, 'b'), (3, 'c')")
    capture_once(warehouse, src, snapshots=True)
    assert_bronze_matches_source(warehouse, s)
    replace(s)
    s.execute("insert into rt values (12, 'z')")  # not published: the new table is not in the publication yet
    with caplog.at_level(logging.WARNING, logger="ingest.sources.postgres.capture"):
        capture_once(warehouse, src, snapshots=True)
    assert_bronze_matches_source(warehouse, s)
    assert f"table {s.schema}.rt was replaced" in caplog.text
    s.execute("insert into rt values (13, 'w')")
    capture_once(warehouse, src, snapshots=True)
    assert_bronze_matches_source(warehouse, s)
    capture_once(warehouse, src, snapshots=True)  # the replacement is recorded: no second tombstone
    truncates = [e for e in bronze_events(warehouse, s.name) if e.action == "truncate"]
    assert [e.truncated_tables for e in truncates] == [[f"{s.schema}.rt"]]


@pytest.mark.parametrize("replace", [swap_in_new_table, drop_and_recreate], ids=["swap-rename", "drop-recreate"])
def test_a_table_replaced_during_a_continuous_run_is_found_and_snapshotted(
    warehouse: Path, make_source: Any, replace: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A continuous run never noticed: the new table is not in the publication, so nothing of it was sent."""
    monkeypatch.setattr("ingest.sources.postgres.capture.SHAPE_CHECK_INTERVAL_S", 1.0)
    monkeypatch.setattr("ingest.sources.postgres.snapshot.REQUEST_POLL_S", 0.5)
    s = make_source("create table rt (id int primary key, v text); create table other (id int primary key)", ["rt"])
    src = s.config()
    prepare(src)
    s.execute("insert into rt values (1, 'a'), (2, 'b'), (3, 'c')")
    with ContinuousCapture(warehouse, src) as run:
        run.wait_for(lambda: rt_matches(warehouse, s), 60, "the initial state of rt in bronze")
        replace(s)
        s.execute("insert into rt values (12, 'z')")
        run.wait_for(lambda: rt_matches(warehouse, s), 60, "the new rt in bronze")
        s.execute("insert into rt values (13, 'w'); update rt set v = 'x2' where id = 10")  # published now
        run.wait_for(lambda: rt_matches(warehouse, s), 60, "the change after the replacement in bronze")


def rt_matches(warehouse: Path, s: Any) -> bool:
    return live_records(warehouse, s.name).get(f"{s.schema}.rt") == table_rows(s.conn, f"{s.schema}.rt")
