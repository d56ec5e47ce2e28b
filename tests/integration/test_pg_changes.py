"""Postgres -> bronze: the change semantics of DESIGN §2 and §6 on a real server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

ITEMS = "create table items (id int primary key, name text, big text)"


def test_two_updates_in_one_transaction_are_two_events(warehouse: Any, make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    with s.conn.transaction():
        s.execute("insert into items values (1, 'a', null)")
        s.execute("update items set name = 'b' where id = 1")
        s.execute("update items set name = 'c' where id = 1")
    capture_once(warehouse, s.config())
    ev = bronze_events(warehouse, s.name)
    assert [(e.action, e.commit_index, json.loads(e.record)["name"]) for e in ev] == [
        ("insert", 0, "a"),
        ("update", 1, "b"),
        ("update", 2, "c"),
    ]
    assert len({e.commit_lsn for e in ev}) == 1
    assert all(e.record_pk == '{"id":1}' for e in ev)


def test_insert_delete_insert_in_one_transaction(warehouse: Any, make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    with s.conn.transaction():
        s.execute("insert into items values (1, 'a', null)")
        s.execute("delete from items where id = 1")
        s.execute("insert into items values (1, 'again', null)")
    capture_once(warehouse, s.config())
    ev = bronze_events(warehouse, s.name)
    assert [(e.action, e.commit_index) for e in ev] == [("insert", 0), ("delete", 1), ("insert", 2)]
    assert ev[1].record is None and json.loads(ev[1].old_record)["id"] == 1
    assert json.loads(ev[2].record) == {"id": 1, "name": "again", "big": None}


def test_primary_key_change_carries_the_old_key(warehouse: Any, make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    s.execute("insert into items values (1, 'a', null)")
    s.execute("update items set id = 2 where id = 1")
    capture_once(warehouse, s.config())
    ev = bronze_events(warehouse, s.name)
    assert [e.action for e in ev] == ["insert", "update"]
    assert ev[1].record_pk == '{"id":2}' and ev[1].old_record_pk == '{"id":1}'


def test_truncate_is_one_event_naming_every_table(warehouse: Any, make_source: Any) -> None:
    s = make_source(ITEMS + "; create table other (id int primary key)", ["items", "other"])
    prepare(s.config())
    s.execute("insert into items values (1, 'a', null)")
    s.execute("insert into other values (1)")
    s.execute("truncate items, other restart identity")
    capture_once(warehouse, s.config())
    ev = bronze_events(warehouse, s.name)
    trunc = [e for e in ev if e.action == "truncate"]
    assert len(trunc) == 1
    assert sorted(trunc[0].truncated_tables) == sorted([f"{s.schema}.items", f"{s.schema}.other"])
    assert trunc[0].truncate_options == 2  # RESTART IDENTITY


def test_unchanged_toast_value_is_not_stored_as_data(warehouse: Any, make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    big = "".join(f"{i:08x}" for i in range(40_000))  # 320 kB, incompressible enough to be TOASTed
    s.execute("alter table items alter column big set storage external")
    s.execute("insert into items values (1, 'a', %s)", (big,))
    s.execute("update items set name = 'b' where id = 1")
    capture_once(warehouse, s.config())
    ev = bronze_events(warehouse, s.name)
    assert json.loads(ev[0].record)["big"] == big
    assert list(ev[1].unchanged_toast) == ["big"]
    assert json.loads(ev[1].record) == {"id": 1, "name": "b"}


def test_replay_after_restart_adds_nothing(warehouse: Any, make_source: Any) -> None:
    """Bronze is the truth: a second run over the same slot position writes no event twice."""
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    for i in range(5):
        s.execute("insert into items values (%s, 'x', null)", (i,))
    capture_once(warehouse, s.config())
    first = bronze_events(warehouse, s.name)
    s.execute("insert into items values (99, 'y', null)")
    capture_once(warehouse, s.config())
    second = bronze_events(warehouse, s.name)
    keys = [(e.commit_lsn, e.commit_index) for e in second]
    assert len(keys) == len(set(keys)) == len(first) + 1


def test_large_transaction_is_written_in_pages(warehouse: Any, make_source: Any) -> None:
    s = make_source(ITEMS, ["items"])
    prepare(s.config())
    s.execute("insert into items select g, 'n' || g, null from generate_series(1, 1000) g")
    cap = capture_once(warehouse, s.config(), max_events=150)
    ev = bronze_events(warehouse, s.name)
    assert [e.commit_index for e in ev] == list(range(1000))
    assert cap.progress.batches >= 7  # 1000 events in pages of 150, plus the drain marker


def test_idle_source_gets_heartbeats_and_its_position_moves(warehouse: Any, make_source: Any) -> None:
    """An idle slot keeps moving: heartbeats are committed and the writer reports what it observed."""
    import time

    from ingest.bronze.writer import BronzeWriter
    from ingest.config import BatchConfig
    from ingest.progress import Progress
    from ingest.sources.postgres.capture import PostgresCapture

    s = make_source(ITEMS, ["items"])
    src = s.config(heartbeat_seconds=1.0)
    prepare(src)
    s.execute("insert into items values (1, 'a', null)")
    writer = BronzeWriter(warehouse)
    cap = PostgresCapture(
        src, BatchConfig(max_events=1000, max_seconds=0.5), writer, Progress(s.name, enabled=False), snapshots=False
    )
    deadline = time.monotonic() + 15
    cap.run(once=False, should_stop=lambda: time.monotonic() > deadline)
    beats = [
        e for e in bronze_events(warehouse, s.name, with_messages=True) if e.message_prefix == "changelake.heartbeat"
    ]
    assert len(beats) >= 3
    pos = [p for p, _ in writer.positions(s.name) if p.writer_id == "stream"]
    assert pos and pos[0].durable_lsn >= max(b.commit_lsn for b in beats[:-1])
