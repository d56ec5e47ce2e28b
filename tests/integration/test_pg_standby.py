"""Capture from a physical standby on PostgreSQL 16 and 18: slot, stream and snapshot on the standby (real servers).

A primary and a streaming standby of it (a cold copy of its data directory, scratch_pg). The
source's `dsn` is the standby's and its `primary_dsn` the primary's: ingest's logical messages
(drain marker, heartbeats, snapshot watermarks) and the publication are written there, and
replicate to the standby, where the slot decodes them. A workload runs on the primary while a
snapshot of the table is paged on the standby; bronze, folded by the placement rule, must equal
the primary's rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.capture.retry import retrying
from ingest.config import BatchConfig, PostgresSource
from ingest.errors import SourceError
from ingest.events import lsn_to_int
from ingest.progress import Progress
from ingest.sources.postgres.admin import HEARTBEAT_PREFIX
from ingest.sources.postgres.capture import PostgresCapture
from ingest.sources.postgres.verify import VerifySnapshot
from tests.helpers.bronze_fold import live_records, table_rows
from tests.helpers.capture_thread import ContinuousCapture
from tests.helpers.pg import PgSource, bronze_events, capture_once, drop_slot, prepare
from tests.helpers.scratch_pg import ScratchCluster

pytestmark = pytest.mark.integration

STANDBY_MAJOR = 16  # the first that decodes on a standby
# The pair's tests run on both ends of the range that has standby decoding (one pair at a time:
# pytest finishes a module fixture's tests on one param before it sets up the next, on the same ports).
PAIR_MAJORS = (STANDBY_MAJOR, 18)
FAILOVER_MAJOR = 17  # the first with failover slots
PRIMARY_PORT, STANDBY_PORT, LONE_PORT = 25393, 25394, 25395
PROMOTED_PRIMARY_PORT, PROMOTED_STANDBY_PORT = 25396, 25397
STANDBY_SLOT = "changelake_standby_capture"
PROBE_SLOT = "changelake_probe"
ROWS = 60
TABLES_SQL = "create table acct (id int primary key, owner text)"


@pytest.fixture(scope="module", params=PAIR_MAJORS, ids=[f"pg{m}" for m in PAIR_MAJORS])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[ScratchCluster, ScratchCluster]]:
    """A primary and its streaming standby: on the first major that decodes on a standby, and on the newest."""
    major = int(request.param)
    primary = ScratchCluster(PRIMARY_PORT, major=major)
    standby: ScratchCluster | None = None
    try:
        standby = ScratchCluster.standby_of(primary, STANDBY_PORT, STANDBY_SLOT)
        yield primary, standby
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()


def _flushed(conn: Any) -> str:
    row = conn.execute("select pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _slots(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("select count(*) from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_standby_source_captures_a_primary_workload_and_places_its_snapshot_exactly(
    pair: tuple[ScratchCluster, ScratchCluster], tmp_path: Path
) -> None:
    """Bronze from the standby folds to the primary's rows; an update open across a page supersedes its row.

    The update of id 5 is running when page 0 takes its snapshot on the standby and commits
    before the page's watermark: the page read the old row, and only the update's xid in the
    page's in-progress list drops it. pg_current_snapshot() on a standby lists none (a hot
    standby keeps them where pg_snapshot does not look): with its list, the old row was placed
    after the update and bronze folded to the stale owner.
    """
    primary, standby = pair
    s = PgSource(primary.dsn, TABLES_SQL, ["acct"])
    try:
        s.execute(f"insert into acct select i, 'o' || i from generate_series(1, {ROWS}) i")
        src = s.config().model_copy(update={"dsn": standby.dsn, "primary_dsn": primary.dsn})
        prepare(src)
        assert _slots(standby.dsn, src.slot_name) == 1 and _slots(primary.dsn, src.slot_name) == 0

        open_update = psycopg.connect(primary.dsn)
        stop = threading.Event()

        def workload() -> None:
            with psycopg.connect(primary.dsn, autocommit=True) as c:
                i = 0
                while not stop.wait(0.01):
                    i += 1
                    c.execute(f"insert into {s.schema}.acct values (%s, 'w')", (1000 + i,))
                    # ids of page 0 are left to the open update
                    c.execute(f"update {s.schema}.acct set owner = 'u' || %s where id = %s", (i, 11 + i % (ROWS - 10)))
                    if i % 7 == 0:
                        c.execute(f"delete from {s.schema}.acct where id = %s", (1000 + i - 3,))

        begins: list[int] = []

        def hook(point: str, task: Any, page: int) -> None:
            if point == "after_begin" and page == 1:
                begins.append(page)
                if len(begins) == 1:
                    # WAL replayed after the replay position was read and before the snapshot: the
                    # standby was not idle across it, so this try must be rolled back and taken again.
                    s.execute("insert into acct values (998, 'between')")
                    standby.wait_replayed(_flushed(s.conn))
            if page != 0:
                return
            if point == "before_read":
                # In progress (with its xid) when the page's snapshot is taken; a later commit raises
                # the standby's xmax past it, so only the in-progress list can hide it.
                open_update.execute(f"update {s.schema}.acct set owner = 'late' where id = 5")
                s.execute("insert into acct values (999, 'after')")
                standby.wait_replayed(_flushed(s.conn))
            elif point == "after_read":
                open_update.commit()

        worker = threading.Thread(target=workload, daemon=True)
        worker.start()
        try:
            capture_once(tmp_path, src, snapshots=True, snapshot_hook=hook, page_rows=10)
        finally:
            stop.set()
            worker.join()
            open_update.close()
        standby.wait_replayed(_flushed(s.conn))
        capture_once(tmp_path, src, snapshots=True)

        live = live_records(tmp_path, src.name)[f"{s.schema}.acct"]
        expected = table_rows(s.conn, f"{s.schema}.acct")
        assert live['{"id":5}']["owner"] == "late"
        assert len(begins) >= 2, "page 1 kept a snapshot taken while the standby replayed WAL"
        assert live == expected
        assert _slots(primary.dsn, src.slot_name) == 0
    finally:
        s.drop()
        with psycopg.connect(standby.dsn, autocommit=True) as c:
            if _slots(standby.dsn, src.slot_name):
                drop_slot(c, src.slot_name)


def test_a_continuous_run_on_a_standby_publishes_a_new_table_on_the_primary(
    pair: tuple[ScratchCluster, ScratchCluster], tmp_path: Path
) -> None:
    """A table that comes into a pattern's scope while `run` streams from the standby is captured.

    The publication is changed on the primary (the standby refuses any write), the standby
    replays it, the table is snapshotted there and its later changes streamed: bronze folds to the
    primary's rows. Heartbeats (every second here) are written on the primary too.
    """
    primary, standby = pair
    s = PgSource(primary.dsn, TABLES_SQL, [])
    src = PostgresSource(
        kind="postgres",
        name=s.name,
        dsn=standby.dsn,
        primary_dsn=primary.dsn,
        tables=[f"{s.schema}.*"],
        new_tables_check_seconds=0.5,
        heartbeat_seconds=1,
    )
    new = f"{s.schema}.fresh"
    try:
        prepare(src)
        s.execute("insert into acct values (1, 'a')")
        with ContinuousCapture(tmp_path, src) as run:
            run.wait_for(lambda: f"{s.schema}.acct" in live_records(tmp_path, s.name), 30, "the first table in bronze")
            s.execute(f"create table {new} (id int primary key, v text)")
            s.execute(f"insert into {new} select g, 'm' || g from generate_series(1, 50) g")
            run.wait_for(lambda: new in src.tables, 30, "the new table in scope")
            s.execute(f"update {new} set v = 'changed' where id = 1")
            in_bronze = lambda: live_records(tmp_path, s.name).get(new, {}) == table_rows(s.conn, new)  # noqa: E731
            run.wait_for(in_bronze, 60, "the new table in bronze")
            heartbeats = lambda: any(  # noqa: E731
                e.message_prefix == HEARTBEAT_PREFIX for e in bronze_events(tmp_path, s.name, with_messages=True)
            )
            run.wait_for(heartbeats, 30, "a heartbeat from the primary in bronze")
    finally:
        s.drop()
        with psycopg.connect(standby.dsn, autocommit=True) as c:
            if _slots(standby.dsn, src.slot_name):
                drop_slot(c, src.slot_name)


def test_verify_on_a_standby_lists_the_transactions_its_snapshot_cannot_see(
    pair: tuple[ScratchCluster, ScratchCluster],
) -> None:
    """verify's snapshot on a standby lists a transaction running on the primary, below a later commit's xmax.

    Its positions are the standby's replay positions (pg_current_wal_insert_lsn() fails there).
    """
    primary, standby = pair
    s = PgSource(primary.dsn, TABLES_SQL, ["acct"])
    running = psycopg.connect(primary.dsn)
    snap = VerifySnapshot(s.config().model_copy(update={"dsn": standby.dsn, "primary_dsn": primary.dsn}))
    try:
        row = running.execute(
            f"insert into {s.schema}.acct values (1, 'open') returning pg_current_xact_id()::text"
        ).fetchone()
        assert row is not None
        xid = int(str(row[0]))
        s.execute("insert into acct values (2, 'committed')")
        standby.wait_replayed(_flushed(s.conn))
        snap.begin()
        assert xid in snap.xip and snap.xmin <= xid < snap.xmax
        assert snap.before <= snap.insert_lsn
    finally:
        snap.close()
        running.close()
        s.drop()


def test_a_standby_source_without_primary_dsn_is_refused_naming_the_option(
    pair: tuple[ScratchCluster, ScratchCluster],
) -> None:
    """A standby cannot write the messages ingest needs: the start says to set primary_dsn, and creates nothing."""
    primary, standby = pair
    s = PgSource(primary.dsn, TABLES_SQL, ["acct"])
    try:
        src = s.config().model_copy(update={"dsn": standby.dsn})
        with pytest.raises(SourceError, match="is a standby.*set `primary_dsn`"):
            prepare(src)
        assert _slots(standby.dsn, src.slot_name) == 0
    finally:
        s.drop()


def test_a_failover_slot_without_synchronized_standby_slots_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a 17+ primary whose synchronized_standby_slots is empty, a failover slot gets a warning saying what to set."""
    lone = ScratchCluster(LONE_PORT, major=FAILOVER_MAJOR)
    try:
        s = PgSource(lone.dsn, TABLES_SQL, ["acct"])
        src = s.config()
        with caplog.at_level(logging.WARNING, logger="ingest.sources.postgres.admin"):
            prepare(src)
        assert any("synchronized_standby_slots is empty" in r.getMessage() for r in caplog.records)
        caplog.clear()
        s.execute("select pg_create_physical_replication_slot(%s)", (STANDBY_SLOT,))
        s.execute(f"alter system set synchronized_standby_slots = '{STANDBY_SLOT}'")
        s.execute("select pg_reload_conf()")
        deadline = time.monotonic() + 10
        while True:
            with psycopg.connect(lone.dsn) as c:  # a new session reads the reloaded setting
                if c.execute("show synchronized_standby_slots").fetchone() == (STANDBY_SLOT,):
                    break
            assert time.monotonic() < deadline, "the reload did not take"
            time.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="ingest.sources.postgres.admin"):
            prepare(src)
        assert not any("synchronized_standby_slots" in r.getMessage() for r in caplog.records)
    finally:
        lone.remove()


