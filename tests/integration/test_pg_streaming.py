"""Large transactions streamed while in progress (protocol 2) land in bronze exactly as protocol 1 lands them.

One workload, two slots made before it, the walsender's `logical_decoding_work_mem` at its 64 kB
minimum (a DSN option): a transaction far larger than that with a savepoint rolled back inside it
(another session commits meanwhile), and a large transaction that aborts. Captured once with
streaming on and once with it off, bronze holds the same rows; the server spilled nothing to its
disk for the streaming slot and did spill for the other (so the check can fail). The comparison
runs on the shared cluster (15) and on 14 and 18 (throwaway clusters, scripts/pg_versions.sh): the
first major with streaming and the newest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.bronze import pending
from ingest.bronze.pending import PendingRows
from ingest.capture.batcher import TransactionBatcher
from ingest.config import PostgresSource
from ingest.sources.postgres import replication
from ingest.sources.postgres.streamed import SPILL_BYTES, StreamedTransactions
from tests.helpers.pg import PgSource, bronze_events, capture_once, confirmed_flush, prepare
from tests.helpers.scratch_pg import ScratchCluster

ROWS = 5000
PREFIX = "test.streaming"
LOW_WORK_MEM = "options=-c%20logical_decoding_work_mem%3D64kB"
SHARED_MAJOR = 15  # scripts/pg.sh's cluster, CHANGELAKE_PG_DSN
EQUALITY_MAJORS = [14, SHARED_MAJOR, 18]  # the first with streaming, the suite's, the newest
PORT_BASE = 25470  # major 14 listens on 25484, 18 on 25488 (free of the other scratch clusters' ports)
STATS_WAIT_S = 5.0  # the walsender reports a slot's counters as it decodes (on 14 through the collector)


@pytest.fixture
def dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """The shared cluster's DSN (the default, and for its major), else a throwaway cluster's of that major."""
    major = int(getattr(request, "param", SHARED_MAJOR))
    if major == SHARED_MAJOR:
        shared = os.environ.get("CHANGELAKE_PG_DSN")
        if not shared:
            pytest.skip("CHANGELAKE_PG_DSN not set")
        yield shared
        return
    cluster = ScratchCluster(PORT_BASE + major, major=major)  # a major not installed errors, never skips
    try:
        with psycopg.connect(cluster.dsn) as c:
            assert c.info.server_version // 10000 == major
        yield cluster.dsn
    finally:
        cluster.remove()


@pytest.fixture
def src(dsn: str) -> Iterator[PgSource]:
    s = PgSource(dsn, "create table items (id int primary key, name text, qty int)", ["items"])
    yield s
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"drop publication if exists changelake_{s.name}_p1")
    s.drop()


def workload(src: PgSource, other: psycopg.Connection[Any]) -> None:
    conn = src.conn
    with conn.transaction():
        src.execute(f"insert into items select g, 'row ' || g, g from generate_series(1, {ROWS}) g")
        other.execute(f"insert into {src.schema}.items values (-1, 'beside', 1)")  # commits meanwhile
        src.execute("savepoint sp")
        src.execute(f"update items set qty = qty + 1000 where id <= {ROWS // 2}")
        src.execute(f"insert into items select g, 'gone', 0 from generate_series({ROWS + 1}, {2 * ROWS}) g")
        src.execute("rollback to savepoint sp")
        src.execute("update items set qty = qty + 1 where id % 3 = 0")
        src.execute("delete from items where id % 7 = 0")
        src.execute("select pg_logical_emit_message(true, %s, 'inside')", (PREFIX,))
    with pytest.raises(psycopg.errors.RaiseException), conn.transaction():
        src.execute(f"insert into items select g, 'aborted', 0 from generate_series(-{ROWS}, -2) g")
        src.execute("do $$ begin raise exception 'abort the large transaction'; end $$")
    other.execute(f"update {src.schema}.items set name = 'after' where id = -1")


def landed(warehouse: Path, source: str) -> list[dict[str, Any]]:
    """The source's bronze rows of this workload, without what differs by run (source name, ingest time)."""
    rows = []
    for r in bronze_events(warehouse, source, with_messages=True):
        if r["action"] == "message" and r["message_prefix"] != PREFIX:
            continue  # drain markers and other tests' messages: every slot of the database sees them
        rows.append({k: v for k, v in r.items() if k not in ("source", "ingested_at")})
    return rows


