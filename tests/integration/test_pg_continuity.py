"""The slot must continue where bronze left off (review findings D2 and W7), on a real server.

A slot that was dropped and recreated (or invalidated and recreated, or advanced by someone
else) starts past what ingest acknowledged; a source restored from a backup, or failed over to a
replica that was behind, has a WAL position behind bronze. On main both were silent: a missing
slot was recreated and streaming went on over the gap.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ingest.errors import SlotGapError
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, drop_slot, prepare

pytestmark = pytest.mark.integration


def _gap(s: Any, warehouse: Path) -> Any:
    """Ids 1-3 in bronze; then the slot is dropped, id 1 deleted and id 4 inserted while none exists."""
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1), (2), (3)")
    capture_once(warehouse, src)
    drop_slot(s.conn, src.slot_name)
    s.execute("delete from items where id = 1")
    s.execute("insert into items values (4)")
    return src


def test_a_recreated_slot_is_an_error_that_names_the_recovery(warehouse: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key)", ["items"])
    src = _gap(s, warehouse)
    with pytest.raises(SlotGapError, match=r"dropped and recreated.*on_history_lost: resnapshot"):
        capture_once(warehouse, src)
    assert [e.record for e in bronze_events(warehouse, s.name)] == ['{"id":1}', '{"id":2}', '{"id":3}']


def test_resnapshot_snapshots_the_tables_again_past_the_new_slot_without_a_tombstone(
    warehouse: Path, make_source: Any
) -> None:
    """The recovery used to truncate every table first: silver deleted every record and created it again."""
    s = make_source("create table items (id int primary key)", ["items"])
    src = _gap(s, warehouse).model_copy(update={"on_history_lost": "resnapshot"})
    streamed = bronze_events(warehouse, s.name)
    capture_once(warehouse, src, snapshots=True)
    assert bronze_events(warehouse, s.name) == streamed  # no tombstone: the snapshot's absent rows delete id 1
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    # Id 1, deleted during the gap, is in no page: silver's search for absent keys tombstones it.
    assert [json.loads(p.record)["id"] for p in pages] == [2, 3, 4]
    assert all(p.table_snapshot is not None for p in pages)  # a whole-table snapshot, searched for absent keys
    assert all(p.high_watermark_lsn > streamed[-1].commit_lsn for p in pages)
    s.execute("insert into items values (5)")
    capture_once(warehouse, src)  # the stream goes on from the new slot
    assert bronze_events(warehouse, s.name)[-1].record == '{"id":5}'


def test_resnapshot_tombstones_a_table_that_cannot_be_snapshotted(warehouse: Path, make_source: Any) -> None:
    """A partitioned table without a key is captured (REPLICA IDENTITY FULL) but read by no snapshot: its
    partitions' CTIDs repeat. Its records cannot be mended, so it keeps the truncate; the others do not.
    """
    s = make_source(
        "create table items (id int primary key);"
        "create table notes (v text, region text) partition by list (region);"
        "create table notes_eu partition of notes for values in ('eu');"
        "alter table notes replica identity full; alter table notes_eu replica identity full",
        ["items", "notes"],
    )
    src = _gap(s, warehouse).model_copy(update={"on_history_lost": "resnapshot"})
    capture_once(warehouse, src, snapshots=True)
    tombstone = bronze_events(warehouse, s.name)[-1]
    assert (tombstone.action, tombstone.message_prefix) == ("truncate", "changelake.historyLost")
    assert list(tombstone.truncated_tables) == [f"{s.schema}.notes"]


def test_a_server_behind_bronze_is_an_error_that_says_it_was_restored(warehouse: Path, make_source: Any) -> None:
    from ingest.bronze.writer import BronzeWriter
    from ingest.events import WriterKind, WriterPosition

    s = make_source("create table items (id int primary key)", ["items"])
    src = s.config()
    prepare(src)
    capture_once(warehouse, src)
    ahead = 1 << 60  # bronze holds positions this server has not reached: it is not the server bronze read
    BronzeWriter(warehouse).raise_position(
        WriterPosition(s.name, "stream", WriterKind.STREAM, ahead, ahead), datetime.now(UTC)
    )
    with pytest.raises(SlotGapError, match=r"behind what bronze already holds.*restored or failed over"):
        capture_once(warehouse, src)
