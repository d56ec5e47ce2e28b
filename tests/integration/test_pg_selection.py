"""Pattern selection on a real server: schemas and patterns with exclusions, and tables picked up while running."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.config import PostgresSource
from ingest.errors import SourceError
from ingest.sources.postgres.changes import table_gone_prefix
from tests.helpers.bronze_fold import live_records, table_rows
from tests.helpers.capture_thread import ContinuousCapture
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration


def published(s: Any, src: PostgresSource) -> set[str]:
    rows = s.conn.execute(
        "select schemaname || '.' || tablename from pg_publication_tables where pubname = %s", (src.publication_name,)
    ).fetchall()
    return {str(r[0]) for r in rows}


def test_a_schema_pattern_with_exclusions_captures_what_it_matches(warehouse: Path, make_source: Any) -> None:
    """`<schema>.*` minus `audit_*` publishes, snapshots and streams exactly the matched tables, case-exact."""
    s = make_source(
        "create table a (id int primary key, v text); create table b (id int primary key, v text); "
        'create table audit_log (id int primary key); create table "Mixed" (id int primary key, v text)',
        [],
    )
    src = PostgresSource(
        kind="postgres",
        name=s.name,
        dsn=s.dsn,
        tables=[f"{s.schema}.*"],
        exclude=[f"{s.schema}.audit_*", f'{s.schema}."Mixed"'],
    )
    prepare(src)
    assert src.tables == [f"{s.schema}.a", f"{s.schema}.b"]
    assert published(s, src) == {f"{s.schema}.a", f"{s.schema}.b"}
    s.execute("insert into a values (1, 'x'); insert into b values (2, 'y'); insert into audit_log values (3)")
    s.execute("""insert into "Mixed" values (4, 'z')""")
    capture_once(warehouse, src, snapshots=True)
    live = live_records(warehouse, s.name)
    assert set(live) == {f"{s.schema}.a", f"{s.schema}.b"}
    # A pattern part is case-exact: `m*` does not select "Mixed", `M*` does.
    assert (
        PostgresSource(kind="postgres", name=s.name, dsn=s.dsn, tables=[f"{s.schema}.m*"]).selection.resolve(
            [(s.schema, "Mixed")]
        )
        == []
    )


def test_a_user_publication_captures_only_what_it_publishes_and_says_what_it_lacks(
    make_source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """On a user's publication a pattern selects within it; the log says what is in scope and what is not.

    Selected tables the publication lacks are named (not captured until it publishes them), and so
    are tables the publication sends that the pattern leaves out (their changes are skipped).
    """
    s = make_source(
        "create table a (id int primary key); create table b (id int primary key); "
        "create table other (id int primary key)",
        [],
    )
    pub = f"pub_{s.suffix}"
    s.execute(f"create publication {pub} for table a, other with (publish_via_partition_root = true)")
    caplog.set_level(logging.INFO, logger="ingest.sources.postgres.scope")
    try:
        src = PostgresSource(
            kind="postgres",
            name=s.name,
            dsn=s.dsn,
            tables=[f"{s.schema}.?"],  # a and b, not other
            publication=pub,
            create_publication=False,
        )
        prepare(src)
        assert src.tables == [f"{s.schema}.a"]
        assert f"source={s.name} tables in scope: {s.schema}.a\n" in caplog.text
        assert f"{s.schema}.b selected but not in publication {pub}" in caplog.text
        assert (
            f"publication {pub} also publishes {s.schema}.other, outside the selection: their changes are skipped"
            in caplog.text
        )
    finally:
        s.execute(f"drop publication {pub}")


def test_a_pattern_selected_table_without_a_key_is_refused_with_the_way_out(make_source: Any) -> None:
    """A table a pattern selects is checked like a named one; the error says how to leave it out."""
    s = make_source("create table a (id int primary key); create table nokey (v text)", [])
    src = PostgresSource(kind="postgres", name=s.name, dsn=s.dsn, tables=[f"{s.schema}.*"])
    with pytest.raises(SourceError, match="nokey has no primary key.*list it under `exclude`"):
        prepare(src)


def test_a_table_created_and_filled_by_a_migration_is_captured_without_a_restart(
    warehouse: Path, make_source: Any
) -> None:
    """A migration creates a table and writes to it in one transaction while `run` streams.

    Before, the table stayed out until the config was edited and ingest restarted. Now the
    running capture publishes it, snapshots it beside the stream, and streams its later changes:
    bronze holds each of the migration's rows exactly once (the snapshot), and each later change
    exactly once (the stream), none lost between the CREATE and the first page.
    """
    s = make_source("create table a (id int primary key, v text)", [])
    src = PostgresSource(
        kind="postgres",
        name=s.name,
        dsn=s.dsn,
        tables=[f"{s.schema}.*"],
        new_tables_check_seconds=0.5,
        heartbeat_seconds=1,
    )
    prepare(src)
    s.execute("insert into a values (1, 'a')")
    new = f"{s.schema}.fresh"
    with ContinuousCapture(warehouse, src) as run:
        run.wait_for(lambda: f"{s.schema}.a" in live_records(warehouse, s.name), 30, "the first table in bronze")
        with psycopg.connect(s.dsn, autocommit=True) as migration, migration.transaction():
            migration.execute(f"create table {new} (id int primary key, v text)")
            migration.execute(f"insert into {new} select g, 'm' || g from generate_series(1, 500) g")
        # Writes right after the migration race the pick-up: each must land once, by page or stream.
        for i in range(501, 521):
            s.execute(f"insert into {new} values ({i}, 'w{i}')")
        run.wait_for(lambda: new in src.tables, 30, "the new table in scope")
        s.execute(f"update {new} set v = 'changed' where id = 1")
        s.execute(f"delete from {new} where id = 2")
        in_bronze = lambda: live_records(warehouse, s.name).get(new, {}) == table_rows(s.conn, new)  # noqa: E731
        run.wait_for(in_bronze, 60, "the new table in bronze")
    assert new in published(s, src)
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    paged = [json.loads(p.record)["id"] for p in pages if p.table_name == "fresh"]
    events = [e for e in bronze_events(warehouse, s.name) if e.table_name == "fresh"]
    streamed_inserts = [json.loads(e.record)["id"] for e in events if e.action == "insert"]
    assert len(paged) == len(set(paged)), "a row was paged twice"
    assert len(streamed_inserts) == len(set(streamed_inserts)), "an insert was streamed twice"
    # The migration's rows were written before the table was published: only the snapshot has them.
    # Row 2 is paged only if its page was read before the test deleted it (then the delete event
    # alone removes it); either way the table in bronze equals the source (in_bronze above).
    assert set(range(1, 501)) - {2} <= set(paged) and not set(range(1, 501)) & set(streamed_inserts)
    assert set(range(1, 521)) - {2} <= set(paged) | set(streamed_inserts)
    assert [e.action for e in events if e.action != "insert"] == ["update", "delete"]


def test_a_new_table_written_by_an_open_transaction_is_published_after_it_ends(
    warehouse: Path, make_source: Any
) -> None:
    """A row inserted by a transaction open while the table was published was in neither page nor stream.

    Its change was decoded as of before the publication took the table, and the first page's MVCC
    snapshot could not see it. Publishing waits for the table's writers to end (a SHARE lock).
    """
    s = make_source("create table a (id int primary key)", [])
    src = PostgresSource(
        kind="postgres", name=s.name, dsn=s.dsn, tables=[f"{s.schema}.*"], new_tables_check_seconds=0.3
    )
    prepare(src)
    new = f"{s.schema}.late"
    with ContinuousCapture(warehouse, src) as run, psycopg.connect(s.dsn, autocommit=True) as writer:
        run.wait_for(lambda: run.capture.batcher is not None, 30, "the stream")
        s.execute(f"create table {new} (id int primary key, v text)")
        with writer.transaction():
            writer.execute(f"insert into {new} values (1, 'open')")
            time.sleep(3)  # several checks meet the table while this transaction is open
        run.wait_for(lambda: new in src.tables, 30, "the new table in scope")
        run.wait_for(
            lambda: live_records(warehouse, s.name).get(new, {}) == table_rows(s.conn, new), 30, "the row in bronze"
        )


def test_tables_leaving_and_entering_a_pattern_while_running_are_tombstoned_or_captured(
    warehouse: Path, make_source: Any
) -> None:
    """While `run` streams `<schema>.t_*`: tables that leave the pattern are tombstoned and unpublished.

    One is dropped, one renamed out of the pattern, one moved out with SET SCHEMA: none of them
    writes a row change, so their records in bronze end only at the tombstone the running capture
    writes (a truncate at the `changelake.tableGone:<slot>` message), and each leaves the
    publication (a renamed or moved table keeps its membership by relation, and would go on being
    sent). A table moved in with SET SCHEMA and one renamed into the pattern are published,
    snapshotted with the rows they had, and their later writes streamed.
    """
    s = make_source(
        "create table t_drop (id int primary key, v text); create table t_rename (id int primary key, v text); "
        "create table t_move (id int primary key, v text); create table t_keep (id int primary key, v text); "
        "create table old_in (id int primary key, v text)",
        [],
    )
    other = f"{s.schema}_other"
    s.execute(f"create schema {other}; create table {other}.t_in (id int primary key, v text)")
    try:
        src = PostgresSource(
            kind="postgres",
            name=s.name,
            dsn=s.dsn,
            tables=[f"{s.schema}.t_*"],
            new_tables_check_seconds=0.5,
            heartbeat_seconds=1,
        )
        prepare(src)
        leaving = [f"{s.schema}.t_drop", f"{s.schema}.t_rename", f"{s.schema}.t_move"]
        keep, moved_in, renamed_in = f"{s.schema}.t_keep", f"{s.schema}.t_in", f"{s.schema}.t_renamed_in"
        assert published(s, src) == {*leaving, keep}
        for t in ("t_drop", "t_rename", "t_move", "t_keep", "old_in", f"{other}.t_in"):
            s.execute(f"insert into {t} select g, '{t}' || g from generate_series(1, 5) g")
        with ContinuousCapture(warehouse, src) as run:
            run.wait_for(lambda: set(live_records(warehouse, s.name)) >= {*leaving, keep}, 30, "the tables in bronze")
            s.execute("drop table t_drop")
            s.execute("alter table t_rename rename to gone_rename")
            s.execute(f"alter table t_move set schema {other}")
            s.execute(f"alter table {other}.t_in set schema {s.schema}")
            s.execute("alter table old_in rename to t_renamed_in")
            # Written after leaving (still published until retired): not captured under either name.
            s.execute("insert into gone_rename values (6, 'after')")
            s.execute(f"update {other}.t_move set v = 'after' where id = 1")
            s.execute("insert into t_in values (6, 'moved in'); insert into t_renamed_in values (6, 'renamed in')")
            run.wait_for(lambda: set(src.tables) == {keep, moved_in, renamed_in}, 30, "the scope followed")

            def in_bronze() -> bool:
                live = live_records(warehouse, s.name)
                return all(live.get(t) == {} for t in leaving) and all(
                    live.get(t) == table_rows(s.conn, t) for t in (keep, moved_in, renamed_in)
                )

            run.wait_for(in_bronze, 60, "the tombstones and the new tables' snapshots in bronze")
            s.execute("update t_in set v = 'later' where id = 1; delete from t_in where id = 2")
            s.execute("insert into t_renamed_in values (7, 'later')")
            run.wait_for(in_bronze, 30, "the later writes in bronze")
        assert published(s, src) == {keep, moved_in, renamed_in}
        events = bronze_events(warehouse, s.name)
        gone = [e for e in events if e.action == "truncate"]
        assert sorted(tuple(e.truncated_tables) for e in gone) == sorted((t,) for t in leaving)
        assert {e.message_prefix for e in gone} == {table_gone_prefix(src.slot_name)}
        captured = {f"{e.table_schema}.{e.table_name}" for e in events if e.action != "truncate"}
        assert captured <= {*leaving, keep, moved_in, renamed_in}, "a table that left was captured under its new name"
        pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
        for t in (moved_in, renamed_in):
            paged = {json.loads(p.record)["id"] for p in pages if f"{p.table_schema}.{p.table_name}" == t}
            assert set(range(1, 6)) <= paged, t
        later = [(e.table_name, e.action) for e in events if e.table_name in ("t_in", "t_renamed_in")]
        assert ("t_in", "update") in later and ("t_in", "delete") in later and ("t_renamed_in", "insert") in later
    finally:
        s.execute(f"drop schema {other} cascade")