def slot_stats(dsn: str, slot: str) -> tuple[int, int]:
    """(spill_bytes, stream_txns) once the server has reported the slot's streamed or spilled transaction.

    Read in a new session each time (a session keeps its statistics snapshot), for up to STATS_WAIT_S.
    """
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        with psycopg.connect(dsn) as c:
            row = c.execute(
                "select spill_bytes, stream_txns from pg_stat_replication_slots where slot_name = %s", (slot,)
            ).fetchone()
        if (row is not None and (row[0] > 0 or row[1] > 0)) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert row is not None, f"no statistics for slot {slot}"
    return int(row[0]), int(row[1])


def two_sources(src: PgSource) -> tuple[PostgresSource, PostgresSource]:
    """The same tables captured twice, streaming and with protocol 1, both prepared (the low work
    memory makes the server stream, or without streaming spill, the large transactions)."""
    dsn = src.dsn + ("&" if "?" in src.dsn else "?") + LOW_WORK_MEM
    streaming = PostgresSource(kind="postgres", name=src.name, dsn=dsn, tables=src.tables)
    plain = PostgresSource(kind="postgres", name=f"{src.name}_p1", dsn=dsn, tables=src.tables, streaming=False)
    prepare(streaming)
    prepare(plain)
    return streaming, plain


