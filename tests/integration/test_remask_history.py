"""A mask added later leaves no plain value anywhere in the warehouse once `remask` has run (docs/masking.md).

Without it (test_mask_added_rebuilds_silver), the rule's re-snapshot masks current silver and gold
but bronze's earlier events and pages, `sequin_events`, the versions `record_history` closed and
old Delta files keep the plain values. Here, the documented steps (docs/masking.md "A rule added
later"): add the rule, `run --once` (the re-snapshot), `changelake-ingest remask`, `dbt build
--full-refresh`, VACUUM silver and gold with RETAIN 0 HOURS. Then no file under the warehouse, no
row read back through delta-rs, no dbt log and no ingest log line holds a raw secret, and
`consumer_records` equals the source with the secret column hashed.

Real PostgreSQL, ingest and dbt (the warm engine). The secrets are uuid4 hex: incompressible, so a
byte search of the Parquet files finds them where they are; rows are also read back decoded, in
case a codec hid one. The table has REPLICA IDENTITY FULL, so updates and deletes carry the whole
old row (the secret in `old_record` too). Without the remask step the byte search fails: 17 (file,
secret) hits, from bronze's events and pages before the rule to silver's history.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from deltalake import DeltaTable

from ingest import cli
from ingest.gold import model_name
from ingest.masking import mask_hash
from tests.helpers.delta_rows import read
from tests.helpers.engine import Engine
from tests.helpers.pg import ROOT, capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, silver

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "r" * 22
TABLE = """
create table users (id int primary key, n int not null default 0, email text, note text);
alter table users replica identity full;
"""
BUILD = ("build", *NO_UNIT_TESTS, "--select", "silver", "path:models/gold/generated")


def _secret() -> str:
    """32 hex digits: not 64, which remask takes for a hash already written under the rule (docs/masking.md)."""
    return uuid.uuid4().hex


def _slot_free(src: Any) -> None:
    """Wait until the previous run's walsender has let the slot go (it lingers a moment after its client)."""
    deadline = time.monotonic() + 60
    with psycopg.connect(src.dsn, autocommit=True) as conn:
        query = "select active_pid from pg_replication_slots where slot_name = %s"
        while (row := conn.execute(query, (src.slot_name,)).fetchone()) and row[0] is not None:
            assert time.monotonic() < deadline, f"slot {src.slot_name} still held by PID {row[0]}"
            time.sleep(0.2)


def _project(tmp_path: Path) -> Path:
    """A copy of the dbt project: the generated models stay out of the tree."""
    project = tmp_path / "project"
    for part in ("models", "macros", "tests/dbt"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("generated", "demo"))
    shutil.copy(ROOT / "dbt_project.yml", project)
    return project


def _vacuum_silver_and_gold(engine: Engine, warehouse: Path) -> list[Path]:
    """VACUUM ... RETAIN 0 HOURS every Delta table under silver and gold, as docs/masking.md says."""
    from pyhive import hive

    tables = sorted(p.parent for p in (warehouse / "dbt").glob("*.db/*/_delta_log"))
    conn = hive.connect(host="127.0.0.1", port=engine.port, username="changelake")
    try:
        cur = conn.cursor()
        cur.execute("set spark.databricks.delta.retentionDurationCheck.enabled = false")
        for table in tables:
            cur.execute(f"vacuum delta.`{table}` retain 0 hours")
            cur.fetchall()
    finally:
        conn.close()
    return tables


def _holding(root: Path, needles: dict[str, bytes]) -> list[tuple[str, str]]:
    """(file, secret name) for every file under `root` whose bytes contain a secret."""
    return [
        (str(p.relative_to(root)), name)
        for p in sorted(root.rglob("*"))
        if p.is_file()
        for name, needle in needles.items()
        if needle in p.read_bytes()
    ]


def _rows_holding(warehouse: Path, needles: dict[str, bytes]) -> list[tuple[str, str]]:
    """(table, secret name) for every Delta table under the warehouse a decoded row of which holds a secret."""
    found = []
    for log in sorted(warehouse.rglob("_delta_log")):
        table = log.parent
        text = json.dumps(read(table), default=str)  # deletion vectors honoured: the rows as readers see them
        found += [(str(table.relative_to(warehouse)), n) for n, s in needles.items() if s.decode() in text]
    return found


