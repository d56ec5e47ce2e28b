"""gap.widen: a 32-bit xid from pgoutput widened to the 64-bit one nearest a snapshot's xmax."""

from __future__ import annotations

import pytest

from ingest.sources.postgres.gap import widen

EPOCH = 1 << 32


@pytest.mark.parametrize(
    ("xid", "xmax", "wide"),
    [
        (731, 740, 731),  # the server's past
        (760, 740, 760),  # not reached yet: a future xid, never one an epoch back
        (EPOCH - 5, EPOCH + 10, EPOCH - 5),  # before the epoch boundary the server has crossed
        (3, EPOCH - 10, EPOCH + 3),  # after a boundary the server has not crossed yet
        (12, 2 * EPOCH + 20, 2 * EPOCH + 12),
        (20 + (1 << 31) + 1, 20 + EPOCH, 20 + (1 << 31) + 1),  # just under 2^31 back
        (20 + (1 << 31) - 1, 20, 20 + (1 << 31) - 1),  # just under 2^31 ahead
    ],
)
def test_widen_takes_the_nearest_64_bit_xid(xid: int, xmax: int, wide: int) -> None:
    assert widen(xid % EPOCH, xmax) == wide
