"""A masked column renamed and its name given to another column: the mask must not stay with the name."""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.errors import SourceError
from ingest.masking import mask_hash
from tests.helpers.capture_thread import ContinuousCapture
from tests.helpers.pg import bronze_events, capture_once

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "y" * 22
USERS = "create table users (id int primary key, email text, n int default 0)"


def _mail() -> str:
    return f"mail-{secrets.token_hex(6)}@example.org"


def _nowhere(warehouse: Path, plaintexts: list[str], log_text: str) -> None:
    for path in (p for p in warehouse.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        for text in plaintexts:
            assert text.encode() not in raw, f"{text!r} is in {path}"
    for text in plaintexts:
        assert text not in log_text, f"{text!r} is in the log"


def test_a_masked_columns_name_given_to_a_new_column_does_not_unmask_the_renamed_one(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rename email away and add a new email: the rule still matched a column, and the real one landed plain."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    alice, carol = _mail(), _mail()
    s.execute("insert into users values (1, %s)", (alice,))
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, masked, snapshots=True)
    s.execute("alter table users rename column email to email_plain")
    s.execute("alter table users add column email text")
    s.execute("update users set email_plain = %s, n = 1 where id = 1", (carol,))

    with pytest.raises(SourceError, match=r"column email \(masked\) was renamed to email_plain, which no rule masks"):
        capture_once(warehouse, masked, snapshots=True)
    _nowhere(warehouse, [alice, carol], caplog.text)

    followed = s.config(columns={s.tables[0]: {"mask_columns": ["email", "email_plain"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, followed, snapshots=True)
    capture_once(warehouse, followed, snapshots=True)  # the re-snapshot the rename asked for
    update = [json.loads(e.record) for e in bronze_events(warehouse, s.name) if e.action == "update"]
    assert update == [{"id": 1, "email_plain": mask_hash(SALT.encode(), carol.encode()), "n": 1, "email": None}]
    _nowhere(warehouse, [alice, carol], caplog.text)


def test_the_same_rename_met_by_a_running_stream_stops_it_before_the_value_lands(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Relation message of the new shape, met mid-stream, is checked like the start's catalog look."""
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source(USERS, ["users"])
    alice, carol = _mail(), _mail()
    masked = s.config(columns={s.tables[0]: {"mask_columns": ["email"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, masked, snapshots=True)  # publication, slot and the first recorded shape
    with ContinuousCapture(warehouse, masked) as run:
        s.execute("insert into users values (1, %s)", (alice,))
        run.wait_for(lambda: len(bronze_events(warehouse, s.name)) == 1, 60, "the insert in bronze")
        s.execute("alter table users rename column email to email_plain")
        s.execute("alter table users add column email text")
        s.execute("update users set email_plain = %s, n = 1 where id = 1", (carol,))
        error = _wait_error(run)
    assert isinstance(error, SourceError)
    assert "column email (masked) was renamed to email_plain, which no rule masks" in str(error)
    _nowhere(warehouse, [alice, carol], caplog.text)


KEPT_PLACES = "create table users (id int primary key, d text, email text)"
KEPT_PLACES_DDL = (
    "alter table users drop column d",
    "alter table users rename column email to d",
    "alter table users add column email text",
)
KEPT_PLACES_ERROR = ".users: column email (masked) was renamed to d, which no rule masks"


def test_drop_rename_add_that_keeps_every_name_in_place_does_not_unmask_the_column(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`drop d; rename email to d; add email` between runs: every name kept its place, and the check passed.

    Names and places alone could not tell, so the former email values (now d) landed in plaintext in
    the update and in the re-snapshot the rename asked for; the recorded attnums tell.
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

    with pytest.raises(SourceError, match=re.escape(KEPT_PLACES_ERROR)):
        capture_once(warehouse, masked, snapshots=True)
    _nowhere(warehouse, [alice, bob], caplog.text)

    followed = s.config(columns={s.tables[0]: {"mask_columns": ["email", "d"]}}, mask_salt_env=SALT_ENV)
    capture_once(warehouse, followed, snapshots=True)
    capture_once(warehouse, followed, snapshots=True)  # the re-snapshot the drop and rename asked for
    salt = SALT.encode()
    update = [json.loads(e.record) for e in bronze_events(warehouse, s.name) if e.action == "update"]
    assert update == [{"id": 1, "d": mask_hash(salt, alice.encode()), "email": mask_hash(salt, bob.encode())}]
    _nowhere(warehouse, [alice, bob], caplog.text)


def test_drop_rename_add_met_by_a_running_stream_stops_it_before_the_value_lands(
    warehouse: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same names-in-place change met mid-stream (a Relation message) is refused by attnum too."""
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
        error = _wait_error(run)
    assert isinstance(error, SourceError)
    assert KEPT_PLACES_ERROR in str(error)
    _nowhere(warehouse, [alice, bob], caplog.text)


def _wait_error(run: ContinuousCapture) -> BaseException | None:
    deadline = time.monotonic() + 60
    while run.error is None and time.monotonic() < deadline:
        time.sleep(0.2)
    err, run.error = run.error, None  # handled here: the context's exit would re-raise it
    return err
