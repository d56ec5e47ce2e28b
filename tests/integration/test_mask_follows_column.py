"""Masks follow the column, not the spelling: a renamed masked column stays masked, whatever takes its name."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.errors import SourceError
from ingest.masking import mask_hash
from tests.helpers.capture_thread import ContinuousCapture
from tests.helpers.delta_rows import read
from tests.helpers.pg import bronze_events, capture_once

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "y" * 22
USERS = "create table users (id int primary key, email text, n int default 0)"


def _mail() -> str:
    """A secret no compression keeps whole in a file: random (so a grep of the bytes finds it if it landed)."""
    return f"mail-{secrets.token_urlsafe(24)}@example.org"


def _h(value: str) -> str:
    return mask_hash(SALT.encode(), value.encode())


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes):
        return [value.decode("utf-8", errors="replace")]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _nowhere(warehouse: Path, plaintexts: list[str], log_text: str) -> None:
    """No byte of any warehouse file, no value of any Parquet file read back, and no log line holds a plaintext."""
    files = [p for p in warehouse.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files), "nothing was written"
    for path in files:
        raw = path.read_bytes()
        for text in plaintexts:
            assert text.encode() not in raw, f"{text!r} is in {path}"
        if path.suffix == ".parquet":
            table: pa.Table = pq.read_table(path)
            for column in table.column_names:
                for value in table.column(column).to_pylist():
                    for s in _strings(value):
                        for text in plaintexts:
                            assert text not in s, f"{text!r} is in column {column} of {path}"
    for text in plaintexts:
        assert text not in log_text, f"{text!r} is in the log"


def _slot_active(s: Any, slot: str) -> bool:
    row = s.conn.execute("select active from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
    return bool(row and row[0])


def _records(warehouse: Path, source: str, action: str) -> list[dict[str, Any]]:
    return [json.loads(e.record) for e in bronze_events(warehouse, source) if e.action == action]


def _page_rows(warehouse: Path, source: str) -> list[Any]:
    return read(warehouse / "bronze" / "snapshot_pages", f"source = '{source}' and row_index >= 0", "ingested_at")


def _latest_pages(warehouse: Path, source: str, rows: int) -> list[dict[str, Any]]:
    pages = _page_rows(warehouse, source)
    return sorted((json.loads(p.record) for p in pages[-rows:]), key=lambda r: int(r["id"]))


def test_a_masked_column_renamed_while_streaming_stays_masked_under_its_new_name(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """RENAME COLUMN of a masked column met by a running stream stopped it: the rule named the old spelling."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    alice, bob, carol, dave = (_mail() for _ in range(4))
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    # The table's first run: no shape recorded before it, the rule follows the one this run records.
    with ContinuousCapture(warehouse, masked) as run:
        run.wait_for(lambda: _slot_active(s, masked.slot_name), 60, "the stream started")
        s.execute("insert into users values (1, %s)", (alice,))
        run.wait_for(lambda: len(bronze_events(warehouse, s.name)) == 1, 60, "the insert in bronze")
        s.execute("alter table users rename column email to contact_email")
        s.execute("insert into users values (2, %s)", (bob,))
        s.execute("update users set contact_email = %s, n = 1 where id = 1", (carol,))
        run.wait_for(lambda: len(bronze_events(warehouse, s.name)) == 3, 60, "the renamed column's changes")
        run.wait_for(lambda: len(_page_rows(warehouse, s.name)) == 2, 60, "the re-snapshot the rename asks for")
        assert run.error is None
    assert "re-snapshotting it" in caplog.text
    assert "masked column email was renamed to contact_email" in caplog.text
    assert "list contact_email in mask_columns" in caplog.text
    assert _records(warehouse, s.name, "insert") == [
        {"id": 1, "email": _h(alice), "n": 0},
        {"id": 2, "contact_email": _h(bob), "n": 0},
    ]
    assert _records(warehouse, s.name, "update") == [{"id": 1, "contact_email": _h(carol), "n": 1}]

    s.execute("insert into users values (3, %s)", (dave,))
    capture_once(warehouse, masked, snapshots=True)  # restarted: bronze's last shape names contact_email only
    assert _records(warehouse, s.name, "insert")[-1] == {"id": 3, "contact_email": _h(dave), "n": 0}
    assert _latest_pages(warehouse, s.name, 2) == [
        {"id": 1, "contact_email": _h(carol), "n": 1},
        {"id": 2, "contact_email": _h(bob), "n": 0},
    ]
    _nowhere(warehouse, [alice, bob, carol, dave], caplog.text)


