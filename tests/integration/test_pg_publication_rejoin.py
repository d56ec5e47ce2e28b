"""A table dropped from the publication and added back, on a real server (membership.py).

pgoutput decodes each change with the catalog as of that change, so the table's changes while it
was out are never sent, and nothing in the stream says so: silver silently missed them. Each
pg_publication_rel row has its own oid and a table added back gets a new one, so ingest records
the rows that make each table a member (bronze.source_relations.publication_membership) and, when
they are not the recorded ones, re-snapshots the table: its pages place the rows that changed, and
silver's absent rule tombstones the keys deleted meanwhile (not folded here: that is dbt's, tested
by test_pg_resnapshot_deletes; here the whole-table snapshot is checked to have no page row of them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ingest.errors import SourceError
from ingest.sources.postgres.published import COLUMN_LISTS_VERSION
from tests.helpers.bronze_fold import live_records, table_rows
from tests.helpers.capture_thread import ContinuousCapture
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

TABLES = "create table items (id int primary key, v text); create table other (id int primary key)"
MEMBERSHIP_LOG = "ingest.sources.postgres.membership"


def whole_table_snapshots(warehouse: Path, source: str, table: str = "items") -> dict[str, list[Any]]:
    """Each whole-table snapshot of `table` (by table_snapshot id) -> its page rows; only complete ones."""
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}' and table_name = '{table}'")
    by_id: dict[str, list[Any]] = {}
    for p in pages:
        if p.table_snapshot is not None:
            by_id.setdefault(p.table_snapshot["id"], []).append(p)
    return {i: rows for i, rows in by_id.items() if any(r.last_page for r in rows)}


def membership_warnings(caplog: pytest.LogCaptureFixture) -> str:
    """What membership.py warned of (other warnings, such as PostgreSQL 17's failover slot one, left out)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name == MEMBERSHIP_LOG)


def upserts_match(warehouse: Path, s: Any) -> bool:
    """Every row the source has is in bronze as the source has it (deleted keys are silver's absent rule's)."""
    qualified = f"{s.schema}.items"
    live = live_records(warehouse, s.name).get(qualified, {})
    return all(live.get(pk) == row for pk, row in table_rows(s.conn, qualified).items())


def lost_changes_in_bronze(warehouse: Path, s: Any) -> list[Any]:
    """The events of lose_changes' changes bronze holds (none: they were never sent)."""
    lost = {("delete", '{"id":1}'), ("update", '{"id":2}'), ("insert", '{"id":100}')}
    return [e for e in bronze_events(warehouse, s.name) if (e.action, e.record_pk) in lost]


def lose_changes(s: Any, publication: str) -> None:
    """Take items out of the publication, change rows, put it back: none of these changes is sent."""
    s.execute(f"alter publication {publication} drop table {s.schema}.items")
    s.execute("delete from items where id = 1")
    s.execute("update items set v = 'lost update' where id = 2")
    s.execute("insert into items values (100, 'lost insert')")
    s.execute(f"alter publication {publication} add table {s.schema}.items")


@pytest.mark.parametrize("managed", [True, False], ids=["managed-publication", "users-publication"])
def test_a_table_that_left_the_publication_and_came_back_is_re_snapshotted(
    warehouse: Path, make_source: Any, managed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The changes made while the table was out of the publication never reached bronze, and no run noticed."""
    s = make_source(TABLES, ["items", "other"])
    src = s.config(create_publication=managed)
    if not managed:
        s.execute(f"create publication {src.publication_name} for table items, other")
    prepare(src)
    s.execute("insert into items select g, 'v' || g from generate_series(1, 5) g")
    capture_once(warehouse, src, snapshots=True)
    assert upserts_match(warehouse, s)
    assert len(whole_table_snapshots(warehouse, s.name)) == 1

    lose_changes(s, src.publication_name)
    rejoined_at = s.current_wal()
    s.execute("insert into items values (101, 'streamed'); update items set v = 'streamed' where id = 3")
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG):
        capture_once(warehouse, src, snapshots=True)
    assert f"table {s.schema}.items was out of publication {src.publication_name}" in membership_warnings(caplog)
    assert ".other" not in membership_warnings(caplog)
    assert lost_changes_in_bronze(warehouse, s) == [], "the changes were lost, as the test means them to be"
    assert upserts_match(warehouse, s)
    snapshots = whole_table_snapshots(warehouse, s.name)
    assert len(snapshots) == 2, "the initial snapshot and the re-snapshot after the rejoin"
    (again,) = [rows for rows in snapshots.values() if min(r.high_watermark_lsn for r in rows) > rejoined_at]
    read_keys = {r.record_pk for r in again if r.record_pk is not None}
    assert read_keys == set(table_rows(s.conn, f"{s.schema}.items"))
    assert '{"id":1}' not in read_keys  # silver's absent rule tombstones it (docs/snapshots.md)

    # Recorded: the next run takes no snapshot, and neither does one after more changes.
    s.execute("update items set v = 'later' where id = 4")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG):
        capture_once(warehouse, src, snapshots=True)
        capture_once(warehouse, src, snapshots=True)
    assert membership_warnings(caplog) == ""
    assert len(whole_table_snapshots(warehouse, s.name)) == 2
    assert upserts_match(warehouse, s)


def test_a_named_table_a_users_publication_dropped_is_refused_and_re_snapshotted_once_back(
    warehouse: Path, make_source: Any
) -> None:
    """Out of a user's publication (not back yet), the named table's changes are not sent: say so, and how to fix it."""
    s = make_source(TABLES, ["items", "other"])
    src = s.config(create_publication=False)
    s.execute(f"create publication {src.publication_name} for table items, other")
    prepare(src)
    s.execute("insert into items select g, 'v' || g from generate_series(1, 5) g")
    capture_once(warehouse, src, snapshots=True)
    s.execute(f"alter publication {src.publication_name} drop table {s.schema}.items")
    s.execute("delete from items where id = 1; insert into items values (100, 'lost insert')")
    with pytest.raises(SourceError, match=f"ALTER PUBLICATION {src.publication_name} ADD TABLE {s.schema}.items"):
        capture_once(warehouse, src, snapshots=True)
    s.execute(f"alter publication {src.publication_name} add table {s.schema}.items")
    capture_once(warehouse, src, snapshots=True)
    assert upserts_match(warehouse, s)
    assert len(whole_table_snapshots(warehouse, s.name)) == 2


def test_a_column_list_ingest_sets_itself_takes_no_re_snapshot(
    warehouse: Path, make_source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Ingest replaces the table's publication row itself (a new column list, in one transaction): nothing is lost."""
    s = make_source("create table items (id int primary key, v text, ssn text)", ["items"])
    if s.conn.info.server_version < COLUMN_LISTS_VERSION:
        pytest.skip("no publication column lists before PostgreSQL 15: ingest never replaces a table's row")
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1, 'a', 'x'), (2, 'b', 'y')")
    capture_once(warehouse, src, snapshots=True)
    masked = s.config(columns={s.tables[0]: {"exclude_columns": ["ssn"]}})
    before = publication_row(s, src.publication_name)
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG):
        capture_once(warehouse, masked, snapshots=True)
        assert publication_row(s, src.publication_name) != before, "ingest replaced the row (the column list)"
        capture_once(warehouse, masked, snapshots=True)
    assert membership_warnings(caplog) == ""
    # One re-snapshot, the exclusion's own (a shape change: records are rewritten without the column).
    assert len(whole_table_snapshots(warehouse, s.name)) == 2


