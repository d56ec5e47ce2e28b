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
