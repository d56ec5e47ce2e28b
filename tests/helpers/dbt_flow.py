"""The dbt flow's workload and the invariants it checks (DESIGN §7.1, §7.2), shared with the cluster test."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from typing import Any

from tests.helpers.silver import source_rows

SEED = int(os.environ.get("CHANGELAKE_TEST_SEED", random.randrange(1 << 30)))
TABLES = """
create table accounts (id int primary key, owner text, balance numeric(12, 2), notes text);
create table lines (account_id int, line_no int, amount int, primary key (account_id, line_no));
create table shifts (id int primary key deferrable initially deferred, v text);
alter table shifts replica identity full;
"""
CAPTURED = ["accounts", "lines", "shifts"]
KEYS = {"accounts": ["id"], "lines": ["account_id", "line_no"], "shifts": ["id"]}


def workload(s: Any, rnd: random.Random, ids: list[int], truncate_lines: bool) -> None:
    for _ in range(40):
        with s.conn.transaction():
            for _ in range(rnd.randint(1, 3)):
                op = rnd.random()
                if op < 0.45 or not ids:
                    new = (max(ids) if ids else 0) + 1
                    s.execute(
                        "insert into accounts values (%s, %s, %s, %s)",
                        (new, f"o{new}", f"{rnd.uniform(0, 1000):.2f}", "n" * rnd.randint(0, 20)),
                    )
                    s.execute("insert into lines values (%s, 1, %s)", (new, rnd.randint(1, 99)))
                    ids.append(new)
                elif op < 0.75:
                    rid = rnd.choice(ids)
                    s.execute("update accounts set balance = balance + 1 where id = %s", (rid,))
                    s.execute("update accounts set owner = owner || '+' where id = %s", (rid,))
                elif op < 0.9:
                    rid = ids.pop(rnd.randrange(len(ids)))
                    s.execute("delete from lines where account_id = %s", (rid,))
                    s.execute("delete from accounts where id = %s", (rid,))
                else:  # primary-key change: delete of the old key + upsert of the new one
                    rid = ids.pop(rnd.randrange(len(ids)))
                    new = max([*ids, rid]) + 1
                    s.execute("update accounts set id = %s where id = %s", (new, rid))
                    s.execute("update lines set account_id = %s where account_id = %s", (new, rid))
                    ids.append(new)
    with s.conn.transaction():  # insert -> delete -> insert of one key in one transaction: present
        new = max(ids) + 1
        s.execute("insert into accounts values (%s, 'x', 1, null)", (new,))
        s.execute("delete from accounts where id = %s", (new,))
        s.execute("insert into accounts values (%s, 'back', 2, null)", (new,))
        ids.append(new)
    shift_keys(s, rnd)
    if truncate_lines:
        s.execute("truncate lines")
        s.execute("insert into lines select id, 2, 5 from accounts where id % 3 = 0")


def shift_keys(s: Any, rnd: random.Random) -> None:
    """Key shifts under a deferrable primary key (review W4): mid-transaction, two rows hold one key.

    `update shifts set id = id + 1` moves row 1 onto key 2 before row 2 leaves it (heap order);
    a swap moves both rows of a pair onto each other's key. Silver must keep every re-held key.
    """
    with s.conn.transaction():
        (top,) = s.conn.execute("select coalesce(max(id), 0) from shifts").fetchone()
        s.execute("insert into shifts select g, 'r' || g from generate_series(%s::int, %s::int) g", (top + 1, top + 5))
    with s.conn.transaction():
        s.execute("update shifts set id = id + 1")
    with s.conn.transaction():
        a, b = rnd.sample([r[0] for r in s.conn.execute("select id from shifts").fetchall()], 2)
        s.execute("update shifts set id = case id when %s then %s else %s end where id in (%s, %s)", (a, b, a, a, b))
        s.execute("delete from shifts where id = (select min(id) from shifts)")


def assert_records_match_source(recs: list[Any], bronze: list[Any], s: Any, pages: Sequence[Any] = ()) -> None:
    """Invariant 1: non-deleted consumer_records equal the source tables; deleted ones are the gone keys.

    `recs` are consumer_records rows, `bronze` the source's wal_events rows and `pages` its
    snapshot_pages record rows, however they were read (a local SparkSession here, the Thrift
    server in tests/cluster).
    """
    seen = {(e.table_name, e.record_pk) for e in bronze if e.record_pk}
    seen |= {(e.table_name, e.old_record_pk) for e in bronze if e.old_record_pk}
    seen |= {(p.table_name, p.record_pk) for p in pages if p.record_pk}
    for table, pk in KEYS.items():
        live = {
            r.record_pk: json.loads(r.record)
            for r in recs
            if r.source == s.name and r.table_name == table and not r.deleted
        }
        expected = source_rows(s, table, pk)
        assert live == expected, f"seed {SEED}: {table} differs"
        deleted = {r.record_pk for r in recs if r.source == s.name and r.table_name == table and r.deleted}
        gone = {k for t, k in seen if t == table} - set(expected)
        assert deleted == gone, f"seed {SEED}: {table} tombstones differ"


def assert_event_log_matches_bronze(events: list[Any], bronze: list[Any], s: Any) -> None:
    """Invariant 2: sequin_events is bronze's change history, once each, seq in position order."""
    events = sorted((r for r in events if r.source == s.name), key=lambda r: r.seq)
    positions = [(r.commit_lsn, r.commit_index) for r in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions == [(e.commit_lsn, e.commit_index) for e in bronze]


def live_state(recs: list[Any]) -> dict[tuple[str, str, str, str], str]:
    """The live consumer_records rows (or as_of / history rows) as {(source, schema, table, pk): record}."""
    return {
        (r.source, r.table_schema, r.table_name, r.record_pk): r.record
        for r in recs
        if not getattr(r, "deleted", False)
    }


def history_at(history: list[Any], positions: dict[str, int]) -> dict[tuple[str, str, str, str], str]:
    """The record_history versions live at each source's commit_lsn in `positions` (as_of's rule)."""
    live = [
        r
        for r in history
        if r.source in positions
        and r.valid_from_lsn <= positions[r.source]
        and (r.valid_to_lsn is None or r.valid_to_lsn > positions[r.source])
    ]
    state = live_state(live)
    assert len(state) == len(live), f"seed {SEED}: two versions of one record live at {positions}"
    return state


def show_rows(output: str) -> list[dict[str, Any]]:
    """The rows `dbt show --output json` printed (its JSON object follows dbt's log lines)."""
    start = output.index('{\n  "show"') if '{\n  "show"' in output else output.index('{"show"')
    doc, _ = json.JSONDecoder().raw_decode(output[start:])
    rows: list[dict[str, Any]] = doc["show"]
    return rows
