"""Comparing the transactions a slot re-delivers with bronze's (history.py): where two histories part."""

from __future__ import annotations

import struct

from ingest.sources.postgres.history import _captured, first_difference

RELS = {16384}


def test_the_same_transactions_are_the_same_history() -> None:
    assert first_difference([(100, 7), (200, 8)], [(100, 7), (200, 8)]) is None
    assert first_difference([], []) is None


def test_another_transaction_at_a_position_bronze_holds_is_named() -> None:
    """A restored source reuses bronze's xids and positions for new transactions: either differing is caught."""
    assert first_difference([(100, 7)], [(100, 9)]) == (
        "at 0/64 the server has transaction 9 where bronze holds transaction 7"
    )
    assert "server sends transaction 9 at 0/50, which bronze does not hold" in str(
        first_difference([(100, 7)], [(80, 9), (100, 7)])
    )
    assert "server sends transaction 9 at 0/50" in str(first_difference([], [(80, 9)]))


def test_a_transaction_of_bronze_the_server_never_sends_is_named() -> None:
    assert "bronze's transaction 8 at 0/C8 is not in the server's history" in str(
        first_difference([(100, 7), (200, 8)], [(100, 7)])
    )
    assert "bronze's transaction 7 at 0/64" in str(first_difference([(100, 7)], [(300, 9)]))


def test_only_messages_that_land_in_bronze_count() -> None:
    insert = b"I" + struct.pack(">I", 16384) + b"N..."
    other = b"U" + struct.pack(">I", 99) + b"K..."
    truncate = b"T" + struct.pack(">IB", 2, 0) + struct.pack(">II", 99, 16384)
    assert _captured(insert, RELS) and _captured(truncate, RELS)
    assert not _captured(other, RELS)
    assert _captured(b"M\x01" + bytes(8) + b"p\x00", RELS)  # a transactional logical message
    assert not _captured(b"M\x00" + bytes(8) + b"p\x00", RELS)
