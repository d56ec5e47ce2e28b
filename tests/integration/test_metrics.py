"""Prometheus metrics of a continuous `run` against the real PostgreSQL move as the workload does (issue 17)."""

from __future__ import annotations

import math
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers.ingest_process import free_port, key, scrape, start_run, stop, wait_for, write_config
from tests.helpers.pg import bronze_events, prepare

pytestmark = pytest.mark.integration


def test_metrics_follow_a_running_stream(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, note text)", ["items"])
    src = s.config()
    prepare(src)
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"initial": False}}
    # No heartbeats of its own during the test (other clients' logical messages still arrive).
    source["heartbeat_seconds"] = 3600
    cfg = write_config(tmp_path, source)
    port = free_port()
    proc = start_run(cfg, "--metrics-port", str(port))
    lbl = {"source": s.name}
    stream = {"source": s.name, "writer": "stream"}
    slot = {"source": s.name, "slot": src.slot_name}
    events = key("changelake_events_total", **stream)
    warehouse = tmp_path / "warehouse"

    def counted_as_in_bronze(rows: int) -> bool:
        """Bronze holds `rows` inserted rows, and events_total counts every event it holds.

        Every event: a transactional logical message of any other client of the database (another
        ingest's heartbeat) reaches this slot too, and is captured as a `message` event.
        """
        if not (warehouse / "bronze/wal_events/_delta_log").exists():
            return False
        n = scrape(port).get(events)
        in_bronze = bronze_events(warehouse, s.name, with_messages=True)
        return len([e for e in in_bronze if e.action != "message"]) == rows and n == len(in_bronze)

    try:
        wait_for(lambda: key("changelake_slot_lag_bytes", **slot) in scrape(port), proc, 60, "slot lag")
        wait_for(lambda: events in scrape(port), proc, 60, "events series")
        before = scrape(port)
        assert before[key("changelake_source_up", **lbl)] == 1
        assert before[key("changelake_slot_wal_status", **slot, wal_status="reserved")] == 1
        assert before[key("changelake_slot_wal_status", **slot, wal_status="lost")] == 0
        keep = before[key("changelake_slot_max_wal_keep_size_bytes", **lbl)]
        assert keep > 0 or math.isnan(keep)
        position0 = before[key("changelake_writer_durable_position", **stream)]

        with psycopg.connect(s.dsn, autocommit=True) as c:
            for i in range(50):  # 50 transactions of 10 rows
                with c.transaction():
                    for j in range(10):
                        c.execute(f"insert into {s.tables[0]} values (%s, repeat('x', 200))", (i * 10 + j,))
        t_inserted = time.time()
        wait_for(lambda: counted_as_in_bronze(500), proc, 60, "500 rows in bronze, all counted")
        wait_for(lambda: key("changelake_safe_bound_position", **lbl) in scrape(port), proc, 30, "safe bound")
        after = scrape(port)

        # A killed walsender: the run retries from its durable position, and the counters say so.
        s.execute(
            "select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = %s", (src.slot_name,)
        )
        with psycopg.connect(s.dsn, autocommit=True) as c:
            c.execute(f"insert into {s.tables[0]} select g, 'y' from generate_series(1000, 1009) g")
        wait_for(lambda: counted_as_in_bronze(510), proc, 90, "510 rows after the outage, all counted")
        outage = scrape(port)
    finally:
        rc, err = stop(proc)
    assert rc == 0, err
    assert len(bronze_events(warehouse, s.name)) == 510
    batches = after[key("changelake_batches_total", **stream)]
    assert batches >= 1
    assert after[key("changelake_commit_duration_seconds_count", **stream)] == batches
    assert after[key("changelake_commit_duration_seconds_bucket", **stream, le="+Inf")] == batches
    # Freshness: the newest event reached bronze within seconds of its commit.
    assert 0 <= after[key("changelake_freshness_seconds", **lbl)] < 30
    assert abs(after[key("changelake_last_event_commit_timestamp_seconds", **lbl)] - t_inserted) < 30
    assert after[key("changelake_batch_freshness_seconds_count", **lbl)] >= 1
    # Positions and WAL bytes moved by at least the WAL of 500 rows of ~200 bytes.
    assert after[key("changelake_writer_durable_position", **stream)] - position0 > 500 * 200
    assert after[key("changelake_wal_bytes_total", **lbl)] > 500 * 200
    assert after[key("changelake_safe_bound_position", **lbl)] > position0
    assert after[key("changelake_slot_lag_bytes", **slot)] >= 0
    safe = after[key("changelake_slot_safe_wal_size_bytes", **slot)]
    assert safe > 0 or math.isnan(safe)
    assert after[key("changelake_alert_active", **lbl, alert="slot_lost")] == 0
    assert not any(k.startswith("changelake_errors_total") and v for k, v in after.items())
    assert outage[key("changelake_retries_total", **lbl)] >= 1
    assert outage[key("changelake_errors_total", **lbl, kind="transient")] >= 1
    assert outage.get(key("changelake_errors_total", **lbl, kind="permanent"), 0) == 0


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets in LISTEN state on `port` (from /proc/net/tcp, IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(addr)
    return found


def test_the_endpoint_listens_on_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    """Regression: with no `metrics.address` the unauthenticated endpoint (source, slot and table
    names, positions, lag) listened on every interface (0.0.0.0)."""
    from ingest import app
    from ingest.config import parse_config

    port = free_port()
    source = "{kind: postgres, name: m, dsn: 'host=127.0.0.1 port=1', tables: [public.t]}"
    cfg = parse_config(f"warehouse: {tmp_path}\nmetrics: {{port: {port}}}\nsources: [{source}]\n")
    app._serve_metrics(cfg, None)
    assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, little-endian hex
    assert "changelake_" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
