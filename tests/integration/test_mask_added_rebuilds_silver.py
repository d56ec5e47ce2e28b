"""A mask added later, through dbt: current silver and gold end masked (issue 30, N6; docs/masking.md).

test_pg_pii checks bronze alone. Here the table is captured without a rule, silver and generated
gold are built with real dbt, the rule is added to the config, and the next runs re-snapshot the
table (the documented step: nothing by hand, the rule is a schema change). An update made between
the rule and the re-snapshot, and one made after it, leave the TOASTed secret and a large TOASTed
text unchanged, so silver has to carry both forward from an earlier event. After the next build
`consumer_records` and the gold view hold the masked value for every current row.

What keeps the plain values by design (docs/masking.md "A rule added later"), until the documented
purge: bronze's events and the snapshot pages from before the rule; silver's history, i.e.
`sequin_events`, every `record_history` version the re-snapshot closed, `snapshot_rows_placed`
and `record_changes`; and the Parquet files of `consumer_records`' earlier Delta versions (its
rows read masked). So this test asserts which rows of silver and gold hold what, and where the
plain values are kept, not that no file holds one.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest import cli
from ingest.gold import model_name
from ingest.masking import mask_hash
from tests.helpers.delta_rows import read
from tests.helpers.engine import Engine
from tests.helpers.pg import ROOT, bronze_events, capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, silver

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "y" * 22
# Both text columns are stored out of line and uncompressed: an update of `n` alone sends the
# unchanged-TOAST marker for each, never the value.
TABLE = """
create table users (id int primary key, n int not null default 0, email text, bio text);
alter table users alter email set storage external;
alter table users alter bio set storage external;
"""
BUILD = ("build", *NO_UNIT_TESTS, "--select", "silver", "path:models/gold/generated")


def _secret(i: int) -> str:
    return f"mail-{i}-{secrets.token_hex(6)}@example.org-" + "x" * 3000  # TOASTed


def _capture(warehouse: Path, src: Any) -> None:
    """One `run --once` (snapshots on), once the previous run's walsender has let the slot go.

    A walsender that has not yet noticed its client left still holds the slot for a moment, and the
    run's start refuses a held slot as transient (`run` retries; this helper waits instead).
    """
    deadline = time.monotonic() + 60
    with psycopg.connect(src.dsn, autocommit=True) as conn:
        query = "select active_pid from pg_replication_slots where slot_name = %s"
        while (row := conn.execute(query, (src.slot_name,)).fetchone()) and row[0] is not None:
            assert time.monotonic() < deadline, f"slot {src.slot_name} still held by PID {row[0]}"
            time.sleep(0.2)
    capture_once(warehouse, src, snapshots=True)


def _project(tmp_path: Path) -> Path:
    """A copy of the dbt project: the generated models stay out of the tree."""
    project = tmp_path / "project"
    for part in ("models", "macros", "tests/dbt"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("generated", "demo"))
    shutil.copy(ROOT / "dbt_project.yml", project)
    return project


def _current(warehouse: Path, source: str) -> dict[int, dict[str, Any]]:
    """consumer_records' rows of the source by id: record (parsed), deleted, needs_reread."""
    rows = [r for r in silver(warehouse, "consumer_records") if r.source == source]
    out = {}
    for r in rows:
        record = json.loads(r.record)
        out[record["id"]] = {"record": record, "deleted": r.deleted, "needs_reread": r.needs_reread}
    return out


def _gold(engine: Engine, model: str) -> dict[int, tuple[int, str, str]]:
    """The generated gold view, read through Spark (the view holds no rows of its own)."""
    rows = engine.sql(f"select id, n, email, bio from gold.`{model}`")
    return {int(r[0]): (int(r[1]), str(r[2]), str(r[3])) for r in rows}  # type: ignore[call-overload]