def test_a_masked_columns_name_given_to_a_new_column_masks_both(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rename email away and add a new email: the rule still matched a name, and the real column landed plain."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    alice, carol, erin = _mail(), _mail(), _mail()
    s.execute("insert into users values (1, %s)", (alice,))
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, masked, snapshots=True)
    s.execute("alter table users rename column email to email_plain")
    s.execute("alter table users add column email text")
    s.execute("update users set email_plain = %s, email = %s, n = 1 where id = 1", (carol, erin))

    capture_once(warehouse, masked, snapshots=True)
    capture_once(warehouse, masked, snapshots=True)  # the re-snapshot the rename asked for
    assert "masked column email was renamed to email_plain" in caplog.text
    assert _records(warehouse, s.name, "update") == [{"id": 1, "email_plain": _h(carol), "n": 1, "email": _h(erin)}]
    assert _latest_pages(warehouse, s.name, 1) == [{"id": 1, "email_plain": _h(carol), "n": 1, "email": _h(erin)}]
    _nowhere(warehouse, [alice, carol, erin], caplog.text)


KEPT_PLACES = "create table users (id int primary key, d text, email text)"
KEPT_PLACES_DDL = (
    "alter table users drop column d",
    "alter table users rename column email to d",
    "alter table users add column email text",
)


def test_drop_rename_add_that_keeps_every_name_in_place_masks_both_columns(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`drop d; rename email to d; add email` between runs: every name kept its place, and d landed plain.

    Names and places alone cannot tell; the recorded attnums do: d is the former email, masked, and
    the new email is masked by the rule's name.
    """
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(KEPT_PLACES, ["users"])
    alice, bob = _mail(), _mail()
    s.execute("insert into users values (1, 'plain', %s)", (alice,))
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, masked, snapshots=True)
    for ddl in KEPT_PLACES_DDL:
        s.execute(ddl)
    s.execute("update users set email = %s where id = 1", (bob,))

    capture_once(warehouse, masked, snapshots=True)
    capture_once(warehouse, masked, snapshots=True)  # the re-snapshot the drop and rename asked for
    assert "masked column email was renamed to d" in caplog.text
    assert _records(warehouse, s.name, "update") == [{"id": 1, "d": _h(alice), "email": _h(bob)}]
    assert _latest_pages(warehouse, s.name, 1) == [{"id": 1, "d": _h(alice), "email": _h(bob)}]
    _nowhere(warehouse, [alice, bob], caplog.text)


def test_drop_rename_add_met_by_a_running_stream_masks_both_columns(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same names-in-place change met mid-stream (a Relation message) is followed by attnum too."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(KEPT_PLACES, ["users"])
    alice, bob = _mail(), _mail()
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, masked, snapshots=True)  # publication, slot and the first recorded shape
    with ContinuousCapture(warehouse, masked) as run:
        s.execute("insert into users values (1, 'plain', %s)", (alice,))
        run.wait_for(lambda: len(bronze_events(warehouse, s.name)) == 1, 60, "the insert in bronze")
        for ddl in KEPT_PLACES_DDL:
            s.execute(ddl)
        s.execute("update users set email = %s where id = 1", (bob,))
        run.wait_for(lambda: len(bronze_events(warehouse, s.name)) == 2, 60, "the update in bronze")
        assert run.error is None
    assert _records(warehouse, s.name, "update") == [{"id": 1, "d": _h(alice), "email": _h(bob)}]
    _nowhere(warehouse, [alice, bob], caplog.text)


def test_a_renamed_excluded_column_still_stops_the_start(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An excluded column is in no recorded shape, so its rule cannot follow a rename: refused, nothing read."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source("create table users (id int primary key, ssn text, n int default 0)", ["users"])
    before, after = _mail(), _mail()
    s.execute("insert into users values (1, %s)", (before,))
    excluded = s.config(columns={s.tables[0]: {"exclude_columns": ["ssn"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, excluded, snapshots=True)
    s.execute("alter table users rename column ssn to tax_id")
    s.execute("insert into users values (2, %s)", (after,))
    with pytest.raises(SourceError, match=r"name ssn, which the table does not have \(its columns: id, tax_id, n\)"):
        capture_once(warehouse, excluded, snapshots=True)
    _nowhere(warehouse, [before, after], caplog.text)


def test_a_rule_added_after_its_column_was_renamed_follows_the_recorded_column(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule and rename both while ingest was stopped: bronze's last shape had email (unmasked) at the column.

    The start refused the rule as naming no column; the recorded attnum says which column it meant.
    """
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    alice, bob = _mail(), _mail()
    s.execute("insert into users values (1, %s)", (alice,))
    capture_once(warehouse, s.config(), snapshots=True)  # unmasked: alice is bronze history (docs/masking.md)
    s.execute("alter table users rename column email to contact_email")
    s.execute("update users set contact_email = %s where id = 1", (bob,))
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, masked, snapshots=True)
    capture_once(warehouse, masked, snapshots=True)  # the re-snapshot the rename asked for
    assert "masked column email was renamed to contact_email" in caplog.text
    assert _records(warehouse, s.name, "update") == [{"id": 1, "contact_email": _h(bob), "n": 0}]
    assert _latest_pages(warehouse, s.name, 1) == [{"id": 1, "contact_email": _h(bob), "n": 0}]
    _nowhere(warehouse, [bob], caplog.text)
