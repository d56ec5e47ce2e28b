"""Block ranges of a large keyless table's snapshot: where each range starts and ends."""

from __future__ import annotations

from ingest.sources.postgres.pages import MAX_TID_OFFSET, cursor_block
from ingest.sources.postgres.snapshot import block_cuts, range_start


def test_blocks_are_cut_into_equal_spans_without_empty_or_repeated_ranges() -> None:
    assert block_cuts(90, 3) == [30, 60]
    assert block_cuts(100, 4) == [25, 50, 75]
    assert block_cuts(2, 4) == [1]  # fewer blocks than ranges: one range a block
    assert block_cuts(1, 4) == []  # a table of one block is not cut
    assert block_cuts(0, 4) == []
    assert block_cuts(90, 1) == []


def test_a_range_pages_from_its_first_block() -> None:
    """A range's lower bound is after every row of the block before it: its first page reads its first block."""
    (tid,) = range_start(30)
    assert tid == f"(29,{MAX_TID_OFFSET})"
    assert cursor_block(tid) == 30
