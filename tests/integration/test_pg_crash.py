"""SIGKILL ingest anywhere, restart, and bronze still holds every committed change exactly once.

The oracle is independent of our decoder: a second slot on the same database decoded with
Postgres's own `test_decoding` plugin, created before any change was made. Each round kills
ingest at a named fault point or at a random moment, while the workload is still writing (review
finding T1); rounds alternate `run --once` and continuous `run` (T2); the comparison is of row
contents, not only ids and actions (T3).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.helpers.ingest_process import run_killed, run_while_writing
from tests.helpers.pg import ROOT, TD_LINE, bronze_events, prepare

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
CONTINUOUS_SECONDS = 12.0  # a continuous round not killed by its fault point is stopped (SIGTERM) after this
ID_VALUE = re.compile(r"id\[integer\]:(-?\d+)")
V_VALUE = re.compile(r"v\[text\]:'((?:[^']|'')*)'")


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


def oracle(dsn: str, slot: str, table: str) -> list[tuple[int, str, int, str | None]]:
    """(xid, action, id, v) of every change to `table`, in commit order, as test_decoding reports it.

    `v` is the new row's value (None for a delete, whose old tuple carries the key only).
    """
    out: list[tuple[int, str, int, str | None]] = []
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
        v = V_VALUE.search(rest)
        value = v.group(1).replace("''", "'") if v else None
        out.append((int(xid), m["action"].lower(), int(ID_VALUE.search(rest).group(1)), value))  # type: ignore[union-attr]
    return out


def run_ingest(cfg: Path, crash_at: str | None, kill_after: float | None, once: bool = True) -> int:
    return run_killed(cfg, crash_at, kill_after, once, CONTINUOUS_SECONDS)


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
    plan += [(None, rnd.uniform(2, 10)) for _ in range(RANDOM_KILLS)]
    for n, (crash_at, kill_after) in enumerate(plan):
        workload(s.conn, rnd, next_id)  # something to read from the start
        seed = rnd.random()
        rc = run_while_writing(
            s,
            partial(workload, rnd=random.Random(seed), next_id=next_id),
            cfg,
            crash_at,
            kill_after,
            n % 2 == 0,
            CONTINUOUS_SECONDS,
        )
        if crash_at:
            assert rc == -signal.SIGKILL, f"crash point {crash_at} was never reached"
        kills += rc == -signal.SIGKILL
    workload(s.conn, rnd, next_id)
    assert run_ingest(cfg, None, None) == 0
    assert kills >= len(FAULT_POINTS)

    expected = oracle(s.dsn, oracle_slot, f"{s.schema}.items")
    got = [
        (e.xid, e.action, json.loads(e.record_pk)["id"], json.loads(e.record)["v"] if e.record else None)
        for e in bronze_events(warehouse, s.name)
    ]
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
