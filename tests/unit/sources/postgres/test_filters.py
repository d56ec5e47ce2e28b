"""A filtered snapshot's predicate must be one expression: quotes and comments are skipped as the server skips them."""

from __future__ import annotations

import pytest

from ingest.positions import SnapshotProgress
from ingest.sources.postgres.filters import filter_sql, predicate_problem


@pytest.mark.parametrize(
    "where",
    [
        "id < 100",
        "name = ')'",
        '"odd)name" = 1',
        "v = $$)$$ or v = $tag$ ( $tag$",
        "E'\\')' = v",
        "id > 5 -- ) closes nothing: a comment",
        "/* ) /* nested */ ( */ id > 1",
        "(a = 1 or b = 2) and (c)",
        "price$ > 0",
    ],
)
def test_one_expression_is_accepted(where: str) -> None:
    assert predicate_problem(where) is None


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("true) or (true", "closes a parenthesis it did not open"),
        ("id = 1; delete from t", "holds a ';'"),
        ("(id = 1", "leaves a parenthesis open"),
        ("v = 'open", "quote is never closed"),
        ('"open = 1', "quote is never closed"),
        ("v = $$open", "quote is never closed"),
        ("/* open", "comment is never closed"),
        ("  ", "empty"),
    ],
)
def test_what_would_escape_its_parentheses_is_refused(where: str, problem: str) -> None:
    assert problem in (predicate_problem(where) or "")


def test_a_trailing_comment_cannot_hide_the_page_conditions_after_it() -> None:
    assert filter_sql("id > 5 -- note").as_string(None) == "(\nid > 5 -- note\n)"


def test_pause_and_filter_survive_the_writer_row() -> None:
    from ingest.events import WriterKind, WriterPosition

    p = SnapshotProgress("s.t", "where-1", paused=True, where="v = 'a'")
    row = WriterPosition("src", p.writer_id, WriterKind.SNAPSHOT, 1, 1, p.to_json())
    back = SnapshotProgress.from_row(row)
    assert (back.paused, back.where) == (True, "v = 'a'")
    assert "paused" in back.summary() and "where v = 'a'" in back.summary()
    plain = SnapshotProgress.from_row(
        WriterPosition("src", "w", WriterKind.SNAPSHOT, 1, 1, '{"table":"s.t","snapshot_id":"x"}')
    )
    assert (plain.paused, plain.where) == (False, None)


def test_a_paused_snapshot_sets_its_table_gauge() -> None:
    from datetime import UTC, datetime

    from ingest.config import AlertsConfig
    from ingest.events import WriterKind, WriterPosition
    from ingest.ops.metrics import REGISTRY
    from ingest.ops.watch import Watcher

    def row(p: SnapshotProgress) -> tuple[WriterPosition, datetime]:
        return WriterPosition("pz", p.writer_id, WriterKind.SNAPSHOT, 5, 5, p.to_json()), datetime.now(UTC)

    rows = [
        row(SnapshotProgress("s.t", "a", paused=True)),
        row(SnapshotProgress("s.t", "b")),
        row(SnapshotProgress("s.u", "c")),
    ]
    w = Watcher("pz", AlertsConfig(), lambda: rows, None, positions_interval_s=0)
    w.poll()
    assert REGISTRY.get_sample_value("changelake_snapshot_pause_status", {"source": "pz", "table": "s.t"}) == 1
    assert REGISTRY.get_sample_value("changelake_snapshot_pause_status", {"source": "pz", "table": "s.u"}) == 0
    rows[:] = [row(SnapshotProgress("s.t", "b"))]  # the paused one was cancelled
    w.poll()
    assert REGISTRY.get_sample_value("changelake_snapshot_pause_status", {"source": "pz", "table": "s.t"}) == 0
    assert REGISTRY.get_sample_value("changelake_snapshot_pause_status", {"source": "pz", "table": "s.u"}) is None
