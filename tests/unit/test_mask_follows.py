"""Masks follow the column across renames: which shape changes keep a masked column's values masked."""

from __future__ import annotations

import pytest

from ingest.errors import SourceError
from ingest.masking import check_masks_followed

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