def publication_row(s: Any, publication: str) -> int:
    row = s.conn.execute(
        "select r.oid::bigint from pg_publication_rel r join pg_publication p on p.oid = r.prpubid "
        "where p.pubname = %s",
        (publication,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_continuous_run_finds_a_leave_and_comeback_between_two_checks(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Between two periodic checks (here inside one transaction, so no check can see it out), nothing is sent."""
    monkeypatch.setattr("ingest.sources.postgres.capture.SHAPE_CHECK_INTERVAL_S", 1.0)
    monkeypatch.setattr("ingest.sources.postgres.snapshot.REQUEST_POLL_S", 0.5)
    s = make_source(TABLES, ["items", "other"])
    src = s.config()
    prepare(src)
    s.execute("insert into items select g, 'v' || g from generate_series(1, 5) g")
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG), ContinuousCapture(warehouse, src) as run:
        run.wait_for(lambda: upserts_match(warehouse, s), 60, "the initial state of items in bronze")
        with s.conn.transaction():
            lose_changes(s, src.publication_name)
        run.wait_for(lambda: len(whole_table_snapshots(warehouse, s.name)) == 2, 60, "the re-snapshot")
        run.wait_for(lambda: upserts_match(warehouse, s), 60, "the lost changes in bronze")
    assert f"table {s.schema}.items was out of publication" in membership_warnings(caplog)
    assert lost_changes_in_bronze(warehouse, s) == [], "the changes were lost, as the test means them to be"


def test_a_continuous_run_publishes_a_table_that_left_the_managed_publication_again(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of the publication and not back: ingest manages it, so it adds the table back and re-snapshots it."""
    monkeypatch.setattr("ingest.sources.postgres.capture.SHAPE_CHECK_INTERVAL_S", 1.0)
    monkeypatch.setattr("ingest.sources.postgres.snapshot.REQUEST_POLL_S", 0.5)
    s = make_source(TABLES, ["items", "other"])
    src = s.config()
    prepare(src)
    s.execute("insert into items select g, 'v' || g from generate_series(1, 5) g")
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG), ContinuousCapture(warehouse, src) as run:
        run.wait_for(lambda: upserts_match(warehouse, s), 60, "the initial state of items in bronze")
        s.execute(f"alter publication {src.publication_name} drop table {s.schema}.items")
        s.execute("delete from items where id = 1; update items set v = 'lost update' where id = 2")
        run.wait_for(lambda: len(whole_table_snapshots(warehouse, s.name)) == 2, 60, "the re-snapshot")
        s.execute("insert into items values (101, 'streamed')")  # published again
        run.wait_for(lambda: upserts_match(warehouse, s), 60, "the lost and later changes in bronze")
    assert f"table {s.schema}.items left publication {src.publication_name}" in membership_warnings(caplog)


def test_a_schema_left_and_added_back_to_a_users_publication_is_met(
    warehouse: Path, make_source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """FOR TABLES IN SCHEMA (15+): membership is the schema's pg_publication_namespace row, new when added back."""
    s = make_source(TABLES, ["items"])
    if s.conn.info.server_version < COLUMN_LISTS_VERSION:
        pytest.skip("no schema publications before PostgreSQL 15")
    src = s.config(create_publication=False)
    s.execute(f"create publication {src.publication_name} for tables in schema {s.schema}")
    prepare(src)
    s.execute("insert into items select g, 'v' || g from generate_series(1, 5) g")
    capture_once(warehouse, src, snapshots=True)
    s.execute(f"alter publication {src.publication_name} drop tables in schema {s.schema}")
    s.execute("delete from items where id = 1; update items set v = 'lost update' where id = 2")
    s.execute(f"alter publication {src.publication_name} add tables in schema {s.schema}")
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG):
        capture_once(warehouse, src, snapshots=True)
    assert f"table {s.schema}.items was out of publication" in membership_warnings(caplog)
    assert upserts_match(warehouse, s)
    assert len(whole_table_snapshots(warehouse, s.name)) == 2


def test_a_table_that_left_the_managed_publication_while_ingest_was_stopped_is_re_snapshotted(
    warehouse: Path, make_source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A start added the missing table back silently, as it adds a new one: the changes made meanwhile stayed lost."""
    s = make_source(TABLES, ["items", "other"])
    src = s.config()
    prepare(src)
    s.execute("insert into items select g, 'v' || g from generate_series(1, 5) g")
    capture_once(warehouse, src, snapshots=True)
    s.execute(f"alter publication {src.publication_name} drop table {s.schema}.items")
    s.execute("delete from items where id = 1; update items set v = 'lost update' where id = 2")
    with caplog.at_level(logging.WARNING, logger=MEMBERSHIP_LOG):
        capture_once(warehouse, src, snapshots=True)
    assert f"table {s.schema}.items was out of publication" in membership_warnings(caplog)
    assert lost_changes_in_bronze(warehouse, s) == []
    assert upserts_match(warehouse, s)
    assert len(whole_table_snapshots(warehouse, s.name)) == 2
