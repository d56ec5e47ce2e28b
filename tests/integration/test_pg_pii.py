"""Columns that must never land (issue 17): excluded and masked values never reach any bronze file."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.config import PostgresSource
from ingest.errors import ConfigError, SourceError
from ingest.masking import mask_hash
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.published import check_published
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once, prepare

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "x" * 22
TABLES = (
    "create table people (id int primary key, name text, ssn text, email text);"
    "create table people_full (id int primary key, name text, ssn text, email text);"
    "alter table people_full replica identity full"
)
RULES = {"exclude_columns": ["ssn"], "mask_columns": ["email"]}


def _config(s: Any, **extra: Any) -> Any:
    columns = {t: RULES for t in s.tables}
    return s.config(columns=columns, mask_salt_env=SALT_ENV, **extra)


def _secrets() -> tuple[str, str]:
    tag = secrets.token_hex(6)
    return f"SSN-{tag}", f"mail-{tag}@example.org"


def _strings(value: Any) -> list[str]:
    """Every string inside a pyarrow value (nested lists and structs included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes):
        return [value.decode("utf-8", errors="replace")]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def assert_never_landed(warehouse: Path, plaintexts: list[str]) -> int:
    """No file under the warehouse holds any of `plaintexts`: raw bytes, and every Parquet value."""
    files = [p for p in warehouse.rglob("*") if p.is_file()]
    assert files, "nothing was written"
    parquet = 0
    for path in files:
        raw = path.read_bytes()
        for text in plaintexts:
            assert text.encode() not in raw, f"{text!r} is in {path}"
        if path.suffix == ".parquet":
            parquet += 1
            table: pa.Table = pq.read_table(path)
            for column in table.column_names:
                for value in table.column(column).to_pylist():
                    for s in _strings(value):
                        for text in plaintexts:
                            assert text not in s, f"{text!r} is in column {column} of {path}"
    return parquet


COLUMN_LISTS = 150000  # server_version_num of 15, the first with publication column lists


def _column_lists(s: Any) -> bool:
    """Whether the server has publication column lists (15+); before, the decoder drops excluded columns."""
    return int(s.conn.execute("show server_version_num").fetchone()[0]) >= COLUMN_LISTS


def _published_columns(s: Any, publication: str) -> dict[str, list[str]]:
    """The columns the publication sends of each table (15+; pg_publication_tables has no attnames before)."""
    return dict(
        s.conn.execute("select tablename, attnames from pg_publication_tables where pubname = %s", (publication,))
    )


def _shape(warehouse: Path, source: str, table: str) -> list[dict[str, Any]]:
    rows = read(
        warehouse / "bronze" / "source_relations", f"source = '{source}' and table_name = '{table}'", "ingested_at"
    )
    return rows[-1].columns  # type: ignore[no-any-return]


def test_stream_never_writes_excluded_or_masked_plaintext(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLES, ["people", "people_full"])
    src = _config(s)
    prepare(src)
    if _column_lists(s):  # before 15 the server sends every column, and the decoder drops ssn (asserted below)
        published = _published_columns(s, src.publication_name)
        assert published["people"] == ["id", "name", "email"]  # the excluded column is left at the server
        assert published["people_full"] == ["id", "name", "ssn", "email"]  # FULL identity: published whole

    plain: list[str] = []
    for table in ("people", "people_full"):
        ssn1, mail1 = _secrets()
        ssn2, mail2 = _secrets()
        ssn3, mail3 = _secrets()
        plain += [ssn1, mail1, ssn2, mail2, ssn3, mail3]
        s.execute(f"insert into {table} values (1, 'a', %s, %s)", (ssn1, mail1))
        s.execute(f"update {table} set ssn = %s, email = %s where id = 1", (ssn2, mail2))
        s.execute(f"insert into {table} values (2, 'b', %s, %s)", (ssn3, mail3))
        s.execute(f"update {table} set id = 3 where id = 2")  # a key change: the old tuple is sent
        s.execute(f"delete from {table} where id = 1")
    capture_once(warehouse, src)

    ev = bronze_events(warehouse, s.name)
    assert [(e.table_name, e.action) for e in ev] == [
        (t, a) for t in ("people", "people_full") for a in ("insert", "update", "insert", "update", "delete")
    ]
    for e in ev:
        for text in (e.record, e.old_record):
            if text is not None:
                assert "ssn" not in json.loads(text)
    full = [e for e in ev if e.table_name == "people_full"]
    mails = plain[7::2]
    assert json.loads(full[0].record)["email"] == mask_hash(SALT.encode(), mails[0].encode())
    assert json.loads(full[1].old_record) == {
        "id": 1,
        "name": "a",
        "email": mask_hash(SALT.encode(), mails[0].encode()),
    }
    assert json.loads(full[1].record)["email"] == mask_hash(SALT.encode(), mails[1].encode())
    assert json.loads(full[4].old_record)["email"] == mask_hash(SALT.encode(), mails[1].encode())
    assert json.loads(ev[0].record) == {"id": 1, "name": "a", "email": mask_hash(SALT.encode(), plain[1].encode())}
    assert ev[3].old_record_pk == '{"id":2}' and ev[4].record_pk == '{"id":1}'

    for table in ("people", "people_full"):
        shape = _shape(warehouse, s.name, table)
        assert [(c["name"], c["json_kind"]) for c in shape] == [("id", "int"), ("name", "text"), ("email", "masked")]
    assert assert_never_landed(warehouse, plain) >= 3


