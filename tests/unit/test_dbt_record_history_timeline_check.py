"""The singular test assert_record_history_is_the_timeline_of_consumer_records fails on each violation it names.

It checks record_history's invariants in one query (tests/dbt/): each violation is planted in a small
history and must come back named, and a consistent history must pass. Rendered with Jinja alone (ref
as plain tables, whole tables) and run by SQLite.
"""

from __future__ import annotations

import sqlite3
from dataclasses import astuple, dataclass, replace
from typing import Any

from jinja2 import Environment

from tests.helpers.pg import ROOT

CHECK = ROOT / "tests" / "dbt" / "assert_record_history_is_the_timeline_of_consumer_records.sql"


@dataclass(frozen=True)
class Record:
    """A consumer_records row (the columns the check reads)."""

    record_pk: str
    record: str | None
    commit_lsn: int
    commit_index: int
    seq: int | None
    updated_at: str
    deleted: bool
    origin: str = "stream"
    needs_reread: bool = False
    source: str = "s"
    table_schema: str = "public"
    table_name: str = "t"


@dataclass(frozen=True)
class Version:
    """A record_history row (the columns the check reads)."""

    record_pk: str
    record: str
    valid_from_lsn: int
    valid_from_index: int
    valid_from_seq: int | None
    valid_from: str
    valid_to_lsn: int | None
    valid_to_index: int | None
    valid_to: str | None
    ended_by: str | None
    origin: str = "stream"
    needs_reread: bool = False
    source: str = "s"
    table_schema: str = "public"
    table_name: str = "t"

    @property
    def row(self) -> tuple[Any, ...]:
        current = self.valid_to_lsn is None
        position = (self.valid_from_lsn, self.valid_from_index) if current else (self.valid_to_lsn, self.valid_to_index)
        return (*astuple(self), current, *position)


def mismatches(records: list[Record], versions: list[Version]) -> list[tuple[str, str]]:
    """The check's failing rows as (record_pk, mismatch), sorted."""
    sql = (
        Environment()
        .from_string(CHECK.read_text())
        .render(
            config=lambda **_: "",
            ref=lambda name: f"{name}_t",
            changelake_touched_tables_predicate=lambda _: "true",
        )
    )
    db = sqlite3.connect(":memory:")
    record_columns = ", ".join(Record.__dataclass_fields__)
    version_columns = ", ".join([*Version.__dataclass_fields__, "is_current", "commit_lsn", "commit_index"])
    db.execute(f"create table consumer_records_t ({record_columns})")
    db.execute(f"create table record_history_t ({version_columns})")
    db.executemany(
        f"insert into consumer_records_t values ({', '.join('?' * len(Record.__dataclass_fields__))})",
        [astuple(r) for r in records],
    )
    db.executemany(
        f"insert into record_history_t values ({', '.join('?' * (len(Version.__dataclass_fields__) + 3))})",
        [v.row for v in versions],
    )
    return sorted(db.execute(f"select record_pk, mismatch from ({sql})").fetchall())


# Key 1: inserted at 10/0, updated at 20/0 (two versions, the second current). Key 2: inserted at
# 10/1, deleted at 30/0 (one closed version, a tombstone).
V1 = Version("1", '{"n":0}', 10, 0, 1, "t10", 20, 0, "t20", "update")
V2 = Version("1", '{"n":1}', 20, 0, 3, "t20", None, None, None, None)
V3 = Version("2", '{"n":5}', 10, 1, 2, "t10", 30, 0, "t30", "delete")
VERSIONS = [V1, V2, V3]
RECORDS = [Record("1", '{"n":1}', 20, 0, 3, "t20", False), Record("2", None, 30, 0, 4, "t30", True)]


def test_a_consistent_history_passes() -> None:
    assert mismatches(RECORDS, VERSIONS) == []


def test_two_current_versions_of_a_record_fail() -> None:
    assert ("1", "more than one current version") in mismatches(
        RECORDS, [replace(V1, valid_to_lsn=None, valid_to_index=None, valid_to=None, ended_by=None), V2, V3]
    )


def test_versions_that_overlap_or_end_before_they_start_fail() -> None:
    overlapping = replace(V1, valid_to_lsn=25)  # ends after the next one starts
    assert mismatches(RECORDS, [overlapping, V2, V3]) == [("1", "versions do not follow each other")]
    backwards = replace(V3, valid_to_lsn=5)
    assert ("2", "versions do not follow each other") in mismatches(RECORDS, [V1, V2, backwards])


def test_a_current_version_that_is_not_the_live_row_fails() -> None:
    stale = [replace(RECORDS[0], record='{"n":2}'), RECORDS[1]]
    assert mismatches(stale, VERSIONS) == [("1", "current version differs from the live consumer_records row")]
    # A live record without a current version, and a current version without a live record.
    assert mismatches(RECORDS, [V1, V3]) == [("1", "current version differs from the live consumer_records row")]
    assert mismatches([RECORDS[0]], [*VERSIONS, Version("3", "{}", 40, 0, 5, "t40", None, None, None, None)]) == [
        ("3", "current version differs from the live consumer_records row")
    ]


def test_a_deleted_record_whose_last_version_does_not_end_at_its_tombstone_fails() -> None:
    ended_by_update = replace(V3, ended_by="update")
    assert mismatches(RECORDS, [V1, V2, ended_by_update]) == [("2", "last version does not end at the tombstone")]
    after_the_tombstone = replace(V3, valid_to_lsn=30, valid_to_index=1)
    assert mismatches(RECORDS, [V1, V2, after_the_tombstone]) == [("2", "last version does not end at the tombstone")]