def test_a_mask_added_later_leaves_current_silver_and_gold_masked(
    warehouse: Path,
    make_source: Any,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLE, ["users"])
    plain = {i: _secret(i) for i in (1, 2, 3)}
    bios = {i: secrets.token_hex(2048) for i in (1, 2, 3)}  # TOASTed, never masked
    hashed = {i: mask_hash(SALT.encode(), m.encode()) for i, m in plain.items()}
    prepare(s.config())
    for i in (1, 2, 3):  # streamed, so the table's shape is recorded (the rule is noticed against it)
        s.execute("insert into users (id, email, bio) values (%s, %s, %s)", (i, plain[i], bios[i]))
    s.execute("update users set n = 10 where id = 1")  # a version carried from the insert, still plain
    _capture(warehouse, s.config())

    project = _project(tmp_path)
    dbt(warehouse, "run", "--select", "table_columns", project=project)
    config = tmp_path / "changelake.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [s.config().model_dump()]}))
    out = project / "models" / "gold" / "generated"
    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out), "--no-comments"]) == 0
    model = model_name(s.name, s.schema, "users")
    dbt(warehouse, *BUILD, project=project)
    # Before the rule the plain values are where the test looks: silver's records and the gold view.
    assert {i: r["record"]["email"] for i, r in _current(warehouse, s.name).items()} == plain
    assert _gold(engine, model) == {i: (10 if i == 1 else 0, plain[i], bios[i]) for i in plain}

    # The rule, added to the config as docs/masking.md says; nothing else is done by hand.
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    s.execute("update users set n = 2 where id = 2")  # between the rule and the re-snapshot
    _capture(warehouse, masked)
    assert "column email became masked" in caplog.text and "re-snapshotting it" in caplog.text
    s.execute("update users set n = 3 where id = 3")  # after it: carried from the snapshot's value
    _capture(warehouse, masked)
    updates = [e for e in bronze_events(warehouse, s.name) if e.action == "update"]
    assert [json.loads(e.record_pk)["id"] for e in updates] == [1, 2, 3]
    assert all(sorted(e.unchanged_toast) == ["bio", "email"] for e in updates)  # no value in the events
    dbt(warehouse, *BUILD, project=project)

    # Current silver: every row masked, the rows no one touched since the rule included, and the
    # unchanged TOASTed values carried forward (the secret as the snapshot's hash, bio as it is).
    current = _current(warehouse, s.name)
    expected = {i: {"id": i, "n": {1: 10, 2: 2, 3: 3}[i], "email": hashed[i], "bio": bios[i]} for i in (1, 2, 3)}
    assert {i: r["record"] for i, r in current.items()} == expected
    assert not any(r["deleted"] or r["needs_reread"] for r in current.values())
    # Generated gold is a view over consumer_records: read through Spark, it is masked too.
    assert _gold(engine, model) == {i: (e["n"], e["email"], e["bio"]) for i, e in expected.items()}

    # record_history: each key's current version is the masked one; the versions the re-snapshot
    # closed keep the plain value, by design (history is append-only; docs/masking.md: the purge).
    history = [r for r in silver(warehouse, "record_history") if r.source == s.name and r.table_name == "users"]
    open_versions = {json.loads(r.record_pk)["id"]: json.loads(r.record) for r in history if r.is_current}
    assert open_versions == expected
    closed: dict[int, set[tuple[int, str]]] = {i: set() for i in plain}
    for r in history:
        if not r.is_current:
            record = json.loads(r.record)
            closed[record["id"]].add((record["n"], record["email"]))
    assert closed == {
        1: {(0, plain[1]), (10, plain[1])},
        2: {(0, plain[2]), (2, plain[2])},  # the update between the rule and the re-snapshot
        3: {(0, plain[3]), (0, hashed[3])},  # the re-snapshot's version, closed by the update after it
    }
    # Bronze: the events and the initial snapshot's pages from before the rule hold the plain
    # values (documented); the re-snapshot's pages are masked.
    before = [json.loads(e.record)["email"] for e in bronze_events(warehouse, s.name) if e.action == "insert"]
    assert before == [plain[1], plain[2], plain[3]]
    events = [r for r in silver(warehouse, "sequin_events") if r.source == s.name and r.action == "insert"]
    assert sorted(json.loads(r.record)["email"] for r in events) == sorted(plain.values())  # silver's too
    pages = read(
        warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and record_pk is not null", "ingested_at"
    )
    emails = [json.loads(p.record)["email"] for p in pages]  # the initial snapshot's, then the re-snapshot's
    assert sorted(emails[:3]) == sorted(plain.values()) and sorted(emails[3:]) == sorted(hashed.values())
    for text in plain.values():  # nor did any log line carry a plaintext
        assert text not in caplog.text
