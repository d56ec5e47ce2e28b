"""Masks follow the column across renames: which shape changes keep a masked column's values masked."""

from __future__ import annotations

import pytest

from ingest.errors import SourceError
from ingest.masking import check_masks_followed

ID, N = ("id", False), ("n", False)


def check(before: list[tuple[str, bool]], now: list[tuple[str, bool]], dropped: bool = False) -> None:
    check_masks_followed("s.users", before, now, dropped, "src")


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
