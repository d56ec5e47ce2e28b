"""The singular test assert_sequin_events_are_the_bronze_change_history fails on each violation it names.

It checks three invariants in one query (tests/dbt/); a check that cannot fail is a defect, so
each violation is planted in a small history and must come back, and an equal history (with a
re-delivered bronze copy) must pass. Rendered with Jinja alone (ref and source as plain tables)
and run by SQLite, with Spark's `max_by` as an aggregate.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from jinja2 import Environment

from tests.helpers.pg import ROOT

CHECK = ROOT / "tests" / "dbt" / "assert_sequin_events_are_the_bronze_change_history.sql"
Event = tuple[str, int, int, str]  # source, commit_lsn, commit_index, action


class MaxBy:
    """Spark's max_by(value, ordering): the value of the row with the largest ordering."""

    def __init__(self) -> None:
        self.best: tuple[Any, Any] | None = None

    def step(self, value: Any, ordering: Any) -> None:
        if ordering is not None and (self.best is None or ordering > self.best[1]):
            self.best = (value, ordering)

    def finalize(self) -> Any:
        return None if self.best is None else self.best[0]


def violations(
    silver: list[tuple[str, int, int, str, int]], bronze: list[Event], ranges: dict[str, tuple[int, int]] | None = None
) -> list[tuple[Any, ...]]:
    """The check's failing rows as (source, commit_lsn, commit_index, violation), sorted.

    `ranges`: a batch build's range per source, (loaded bound before the run, the run's safe
    bound], as macro changelake_run_rows_predicate writes it; whole tables without.
    """

    def run_rows(qualifier: str | None = None) -> str:
        if ranges is None:
            return "true"
        p = f"{qualifier}." if qualifier else ""
        terms = [
            f"({p}source = '{s}' and {p}commit_lsn > {lo} and {p}commit_lsn <= {hi})" for s, (lo, hi) in ranges.items()
        ]
        return "(" + (" or ".join(terms) or "false") + ")"

    sql = (
        Environment()
        .from_string(CHECK.read_text())
        .render(
            config=lambda **_: "",
            ref=lambda name: f"{name}_t",
            source=lambda _, name: f"{name}_t",
            changelake_run_rows_predicate=run_rows,
        )
    )
    db = sqlite3.connect(":memory:")
    db.create_aggregate("max_by", 2, MaxBy)  # type: ignore[arg-type]
    db.execute("create table sequin_events_t (source text, commit_lsn int, commit_index int, action text, seq int)")
    db.execute("create table wal_events_t (source text, commit_lsn int, commit_index int, action text)")
    db.executemany("insert into sequin_events_t values (?, ?, ?, ?, ?)", silver)
    db.executemany("insert into wal_events_t values (?, ?, ?, ?)", bronze)
    rows = db.execute(f"select event_source, commit_lsn, commit_index, violated_invariant from ({sql})").fetchall()
    return sorted(rows)


BRONZE: list[Event] = [("a", 10, 0, "insert"), ("a", 10, 1, "update"), ("a", 20, 0, "delete"), ("b", 5, 0, "insert")]
SILVER = [("a", 10, 0, "insert", 1), ("a", 10, 1, "update", 2), ("a", 20, 0, "delete", 3), ("b", 5, 0, "insert", 1)]


def test_an_equal_history_passes_with_re_delivered_copies_messages_and_events_above_the_loaded_position() -> None:
    bronze = [*BRONZE, ("a", 10, 1, "update"), ("a", 15, 0, "message"), ("a", 30, 0, "insert"), ("c", 1, 0, "insert")]
    assert violations(SILVER, bronze) == []


def test_a_silver_event_bronze_does_not_hold_fails() -> None:
    silver = [*SILVER, ("a", 25, 0, "insert", 4)]
    assert violations(silver, BRONZE) == [("a", 25, 0, "not in bronze")]
    # The same key under another action is not the bronze event either.
    changed = [("a", 10, 0, "update", 1), *SILVER[1:]]
    assert ("a", 10, 0, "not in bronze") in violations(changed, BRONZE)


def test_a_bronze_event_below_the_loaded_position_missing_from_silver_fails() -> None:
    bronze = [*BRONZE, ("a", 15, 3, "insert"), ("a", 20, 0, "update")]
    assert violations(SILVER, bronze) == [
        ("a", 15, 3, "missing below the loaded position"),
        ("a", 20, 0, "missing below the loaded position"),
    ]


def test_a_seq_that_is_not_the_position_rank_fails() -> None:
    silver = [("a", 10, 0, "insert", 1), ("a", 10, 1, "update", 3), ("a", 20, 0, "delete", 4), SILVER[3]]
    assert violations(silver, BRONZE) == [
        ("a", 10, 1, "seq is not the position rank"),
        ("a", 20, 0, "seq is not the position rank"),
    ]


# A batch build: source a loaded through 10 before the run, which loaded through 30 (b through 5).
HISTORY_BRONZE: list[Event] = [*BRONZE, ("a", 25, 0, "insert"), ("a", 30, 0, "update")]
HISTORY_SILVER = [*SILVER, ("a", 25, 0, "insert", 4), ("a", 30, 0, "update", 5)]
RUN = {"a": (10, 30), "b": (0, 5)}


def test_a_batch_build_checks_its_range_and_counts_the_rank_on_from_the_seq_below() -> None:
    assert violations(HISTORY_SILVER, HISTORY_BRONZE, RUN) == []
    # seq must go on from the largest seq below the range (2 at position 10/1): 3, 4, 5.
    renumbered = [
        *SILVER[:2],
        ("a", 20, 0, "delete", 4),
        SILVER[3],
        ("a", 25, 0, "insert", 5),
        ("a", 30, 0, "update", 6),
    ]
    assert violations(renumbered, HISTORY_BRONZE, RUN) == [
        ("a", 20, 0, "seq is not the position rank"),
        ("a", 25, 0, "seq is not the position rank"),
        ("a", 30, 0, "seq is not the position rank"),
    ]
    # In the range: an event silver lost, and one bronze does not hold.
    lost = [r for r in HISTORY_SILVER if r[1] != 25]
    assert ("a", 25, 0, "missing below the loaded position") in violations(lost, HISTORY_BRONZE, RUN)
    extra = [*HISTORY_SILVER, ("a", 30, 1, "delete", 6)]
    assert violations(extra, HISTORY_BRONZE, RUN) == [("a", 30, 1, "not in bronze")]


def test_below_the_range_is_the_nightly_checks() -> None:
    """An event appended to bronze below an earlier run's bound is outside every later range: the
    whole-table check (nightly, or a dbt test that built nothing) finds it, a batch build does not."""
    late = [*HISTORY_BRONZE, ("a", 5, 0, "insert")]
    assert violations(HISTORY_SILVER, late, RUN) == []
    assert ("a", 5, 0, "missing below the loaded position") in violations(HISTORY_SILVER, late)
