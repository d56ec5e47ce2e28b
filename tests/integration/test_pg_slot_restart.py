"""A start after a large streamed transaction does not make the server decode it again and spill it.

The bug: ingest confirms a streamed transaction's commit last (never past an open one's start), so
the restart point PostgreSQL proposed while the transaction ran (its start) waits for that, the
running-transactions records after the commit are dropped meanwhile (one proposal at a time),
and a `run --once` ends with restart_lsn at the transaction's start. The next run's
walsender read the transaction again from there, before the slot's confirmed position, where the
server does not stream, and spilled it to its disk (134 MB and seconds at every second start in
BENCHMARKS.md; bronze was right). Ingest now advances its slot to the slot's own confirmed
position before streaming (restart_point.py): restart_lsn passes the transaction, and the second
run spills nothing. On 15 (the shared cluster), on 14 and 18 (throwaway clusters) and from a 16
standby. The advance is an optimisation: one refused because another session holds the slot
does not stop ingest, and a slot a 17 standby synchronizes from its primary is left alone.

The advance needs a running-transactions record between the commit and the confirmed position; a
`run --once` started right after the commit (the scheduled job's case) has none, and the next run
spilled the transaction all the same. A `--once` run whose slot's restart_lsn lags its drain by a
large transaction's worth of WAL now has the server log one (pg_log_standby_snapshot(), 16+) and
drains past it: restart_lsn passes the transaction within that run (16, 18). On 14/15, and for a
role not allowed the function, the run goes on with a debug line.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.capture.retry import retrying
from ingest.config import BatchConfig, PostgresSource
from ingest.events import int_to_lsn, lsn_to_int
from ingest.progress import Progress
from ingest.sources.postgres.capture import PostgresCapture
from ingest.sources.postgres.replication import ReplicationStream
from ingest.sources.postgres.restart_point import advance_restart_point
from tests.helpers.pg import PgSource, bronze_events, capture_once, confirmed_flush, prepare
from tests.helpers.scratch_pg import ScratchCluster
from tests.integration.test_pg_failover import _captured, _slot, _sync
from tests.integration.test_pg_streaming import LOW_WORK_MEM

pytestmark = pytest.mark.integration

SHARED_MAJOR = 15  # scripts/pg.sh's cluster, CHANGELAKE_PG_DSN
MAJORS = [14, SHARED_MAJOR, 18]  # the first with streaming, the suite's, the newest
LOGGING_MAJORS = [16, 18]  # the first with pg_log_standby_snapshot(), the newest
NOT_LOGGING_MAJORS = [14, SHARED_MAJOR]  # without it
PORT_BASE = 25440  # major 14 listens on 25454, 16 on 25456, 18 on 25458 (free of the other scratch clusters' ports)
PLAIN_ROLE = "changelake_plain"  # REPLICATION, not a superuser: pg_log_standby_snapshot() is not its to call
ROWS = 5000  # far more than the walsender's 64 kB logical_decoding_work_mem
STANDBY_MAJOR = 16  # the first that decodes on a standby
PRIMARY_PORT, STANDBY_PORT = 25459, 25460
STANDBY_SLOT = "changelake_restart_standby"
SYNCED_MAJOR = 17  # the first whose standbys synchronize failover slots
SYNC_PRIMARY_PORT, SYNC_STANDBY_PORT = 25461, 25462
TABLES_SQL = "create table items (id int primary key, name text)"
STATS = ("spill_txns", "spill_bytes", "total_txns")
LOGGER = "ingest.sources.postgres.restart_point"
STATS_WAIT_S = 5.0  # the walsender reports a slot's counters as it decodes (on 14 through the collector)


@pytest.fixture
def dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """The shared cluster's DSN for its major, else a throwaway cluster's."""
    major = int(request.param)
    if major == SHARED_MAJOR:
        shared = os.environ.get("CHANGELAKE_PG_DSN")
        if not shared:
            pytest.skip("CHANGELAKE_PG_DSN not set")
        yield shared
        return
    cluster = ScratchCluster(PORT_BASE + major, major=major)
    try:
        yield cluster.dsn
    finally:
        cluster.remove()


@pytest.fixture
def src(dsn: str) -> Iterator[PgSource]:
    s = PgSource(dsn, TABLES_SQL, ["items"])
    yield s
    s.drop()


def streaming_source(cfg: PostgresSource) -> PostgresSource:
    """`cfg` with the walsender's logical_decoding_work_mem at its minimum (a DSN option), prepared."""
    dsn = cfg.dsn + ("&" if "?" in cfg.dsn else "?") + LOW_WORK_MEM
    low: PostgresSource = cfg.model_copy(update={"dsn": dsn})
    prepare(low)
    return low