def count_decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows of streamed transactions decoded as they arrived reach the batcher (one entry each)."""
    seen: list[int] = []
    add_rows = TransactionBatcher.add_rows

    def counted(self: TransactionBatcher, rows: PendingRows, *args: Any) -> None:
        seen.append(rows.rows)
        add_rows(self, rows, *args)

    monkeypatch.setattr(TransactionBatcher, "add_rows", counted)
    return seen


# Held and spilled on the shared cluster; held on the other majors (the server side is what differs there).
EQUALITY_CASES = [
    pytest.param(m, b, id=f"pg{m}-{name}")
    for m in EQUALITY_MAJORS
    for b, name in ((SPILL_BYTES, "held"), (1, "spilled"))
    if m == SHARED_MAJOR or b == SPILL_BYTES
]


@pytest.mark.parametrize(("dsn", "spill_bytes"), EQUALITY_CASES, indirect=["dsn"])
def test_streamed_transactions_land_as_protocol_1_lands_them(
    src: PgSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill_bytes: int
) -> None:
    """Held in memory or spilled to ingest's temporary files from the first change on, the same bronze.

    The large transaction is decoded as its chunks arrive (its rows, not its messages, reach the
    batcher), and its decoded rows are spilled too in the spilled case.
    """
    monkeypatch.setattr(replication, "StreamedTransactions", partial(StreamedTransactions, spill_bytes))
    monkeypatch.setattr(pending, "SPILL_BYTES", spill_bytes)
    decoded = count_decoded(monkeypatch)
    streaming, plain = two_sources(src)
    with psycopg.connect(src.dsn, autocommit=True) as other:
        workload(src, other)

    capture_once(tmp_path / "streaming", streaming)
    assert decoded and decoded[0] > ROWS, "the large transaction was decoded as it arrived"
    capture_once(tmp_path / "plain", plain)

    got, want = landed(tmp_path / "streaming", streaming.name), landed(tmp_path / "plain", plain.name)
    assert len(want) > ROWS, "the large transaction landed"
    assert got == want
    names = {r["record"] for r in got if r["record"] and ("gone" in r["record"] or "aborted" in r["record"])}
    assert not names, "a rolled-back savepoint's or an aborted transaction's rows landed"
    assert [r["message_content"] for r in got if r["action"] == "message"] == ["inside"]

    spilled, streamed = slot_stats(src.dsn, streaming.slot_name)
    assert streamed >= 1 and spilled == 0, "with streaming on the server streams, and spills nothing"
    spilled, streamed = slot_stats(src.dsn, plain.slot_name)
    assert streamed == 0 and spilled > 0, "with streaming off the same workload spills on the server"


def test_a_transaction_open_across_runs_lands_once(src: PgSource, tmp_path: Path) -> None:
    """Chunks held when a run ends are dropped, and the next run gets the transaction again, whole, once.

    The first run streams chunks of a transaction still open and lands one that committed
    meanwhile, but confirms the slot no further than the open one's start; the open one commits
    after the run, and the next run lands it as protocol 1 does (the server streams it again from
    its start; the one committed meanwhile is re-delivered and skipped).
    """
    streaming, plain = two_sources(src)
    with psycopg.connect(src.dsn, autocommit=True) as other:
        with src.conn.transaction():
            src.execute(f"insert into items select g, 'row ' || g, g from generate_series(1, {ROWS}) g")
            other.execute(f"insert into {src.schema}.items values (-1, 'beside', 1)")
            capture_once(tmp_path / "streaming", streaming)
            [beside] = landed(tmp_path / "streaming", streaming.name)
            assert beside["record_pk"] == '{"id":-1}'
            # Confirmed no further than the open transaction's start, before what committed meanwhile.
            assert confirmed_flush(src.dsn, streaming.slot_name) < beside["commit_lsn"]
            src.execute("delete from items where id % 2 = 0")
        capture_once(tmp_path / "streaming", streaming)
    capture_once(tmp_path / "plain", plain)

    got, want = landed(tmp_path / "streaming", streaming.name), landed(tmp_path / "plain", plain.name)
    assert len(want) == 1 + ROWS + ROWS // 2
    assert got == want


def test_schema_changes_inside_streamed_transactions_land_as_protocol_1_lands_them(
    src: PgSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column added inside a large streamed transaction (a second Relation message mid-stream), and a
    type created inside another, land as protocol 1 lands them, paged alike behind the safe bound.

    The first is decoded as it arrives (with the shape each change was written with); the second
    cannot be (a type created by the transaction itself is not in the catalog before its commit)
    and is decoded at its commit from the held messages. Pages of 1,000 events: the cuts, and so
    the rows whose end_lsn is still unknown, are the same.
    """
    decoded = count_decoded(monkeypatch)
    streaming, plain = two_sources(src)
    with src.conn.transaction():
        src.execute(f"insert into items select g, 'row ' || g, g from generate_series(1, {ROWS}) g")
        src.execute("alter table items add column note text")
        src.execute(f"insert into items select g, 'more', g, 'n' || g from generate_series({ROWS + 1}, {2 * ROWS}) g")
        src.execute("update items set note = 'late' where id % 5 = 0")
    with src.conn.transaction():
        src.execute("create type mood as enum ('calm', 'busy')")
        src.execute("alter table items add column m mood")
        src.execute(f"update items set m = 'busy' where id <= {ROWS}")

    capture_once(tmp_path / "streaming", streaming, max_events=1000)
    capture_once(tmp_path / "plain", plain, max_events=1000)

    got, want = landed(tmp_path / "streaming", streaming.name), landed(tmp_path / "plain", plain.name)
    assert len(want) == 2 * ROWS + 2 * ROWS // 5 + ROWS
    assert got == want
    assert sum(r["end_lsn"] is None for r in want) > ROWS, "the large transactions went in pages"
    assert '"note":"n5001"' in got[ROWS]["record"] and '"m":"busy"' in got[-1]["record"]
    assert decoded == [2 * ROWS + 2 * ROWS // 5], "the first was decoded as it arrived, the second was not"
