"""LSN text <-> integer, and the Delta txnAppId/txnVersion of positions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ingest.bronze.writer import TXN_INDEX_BITS, TXN_MAX_LSN, txn_identity
from ingest.events import int_to_lsn, lsn_to_int


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_lsn_round_trip(v: int) -> None:
    assert lsn_to_int(int_to_lsn(v)) == v


def test_lsn_known_value() -> None:
    assert lsn_to_int("16/B374D848") == (0x16 << 32) | 0xB374D848


_POSITIONS = st.one_of(
    # Postgres below 8 TiB of WAL (the packing tables written before txn_identity have)
    st.tuples(st.integers(0, TXN_MAX_LSN - 1), st.integers(0, (1 << TXN_INDEX_BITS) - 1)),
    # MongoDB clusterTimes (seconds << 32 | increment), Postgres past 8 TiB, huge transactions
    st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 32) - 1)),
    # near the boundaries, so equal epochs and equal LSNs are drawn often
    st.tuples(
        st.sampled_from([0, TXN_MAX_LSN - 1, TXN_MAX_LSN, 7_300_000_000_000_000_000, (1 << 64) - 1]),
        st.sampled_from([0, 1, (1 << TXN_INDEX_BITS) - 1, 1 << TXN_INDEX_BITS, (1 << 32) - 1]),
    ),
)


@given(_POSITIONS, _POSITIONS)
def test_txn_identity_orders_like_positions_within_an_app_id(a: tuple[int, int], b: tuple[int, int]) -> None:
    """Every position gets a Delta txnVersion (C8); within one txnAppId versions follow positions."""
    (app_a, va), (app_b, vb) = txn_identity("s/w", *a), txn_identity("s/w", *b)
    assert 0 <= va < 1 << 63 and 0 <= vb < 1 << 63  # Delta's txnVersion is a signed long
    if a == b:
        assert (app_a, va) == (app_b, vb)
    elif app_a == app_b:
        assert (va < vb) == (a < b)


@given(st.tuples(st.integers(0, TXN_MAX_LSN - 1), st.integers(0, (1 << TXN_INDEX_BITS) - 1)))
def test_txn_identity_keeps_the_packing_of_existing_tables(p: tuple[int, int]) -> None:
    assert txn_identity("s/w", *p) == ("s/w", (p[0] << TXN_INDEX_BITS) | p[1])
