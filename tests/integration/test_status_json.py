"""`status --json` against the real PostgreSQL: its exit codes say healthy, lagging, stale, slot missing or lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.config import PostgresSource
from tests.helpers.ingest_process import ingest, status_json, write_config
from tests.helpers.pg import drop_slot, prepare
from tests.helpers.scratch_pg import ScratchCluster

pytestmark = pytest.mark.integration

HEALTHY, LAGGING, STALE, LOST_OR_UNREACHABLE = 0, 3, 4, 5


def source_doc(src: PostgresSource) -> dict[str, Any]:
    return {"kind": "postgres", "name": src.name, "dsn": src.dsn, "tables": src.tables, "snapshot": {"initial": False}}


def insert(dsn: str, table: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"insert into {table} select g, repeat('x', 200) from generate_series(1, %s) g", (n,))


def kinds(doc: dict[str, Any]) -> list[str]:
    return [a["kind"] for a in doc["sources"][0]["alerts"]]


def test_a_stopped_ingest_turns_stale_and_a_running_one_says_so(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, note text)", ["items"])
    src = s.config()
    prepare(src)
    cfg = write_config(tmp_path, source_doc(src), alerts={"max_position_age_seconds": 8})
    insert(s.dsn, s.tables[0], 10)
    assert ingest(cfg, "run", "--once").returncode == 0
    rc, doc = status_json(cfg)
    assert (rc, doc["state"], kinds(doc)) == (HEALTHY, "healthy", []), doc
    one = doc["sources"][0]
    assert one["reachable"] and one["slot"]["exists"] and one["slot"]["wal_status"] in ("reserved", "extended")
    assert [w["writer_id"] for w in one["writers"]] == ["stream"]
    assert one["safe_bound"] == one["writers"][0]["durable_position"] and one["last_commit_at"] is not None

    time.sleep(9)  # nothing raises the stream writer's row: ingest is not running
    rc, doc = status_json(cfg)
    assert (rc, doc["state"], kinds(doc)) == (STALE, "stale", ["writer_stale"]), doc
    assert doc["sources"][0]["alerts"][0]["writer_id"] == "stream"
    assert doc["sources"][0]["writers"][0]["position_age_seconds"] > 8

    # A run's watcher logs the same alert at WARNING (its first look at bronze precedes the run's first raise).
    run = ingest(cfg, "run", "--once")
    assert run.returncode == 0, run.stderr
    assert "level=WARNING" in run.stderr and "alert source=" + s.name + " alert=writer_stale" in run.stderr
    rc, doc = status_json(cfg)
    assert rc == HEALTHY, doc  # raised again


def test_lag_past_the_threshold_and_a_dropped_slot(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, note text)", ["items"])
    src = s.config()
    prepare(src)
    cfg = write_config(tmp_path, source_doc(src), alerts={"max_lag_bytes": 1_000_000})
    assert ingest(cfg, "run", "--once").returncode == 0
    insert(s.dsn, s.tables[0], 20_000)  # ~5 MB of WAL the slot now holds back
    rc, doc = status_json(cfg)
    assert (rc, doc["state"]) == (LAGGING, "lagging"), doc
    assert "slot_lag" in kinds(doc) and doc["sources"][0]["slot"]["lag_bytes"] > 1_000_000

    assert ingest(cfg, "run", "--once").returncode == 0
    rc, doc = status_json(cfg)
    assert "slot_lag" not in kinds(doc), doc

    drop_slot(s.conn, src.slot_name)
    rc, doc = status_json(cfg)
    assert (rc, doc["state"], kinds(doc)) == (LOST_OR_UNREACHABLE, "lost", ["slot_missing"]), doc
    slot = doc["sources"][0]["slot"]
    assert slot["exists"] is False and slot["lag_bytes"] is None and slot["confirmed_flush_lsn"] is None


@pytest.fixture
def scratch() -> Iterator[ScratchCluster]:
    cluster = ScratchCluster(25343)
    yield cluster
    cluster.remove()


def test_near_the_wal_limit_then_invalidated(tmp_path: Path, scratch: ScratchCluster) -> None:
    """max_slot_wal_keep_size 64MB: lagging once the slot holds 80 % of it, lost once a checkpoint drops its WAL."""
    with psycopg.connect(scratch.dsn, autocommit=True) as c:
        c.execute("create table items (id int primary key, note text)")
    scratch.restart_with("max_slot_wal_keep_size = '64MB'")
    src = PostgresSource(kind="postgres", name="kept", dsn=scratch.dsn, tables=["public.items"])
    prepare(src)
    cfg = write_config(tmp_path, source_doc(src))
    assert ingest(cfg, "run", "--once").returncode == 0
    rc, doc = status_json(cfg)
    assert rc == HEALTHY and doc["sources"][0]["slot"]["max_wal_keep_size_bytes"] == 64 << 20, doc

    with psycopg.connect(scratch.dsn, autocommit=True) as c:
        while (lag := slot_lag(c, src.slot_name)) < 56 << 20:  # past 80 %, short of 100 %
            c.execute("select pg_logical_emit_message(false, 'filler', repeat('x', 1 << 20))")
    rc, doc = status_json(cfg)
    assert (rc, doc["state"]) == (LAGGING, "lagging"), (lag, doc)
    assert "slot_near_limit" in kinds(doc)

    with psycopg.connect(scratch.dsn, autocommit=True) as c:
        for _ in range(8):
            c.execute("select pg_logical_emit_message(false, 'filler', repeat('x', 8 << 20))")
            c.execute("select pg_switch_wal()")
        c.execute("checkpoint")
    rc, doc = status_json(cfg)
    assert (rc, doc["state"], kinds(doc)) == (LOST_OR_UNREACHABLE, "lost", ["slot_lost"]), doc
    assert doc["sources"][0]["slot"]["wal_status"] == "lost"


def slot_lag(c: psycopg.Connection[Any], slot: str) -> int:
    row = c.execute(
        "select pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint from pg_replication_slots "
        "where slot_name = %s",
        (slot,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_requested_snapshot_is_listed_until_a_run_completes_it(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, note text)", ["items"])
    src = s.config()
    prepare(src)
    insert(s.dsn, s.tables[0], 30)
    cfg = write_config(tmp_path, source_doc(src))
    assert ingest(cfg, "run", "--once").returncode == 0
    assert ingest(cfg, "snapshot", s.tables[0]).returncode == 0
    rc, doc = status_json(cfg)
    snaps = doc["sources"][0]["snapshots"]
    assert rc == HEALTHY and [(x["table"], x["pages"], x["rows"]) for x in snaps] == [(s.tables[0], 0, 0)], doc
    assert {w["kind"] for w in doc["sources"][0]["writers"]} == {"stream", "snapshot"}
    assert ingest(cfg, "run", "--once").returncode == 0
    rc, doc = status_json(cfg)
    assert rc == HEALTHY and doc["sources"][0]["snapshots"] == [], doc


# A password with an unescaped '@' in a URI (libpq then takes the rest for the host), and one with
# a space in key=value form (libpq then reads the rest as a key): neither is a working DSN.
LEAKY_DSNS = {
    "s3a": ("postgresql://alice:Sup3rS3cr@tPart!@127.0.0.1:{port}/rr", ("Sup3rS3cr", "tPart")),
    "s3b": ("host=127.0.0.1 port={port} dbname=rr user=alice password=Sup3r S3cretTail", ("Sup3r", "S3cretTail")),
}


@pytest.mark.parametrize("name", sorted(LEAKY_DSNS))
def test_a_malformed_dsn_is_refused_without_showing_its_secret(tmp_path: Path, name: str) -> None:
    """Regression: fragments of a password reached the terminal, logs and `status --json` ("cannot
    connect to ... host=tPart!@127.0.0.1", "missing "=" after "S3cretTail" in connection info")."""
    template, secrets = LEAKY_DSNS[name]
    dsn = template.format(port=1)
    cfg = write_config(tmp_path, {"kind": "postgres", "name": name, "dsn": dsn, "tables": ["public.t"]})
    for args in (("-v", "run", "--once"), ("status", "--json"), ("status",), ("setup",)):
        p = ingest(cfg, *args)
        shown = p.stdout + p.stderr
        assert p.returncode == 2, shown
        assert "sources.0.dsn" in p.stderr, shown
        assert not [s for s in secrets if s in shown], shown


def test_safe_dsn_hides_a_host_that_holds_a_password_fragment() -> None:
    from ingest.sources.postgres.replication import safe_dsn

    shown = safe_dsn("user=alice password=Sup3rS3cr host=tPart!@127.0.0.1 port=5432 dbname=rr")
    assert "Sup3rS3cr" not in shown and "tPart" not in shown and "alice" in shown
    assert "host=/var/run/postgresql" in safe_dsn("host=/var/run/postgresql dbname=rr")
    assert "::1" in safe_dsn("host=::1 dbname=rr")
