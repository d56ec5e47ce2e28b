"""Failover on PostgreSQL 17 and 18: ingest continues from the slot a standby synchronized, or refuses (real servers).

A primary and a physical standby of it (a cold copy of its data directory; the bundled majors
have no pg_basebackup) on PostgreSQL 17, the first with failover slots, and on 18, the newest
(scripts/pg_versions.sh). Ingest creates its slot as a
failover slot; the primary lists the standby's physical slot in `synchronized_standby_slots`, so
no change reaches ingest before the standby has it. The primary is killed (SIGKILL), the standby
promoted, and ingest pointed at it. With `sync_replication_slots = on` the standby holds the slot,
and bronze must end with every committed change exactly once, equal to the promoted server's rows.
Without it the promoted server has no slot: ingest must refuse with the recovery steps, never
stream from the promoted server's present.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.errors import SlotGapError
from ingest.events import lsn_to_int
from tests.helpers.delta_rows import read
from tests.helpers.pg import PgSource, bronze_events, capture_once, prepare
from tests.helpers.scratch_pg import ScratchCluster

pytestmark = pytest.mark.integration

FAILOVER_MAJORS = (17, 18)  # the first with failover slots, and the newest
PRIMARY_PORT, STANDBY_PORT = 25387, 25388
STANDBY_SLOT = "changelake_failover_standby"
SYNC_TIMEOUT_S = 30
TABLES_SQL = "create table acct (id int primary key, owner text)"


def _slot(dsn: str, slot: str) -> dict[str, Any] | None:
    """The slot's row of pg_replication_slots on the server at `dsn`, as a dict; None when it has none."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("select to_jsonb(s) from pg_replication_slots s where slot_name = %s", (slot,)).fetchone()
    return None if row is None else dict(row[0])


@pytest.fixture(params=FAILOVER_MAJORS, ids=[f"pg{m}" for m in FAILOVER_MAJORS])
def major(request: pytest.FixtureRequest) -> int:
    """The PostgreSQL major of the pair (a missing one fails the test, as in test_pg_versions: never a skip)."""
    return int(request.param)


@pytest.fixture
def pair(request: pytest.FixtureRequest, major: int) -> Iterator[tuple[ScratchCluster, ScratchCluster]]:
    """A primary of `major` and its standby; the standby synchronizes failover slots if `request.param`."""
    primary = ScratchCluster(PRIMARY_PORT, major=major)
    standby: ScratchCluster | None = None
    try:
        with psycopg.connect(primary.dsn) as c:
            assert c.info.server_version // 10000 == major
        sync = ["sync_replication_slots = on"] if request.param else []
        standby = ScratchCluster.standby_of(primary, STANDBY_PORT, STANDBY_SLOT, sync)
        # Set after the copy: a promoted standby that named its own (missing) slot here would hold
        # every logical walsender back.
        with psycopg.connect(primary.dsn, autocommit=True) as c:
            c.execute(f"alter system set synchronized_standby_slots = '{STANDBY_SLOT}'")
            c.execute("select pg_reload_conf()")
        yield primary, standby
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()


def _sync(s: PgSource, standby: ScratchCluster, warehouse: Path, src: Any) -> dict[str, Any]:
    """Capture until the standby holds the slot synchronized, persistent, and confirmed as far as the primary's.

    The standby keeps its copy temporary (and drops it at promotion) until the primary's slot has
    advanced past the catalog horizon the standby could reserve; the primary's slot gets there by
    decoding a running-transactions record (logged every 15 s on a busy server; here on demand)
    and confirming past it. The sync worker naps up to 30 s when nothing changed; a configuration
    reload wakes it.
    """
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        on_primary = _slot(s.dsn, src.slot_name)
        assert on_primary is not None
        row = _slot(standby.dsn, src.slot_name)
        if (
            row is not None
            and row["synced"]
            and not row["temporary"]
            and row["confirmed_flush_lsn"] is not None
            and lsn_to_int(row["confirmed_flush_lsn"]) >= lsn_to_int(on_primary["confirmed_flush_lsn"])
        ):
            return row
        assert time.monotonic() < deadline, f"the standby did not synchronize slot {src.slot_name}: {row}"
        s.execute("select pg_log_standby_snapshot()")
        capture_once(warehouse, src)
        with psycopg.connect(standby.dsn, autocommit=True) as c:
            c.execute("select pg_reload_conf()")
        time.sleep(0.2)


def _captured(primary: ScratchCluster, warehouse: Path, dsn: str | None = None) -> tuple[PgSource, Any]:
    """A source on the primary whose slot exists and whose first three inserts bronze holds.

    `dsn`: what ingest connects with (default the primary's).
    """
    s = PgSource(primary.dsn, TABLES_SQL, ["acct"])
    src = s.config().model_copy(update={"dsn": dsn or primary.dsn})
    prepare(src)
    s.execute("insert into acct values (1, 'a'), (2, 'b'), (3, 'c')")
    capture_once(warehouse, src)
    return s, src