def log_running_xacts(conn: psycopg.Connection[Any]) -> None:
    """Have the server WAL-log its running transactions now: pg_log_standby_snapshot() from 16, a checkpoint before."""
    conn.execute("select pg_log_standby_snapshot()" if conn.info.server_version >= 160000 else "checkpoint")


def large_transaction(s: PgSource) -> int:
    """Commit a transaction far larger than the walsender's memory, the way the slot keeps its start; its end.

    Running-transactions records as a busy server writes them: the walsender proposes the first of
    the two before the transaction as the restart point and drops the second (one proposal at a
    time); the first applies when ingest confirms past it while the transaction streams. The
    record inside the transaction then proposes the second (the transaction's start), to apply
    once ingest confirms past that record, that is after the commit; the record after the commit
    is decoded while it waits, and dropped.
    """
    with psycopg.connect(s.dsn, autocommit=True) as other:
        log_running_xacts(other)
        log_running_xacts(other)
        with s.conn.transaction():
            s.execute(f"insert into items select g, 'row ' || g from generate_series(1, {ROWS}) g")
            log_running_xacts(other)
            s.execute(f"insert into items select g, 'more' from generate_series({ROWS + 1}, {2 * ROWS}) g")
        end = s.current_wal()
        log_running_xacts(other)
    return end


def bare_large_transaction(s: PgSource) -> int:
    """Commit a transaction far larger than the walsender's memory, logging no running transactions; its end.

    As a bulk load ingest's scheduled run starts right after: the background writer logs such a
    record only every 15 s, so none is likely to lie between the commit and the run's drain.
    """
    with s.conn.transaction():
        s.execute(f"insert into items select g, 'row ' || g from generate_series(1, {ROWS}) g")
        s.execute(f"insert into items select g, 'more' from generate_series({ROWS + 1}, {2 * ROWS}) g")
    return s.current_wal()


