"""SIGKILL ingest anywhere, restart, and bronze still holds every committed change exactly once.

The oracle is independent of our decoder: a second slot on the same database decoded with
Postgres's own `test_decoding` plugin, created before any change was made.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.helpers.pg import ROOT, bronze_events, prepare

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SEED = int(os.environ.get("CHANGELAKE_TEST_SEED", random.randrange(1 << 30)))
# Each point is reached at least twice per round whatever the batch boundaries (every round
# commits several batches, and its large transaction is written in pages).
FAULT_POINTS = [
    "before_events_commit:1",
    "before_events_commit:2",
    "after_events_commit:1",
    "after_position_commit:1",
    "after_position_commit:2",
    "after_ack:1",
    "after_ack:2",
    "mid_transaction_flush:1",
    "mid_transaction_flush:2",
]
RANDOM_KILLS = 2
TD_LINE = re.compile(r"^table (?P<table>[^:]+): (?P<action>INSERT|UPDATE|DELETE|TRUNCATE):(?P<rest>.*)$")
ID_VALUE = re.compile(r"id\[integer\]:(-?\d+)")


def workload(conn: psycopg.Connection[Any], rnd: random.Random, next_id: list[int]) -> None:
    """Inserts, updates (two per row in one transaction too), deletes, a PK change, a large transaction."""
    live = [r[0] for r in conn.execute("select id from items").fetchall()]
    for _ in range(30):
        with conn.transaction():
            for _ in range(rnd.randint(1, 4)):
                op = rnd.random()
                if op < 0.5 or not live:
                    next_id[0] += 1
                    conn.execute("insert into items values (%s, %s)", (next_id[0], f"v{rnd.random():.6f}"))
                    live.append(next_id[0])
                elif op < 0.8:
                    rid = rnd.choice(live)
                    conn.execute("update items set v = %s where id = %s", (f"u{rnd.random():.6f}", rid))
                    conn.execute("update items set v = v || '!' where id = %s", (rid,))
                elif op < 0.95:
                    rid = live.pop(rnd.randrange(len(live)))
                    conn.execute("delete from items where id = %s", (rid,))
                else:
                    rid = live.pop(rnd.randrange(len(live)))
                    next_id[0] += 1
                    conn.execute("update items set id = %s where id = %s", (next_id[0], rid))
                    live.append(next_id[0])
    with conn.transaction():  # larger than a batch: written in pages
        start = next_id[0] + 1
        next_id[0] += 120
        conn.execute("insert into items select g, 'bulk' from generate_series(%s::int, %s::int) g", (start, next_id[0]))


def oracle(dsn: str, slot: str, table: str) -> list[tuple[int, str, int]]:
    """(xid, action, id) of every change to `table`, in commit order, as test_decoding reports it."""
    out: list[tuple[int, str, int]] = []
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "select xid::text::bigint, data from pg_logical_slot_peek_changes(%s, null, null)", (slot,)
        ).fetchall()
    for xid, data in rows:
        m = TD_LINE.match(data)
        if not m or m["table"] != table:
            continue
        rest = m["rest"]
        if "new-tuple:" in rest:
            rest = rest.split("new-tuple:", 1)[1]
        out.append((int(xid), m["action"].lower(), int(ID_VALUE.search(rest).group(1))))  # type: ignore[union-attr]
    return out


def run_ingest(cfg: Path, crash_at: str | None, kill_after: float | None) -> int:
    env = dict(os.environ)
    env.pop("CHANGELAKE_CRASH_AT", None)
    if crash_at:
        env["CHANGELAKE_CRASH_AT"] = crash_at
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", "--once"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"ingest failed ({proc.returncode}): {err.decode()[-3000:]}")
    return proc.returncode


def test_sigkill_anywhere_loses_and_duplicates_nothing(tmp_path: Path, make_source: Any) -> None:
    print(f"crash test seed: {SEED} (rerun with CHANGELAKE_TEST_SEED={SEED})")
    rnd = random.Random(SEED)
    s = make_source("create table items (id int primary key, v text)", ["items"])
    oracle_slot = f"oracle_{s.suffix}"
    s.execute("select pg_create_logical_replication_slot(%s, 'test_decoding')", (oracle_slot,))
    prepare(s.config())
    warehouse = tmp_path / "warehouse"
    cfg = tmp_path / "ingest.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "warehouse": str(warehouse),
                "batch": {"max_events": 40, "max_seconds": 1},
                "sources": [
                    {
                        "kind": "postgres",
                        "name": s.name,
                        "dsn": s.dsn,
                        "tables": s.tables,
                        "snapshot": {"initial": False},  # the stream's crash points; snapshots: test_pg_snapshot
                    }
                ],
            }
        )
    )
    next_id = [0]
    kills = 0
    plan: list[tuple[str | None, float | None]] = [(p, None) for p in FAULT_POINTS]
    plan += [(None, rnd.uniform(8, 30)) for _ in range(RANDOM_KILLS)]
    for crash_at, kill_after in plan:
        workload(s.conn, rnd, next_id)
        rc = run_ingest(cfg, crash_at, kill_after)
        if crash_at:
            assert rc == -signal.SIGKILL, f"crash point {crash_at} was never reached"
        kills += rc == -signal.SIGKILL
    workload(s.conn, rnd, next_id)
    assert run_ingest(cfg, None, None) == 0
    assert kills >= len(FAULT_POINTS)

    expected = oracle(s.dsn, oracle_slot, f"{s.schema}.items")
    got = [(e.xid, e.action, json.loads(e.record_pk)["id"]) for e in bronze_events(warehouse, s.name)]
    assert len(expected) > 300
    missing = len([x for x in expected if x not in got])
    assert got == expected, f"seed {SEED}: {len(got)} bronze events vs {len(expected)} committed; {missing} missing"

    # `status` reports the slot's confirmed position, lag, wal_status and the safe bound.
    out = subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"source {s.name}" in out.stdout and re.search(r"wal_status (reserved|extended)", out.stdout)
    assert "writer stream (stream): durable" in out.stdout and "safe bound:" in out.stdout
