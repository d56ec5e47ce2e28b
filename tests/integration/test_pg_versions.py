"""Every supported PostgreSQL major, 14 to 18, captured into bronze the same way (docs/postgres.md).

Each major runs in a throwaway cluster of its own (scripts/pg_versions.sh fetches the non-Debian
ones at setup): the publication and slot are created, a workload of inserts, an update, a delete
and a truncate runs beside a table that held rows before the slot existed, and one `--once` run
with snapshots writes bronze. Bronze must then hold exactly the workload's events, each carrying
the xid and a commit position inside the window its transaction committed in, and the snapshot
pages the tables' rows; the slot confirms no more than bronze recorded. Per major, what the server
offers is checked too: the failover flag on the slot from 17, and from 18 a stored generated
column's values in the stream and in snapshots alike (before 18 the column is in neither).
PostgreSQL 13, whose pgoutput cannot send logical messages, is refused before anything is created.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.errors import SourceError
from ingest.events import lsn_to_int
from tests.helpers.delta_rows import read
from tests.helpers.pg import PgSource, bronze_events, capture_once, prepare
from tests.helpers.scratch_pg import ScratchCluster

pytestmark = pytest.mark.integration

DEBIAN_MAJOR = 15  # scripts/pg.sh's PostgreSQL; every other major comes from scripts/pg_versions.sh
SUPPORTED = [14, DEBIAN_MAJOR, 16, 17, 18]
REFUSED = 13
PORT_BASE = 25400  # major 13 listens on 25413, ... (free of the other scratch clusters' ports)
FAILOVER_SLOTS_MAJOR = 17
GENERATED_COLUMNS_MAJOR = 18
TABLES_SQL = (
    "create table items (id int primary key, v text);"
    "create table other (id int primary key);"
    "create table pre (id int primary key, v text);"
    "create table gen (id int primary key, n int, twice int generated always as (n * 2) stored)"
)


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[int, ScratchCluster]]:
    major: int = request.param
    c = ScratchCluster(PORT_BASE + major, major=None if major == DEBIAN_MAJOR else major)
    try:
        yield major, c
    finally:
        c.remove()


class Workload:
    """Runs transactions and records, for each, its xid and the WAL window its commit fell in."""

    def __init__(self, source: PgSource) -> None:
        self.source = source
        self.transactions: list[tuple[int, int, int]] = []  # (xid, WAL position before, after)

    def _lsn(self) -> int:
        row = self.source.conn.execute("select pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return lsn_to_int(str(row[0]))

    def transaction(self, *statements: str) -> None:
        before = self._lsn()
        with self.source.conn.transaction():
            row = self.source.conn.execute("select txid_current()").fetchone()
            assert row is not None
            for statement in statements:
                self.source.execute(statement)
        self.transactions.append((int(str(row[0])), before, self._lsn()))


@pytest.mark.parametrize("cluster", SUPPORTED, ids=[f"pg{m}" for m in SUPPORTED], indirect=True)
def test_capture_is_the_same_on_every_major(cluster: tuple[int, ScratchCluster], tmp_path: Path) -> None:
    major, pg = cluster
    s = PgSource(pg.dsn, TABLES_SQL, ["items", "other", "pre", "gen"])
    try:
        (version,) = s.conn.execute("select current_setting('server_version_num')::int").fetchone() or (0,)
        assert int(str(version)) // 10000 == major
        s.execute("insert into pre values (1, 'a'), (2, 'b'), (3, 'c')")
        s.execute("insert into gen (id, n) values (1, 10)")
        src = s.config()
        prepare(src)
        w = Workload(s)
        w.transaction("insert into items values (1, 'a'), (2, 'b'), (3, 'c')")
        w.transaction("update items set v = 'b2' where id = 2", "delete from items where id = 3")
        w.transaction("insert into other values (1), (2)")
        w.transaction("truncate other")
        w.transaction("update pre set v = 'a2' where id = 1")
        w.transaction("insert into gen (id, n) values (2, 20)", "update gen set n = 11 where id = 1")
        warehouse = tmp_path / "warehouse"
        capture_once(warehouse, src, snapshots=True)

        def gen(key: int, n: int) -> dict[str, int]:
            """A row of `gen` as captured: with its generated column where the server publishes it."""
            return {"id": key, "n": n} | ({"twice": 2 * n} if major >= GENERATED_COLUMNS_MAJOR else {})

        events = bronze_events(warehouse, s.name)
        got = [
            (
                e.table_name,
                e.action,
                e.record_pk,
                json.loads(e.record) if e.record else None,
                sorted(e.truncated_tables or []),
            )
            for e in events
        ]
        assert got == [
            ("items", "insert", '{"id":1}', {"id": 1, "v": "a"}, []),
            ("items", "insert", '{"id":2}', {"id": 2, "v": "b"}, []),
            ("items", "insert", '{"id":3}', {"id": 3, "v": "c"}, []),
            ("items", "update", '{"id":2}', {"id": 2, "v": "b2"}, []),
            ("items", "delete", '{"id":3}', None, []),
            ("other", "insert", '{"id":1}', {"id": 1}, []),
            ("other", "insert", '{"id":2}', {"id": 2}, []),
            ("other", "truncate", None, None, [f"{s.schema}.other"]),
            ("pre", "update", '{"id":1}', {"id": 1, "v": "a2"}, []),
            ("gen", "insert", '{"id":2}', gen(2, 20), []),
            ("gen", "update", '{"id":1}', gen(1, 11), []),
        ]
        # Positions: one commit position and xid per transaction, inside the window it committed in.
        per_transaction = [3, 2, 2, 1, 1, 2]
        starts = [sum(per_transaction[:i]) for i in range(len(per_transaction))]
        for (xid, before, after), start, n in zip(w.transactions, starts, per_transaction, strict=True):
            mine = events[start : start + n]
            assert {e.xid for e in mine} == {xid}
            assert len({e.commit_lsn for e in mine}) == 1
            assert before < mine[0].commit_lsn < after
            assert [e.commit_index for e in mine] == list(range(n))

        pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}'", "table_name, row_index")
        rows = [(p.table_name, json.loads(p.record)) for p in pages if p.row_index >= 0]  # by table, key
        assert rows == [
            ("gen", gen(1, 11)),
            ("gen", gen(2, 20)),
            ("items", {"id": 1, "v": "a"}),
            ("items", {"id": 2, "v": "b2"}),
            ("pre", {"id": 1, "v": "a2"}),
            ("pre", {"id": 2, "v": "b"}),
            ("pre", {"id": 3, "v": "c"}),
        ]
        assert {p.table_name for p in pages if p.row_index == -1} == {"other"}  # an empty table's marker

        acked = [p.ack_lsn for p in read(warehouse / "bronze" / "stream_positions", f"source = '{s.name}'")]
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            slot = c.execute(
                "select confirmed_flush_lsn::text, to_jsonb(s) -> 'failover' from pg_replication_slots s "
                "where slot_name = %s",
                (src.slot_name,),
            ).fetchone()
        assert slot is not None and len(acked) == 1
        # The slot confirmed the workload, and nothing beyond what bronze recorded as acknowledged.
        assert events[-1].end_lsn <= lsn_to_int(str(slot[0])) <= acked[0]
        # A failover slot is synchronized to standbys that ask for it (17+); older servers have no such flag.
        failover: Any = slot[1]
        assert failover is (True if major >= FAILOVER_SLOTS_MAJOR else None)
    finally:
        s.drop()


@pytest.mark.parametrize("cluster", [REFUSED], ids=[f"pg{REFUSED}"], indirect=True)
def test_an_unsupported_major_is_refused_before_anything_is_created(cluster: tuple[int, ScratchCluster]) -> None:
    """On 13 the stream died at START_REPLICATION ("unrecognized pgoutput option: messages") after the
    publication and slot had been created; now setup says which majors work and touches nothing."""
    _major, pg = cluster
    s = PgSource(pg.dsn, TABLES_SQL, ["items"])
    try:
        with pytest.raises(SourceError, match=r"PostgreSQL 13\.\d+ is not supported: ingest needs 14 or newer"):
            prepare(s.config())
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            assert c.execute("select count(*) from pg_replication_slots").fetchone() == (0,)
            assert c.execute("select count(*) from pg_publication").fetchone() == (0,)
    finally:
        s.drop()