def test_snapshot_never_reads_excluded_or_writes_masked_plaintext(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLES, ["people", "people_full"])
    plain = []
    for table in ("people", "people_full"):
        for i in range(1, 6):
            ssn, mail = _secrets()
            plain += [ssn, mail]
            s.execute(f"insert into {table} values (%s, 'n', %s, %s)", (i, ssn, mail))
    src = _config(s, snapshot={"page_rows": 2})
    prepare(src)
    capture_once(warehouse, src, snapshots=True)
    rows = read(
        warehouse / "bronze" / "snapshot_pages",
        f"source = '{s.name}' and row_index >= 0",
        "table_name, page_number, row_index",
    )
    assert len(rows) == 10
    for r in rows:
        record = json.loads(r.record)
        assert set(record) == {"id", "name", "email"}
        i = record["id"]
        offset = 0 if r.table_name == "people" else 10
        assert record["email"] == mask_hash(SALT.encode(), plain[offset + 2 * (i - 1) + 1].encode())
        assert r.record_pk == f'{{"id":{i}}}' and list(r.key_text) == [str(i)]
    assert assert_never_landed(warehouse, plain) >= 1


def test_mask_with_null_writes_null(warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SALT_ENV, raising=False)
    s = make_source(TABLES, ["people"])
    src = s.config(columns={s.tables[0]: RULES}, mask_with="null")
    prepare(src)
    ssn, mail = _secrets()
    s.execute("insert into people values (1, 'a', %s, %s)", (ssn, mail))
    capture_once(warehouse, src)
    (ev,) = bronze_events(warehouse, s.name)
    assert json.loads(ev.record) == {"id": 1, "name": "a", "email": None}
    assert_never_landed(warehouse, [ssn, mail])


def test_changing_the_rules_is_a_new_shape(warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLES, ["people"])
    plain_src = s.config()
    prepare(plain_src)
    s.execute("insert into people values (1, 'a', 'visible', 'v@example.org')")
    capture_once(warehouse, plain_src)
    masked_src = _config(s)
    prepare(masked_src)  # the publication's column list is set (15+): a schema change
    if _column_lists(s):
        assert _published_columns(s, masked_src.publication_name) == {"people": ["id", "name", "email"]}
    ssn, mail = _secrets()
    s.execute("insert into people values (2, 'b', %s, %s)", (ssn, mail))
    capture_once(warehouse, masked_src)
    ev = bronze_events(warehouse, s.name)
    assert json.loads(ev[0].record)["ssn"] == "visible"
    assert json.loads(ev[1].record) == {"id": 2, "name": "b", "email": mask_hash(SALT.encode(), mail.encode())}
    shapes = read(warehouse / "bronze" / "source_relations", f"source = '{s.name}'", "first_seen_lsn")
    assert [[c["name"] for c in r.columns] for r in shapes] == [["id", "name", "ssn", "email"], ["id", "name", "email"]]
    assert_never_landed(warehouse, [ssn, mail])


def test_a_key_column_cannot_be_excluded_or_masked(make_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLES, ["people"])
    src = s.config(columns={s.tables[0]: {"mask_columns": ["id"]}}, mask_salt_env=SALT_ENV)
    with pytest.raises(ConfigError, match=r"id is part of the row's key"):
        prepare(src)
    with psycopg.connect(s.dsn) as c:  # refused before anything was created at the source
        assert c.execute("select 1 from pg_publication where pubname = %s", (src.publication_name,)).fetchone() is None


def test_existing_publication_that_publishes_an_excluded_column_is_named(
    make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLES, ["people"])
    if not _column_lists(s):
        pytest.skip("no publication column lists before PostgreSQL 15: the decoder drops excluded columns")
    s.execute(f"create publication changelake_{s.name} for table people")
    src = _config(s, create_publication=False)
    with pytest.raises(Exception, match=r"publishes .*people with columns all.*alter publication"):
        prepare(src)


