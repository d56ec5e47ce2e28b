"""A MongoDB rule naming a field with other case than the documents' (`Email` for `email`) stops capture.

MongoDB has no schema to check the rule's names against beforehand, so each document is checked as
it is turned into bronze: the stream's events and the snapshot's pages. Every warehouse file and
the log are searched for the raw secrets.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.errors import SourceError
from ingest.masking import mask_hash
from ingest.progress import Progress
from ingest.sources.mongodb.capture import MongoCapture
from tests.helpers.pg import bronze_events

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "test-salt-" + "c" * 22
REFUSED = r"\.users: a document has field 'email', which mask_columns names only as 'Email'"


def _source(uri: str, db: Any, rule: str) -> MongoSource:
    return MongoSource(
        kind="mongodb",
        name=f"m_{db.name[3:]}",
        uri=uri,
        database=db.name,
        collections=["users"],
        columns={"users": {"mask_columns": [rule]}},
        mask_salt_env=SALT_ENV,
        max_await_seconds=0.3,
    )


def _once(warehouse: Path, src: MongoSource) -> None:
    cap = MongoCapture(
        src, BatchConfig(max_events=1000, max_seconds=5), BronzeWriter(warehouse), Progress(src.name, False)
    )
    cap.run(once=True, should_stop=lambda: False)


def _mail() -> str:
    return f"mail-{secrets.token_hex(6)}@example.org"


def _nowhere(warehouse: Path, plaintexts: list[str], log_text: str) -> None:
    for path in (p for p in warehouse.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        for text in plaintexts:
            assert text.encode() not in raw, f"{text!r} is in {path}"
    for text in plaintexts:
        assert text not in log_text, f"{text!r} is in the log"


def test_a_streamed_document_with_the_field_in_other_case_is_refused_until_the_rule_names_it(
    warehouse: Path, mongo_uri: str, mongo_db: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rule naming `Email` was accepted while documents carried `email`, which landed in plaintext."""
    monkeypatch.setenv(SALT_ENV, SALT)
    bob = _mail()
    mongo_db.users.insert_one({"_id": 1, "n": 1})
    typo = _source(mongo_uri, mongo_db, "Email")
    _once(warehouse, typo)  # the snapshot: no document has the field yet
    mongo_db.users.insert_one({"_id": 2, "n": 2})
    mongo_db.users.insert_one({"_id": 3, "email": bob})

    with pytest.raises(SourceError, match=REFUSED):
        _once(warehouse, typo)
    _nowhere(warehouse, [bob], caplog.text)
    with pytest.raises(SourceError, match=REFUSED):  # the stream did not go past it
        _once(warehouse, typo)
    _nowhere(warehouse, [bob], caplog.text)

    _once(warehouse, _source(mongo_uri, mongo_db, "email"))
    inserts = [json.loads(e.record) for e in bronze_events(warehouse, typo.name) if e.action == "insert"]
    assert [r["_id"] for r in inserts] == [{"$numberInt": "2"}, {"$numberInt": "3"}]
    assert inserts[1]["email"] == mask_hash(SALT.encode(), bob.encode())
    _nowhere(warehouse, [bob], caplog.text)


def test_a_snapshotted_document_with_the_field_in_other_case_is_refused(
    warehouse: Path, mongo_uri: str, mongo_db: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The snapshot's pages are checked the same way: nothing of the page is written."""
    monkeypatch.setenv(SALT_ENV, SALT)
    alice = _mail()
    mongo_db.users.insert_many([{"_id": 1, "n": 1}, {"_id": 2, "email": alice}])
    with pytest.raises(SourceError, match=REFUSED):
        _once(warehouse, _source(mongo_uri, mongo_db, "Email"))
    _nowhere(warehouse, [alice], caplog.text)