def test_remask_leaves_no_plain_value_in_bronze_silver_gold_or_logs(
    warehouse: Path,
    make_source: Any,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLE, ["users"])
    mail = {i: _secret() for i in (1, 2, 3)}
    mail_v2 = _secret()  # id 1's second address: the first lives only in history
    notes = {i: f"note-{i}" for i in (1, 2, 3)}
    prepare(s.config())
    for i in (1, 2, 3):
        s.execute("insert into users (id, email, note) values (%s, %s, %s)", (i, mail[i], notes[i]))
    s.execute("update users set email = %s, n = 1 where id = 1", (mail_v2,))
    s.execute("delete from users where id = 3")  # a key whose row is gone: its secret only in history
    _slot_free(s.config())
    capture_once(warehouse, s.config(), snapshots=True)

    project = _project(tmp_path)
    dbt(warehouse, "run", "--select", "table_columns", project=project)
    config = tmp_path / "changelake.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [s.config().model_dump()]}))
    out = project / "models" / "gold" / "generated"
    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out), "--no-comments"]) == 0
    model = model_name(s.name, s.schema, "users")
    dbt(warehouse, *BUILD, project=project)
    needles = {f"mail[{i}]": m.encode() for i, m in mail.items()} | {"mail_v2": mail_v2.encode()}
    assert {n for _f, n in _holding(warehouse, needles)} == set(needles)  # the search finds them before

    # The rule, then the documented steps: run (the re-snapshot), remask, full refresh, vacuum.
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [masked.model_dump()]}))
    s.execute("update users set n = 2 where id = 2")  # between the rule and the re-snapshot
    _slot_free(s.config())
    capture_once(warehouse, masked, snapshots=True)
    assert "column email became masked" in caplog.text
    _slot_free(s.config())
    capsys.readouterr()
    assert cli.main(["-c", str(config), "remask", "--source", s.name]) == 0
    said = capsys.readouterr().out
    assert f"{s.name}: {s.schema}.users: bronze.wal_events: " in said and "dbt build --full-refresh" in said
    lines = [line for line in said.splitlines() if "rows rewritten" in line]
    rewritten = {line.split(": bronze.")[1].split(":")[0]: line for line in lines}
    assert set(rewritten) == {"wal_events", "snapshot_pages"}
    assert not any(line.split(": ")[-1].startswith("0 of") for line in rewritten.values()), said
    dbt_logs = dbt(warehouse, "build", "--full-refresh", *BUILD[1:], project=project)
    vacuumed = _vacuum_silver_and_gold(engine, warehouse)
    assert any(t.name == "record_history" for t in vacuumed) and any(t.name == "sequin_events" for t in vacuumed)

    # No byte of any file under the warehouse, no decoded row, no log holds a raw secret.
    assert _holding(warehouse, needles) == []
    assert _rows_holding(warehouse, needles) == []
    assert _holding(warehouse.parent / "dbt-logs", needles) == []
    logs = caplog.text + said + dbt_logs
    assert not [n for n, s_ in needles.items() if s_.decode() in logs]

    # Silver is the source with the secret hashed; history holds only hashes.
    def h(value: str) -> str:
        return mask_hash(SALT.encode(), value.encode())

    current = {
        json.loads(r.record)["id"]: json.loads(r.record)
        for r in silver(warehouse, "consumer_records")
        if r.source == s.name and not r.deleted
    }
    with psycopg.connect(s.dsn) as conn:
        query = f"select id, n, email, note from {s.schema}.users order by id"
        source = {r[0]: {"id": r[0], "n": r[1], "email": h(r[2]), "note": r[3]} for r in conn.execute(query)}
    assert (
        current
        == source
        == {
            1: {"id": 1, "n": 1, "email": h(mail_v2), "note": notes[1]},
            2: {"id": 2, "n": 2, "email": h(mail[2]), "note": notes[2]},
        }
    )
    history = [r for r in silver(warehouse, "record_history") if r.source == s.name and r.table_name == "users"]
    emails = {json.loads(r.record)["email"] for r in history if r.record is not None}
    assert emails <= {h(m) for m in [*mail.values(), mail_v2]} and h(mail[1]) in emails and h(mail[3]) in emails
    gold = [tuple(r) for r in engine.sql(f"select email from gold.`{model}` order by id")]
    assert gold == [(h(mail_v2),), (h(mail[2]),)]
    # Bronze is still append-only.
    for name in ("wal_events", "snapshot_pages"):
        assert DeltaTable(str(warehouse / "bronze" / name)).metadata().configuration["delta.appendOnly"] == "true"
    # A second remask finds nothing to rewrite.
    assert cli.main(["-c", str(config), "remask", "--source", s.name]) == 0
    assert all(" 0 of " in line for line in capsys.readouterr().out.splitlines() if "rows rewritten" in line)
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and record_pk is not null")
    assert {json.loads(p.record)["email"] for p in pages} <= {h(m) for m in [*mail.values(), mail_v2]}


def test_remask_refuses_a_postgres_source_whose_slot_is_in_use(
    warehouse: Path,
    make_source: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A running ingest holds the slot: remask stops before reading bronze, exit 2 naming the slot."""
    recvlogical = shutil.which("pg_recvlogical")
    if recvlogical is None:
        pytest.skip("pg_recvlogical (PostgreSQL client tools) is not installed")
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLE, ["users"])
    prepare(s.config())
    s.execute("insert into users (id, email) values (1, %s)", (_secret(),))
    capture_once(warehouse, s.config(), snapshots=True)
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    config = tmp_path / "changelake.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [masked.model_dump()]}))
    _slot_free(masked)
    version = DeltaTable(str(warehouse / "bronze" / "wal_events")).version()
    args = ["-d", s.dsn, "-S", masked.slot_name, "--start", "-f", "/dev/null", "-o", "proto_version=1"]
    holder = subprocess.Popen([recvlogical, *args, "-o", f"publication_names={masked.publication_name}"])
    try:
        deadline = time.monotonic() + 30
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            query = "select active_pid from pg_replication_slots where slot_name = %s"
            while (row := conn.execute(query, (masked.slot_name,)).fetchone()) is None or row[0] is None:
                assert time.monotonic() < deadline and holder.poll() is None, "pg_recvlogical did not take the slot"
                time.sleep(0.1)
        capsys.readouterr()
        assert cli.main(["-c", str(config), "remask"]) == 2
        err = capsys.readouterr().err
        assert f"slot {masked.slot_name} is in use" in err and "ingest is running" in err
    finally:
        holder.terminate()
        holder.wait(10)
    assert DeltaTable(str(warehouse / "bronze" / "wal_events")).version() == version