def test_a_column_added_after_the_column_list_is_an_error_not_a_gap(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column list names columns: one added later would silently be left out of the stream."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(TABLES, ["people"])
    if not _column_lists(s):
        pytest.skip("no publication column lists before PostgreSQL 15: every column is sent")
    src = _config(s)
    prepare(src)
    capture_once(warehouse, src)  # streaming with the column list set
    s.execute("alter table people add column phone text")
    s.execute("insert into people values (1, 'a', 'x', 'y', '555')")
    admin = PostgresAdmin(src)
    try:  # what a Relation message of the table checks while streaming
        with pytest.raises(SourceError, match=r"column\(s\) phone that publication .* does not send"):
            check_published(admin, s.tables[0], src.masks().table(s.tables[0]))
    finally:
        admin.close()
    with pytest.raises(SourceError, match=r"did not send column\(s\) phone .* Request a snapshot"):
        capture_once(warehouse, src)  # the next start sets the list, and says what the changes before lacked
    (attnames,) = s.conn.execute(
        "select attnames from pg_publication_tables where pubname = %s", (src.publication_name,)
    ).fetchone()  # type: ignore[misc]
    assert attnames == ["id", "name", "email", "phone"]
    s.execute("insert into people values (2, 'b', 'x', 'y', '556')")
    capture_once(warehouse, src)  # then it runs: the change before the list was set lacks the column
    assert [json.loads(e.record).get("phone") for e in bronze_events(warehouse, s.name)] == [None, "556"]


USERS = "create table users (id int primary key, email text, n int default 0)"


def _files(warehouse: Path) -> set[Path]:
    return {p for p in warehouse.rglob("*") if p.is_file()} if warehouse.exists() else set()


def assert_nowhere(warehouse: Path, plaintexts: list[str], log_text: str, before: set[Path] | None = None) -> None:
    """No file under the warehouse (or none written since `before`) and no log line holds any plaintext."""
    for path in _files(warehouse) - (before or set()):
        raw = path.read_bytes()
        for text in plaintexts:
            assert text.encode() not in raw, f"{text!r} is in {path}"
    for text in plaintexts:
        assert text not in log_text, f"{text!r} is in the log"


def _users(s: Any, **rules: Any) -> Any:
    return s.config(columns={s.tables[0]: rules}, mask_salt_env=SALT_ENV) if rules else s.config()


@pytest.mark.parametrize("name", ["Email", "emial", "e_mail"])
def test_a_rule_naming_no_column_is_refused_before_anything_is_written(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """A mask whose name matched no column (a typo, a case mismatch) was accepted and never applied."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    _ssn, mail = _secrets()
    s.execute("insert into users values (1, %s)", (mail,))
    src = _users(s, mask_columns=[name])
    with pytest.raises(
        SourceError, match=rf"name {name}\b.*which the table does not have \(its columns: id, email, n\)"
    ):
        capture_once(warehouse, src, snapshots=True)
    with psycopg.connect(s.dsn) as c:  # refused before the publication or slot was created
        assert c.execute("select 1 from pg_publication where pubname = %s", (src.publication_name,)).fetchone() is None
    assert_nowhere(warehouse, [mail], caplog.text)


def _secret_mail() -> str:
    """An address no compression keeps whole in a file: random, and long enough to grep for."""
    return f"mail-{secrets.token_urlsafe(24)}@example.org"


def test_a_renamed_masked_column_keeps_its_mask_across_restarts(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """RENAME COLUMN of a masked column stopped the stream: the rule named the old spelling, not the column.

    The rule follows the column (its attnum, as bronze recorded it masked): the changes under the
    new name, the re-snapshot and every later run mask it, with a warning to update the config.
    """
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    alice, bob, carol, dave, erin = (_secret_mail() for _ in range(5))
    s.execute("insert into users values (1, %s), (2, %s)", (alice, bob))
    masked = _users(s, mask_columns=["email"])
    capture_once(warehouse, masked, snapshots=True)
    s.execute("insert into users values (3, %s)", (dave,))  # WAL the next run decodes with the old name
    s.execute("alter table users rename column email to contact_email")
    s.execute("update users set contact_email = %s where id = 1", (carol,))
    plain = [alice, bob, carol, dave, erin]

    capture_once(warehouse, masked, snapshots=True)  # the start follows the rule, and so does the stream
    assert "column email was renamed to contact_email" in caplog.text
    assert "mask_columns" in caplog.text and "re-snapshotting it" in caplog.text
    capture_once(warehouse, masked, snapshots=True)  # the stream met the rename after that run's snapshots
    s.execute("insert into users values (4, %s)", (erin,))
    capture_once(warehouse, masked, snapshots=True)  # bronze's last shape names contact_email only now
    salt = SALT.encode()
    ev = bronze_events(warehouse, s.name)
    by_id = {json.loads(e.record_pk)["id"]: json.loads(e.record) for e in ev if e.record}
    assert by_id[3] == {"id": 3, "email": mask_hash(salt, dave.encode()), "n": 0}  # the old name, masked
    assert by_id[1] == {"id": 1, "contact_email": mask_hash(salt, carol.encode()), "n": 0}
    assert by_id[4] == {"id": 4, "contact_email": mask_hash(salt, erin.encode()), "n": 0}
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and row_index >= 0", "ingested_at")
    resnapshot = {json.loads(p.record_pk)["id"]: json.loads(p.record) for p in pages[2:]}
    assert resnapshot == {
        i: {"id": i, "contact_email": mask_hash(salt, m.encode()), "n": 0} for i, m in ((1, carol), (2, bob), (3, dave))
    }
    assert {c["name"]: c["json_kind"] for c in _shape(warehouse, s.name, "users")}["contact_email"] == "masked"
    assert_nowhere(warehouse, plain, caplog.text)
    assert_never_landed(warehouse, plain)


def test_a_table_that_left_the_config_leaves_the_publication_and_is_not_captured(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A masked table removed from the config stayed published, and its changes landed unmasked."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS + "; create table orders (id int primary key, note text)", ["users", "orders"])
    users, orders = s.tables
    alice, carol, dave = (_secrets()[1] for _ in range(3))
    both = s.config(columns={users: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    prepare(both)
    s.execute("insert into users values (1, %s)", (alice,))
    capture_once(warehouse, both)
    s.execute("update users set email = %s where id = 1", (carol,))  # before the table leaves: still masked

    only_orders = PostgresSource(kind="postgres", name=s.name, dsn=s.dsn, tables=[orders])
    prepare(only_orders)
    published = s.conn.execute(
        "select tablename from pg_publication_tables where pubname = %s", (only_orders.publication_name,)
    ).fetchall()
    assert published == [("orders",)]
    assert f"dropping {users} from publication" in caplog.text
    s.execute("update users set email = %s where id = 1", (dave,))
    s.execute("insert into orders values (1, 'o')")
    capture_once(warehouse, only_orders)
    ev = bronze_events(warehouse, s.name)
    assert [(e.table_name, e.action) for e in ev] == [("users", "insert"), ("orders", "insert")]
    assert "is in the publication but not in the source's configured tables" in caplog.text
    assert_nowhere(warehouse, [alice, carol, dave], caplog.text)


def test_a_publication_ingest_does_not_manage_sends_unconfigured_tables_that_are_never_written(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An existing publication's tables beyond the configured ones were captured without any rule."""
    s = make_source(USERS + "; create table orders (id int primary key, note text)", ["users", "orders"])
    s.execute(f"create publication changelake_{s.name} for table users, orders")
    src = PostgresSource(kind="postgres", name=s.name, dsn=s.dsn, tables=[s.tables[1]], create_publication=False)
    prepare(src)
    mail = _secrets()[1]
    s.execute("insert into users values (1, %s)", (mail,))
    s.execute("insert into orders values (1, 'o')")
    capture_once(warehouse, src)
    assert [e.table_name for e in bronze_events(warehouse, s.name)] == ["orders"]
    assert_nowhere(warehouse, [mail], caplog.text)


def test_a_mask_added_later_re_snapshots_the_table_masked(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A mask added later re-masked nothing: untouched rows kept their plain values in silver."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS + "; alter table users alter column email set storage external", ["users"])
    alice, bob = (_secrets()[1] + "-" + "x" * 3000 for _ in range(2))  # TOASTed: unchanged on updates of n
    prepare(s.config())
    s.execute("insert into users values (1, %s), (2, %s)", (alice, bob))  # streamed: the shape is recorded
    capture_once(warehouse, s.config(), snapshots=True)
    history = _files(warehouse)  # plain values from before the rule: the documented history
    masked = _users(s, mask_columns=["email"])
    capture_once(warehouse, masked, snapshots=True)
    assert "column email became masked" in caplog.text and "re-snapshotting it" in caplog.text
    s.execute("update users set n = 1 where id = 2")
    capture_once(warehouse, masked, snapshots=True)
    pages = read(warehouse / "bronze" / "snapshot_pages", f"source = '{s.name}' and row_index >= 0", "ingested_at")
    latest = {json.loads(p.record_pk)["id"]: json.loads(p.record)["email"] for p in pages[-2:]}
    assert latest == {i: mask_hash(SALT.encode(), m.encode()) for i, m in ((1, alice), (2, bob))}
    (update,) = [e for e in bronze_events(warehouse, s.name) if e.action == "update"]
    assert update.unchanged_toast == ["email"]  # silver carries the re-snapshot's masked value forward
    assert_nowhere(warehouse, [alice, bob], caplog.text, before=history)
