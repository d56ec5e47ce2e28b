"""The checks a standby source's start makes of the standby and of its `primary_dsn` (no server)."""

from __future__ import annotations

import pytest

from ingest.config import PostgresSource
from ingest.errors import SourceError
from ingest.sources.postgres.standby import StandbyRole, check_standby, primary_dsn

SYSTEM = 7_300_000_000_000_000_001
STANDBY_16 = StandbyRole(in_recovery=True, version_num=160004, system_identifier=SYSTEM)
PRIMARY_16 = StandbyRole(in_recovery=False, version_num=160004, system_identifier=SYSTEM)


def _src(primary: str | None = "host=primary dbname=shop") -> PostgresSource:
    return PostgresSource(
        kind="postgres", name="shop", dsn="host=replica dbname=shop", primary_dsn=primary, tables=["public.orders"]
    )


def test_a_standby_of_the_same_system_is_accepted() -> None:
    check_standby(_src(), STANDBY_16, PRIMARY_16)


def test_a_missing_primary_dsn_is_named() -> None:
    with pytest.raises(SourceError, match="is a standby .*set `primary_dsn`"):
        primary_dsn(_src(primary=None))
    assert primary_dsn(_src()) == "host=primary dbname=shop"


@pytest.mark.parametrize(
    ("standby", "primary", "says"),
    [
        (StandbyRole(True, 150008, SYSTEM), PRIMARY_16, "needs PostgreSQL 16 or newer"),
        (STANDBY_16, StandbyRole(True, 160004, SYSTEM), "is a standby too"),
        (STANDBY_16, StandbyRole(False, 160004, SYSTEM + 1), "is not the primary of"),
    ],
    ids=["standby-of-15", "primary-in-recovery", "another-system"],
)
def test_a_standby_that_cannot_be_captured_is_refused(standby: StandbyRole, primary: StandbyRole, says: str) -> None:
    """Each refusal says why: messages written to another system would never reach the slot."""
    with pytest.raises(SourceError, match=says):
        check_standby(_src(), standby, primary)


def test_primary_dsn_must_parse() -> None:
    with pytest.raises(ValueError, match="primary_dsn"):
        _src(primary="postgresql://[broken")
