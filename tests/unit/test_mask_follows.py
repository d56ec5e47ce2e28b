"""Masks follow the column across renames: the rules follow it by attnum, and the shape check backs them up."""

from __future__ import annotations

import pytest

from ingest.errors import SourceError
from ingest.events import ColumnShape, RelationShape
from ingest.masking import MaskWith, TableMask, check_masks_followed
from ingest.sources.postgres.followed import recorded_columns

ID, N = ("id", False), ("n", False)


def check(before: list[tuple[str, bool]], now: list[tuple[str, bool]], dropped: bool = False) -> None:
    """Shapes without attnums (recorded before they were): matched by names and places."""
    check_masks_followed("s.users", [(n, m, None) for n, m in before], [(n, m, None) for n, m in now], dropped, "src")


def check_numbered(before: list[tuple[str, bool, int]], now: list[tuple[str, bool, int]]) -> None:
    """Shapes whose columns all carry their attnum; the table has dropped columns (places tell nothing)."""
    check_masks_followed("s.users", list(before), list(now), True, "src")


def test_a_rule_that_followed_its_column_passes() -> None:
    check([ID, ("email", True), N], [ID, ("email_address", True), N])
    check([ID, ("email", True), N], [ID, ("email", True), N, ("added", False)])  # no rename at all
    check([ID, N], [ID, ("n2", False)])  # no masked column involved


def test_a_masked_name_given_to_a_new_column_is_refused() -> None:
    with pytest.raises(SourceError, match=r"column email \(masked\) was renamed to email_plain, which no rule masks"):
        check([ID, ("email", True), N], [ID, ("email_plain", False), N, ("email", True)])
    with pytest.raises(SourceError, match=r"column email \(masked\) was renamed to old_email"):
        check([ID, N, ("email", True)], [ID, N, ("old_email", False), ("email", True)])  # the last column


def test_two_names_swapped_are_refused() -> None:
    with pytest.raises(SourceError, match=r"column a \(masked\) was renamed to b"):
        check([ID, ("a", True), ("b", False)], [ID, ("b", False), ("a", True)])


def test_with_dropped_columns_places_do_not_tell() -> None:
    with pytest.raises(SourceError, match="has dropped columns"):
        check([ID, ("email", True), N], [ID, ("email_plain", False), N, ("email", True)], dropped=True)
    # every name that is new since is masked, and no name took another's place: the values stay masked
    check([ID, ("email", True), N], [ID, ("email_address", True), N], dropped=True)
    with pytest.raises(SourceError, match="has dropped columns"):  # the name email moved: not accepted
        check([ID, ("email", True), N], [ID, ("email_plain", True), N, ("email", True)], dropped=True)
    with pytest.raises(SourceError, match="has dropped columns"):
        check([ID, ("a", True), ("b", False)], [ID, ("b", True), ("a", True)], dropped=True)


def test_with_attnums_drop_rename_add_that_keeps_every_name_in_place_is_refused() -> None:
    """`drop d; rename email to d; add email` left every name where it was and passed the name check.

    The former email values, now in d, then landed in plaintext in the stream and the re-snapshot.
    """
    before = [("id", False, 1), ("d", False, 2), ("email", True, 3)]
    with pytest.raises(SourceError, match=r"table s.users: column email \(masked\) was renamed to d, which no rule"):
        check_numbered(before, [("id", False, 1), ("d", False, 3), ("email", True, 4)])
    check_numbered(before, [("id", False, 1), ("d", True, 3), ("email", True, 4)])  # d masked too: followed
    check_numbered(before, [("id", False, 1), ("d", True, 3), ("email", False, 4)])  # the new email is not the old


def test_with_attnums_the_column_is_followed_whatever_names_and_places_say() -> None:
    base = [("id", False, 1), ("email", True, 2), ("n", False, 3)]
    check_numbered(base, [("id", False, 1), ("email_address", True, 2), ("n", False, 3)])  # renamed, rule moved
    # The name moved to a new column and both names are masked: places alone refused this.
    check_numbered(base, [("id", False, 1), ("email_plain", True, 2), ("n", False, 3), ("email", True, 4)])
    check_numbered(base, [("id", False, 1), ("n", False, 3)])  # dropped: nothing of it lands
    check_numbered(base, [("id", False, 1), ("email", False, 2), ("n", False, 3)])  # its rule taken off
    with pytest.raises(SourceError, match=r"column email \(masked\) was renamed to n, which no rule masks"):
        check_numbered(base, [("id", False, 1), ("n", False, 2), ("email", True, 3)])  # two names swapped


def test_a_shape_without_attnums_falls_back_to_names_and_places() -> None:
    """One column without an attnum (a shape recorded before they were) and the names decide."""
    before: list[tuple[str, bool, int | None]] = [("id", False, None), ("d", False, None), ("email", True, None)]
    check_masks_followed("s.users", before, [("id", False, 1), ("d", False, 3), ("email", True, 4)], True, "src")


