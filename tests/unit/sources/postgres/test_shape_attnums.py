"""Shape changes matched by attnum where both shapes have them, by name and place otherwise."""

from __future__ import annotations

from ingest.events import ColumnShape, RelationShape
from ingest.sources.postgres.schema_changes import shape_change_kinds

INT4, TEXT = 23, 25


def shape(*cols: tuple[str, int, int | None]) -> RelationShape:
    """A shape of (name, type oid, attnum) columns, keyed by `id`."""
    return RelationShape(
        1,
        "public",
        "t",
        "d",
        tuple(ColumnShape(n, oid, str(oid), -1, n == "id", 1 if n == "id" else None, "text", a) for n, oid, a in cols),
        0,
    )


def test_drop_rename_add_is_three_changes_by_attnum() -> None:
    """Same names and types before and after: by names nothing changed, by attnum a dropped, b -> a, b added."""
    before = shape(("id", INT4, 1), ("a", TEXT, 2), ("b", TEXT, 3))
    after = shape(("id", INT4, 1), ("a", TEXT, 3), ("b", TEXT, 4))
    assert shape_change_kinds(before, after) == {"added": ["b"], "dropped": ["a"], "renamed": ["b -> a"]}


def test_a_retyped_column_is_the_one_with_its_attnum() -> None:
    """`drop a; rename b to a` where b was text and a int: a's attnum left, b's is now called a and still text."""
    before = shape(("id", INT4, 1), ("a", INT4, 2), ("b", TEXT, 3))
    after = shape(("id", INT4, 1), ("a", TEXT, 3))
    assert shape_change_kinds(before, after) == {"dropped": ["a"], "renamed": ["b -> a"]}


def test_a_shape_without_attnums_is_compared_by_name() -> None:
    """A shape recorded before attnums were, against the same columns with them: no change (the upgrade's re-record)."""
    old = shape(("id", INT4, None), ("a", TEXT, None), ("b", TEXT, None))
    assert shape_change_kinds(old, shape(("id", INT4, 1), ("a", TEXT, 2), ("b", TEXT, 3))) == {}
    assert shape_change_kinds(old, shape(("id", INT4, 1), ("c", TEXT, 2), ("b", TEXT, 3))) == {"renamed": ["a -> c"]}
