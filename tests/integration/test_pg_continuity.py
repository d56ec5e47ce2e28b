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


def test_resnapshot_tombstones_the_tables_at_the_new_slot_and_snapshots_them(warehouse: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key)", ["items"])
    src = _gap(s, warehouse).model_copy(update={"on_history_lost": "resnapshot"})
    capture_once(warehouse, src, snapshots=True)
    events = bronze_events(warehouse, s.name)
    tombstone = events[-1]
    assert (tombstone.action, tombstone.message_prefix) == ("truncate", "changelake.historyLost")
    assert list(tombstone.truncated_tables) == [f"{s.schema}.items"]
    assert all(e.commit_lsn < tombstone.commit_lsn for e in events[:-1])
    pages = read(warehouse / "bronze/snapshot_pages", f"source = '{s.name}' and row_index >= 0", "row_index")
    # Id 1, deleted during the gap, stays deleted: the tombstone removes it, the snapshot does not bring it back.
    assert [json.loads(p.record)["id"] for p in pages] == [2, 3, 4]
    assert all(p.high_watermark_lsn > tombstone.commit_lsn for p in pages)
    s.execute("insert into items values (5)")
    capture_once(warehouse, src)  # the stream goes on from the new slot
    assert bronze_events(warehouse, s.name)[-1].record == '{"id":5}'


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
