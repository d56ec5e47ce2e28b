"""Bad input gets a clear error and loses nothing (wrong DSN, missing table, no key, busy or lost slot ...)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.errors import BronzeWriteError, SlotInvalidatedError, SourceError
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.replication import ReplicationStream
from tests.helpers.pg import bronze_events, capture_once, prepare
from tests.helpers.scratch_pg import ScratchCluster

pytestmark = pytest.mark.integration

ITEMS = "create table items (id int primary key, v text)"


def test_wrong_password_is_named_without_the_secret(make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    bad = s.config().model_copy(update={"dsn": "postgresql://nobody:hunter2@127.0.0.1:1/x"})
    with pytest.raises(SourceError) as e:
        prepare(bad)
    assert "cannot connect" in str(e.value) and "hunter2" not in str(e.value)


def test_missing_table_is_named(make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    cfg = s.config().model_copy(update={"selectors": [f"{s.schema}.items", f"{s.schema}.nope"]})
    with pytest.raises(SourceError, match=rf"{s.schema}\.nope does not exist"):
        prepare(cfg)


def test_table_without_primary_key_needs_full_identity(make_source: Any) -> None:
    s = make_source("create table nokey (a int, b text)", ["nokey"])
    with pytest.raises(SourceError, match="REPLICA IDENTITY FULL"):
        prepare(s.config())
    s.execute("alter table nokey replica identity full")
    prepare(s.config())  # accepted; the whole row is the key, and its snapshot pages by CTID


def test_missing_publication_without_create(make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    with pytest.raises(SourceError, match="does not exist and create_publication is false"):
        prepare(s.config(create_publication=False))


def test_slot_in_use_by_another_process(make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    first = ReplicationStream(s.dsn, s.config().slot_name, s.config().publication_name)
    first.open()
    try:
        second = ReplicationStream(s.dsn, s.config().slot_name, s.config().publication_name)
        with pytest.raises(SourceError, match="in use by another process"):
            second.open()
    finally:
        first.close()


def freeze(path: Path, on: bool) -> None:
    """Make a directory refuse new files, even for root (chattr +i), or undo it."""
    if os.getuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)
    else:
        path.chmod(0o555 if on else 0o755)


def test_failed_delta_commit_does_not_advance_the_slot(warehouse: Path, make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    capture_once(warehouse, s.config())  # creates bronze
    admin = PostgresAdmin(s.config())
    before = admin.slot_health().confirmed_flush_lsn
    # Where WAL ends before the insert: the failed run may confirm what bronze already holds from
    # the first run (its last position can be past the slot's, e.g. an idle stream's keepalive
    # that run recorded), never the insert.
    (before_insert,) = s.conn.execute("select (pg_current_wal_lsn() - '0/0')::bigint").fetchone()
    s.execute("insert into items values (1, 'a')")
    partition = warehouse / "bronze" / "wal_events" / f"source={s.name}"
    freeze(partition, True)  # the next append cannot create its files there (as a full disk would)
    try:
        with pytest.raises(BronzeWriteError):
            capture_once(warehouse, s.config())
        assert before <= admin.slot_health().confirmed_flush_lsn <= before_insert
    finally:
        freeze(partition, False)
    capture_once(warehouse, s.config())  # the change was kept by the slot and arrives now
    assert [e.record_pk for e in bronze_events(warehouse, s.name)] == ['{"id":1}']
    admin.close()


@pytest.fixture(scope="module")
def scratch_cluster() -> Iterator[ScratchCluster]:
    """A second, throwaway PostgreSQL cluster whose settings the tests may break."""
    cluster = ScratchCluster(25339)
    yield cluster
    cluster.remove()


def test_invalidated_slot_says_how_to_recover(scratch_cluster: ScratchCluster) -> None:
    from ingest.config import PostgresSource

    dsn = scratch_cluster.dsn
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("create table if not exists big (id serial primary key, pad text)")
    src = PostgresSource(kind="postgres", name="lost", dsn=dsn, tables=["public.big"])
    prepare(src)
    scratch_cluster.restart_with("max_slot_wal_keep_size = 1MB")
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(4):  # push several WAL segments past the slot, then let a checkpoint drop them
            c.execute("insert into big (pad) select repeat('x', 1000) from generate_series(1, 20000)")
            c.execute("select pg_switch_wal()")
        c.execute("checkpoint")
        status = c.execute("select wal_status from pg_replication_slots where slot_name = 'changelake_lost'").fetchone()
    assert status is not None and status[0] == "lost"
    with pytest.raises(SlotInvalidatedError, match=r"changelake_lost.*invalidated.*on_history_lost: resnapshot"):
        prepare(src)
    # With the recovery configured, the invalidated slot is replaced by a new one (W7: the capture
    # then tombstones and re-snapshots: test_pg_continuity.py).
    prepare(src.model_copy(update={"on_history_lost": "resnapshot"}))
    with psycopg.connect(dsn, autocommit=True) as c:
        status = c.execute("select wal_status from pg_replication_slots where slot_name = 'changelake_lost'").fetchone()
    assert status is not None and status[0] != "lost"


def test_server_without_logical_wal_level(scratch_cluster: ScratchCluster) -> None:
    from ingest.config import PostgresSource

    dsn = scratch_cluster.dsn
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots")
    scratch_cluster.restart_with("wal_level = replica")
    src = PostgresSource(kind="postgres", name="replica", dsn=dsn, tables=["public.big"])
    with pytest.raises(SourceError, match="wal_level is 'replica'.*wal_level = logical"):
        prepare(src)
