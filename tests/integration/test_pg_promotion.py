"""A source failed over to a standby that was behind bronze is detected, never skipped (real servers).

A physical standby that stopped replaying (here: stopped) while the primary committed what ingest
captured is promoted after the primary is lost. Its history forks below bronze's position; once
the application has written past that position on it, nothing about positions looks wrong. The
standby's logical slot, if it has one, is whatever its data directory held (PostgreSQL 15 does not
keep logical slots up to date on a standby), so it starts behind bronze: the promoted server's new
transactions at positions bronze already holds would be skipped as re-delivered, silently.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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
from tests.helpers.scratch_pg import ScratchCluster, copy_data_dir, matrix_major

pytestmark = pytest.mark.integration

PRIMARY_PORT, STANDBY_PORT = 25361, 25362
CATCH_UP_TIMEOUT_S = 30


@pytest.fixture
def primary() -> Iterator[ScratchCluster]:
    cluster = ScratchCluster(PRIMARY_PORT)
    yield cluster
    cluster.remove()


@pytest.fixture
def standby() -> Iterator[ScratchCluster]:
    """A cluster whose data directory the test replaces with a standby's."""
    cluster = ScratchCluster(STANDBY_PORT)
    yield cluster
    cluster.remove()


def _as_postgres(cmd: list[str]) -> list[str]:
    """Server tools refuse to run as root (as scripts/pg.sh does it)."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _make_standby(primary: ScratchCluster, standby: ScratchCluster, s: PgSource, with_slot: bool) -> None:
    """Replace `standby`'s data directory with a streaming standby of `primary`, and start it.

    `with_slot`: from a cold copy of the stopped primary's data directory, which carries its
    pg_replslot and so the logical slot; else from pg_basebackup, which leaves slots out (on the
    matrix's majors, whose bundles have no pg_basebackup: a cold copy without pg_replslot's slots).
    """
    data = standby.state / "pgdata"
    standby.stop()
    shutil.rmtree(data)
    conninfo = f"host=127.0.0.1 port={PRIMARY_PORT} user=changelake application_name=standby"
    if with_slot or matrix_major() is not None:
        s.conn.close()
        primary.stop()
        copy_data_dir(primary.state / "pgdata", data)
        primary.start()
        s.reconnect()
        if not with_slot:
            for kept in (data / "pg_replslot").iterdir():
                shutil.rmtree(kept)
        (data / "standby.signal").touch()
        recovery = f"primary_conninfo = '{conninfo}'\n"
    else:
        bin_dir = next(p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin")) if (p / "postgres").exists())
        backup = [str(bin_dir / "pg_basebackup"), "-D", str(data), "-d", conninfo, "-R", "-X", "stream", "-c", "fast"]
        subprocess.run(_as_postgres(backup), check=True, capture_output=True)
        recovery = ""  # -R wrote standby.signal and primary_conninfo
    conf = data / "postgresql.conf"
    # hot_standby_feedback: the primary keeps the catalog rows the standby's copy of the slot decodes with.
    conf.write_text(
        conf.read_text()
        + f"port = {STANDBY_PORT}\nunix_socket_directories = '{data}'\nhot_standby_feedback = on\n"
        + recovery
    )
    standby.start()


def _wait_caught_up(s: PgSource, standby: ScratchCluster) -> None:
    """Until the standby has replayed everything the primary has flushed."""
    row = s.conn.execute("select pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    standby.wait_replayed(str(row[0]), CATCH_UP_TIMEOUT_S)


def promoted_past_bronze(
    primary: ScratchCluster, standby: ScratchCluster, warehouse: Path, with_slot: bool
) -> tuple[PgSource, Any, int]:
    """Bronze holds id 0, which the standby has too, and ids 1-3, which it never received: it was
    stopped before them. The primary is lost, the standby promoted, and the application has written
    ids 101-103 and enough else on it to pass bronze's position. Returns the source (connected to
    the promoted server), its config pointed there, and bronze's durable position.
    """
    s = PgSource(
        primary.dsn, "create table acct (id int primary key, owner text); create table filler (pad text)", ["acct"]
    )
    src = s.config()
    prepare(src)
    capture_once(warehouse, src)  # registered, nothing yet
    _make_standby(primary, standby, s, with_slot)
    s.execute("insert into acct values (0, 'both')")
    capture_once(warehouse, src)
    _wait_caught_up(s, standby)
    standby.stop()  # lags from here
    for i in (1, 2, 3):
        s.execute("insert into acct values (%s, %s)", (i, f"lost-{i}"))
    capture_once(warehouse, src)
    durable = next(p.durable_lsn for p, _ in BronzeWriter(warehouse).positions(s.name) if p.writer_id == "stream")
    s.conn.close()
    primary.stop()  # lost
    standby.start()
    with psycopg.connect(standby.dsn, autocommit=True) as c:
        c.execute("select pg_promote(true, 60)")
    s.dsn = standby.dsn
    s.reconnect()
    for i in (101, 102, 103):
        s.execute("insert into acct values (%s, %s)", (i, f"new-{i}"))
    s.execute("insert into filler select repeat('x', 200) from generate_series(1, 2000)")
    assert s.current_wal() > durable  # past bronze: no position looks wrong
    return s, src.model_copy(update={"dsn": standby.dsn}), durable


def _slot_start(s: PgSource, src: Any) -> int | None:
    row = s.conn.execute(
        "select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s", (src.slot_name,)
    ).fetchone()
    return lsn_to_int(str(row[0])) if row is not None else None


def test_a_promoted_standby_that_was_behind_bronze_is_an_error_not_a_silent_skip(
    primary: ScratchCluster, standby: ScratchCluster, warehouse: Path
) -> None:
    """A standby promoted behind bronze, with the slot its data directory carried, had its new
    transactions at positions bronze holds skipped as re-delivered (the dangerous case: its slot
    exists and starts behind bronze).
    """
    s, src, durable = promoted_past_bronze(primary, standby, warehouse, with_slot=True)
    start = _slot_start(s, src)
    assert start is not None and start < durable  # the copy's slot, behind bronze
    before = [e.record for e in bronze_events(warehouse, s.name)]
    with pytest.raises(SlotGapError, match=r"does not re-deliver what bronze holds.*failed over.*on_history_lost"):
        capture_once(warehouse, src)
    assert [e.record for e in bronze_events(warehouse, s.name)] == before  # nothing skipped, nothing written
    assert _slot_start(s, src) == start  # not moved
    s.conn.close()


def test_a_promoted_standby_with_resnapshot_folds_to_the_promoted_servers_rows(
    primary: ScratchCluster, standby: ScratchCluster, warehouse: Path
) -> None:
    s, src, durable = promoted_past_bronze(primary, standby, warehouse, with_slot=True)
    src = src.model_copy(update={"on_history_lost": "resnapshot"})
    before = bronze_events(warehouse, s.name)
    capture_once(warehouse, src, snapshots=True)
    # The promoted server has run its own transactions under the lost ones' xids, so its snapshots
    # place the lost history below them: no truncate, and silver finds ids 1-3 absent.
    assert bronze_events(warehouse, s.name) == before
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert [json.loads(p.record)["id"] for p in pages] == [0, 101, 102, 103]
    assert all(p.table_snapshot is not None and p.high_watermark_lsn > durable for p in pages)
    s.execute("insert into acct values (104, 'new-104')")
    capture_once(warehouse, src)
    assert bronze_events(warehouse, s.name)[-1].record == '{"id":104,"owner":"new-104"}'
    s.conn.close()


def test_a_promoted_standby_without_the_slot_is_a_gap_error(
    primary: ScratchCluster, standby: ScratchCluster, warehouse: Path
) -> None:
    """A standby made by pg_basebackup has no logical slot (PostgreSQL < 17 does not carry them to
    a standby), so ingest's slot check sees one it created just now, past what bronze acknowledged:
    the gap error that names the recovery, never a stream from the promoted server's present.
    """
    s, src, _ = promoted_past_bronze(primary, standby, warehouse, with_slot=False)
    assert _slot_start(s, src) is None
    before = [e.record for e in bronze_events(warehouse, s.name)]
    with pytest.raises(SlotGapError, match=r"past what bronze acknowledged.*recreated.*on_history_lost"):
        capture_once(warehouse, src)
    assert [e.record for e in bronze_events(warehouse, s.name)] == before
    s.conn.close()
