"""Table and collection selection: names, wildcard patterns, exclusions, quoting (ingest/selection.py)."""

from __future__ import annotations

import pytest

from ingest.config import parse_config
from ingest.errors import ConfigError
from ingest.selection import Selection, Selector

CATALOG = [
    ("public", "orders"),
    ("public", "audit_2024"),
    ("public", "Orders"),
    ("tenant_a", "orders"),
    ("tenant_b", "orders"),
    ("tenant_b", "items"),
    ("tenantx", "orders"),
    ("Sales*", "q1"),
]


def test_patterns_resolve_in_entry_order_minus_exclusions() -> None:
    sel = Selection.parse(["public.*", "tenant_*.orders"], ["public.audit_*"], 2)
    assert sel.resolve(CATALOG) == ["public.Orders", "public.orders", "tenant_a.orders", "tenant_b.orders"]


def test_matching_is_case_exact() -> None:
    sel = Selection.parse(["public.o*"], [], 2)
    assert sel.resolve(CATALOG) == ["public.orders"]
    assert not sel.matches(("PUBLIC", "orders"))


def test_a_quoted_part_is_literal() -> None:
    """A star inside double quotes is a character: `"Sales*".q1` names one schema, not every `Sales...`."""
    literal = Selector.parse('"Sales*".q1', 2)
    assert not literal.is_pattern and literal.name == "Sales*.q1"
    assert literal.matches(("Sales*", "q1")) and not literal.matches(("Sales2", "q1"))
    assert Selector.parse('"a""b".t', 2).name == 'a"b.t'


def test_a_name_with_quotes_inside_stays_a_name() -> None:
    """Names the config took before (a double quote inside, not around) keep meaning the same table."""
    s = Selector.parse('t.Order Items "v2"', 2)
    assert s.name == 't.Order Items "v2"' and not s.is_pattern


def test_question_mark_is_one_character() -> None:
    sel = Selection.parse(["tenant_?.orders"], [], 2)
    assert sel.resolve(CATALOG) == ["tenant_a.orders", "tenant_b.orders"]


def test_named_entries_resolve_even_when_absent() -> None:
    """A named table must exist: it stays in the resolution so the start says it is missing."""
    assert Selection.parse(["public.gone", "tenant_b.*"], [], 2).resolve(CATALOG) == [
        "public.gone",
        "tenant_b.items",
        "tenant_b.orders",
    ]


@pytest.mark.parametrize("bad", ["public", "a.b.c", "public.", '"a.b".c'])
def test_malformed_selectors_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        Selector.parse(bad, 2)


def test_a_named_table_also_excluded_is_refused() -> None:
    with pytest.raises(ValueError, match="listed and also excluded"):
        Selection.parse(["public.orders"], ["public.*"], 2)


def test_collections_match_as_one_part() -> None:
    """A MongoDB collection name may hold dots: the whole name is one part."""
    sel = Selection.parse(["events.*", "users"], ["events.debug"], 1)
    names = [("events.click",), ("events.debug",), ("users",), ("system.views",), ("orders",)]
    assert sel.resolve(names) == ["users", "events.click"]


def _source(extra: str) -> str:
    return (
        "sources:\n  - kind: postgres\n    name: app\n    dsn: postgresql://u@h/d\n"
        "    tables: ['public.*', {name: public.people, exclude_columns: [email]}]\n" + extra
    )


def test_config_takes_patterns_and_exclusions() -> None:
    src = parse_config(_source("    exclude: [public.audit_*]\n")).sources[0]
    assert src.kind == "postgres"
    assert src.selection.has_patterns and src.tables == ["public.people"]
    assert src.selection.matches(("public", "x")) and not src.selection.matches(("public", "audit_1"))


def test_config_column_rules_must_name_a_selected_table() -> None:
    with pytest.raises(ConfigError, match="other.t is not one of the source's tables"):
        parse_config(_source("    columns: {other.t: {exclude_columns: [x]}}\n"))


def test_config_refuses_a_malformed_pattern_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"sources\.0\.tables: .*not schema\.table"):
        parse_config(_source("").replace("'public.*'", "'public'"))