def _fail_over(s: PgSource, primary: ScratchCluster, standby: ScratchCluster) -> Any:
    """Kill the primary once the standby has replayed all it flushed, promote the standby, and point `s` there.

    Returns the source's config pointed at the promoted server.
    """
    row = s.conn.execute("select pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    standby.wait_replayed(str(row[0]), SYNC_TIMEOUT_S)
    s.conn.close()
    primary.kill()
    standby.promote()
    s.dsn = standby.dsn
    s.reconnect()
    return s.config()


def _durable(warehouse: Path, source: str) -> int:
    return next(p.durable_lsn for p, _ in BronzeWriter(warehouse).positions(source) if p.writer_id == "stream")


def _changes(warehouse: Path, source: str) -> list[tuple[str, str, Any]]:
    return [
        (e.action, e.record_pk, json.loads(e.record) if e.record else None) for e in bronze_events(warehouse, source)
    ]


def _rows(s: PgSource) -> dict[int, str]:
    return {int(str(i)): str(o) for i, o in s.conn.execute("select id, owner from acct order by id").fetchall()}


def _insert(i: int, owner: str) -> tuple[str, str, Any]:
    return ("insert", f'{{"id":{i}}}', {"id": i, "owner": owner})


@pytest.mark.parametrize("pair", [True], ids=["synced"], indirect=True)
def test_ingest_continues_from_the_synced_slot_after_a_failover(
    pair: tuple[ScratchCluster, ScratchCluster], warehouse: Path
) -> None:
    primary, standby = pair
    # Ingest follows the failover through a multi-host DSN: libpq connects to whichever server accepts writes.
    both = (
        f"postgresql://changelake@127.0.0.1:{PRIMARY_PORT},127.0.0.1:{STANDBY_PORT}/changelake"
        "?target_session_attrs=read-write"
    )
    s, src = _captured(primary, warehouse, both)
    primary_slot = _slot(primary.dsn, src.slot_name)
    assert primary_slot is not None and primary_slot["failover"] is True
    synced = _sync(s, standby, warehouse, src)
    assert synced["failover"] is True
    # The worker syncs every 0.2-30 s, so a promotion may find the slot behind what ingest
    # acknowledged since; pausing it here makes that case certain: the promoted server re-delivers
    # the transactions captured below, and ingest must skip each of them once.
    with psycopg.connect(standby.dsn, autocommit=True) as c:
        c.execute("alter system set sync_replication_slots = off")
        c.execute("select pg_reload_conf()")
    s.execute("update acct set owner = 'b2' where id = 2")
    s.execute("delete from acct where id = 3")
    s.execute("insert into acct values (4, 'd'), (5, 'e')")
    capture_once(warehouse, src)  # acknowledged on the primary only
    durable = _durable(warehouse, s.name)
    s.execute("insert into acct values (6, 'f')")  # committed, never captured from the primary
    s.execute("update acct set owner = 'd2' where id = 4")
    _fail_over(s, primary, standby)
    behind = _slot(standby.dsn, src.slot_name)
    assert behind is not None and behind["confirmed_flush_lsn"] == synced["confirmed_flush_lsn"]
    assert lsn_to_int(behind["confirmed_flush_lsn"]) < durable  # re-delivers what bronze holds
    s.execute("delete from acct where id = 1")  # the application writes on the promoted server

    capture_once(warehouse, src)  # the same config: its DSN leads to the promoted server now

    assert _changes(warehouse, s.name) == [
        _insert(1, "a"),
        _insert(2, "b"),
        _insert(3, "c"),
        ("update", '{"id":2}', {"id": 2, "owner": "b2"}),
        ("delete", '{"id":3}', None),
        _insert(4, "d"),
        _insert(5, "e"),
        _insert(6, "f"),
        ("update", '{"id":4}', {"id": 4, "owner": "d2"}),
        ("delete", '{"id":1}', None),
    ]
    events = bronze_events(warehouse, s.name)
    assert len({(e.commit_lsn, e.commit_index) for e in events}) == len(events)  # each change once
    # Last change wins per key: bronze folds to exactly the promoted server's rows.
    folded: dict[int, str] = {}
    for e in events:
        key = json.loads(e.record_pk)["id"]
        if e.action == "delete":
            folded.pop(key, None)
        else:
            folded[key] = json.loads(e.record)["owner"]
    assert folded == _rows(s)
    after = _slot(standby.dsn, src.slot_name)
    acked = [p.ack_lsn for p in read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")]
    assert after is not None and events[-1].end_lsn <= lsn_to_int(after["confirmed_flush_lsn"]) <= acked[0]
    s.drop()


@pytest.mark.parametrize("pair", [False], ids=["unsynced"], indirect=True)
def test_a_failover_to_a_standby_without_the_slot_is_refused_with_the_recovery(
    pair: tuple[ScratchCluster, ScratchCluster], warehouse: Path
) -> None:
    primary, standby = pair
    s, src = _captured(primary, warehouse)
    s.execute("insert into acct values (4, 'd')")
    promoted = _fail_over(s, primary, standby)
    assert _slot(standby.dsn, src.slot_name) is None  # never synchronized
    before = _changes(warehouse, s.name)
    with pytest.raises(SlotGapError, match=r"past what bronze acknowledged.*promoted standby.*on_history_lost"):
        capture_once(warehouse, promoted)
    assert _changes(warehouse, s.name) == before  # nothing streamed from the promoted server's present

    # The recovery the error names: every table snapshotted whole from the promoted server, no truncate.
    capture_once(warehouse, promoted.model_copy(update={"on_history_lost": "resnapshot"}), snapshots=True)
    assert not [e for e in bronze_events(warehouse, s.name) if e.message_prefix == "changelake.historyLost"]
    pages = read(
        warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0 and table_snapshot is not null"
    )
    assert {json.loads(p.record)["id"]: json.loads(p.record)["owner"] for p in pages} == _rows(s)
    s.drop()
