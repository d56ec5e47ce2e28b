"""A masked column renamed and its name given to another column: the mask must not stay with the name."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from ingest.errors import SourceError
from ingest.masking import mask_hash
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