SALTED = TableMask(frozenset(), frozenset({"email"}), MaskWith.HASH, b"s" * 16)


def test_a_renamed_masked_column_is_masked_under_its_new_name(caplog: pytest.LogCaptureFixture) -> None:
    """RENAME COLUMN of a masked column refused the stream: the rule named the spelling, not the column."""
    followed = SALTED.follow_renames("s.users", {"id": 1, "contact_email": 2, "n": 3}, [("email", 2, True)], "src")
    assert followed.mask == {"email", "contact_email"} and followed.followed == {"email"}
    assert "masked column email was renamed to contact_email (the same column, attnum 2)" in caplog.text
    assert "list contact_email in mask_columns" in caplog.text
    followed.check_names("s.users", ["id", "contact_email", "n"], "src")  # the old name is not refused
    # Old WAL still carries the former name: masked by it, with no guess.
    assert followed.for_relation("s.users", ["id", "email", "n"], ["id", "contact_email", "n"], "src") == followed


def test_a_name_that_never_was_a_recorded_masked_column_is_still_refused() -> None:
    followed = SALTED.follow_renames("s.users", {"id": 1, "contact_email": 2}, [], "src")
    assert followed is SALTED
    with pytest.raises(SourceError, match=r"name email, which the table does not have"):
        followed.check_names("s.users", ["id", "contact_email"], "src")
    typo = TableMask(frozenset(), frozenset({"emial"}), MaskWith.HASH, b"s" * 16)
    followed = typo.follow_renames("s.users", {"id": 1, "contact_email": 2}, [("email", 2, True)], "src")
    with pytest.raises(SourceError, match=r"name emial, which the table does not have"):
        followed.check_names("s.users", ["id", "contact_email"], "src")


def test_drop_rename_add_masks_the_former_column_and_the_new_one() -> None:
    """`drop d; rename email to d; add email`: d holds the former email values, and the rule's name a new column."""
    followed = SALTED.follow_renames("s.users", {"id": 1, "d": 3, "email": 4}, [("email", 3, True)], "src")
    assert followed.mask == {"email", "d"} and followed.followed == frozenset()


def test_a_rule_whose_name_is_gone_follows_the_column_recorded_under_it_unmasked() -> None:
    """Rule added and column renamed while ingest was stopped: bronze recorded the column, but not masked yet."""
    followed = SALTED.follow_renames("s.users", {"id": 1, "contact_email": 2}, [("email", 2, False)], "src")
    assert followed.mask == {"email", "contact_email"} and followed.followed == {"email"}
    # The rule's name is a column now: the rule is that column's, and the unmasked one renamed away stays so.
    assert SALTED.follow_renames("s.users", {"id": 1, "old_email": 2, "email": 5}, [("email", 2, False)], "s") is SALTED
    # Dropped and added again under the name, then renamed twice: each column the name was is masked.
    twice = SALTED.follow_renames("s.users", {"id": 1, "a": 2, "b": 5}, [("email", 2, True), ("email", 5, False)], "s")
    assert twice.mask == {"email", "a", "b"}


def test_what_does_not_follow() -> None:
    now = {"id": 1, "email": 2, "n": 3}
    assert SALTED.follow_renames("s.users", now, [("email", 2, True)], "src") is SALTED  # not renamed
    assert SALTED.follow_renames("s.users", {"id": 1, "n": 3}, [("email", 2, True)], "src") is SALTED  # dropped
    # Recorded masked under a name no rule names now: the rule was taken off, as the config says.
    assert SALTED.follow_renames("s.users", {"id": 1, "phone": 2, "email": 3}, [("phone", 2, True)], "src") is SALTED
    # An excluded column is never in a recorded shape: nothing to follow it by.
    excluded = TableMask(frozenset({"ssn"}), frozenset(), MaskWith.NULL, None)
    assert excluded.follow_renames("s.users", {"id": 1, "tax_id": 2}, [("ssn", 2, False)], "src") is excluded
    # The config lists the new name already: nothing to say.
    both = TableMask(frozenset(), frozenset({"email", "contact_email"}), MaskWith.HASH, b"s" * 16)
    assert both.follow_renames("s.users", {"id": 1, "contact_email": 2}, [("email", 2, True)], "src") is both


def test_recorded_columns_are_taken_from_shapes_with_attnums() -> None:
    def col(name: str, kind: str, attnum: int | None) -> ColumnShape:
        return ColumnShape(name, 25, "text", -1, False, None, kind, attnum)

    shapes = [
        RelationShape(7, "s", "users", "d", (col("id", "number", 1), col("email", "masked", 2)), 10),
        RelationShape(7, "s", "users", "d", (col("id", "number", 1), col("contact_email", "masked", 2)), 20),
        RelationShape(7, "s", "users", "d", (col("id", "number", None), col("phone", "masked", None)), 30),
    ]
    assert recorded_columns(shapes) == {
        ("s.users", 7, "id", 1, False),
        ("s.users", 7, "email", 2, True),
        ("s.users", 7, "contact_email", 2, True),
    }
