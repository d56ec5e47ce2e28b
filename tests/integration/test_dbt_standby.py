"""Capture from a physical standby, through dbt: silver equals the primary (docs/postgres.md).

test_pg_standby checks bronze from a standby against the primary by folding it in Python. Here
the same source (`dsn` the standby's on PostgreSQL 16, the first major that decodes on a standby,
`primary_dsn` the primary's) goes through real dbt, and silver is held to the oracle of the
primary path (tests/helpers/dbt_flow.py): `consumer_records` equals the primary's rows key for key,
its deleted records are exactly the keys that are gone, and `sequin_events` is bronze's change
history once each in position order. Two rounds (`run --once`, then `dbt build`), the second with
updates, deletes, a key change and a truncate-free re-insert, as a scheduled job runs them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers.dbt_flow import assert_event_log_matches_bronze
from tests.helpers.engine import Engine
from tests.helpers.pg import PgSource, bronze_events, capture_once, drop_slot, prepare
from tests.helpers.scratch_pg import ScratchCluster
from tests.helpers.silver import NO_UNIT_TESTS, dbt, silver, source_rows

pytestmark = pytest.mark.integration

STANDBY_MAJOR = 16
PRIMARY_PORT, STANDBY_PORT = 25481, 25482
STANDBY_SLOT = "changelake_standby_dbt"
TABLES_SQL = "create table acct (id int primary key, owner text, balance numeric(12, 2), note text)"


@pytest.fixture
def pair() -> Iterator[tuple[ScratchCluster, ScratchCluster]]:
    primary = ScratchCluster(PRIMARY_PORT, major=STANDBY_MAJOR)
    standby: ScratchCluster | None = None
    try:
        standby = ScratchCluster.standby_of(primary, STANDBY_PORT, STANDBY_SLOT)
        yield primary, standby
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()


def _replayed(s: PgSource, standby: ScratchCluster) -> None:
    row = s.conn.execute("select pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    standby.wait_replayed(str(row[0]))


def _assert_silver_is_the_primary(warehouse: Path, s: PgSource) -> None:
    recs = [r for r in silver(warehouse, "consumer_records") if r.source == s.name]
    live = {r.record_pk: json.loads(r.record) for r in recs if r.table_name == "acct" and not r.deleted}
    expected = source_rows(s, "acct", ["id"])
    assert live == expected
    bronze = bronze_events(warehouse, s.name)
    seen = {e.record_pk for e in bronze if e.record_pk} | {e.old_record_pk for e in bronze if e.old_record_pk}
    deleted = {r.record_pk for r in recs if r.table_name == "acct" and r.deleted}
    assert deleted == seen - set(expected)
    assert_event_log_matches_bronze(silver(warehouse, "sequin_events"), bronze, s)


def test_silver_from_a_standby_source_equals_the_primary(
    pair: tuple[ScratchCluster, ScratchCluster], warehouse: Path, engine: Engine
) -> None:
    primary, standby = pair
    s = PgSource(primary.dsn, TABLES_SQL, ["acct"])
    src = s.config().model_copy(update={"dsn": standby.dsn, "primary_dsn": primary.dsn})
    try:
        s.execute("insert into acct select i, 'o' || i, i * 1.25, repeat('n', i) from generate_series(1, 200) i")
        prepare(src)
        # Changes after the slot: the stream carries them beside the initial snapshot's pages.
        s.execute("update acct set owner = 'moved' where id % 7 = 0")
        s.execute("delete from acct where id % 11 = 0")
        s.execute("insert into acct values (1001, 'late', 9.99, null)")
        _replayed(s, standby)
        capture_once(warehouse, src, snapshots=True)
        dbt(warehouse, "build", *NO_UNIT_TESTS, "--select", "silver")
        _assert_silver_is_the_primary(warehouse, s)

        # Round two: updates, deletes, a key change and a deleted key inserted again.
        s.execute("update acct set balance = balance + 1 where id between 20 and 60")
        s.execute("delete from acct where id between 100 and 120")
        s.execute("update acct set id = 5000 where id = 3")
        s.execute("insert into acct values (22, 'back', 0, 'again')")
        _replayed(s, standby)
        capture_once(warehouse, src, snapshots=True)
        dbt(warehouse, "build", *NO_UNIT_TESTS, "--select", "silver")
        _assert_silver_is_the_primary(warehouse, s)
        with psycopg.connect(primary.dsn) as c:
            assert c.execute("select count(*) from pg_replication_slots where slot_type = 'logical'").fetchone() == (
                0,
            ), "the logical slot belongs on the standby"
    finally:
        s.drop()
        with psycopg.connect(standby.dsn, autocommit=True) as c:
            if c.execute("select 1 from pg_replication_slots where slot_name = %s", (src.slot_name,)).fetchone():
                drop_slot(c, src.slot_name)
