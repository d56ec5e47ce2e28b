"""A source whose history does not continue where bronze left off is detected, never skipped (real servers).

A database restored from a storage snapshot (here: a copy of the stopped data directory) comes
back with its slot where the copy had it, behind what bronze holds; once it has written past
bronze's position, nothing about positions looks wrong. Its new transactions at positions bronze
already holds used to be skipped as re-delivered, silently, and bronze's rows of the history that
no longer exists stayed live. A slot that went backwards in the same history (a crash before the
acknowledgement reached the server, or an older copy of the slot) must still just re-deliver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.errors import SlotGapError
from tests.helpers.delta_rows import read
from tests.helpers.pg import PgSource, bronze_events, capture_once, prepare
from tests.helpers.scratch_pg import ScratchCluster, copy_data_dir

pytestmark = pytest.mark.integration

PORT = 25347


@pytest.fixture
def scratch() -> Iterator[ScratchCluster]:
    cluster = ScratchCluster(PORT)
    yield cluster
    cluster.remove()


def restored_past_bronze(
    scratch: ScratchCluster, tmp_path: Path, warehouse: Path, lost: int = 3, lost_transactions: int = 1
) -> tuple[PgSource, Any, int]:
    """Bronze holds ids 1-`lost` of a history the source no longer has: it was restored from a copy
    taken before them, and has since written ids 101-103 and enough else to pass bronze's position
    (four transactions: the restored server hands out again the xids of the first four lost ones).
    """
    s = PgSource(
        scratch.dsn, "create table acct (id int primary key, owner text); create table filler (pad text)", ["acct"]
    )
    src = s.config()
    prepare(src)
    capture_once(warehouse, src)  # registered, nothing yet
    s.conn.close()
    pgdata = scratch.state / "pgdata"
    scratch.stop()
    copy_data_dir(pgdata, tmp_path / "copy")
    scratch.start()
    s.reconnect()
    per = -(-lost // lost_transactions)
    for first in range(1, lost + 1, per):
        s.execute(
            "insert into acct select g, 'old-' || g from generate_series(%s::int, %s::int) g",
            (first, min(first + per - 1, lost)),
        )
    capture_once(warehouse, src)
    durable = next(p.durable_lsn for p, _ in BronzeWriter(warehouse).positions(s.name) if p.writer_id == "stream")
    s.conn.close()
    scratch.stop()
    copy_data_dir(tmp_path / "copy", pgdata)  # the restore
    scratch.start()
    s.reconnect()
    for i in (101, 102, 103):
        s.execute("insert into acct values (%s, %s)", (i, f"new-{i}"))
    s.execute("insert into filler select repeat('x', 200) from generate_series(1, 2000)")
    assert s.current_wal() > durable  # past bronze: no position looks wrong
    return s, src, durable


def test_a_restored_source_past_bronze_is_an_error_not_a_silent_skip(
    scratch: ScratchCluster, tmp_path: Path, warehouse: Path
) -> None:
    """A restore whose WAL passed bronze's position had its new transactions skipped as re-delivered."""
    s, src, _ = restored_past_bronze(scratch, tmp_path, warehouse)
    before = [e.record for e in bronze_events(warehouse, s.name)]
    with pytest.raises(SlotGapError, match=r"does not re-deliver what bronze holds.*restored.*on_history_lost"):
        capture_once(warehouse, src)
    assert [e.record for e in bronze_events(warehouse, s.name)] == before  # nothing skipped, nothing written
    s.conn.close()


def test_a_restored_source_with_resnapshot_is_snapshotted_again_without_a_tombstone(
    scratch: ScratchCluster, tmp_path: Path, warehouse: Path
) -> None:
    """The restored server ran its own transactions under every xid of the lost one: its snapshots see
    them all as committed, so the pages and the search for absent keys place the lost history below
    the snapshot, and silver needs no truncate (ids 1-3 are found absent).
    """
    s, src, durable = restored_past_bronze(scratch, tmp_path, warehouse)
    src = src.model_copy(update={"on_history_lost": "resnapshot"})
    before = bronze_events(warehouse, s.name)
    capture_once(warehouse, src, snapshots=True)
    assert bronze_events(warehouse, s.name) == before
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert [json.loads(p.record)["id"] for p in pages] == [101, 102, 103]
    assert all(p.table_snapshot is not None and p.high_watermark_lsn > durable for p in pages)
    s.execute("insert into acct values (104, 'new-104')")
    capture_once(warehouse, src)
    assert bronze_events(warehouse, s.name)[-1].record == '{"id":104,"owner":"new-104"}'
    s.conn.close()


def test_a_restored_source_behind_the_lost_xids_is_tombstoned_and_snapshotted_again(
    scratch: ScratchCluster, tmp_path: Path, warehouse: Path
) -> None:
    """Bronze holds transactions under xids the restored server has not handed out yet: a page would
    count them as changes it could not see (dropping its row, or leaving a lost key live), so the
    recovery truncates every table below the new slot's start before the snapshots, as it always did.
    """
    s, src, durable = restored_past_bronze(scratch, tmp_path, warehouse, lost=30, lost_transactions=30)
    src = src.model_copy(update={"on_history_lost": "resnapshot"})
    capture_once(warehouse, src, snapshots=True)
    events = bronze_events(warehouse, s.name)
    tombstone = events[-1]
    assert (tombstone.action, tombstone.message_prefix) == ("truncate", "changelake.historyLost")
    assert list(tombstone.truncated_tables) == [f"{s.schema}.acct"]
    assert tombstone.commit_lsn >= durable  # after everything of the old history
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    assert [json.loads(p.record)["id"] for p in pages] == [101, 102, 103]
    assert all(p.high_watermark_lsn > tombstone.commit_lsn for p in pages)
    s.conn.close()


def test_a_slot_behind_bronze_in_the_same_history_re_delivers_without_error(warehouse: Path, make_source: Any) -> None:
    """The history check must not mistake an ordinary re-delivery (a slot behind bronze) for a restore."""
    s = make_source("create table items (id int primary key)", ["items"])
    src = s.config()
    prepare(src)
    behind = f"behind_{s.suffix}"
    s.execute("select pg_copy_logical_replication_slot(%s, %s)", (src.slot_name, behind))
    for i in range(1, 4):
        s.execute("insert into items values (%s)", (i,))
    s.execute("insert into items select g from generate_series(10, 60) g")
    capture_once(warehouse, src)
    # 54 rows and the first run's drain marker, and a heartbeat when the run was slow enough to emit one.
    first_run = bronze_events(warehouse, s.name, with_messages=True)
    assert len([e for e in first_run if e.action != "message"]) == 54
    # The copy still starts before all of it: the stream is pointed at it, as after a restart
    # whose acknowledgement never reached the server.
    cap = capture_once(warehouse, src.model_copy(update={"slot": behind}))
    assert cap.skipped == len(first_run)  # every event of the first run, all in bronze already
    ids = [json.loads(e.record)["id"] for e in bronze_events(warehouse, s.name)]
    assert ids == [1, 2, 3, *range(10, 61)]
