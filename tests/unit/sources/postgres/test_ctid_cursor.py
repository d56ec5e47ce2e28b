"""The CTID cursor of keyless snapshots: where the next page starts, and the writer row that keeps it."""

from __future__ import annotations

from ingest.events import WriterKind, WriterPosition
from ingest.positions import SnapshotProgress
from ingest.sources.postgres.pages import MAX_TID_OFFSET, cursor_block, tid_block


def test_a_cursor_after_a_row_stays_in_its_block_and_one_after_a_whole_block_moves_on() -> None:
    assert tid_block("(12,7)") == 12
    assert cursor_block("(12,7)") == 12  # rows after offset 7 of block 12 may remain
    assert cursor_block(f"(12,{MAX_TID_OFFSET})") == 13


def test_the_writer_row_keeps_the_file_a_ctid_snapshot_reads() -> None:
    """A resumed CTID snapshot must know the file its cursor belongs to (a rewrite moves every row)."""
    p = SnapshotProgress("s.t", "abc", pages=3, until=("40",), bounded=True, relfilenode=16_384)
    pos = WriterPosition("src", p.writer_id, WriterKind.SNAPSHOT, 1, 1, p.to_json())
    back = SnapshotProgress.from_row(pos)
    assert (back.relfilenode, back.until, back.bounded) == (16_384, ("40",), True)
    keyed = SnapshotProgress("s.t", "abc", until=("9",), bounded=True)
    row = WriterPosition("src", keyed.writer_id, WriterKind.SNAPSHOT, 1, 1, keyed.to_json())
    assert SnapshotProgress.from_row(row).relfilenode is None