def test_a_standby_promoted_mid_run_gets_the_primary_side_work_and_the_old_primary_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A standby promoted while `run` streams from it: the run goes on there, nothing to the old primary.

    Ingest kept writing heartbeats (and would have written watermarks and drain markers) through
    primary_dsn after the promotion: into the old primary, which here is still up and diverges,
    while the promoted server's slot never sees them. A logical slot made on the old primary after
    the promotion must decode none of ingest's messages; the promoted server's changes reach
    bronze once each, and its heartbeats too. The run is wrapped in the retry loop as `run` is.
    """
    primary = ScratchCluster(PROMOTED_PRIMARY_PORT, major=STANDBY_MAJOR)
    standby: ScratchCluster | None = None
    s: PgSource | None = None
    stop = threading.Event()
    errors: list[BaseException] = []
    try:
        standby = ScratchCluster.standby_of(primary, PROMOTED_STANDBY_PORT, STANDBY_SLOT)
        s = PgSource(primary.dsn, TABLES_SQL, ["acct"])
        src = s.config().model_copy(update={"dsn": standby.dsn, "primary_dsn": primary.dsn, "heartbeat_seconds": 1})
        prepare(src)
        s.execute("insert into acct select i, 'o' || i from generate_series(1, 20) i")
        writer = BronzeWriter(tmp_path)

        def attempt() -> None:
            batch = BatchConfig(max_events=10_000, max_seconds=0.2)
            cap = PostgresCapture(src, batch, writer, Progress(src.name, False))
            cap.run(once=False, should_stop=stop.is_set)

        def run() -> None:
            try:
                retrying(attempt, src.name, stop.is_set, 60, 1.0)
            except BaseException as e:  # surfaced by wait below
                errors.append(e)

        def wait(check: Any, what: str) -> None:
            deadline = time.monotonic() + 30
            while not check():
                assert not errors, f"the run failed waiting for {what}: {errors[0]!r}"
                assert time.monotonic() < deadline, f"{what} not reached within 30 s"
                time.sleep(0.3)

        table = f"{s.schema}.acct"
        runner = threading.Thread(target=run, daemon=True)
        with caplog.at_level(logging.WARNING, logger="ingest.capture.retry"):
            runner.start()
            wait(lambda: live_records(tmp_path, src.name).get(table) == table_rows(s.conn, table), "the first rows")
            standby.promote()
            with psycopg.connect(standby.dsn, autocommit=True) as promoted:
                row = promoted.execute("select pg_current_wal_insert_lsn()::text").fetchone()
                assert row is not None
                promoted_at = lsn_to_int(str(row[0]))
                time.sleep(0.5)  # a heartbeat checked for recovery just before the promotion has landed
                s.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (PROBE_SLOT,))
                s.execute("insert into acct values (500, 'old primary only')")  # the old primary diverges
                promoted.execute(f"insert into {table} select i, 'p' || i from generate_series(21, 40) i")
                promoted.execute(f"update {table} set owner = 'changed' where id <= 5")
                promoted.execute(f"delete from {table} where id = 6")
                wait(lambda: live_records(tmp_path, src.name).get(table) == table_rows(promoted, table), "the rows")
                heartbeats_after = lambda: any(  # noqa: E731
                    e.message_prefix == HEARTBEAT_PREFIX and e.commit_lsn > promoted_at
                    for e in bronze_events(tmp_path, src.name, with_messages=True)
                )
                wait(heartbeats_after, "a heartbeat written on the promoted server")
                time.sleep(1.5)  # more heartbeats, had they gone to the old primary
        assert any("was promoted" in r.getMessage() for r in caplog.records)
        decoded = s.conn.execute(
            "select data from pg_logical_slot_peek_binary_changes(%s, null, null, 'proto_version', '1', "
            "'publication_names', %s, 'messages', 'true')",
            (PROBE_SLOT, src.publication_name),
        ).fetchall()
        assert decoded, "the probe slot decoded nothing: it cannot tell"
        assert not [d for (d,) in decoded if b"changelake." in bytes(d)], "ingest wrote to the old primary"
        inserts = [e.record_pk for e in bronze_events(tmp_path, src.name) if e.action == "insert"]
        assert len(inserts) == len(set(inserts)) == 40
    finally:
        stop.set()
        if s is not None:
            s.drop()
        if standby is not None:
            standby.remove()
        primary.remove()