def slot_row(dsn: str, slot: str) -> dict[str, Any]:
    """restart_lsn (an integer), active_pid and the slot's pg_stat_replication_slots counters (0 when unreported)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            f"select s.restart_lsn - '0/0'::pg_lsn, s.active_pid, {', '.join(f'coalesce(t.{k}, 0)' for k in STATS)} "
            "from pg_replication_slots s left join pg_stat_replication_slots t using (slot_name) "
            "where s.slot_name = %s",
            (slot,),
        ).fetchone()
    assert row is not None, f"no slot {slot}"
    return {"restart_lsn": int(row[0]), "active_pid": row[1], **dict(zip(STATS, map(int, row[2:]), strict=True))}


def wait_inactive(dsn: str, slot: str) -> dict[str, Any]:
    """The slot once no walsender holds it (the last run's exits just after the run; a scheduled run starts later)."""
    deadline = time.monotonic() + 10
    while (row := slot_row(dsn, slot))["active_pid"] is not None:
        assert time.monotonic() < deadline, f"slot {slot} still active for PID {row['active_pid']}"
        time.sleep(0.05)
    return row


def stats_after(dsn: str, slot: str, before: dict[str, Any]) -> dict[str, Any]:
    """The slot's row once the server has reported the run's transactions (total_txns moved, then a moment more)."""
    deadline = time.monotonic() + STATS_WAIT_S
    while slot_row(dsn, slot)["total_txns"] == before["total_txns"] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    return slot_row(dsn, slot)


def two_runs_decode_it_once(cfg: PostgresSource, end: int, warehouse: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`run --once` twice after the transaction ending at `end`: the second starts past it and spills nothing.

    From 16 the first run passes the transaction itself (it has the server log its running
    transactions before the run's drain ends); before 16 the second run's start advance does, from
    the record logged after the commit.
    """
    with psycopg.connect(cfg.dsn) as c:
        logs_running_xacts = c.info.server_version >= LOGGING_MAJORS[0] * 10000
    capture_once(warehouse, cfg)
    first = wait_inactive(cfg.dsn, cfg.slot_name)
    assert first["spill_txns"] == 0, "the first run streamed the transaction"
    if logs_running_xacts:
        assert first["restart_lsn"] >= end, "the first run left restart_lsn before the transaction's commit"
    else:
        assert first["restart_lsn"] < end, "the first run left restart_lsn in the transaction (else nothing to test)"
    assert confirmed_flush(cfg.dsn, cfg.slot_name) > end

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        capture_once(warehouse, cfg)
    second = stats_after(cfg.dsn, cfg.slot_name, first)
    assert (second["spill_txns"], second["spill_bytes"]) == (first["spill_txns"], first["spill_bytes"]), (
        "the second run made the server decode the transaction again and spill it"
    )
    assert second["restart_lsn"] >= end
    assert len(bronze_events(warehouse, cfg.name)) == 2 * ROWS, "each row once"
    [line] = [r for r in caplog.records if r.name == LOGGER and "restart point" in r.getMessage()]
    assert line.levelno == logging.DEBUG, "one quiet line"
    moved = re.search(r"restart_lsn=(\S+) moved_bytes=(\d+)", line.getMessage())
    assert moved is not None, line.getMessage()
    assert lsn_to_int(moved[1]) >= end, "before START_REPLICATION, past the transaction"
    if not logs_running_xacts:
        assert int(moved[2]) > 0, "the advance moved it"


@pytest.mark.parametrize("dsn", MAJORS, ids=[f"pg{m}" for m in MAJORS], indirect=True)
def test_the_next_run_after_a_large_streamed_transaction_does_not_decode_it_again(
    src: PgSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix the second run's walsender read the transaction again from its start and spilled it."""
    cfg = streaming_source(src.config())
    end = large_transaction(src)
    two_runs_decode_it_once(cfg, end, tmp_path, caplog)


def test_a_standby_slot_is_advanced_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Capture from a standby (16): its slot decodes the primary's running-transactions records alike."""
    primary = ScratchCluster(PRIMARY_PORT, major=STANDBY_MAJOR)
    standby: ScratchCluster | None = None
    s: PgSource | None = None
    try:
        standby = ScratchCluster.standby_of(primary, STANDBY_PORT, STANDBY_SLOT)
        s = PgSource(primary.dsn, TABLES_SQL, ["items"])
        standby.wait_replayed(int_to_lsn(s.current_wal()))  # its table, before the source's checks read it there
        cfg = streaming_source(s.config().model_copy(update={"dsn": standby.dsn, "primary_dsn": primary.dsn}))
        end = large_transaction(s)
        two_runs_decode_it_once(cfg, end, tmp_path, caplog)
    finally:
        if s is not None:
            s.conn.close()
        if standby is not None:
            standby.remove()
        primary.remove()


@pytest.mark.parametrize("dsn", [SHARED_MAJOR], ids=[f"pg{SHARED_MAJOR}"], indirect=True)
def test_an_advance_refused_for_a_slot_held_elsewhere_does_not_stop_ingest(
    src: PgSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds the slot at the start (as a previous run's exiting walsender does): the advance
    is refused, quietly, and the run (in the retry loop, as `run` is) starts once the slot is free, and captures."""
    cfg = streaming_source(src.config())
    src.execute("insert into items values (1, 'one')")
    holder = ReplicationStream(cfg.dsn, cfg.slot_name, cfg.publication_name)
    holder.open()

    class ReleaseWhenRefused(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "not advanced" in record.getMessage():
                holder.close()

    def attempt() -> None:
        batch = BatchConfig(max_events=1000, max_seconds=5)
        PostgresCapture(cfg, batch, BronzeWriter(tmp_path), Progress(cfg.name, False)).run(
            once=True, should_stop=lambda: False
        )

    logger = logging.getLogger(LOGGER)
    release = ReleaseWhenRefused()
    logger.addHandler(release)
    try:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            retrying(attempt, cfg.name, lambda: False, 30, 1.0)
    finally:
        logger.removeHandler(release)
        holder.close()
    refused = [r for r in caplog.records if r.name == LOGGER and "not advanced" in r.getMessage()]
    assert refused and refused[0].levelno == logging.DEBUG and "sqlstate=55006" in refused[0].getMessage()
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert [r["record_pk"] for r in bronze_events(tmp_path, cfg.name)] == ['{"id":1}']


def test_a_slot_a_standby_synchronizes_is_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A failover slot a standby synchronizes from its primary (17): the server refuses to decode it there, even
    to advance it; ingest pointed at the standby does not try (a quiet line), and the slot stays as synchronized."""
    primary = ScratchCluster(SYNC_PRIMARY_PORT, major=SYNCED_MAJOR)
    standby: ScratchCluster | None = None
    try:
        sync = ["sync_replication_slots = on"]
        standby = ScratchCluster.standby_of(primary, SYNC_STANDBY_PORT, STANDBY_SLOT, sync)
        s, cfg = _captured(primary, tmp_path)
        synced = _sync(s, standby, tmp_path, cfg)
        with psycopg.connect(standby.dsn, autocommit=True) as c:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
                c.execute(
                    "select pg_replication_slot_advance(slot_name, confirmed_flush_lsn) from pg_replication_slots "
                    "where slot_name = %s",
                    (cfg.slot_name,),
                )
            assert "synchronized from the primary" in str(refused.value.diag.message_detail)
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                advance_restart_point(c, cfg.model_copy(update={"dsn": standby.dsn}))
        [line] = [r for r in caplog.records if r.name == LOGGER]
        assert line.levelno == logging.DEBUG and "synchronized from the primary" in line.getMessage()
        after = _slot(standby.dsn, cfg.slot_name)
        assert after is not None
        assert (after["restart_lsn"], after["confirmed_flush_lsn"]) == (
            synced["restart_lsn"],
            synced["confirmed_flush_lsn"],
        )
        s.conn.close()
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()


def one_run_after_a_bulk_load(
    src: PgSource, warehouse: Path, caplog: pytest.LogCaptureFixture
) -> tuple[PostgresSource, int]:
    """A large transaction without running-transactions records, then one `run --once` (logged at debug level)."""
    cfg = streaming_source(src.config())
    end = bare_large_transaction(src)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        capture_once(warehouse, cfg)
    return cfg, end


@pytest.mark.parametrize("dsn", LOGGING_MAJORS, ids=[f"pg{m}" for m in LOGGING_MAJORS], indirect=True)
def test_a_run_right_after_a_large_streamed_transaction_moves_restart_lsn_past_it(
    src: PgSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix the run ended with restart_lsn at the transaction's start (no running-transactions record
    after its commit), and the next run's walsender read the transaction again from there and spilled it."""
    cfg, end = one_run_after_a_bulk_load(src, tmp_path, caplog)
    first = wait_inactive(cfg.dsn, cfg.slot_name)
    assert first["spill_txns"] == 0, "the run streamed the transaction"
    assert first["restart_lsn"] >= end, "the run left restart_lsn before the transaction's commit"
    logged = [r for r in caplog.records if r.name == LOGGER and "running transactions logged" in r.getMessage()]
    assert [r.levelno for r in logged] == [logging.DEBUG], "one quiet line"

    capture_once(tmp_path, cfg)
    second = stats_after(cfg.dsn, cfg.slot_name, first)
    assert (second["spill_txns"], second["spill_bytes"]) == (first["spill_txns"], first["spill_bytes"]), (
        "the second run made the server decode the transaction again and spill it"
    )
    assert len(bronze_events(tmp_path, cfg.name)) == 2 * ROWS, "each row once"


@pytest.mark.parametrize("dsn", NOT_LOGGING_MAJORS, ids=[f"pg{m}" for m in NOT_LOGGING_MAJORS], indirect=True)
def test_a_server_without_pg_log_standby_snapshot_is_not_asked(
    src: PgSource, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """14 and 15 have no way to log running transactions short of a checkpoint: the run says so quietly."""
    cfg, end = one_run_after_a_bulk_load(src, tmp_path, caplog)
    assert len(bronze_events(tmp_path, cfg.name)) == 2 * ROWS
    assert confirmed_flush(cfg.dsn, cfg.slot_name) > end
    mine = [r for r in caplog.records if r.name == LOGGER and "running transactions" in r.getMessage()]
    assert [r.levelno for r in mine] == [logging.DEBUG] and "PostgreSQL 16" in mine[0].getMessage()


def plain_role_dsn(dsn: str) -> str:
    """`dsn` as PLAIN_ROLE, created on its server with REPLICATION and CREATE on the database (for its schema)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"create role {PLAIN_ROLE} login replication")
        c.execute(f"grant create on database {c.info.dbname} to {PLAIN_ROLE}")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"postgresql://{PLAIN_ROLE}@{info['host']}:{info['port']}/{info['dbname']}"


@pytest.mark.parametrize("dsn", [18], ids=["pg18"], indirect=True)
def test_a_role_not_allowed_to_log_running_transactions_still_captures(
    dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EXECUTE on pg_log_standby_snapshot() is the superuser's unless granted: the refusal is one debug line,
    the run captures, and the process does not ask again (a second run with the same lag)."""
    s = PgSource(plain_role_dsn(dsn), TABLES_SQL, ["items"])
    try:
        cfg = streaming_source(s.config())
        bare_large_transaction(s)
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            capture_once(tmp_path, cfg)
            s.execute(f"update items set name = 'again' where id <= {ROWS}")
            capture_once(tmp_path, cfg)
        mine = [r for r in caplog.records if r.name == LOGGER and "running transactions" in r.getMessage()]
        assert [r.levelno for r in mine] == [logging.DEBUG], "one quiet line, in the first run only"
        assert "sqlstate=42501" in mine[0].getMessage()
        assert not [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
        assert len(bronze_events(tmp_path, cfg.name)) == 3 * ROWS
    finally:
        s.drop()
