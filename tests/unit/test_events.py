"""LSN text <-> integer, and the Delta txnVersion packing of positions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ingest.bronze.writer import TXN_INDEX_BITS, txn_version
from ingest.events import int_to_lsn, lsn_to_int


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_lsn_round_trip(v: int) -> None:
    assert lsn_to_int(int_to_lsn(v)) == v


def test_lsn_known_value() -> None:
    assert lsn_to_int("16/B374D848") == (0x16 << 32) | 0xB374D848


@given(
    st.tuples(st.integers(0, 1 << 40), st.integers(0, (1 << TXN_INDEX_BITS) - 1)),
    st.tuples(st.integers(0, 1 << 40), st.integers(0, (1 << TXN_INDEX_BITS) - 1)),
)
def test_txn_version_orders_like_positions(a: tuple[int, int], b: tuple[int, int]) -> None:
    va, vb = txn_version(*a), txn_version(*b)
    assert va is not None and vb is not None
    assert (va < vb) == (a < b)
