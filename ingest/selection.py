"""Which tables (or collections) a source captures: names, wildcard patterns and exclusions, matched exactly.

A selector names one table (`public.orders`) or many (`public.*`, `tenant_*.orders`): `*` stands
for any run of characters and `?` for one, in either part. Matching is case-exact against the
names the catalog stores (Postgres folds an unquoted `CREATE TABLE Orders` to `orders`). A part
in double quotes is taken literally (`"Sales*2024"` names a table with a star in it; `""` is a
quote inside it). The selection is pure: resolving it against a live catalog is the source's job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WILDCARDS = frozenset("*?")
QUOTE = '"'


@dataclass(frozen=True, slots=True)
class NamePart:
    """One part of a selector (a schema, a table or a collection name): literal text or a wildcard pattern."""

    text: str
    literal: bool

    @property
    def is_pattern(self) -> bool:
        """Whether this part can match more than one name."""
        return not self.literal and any(c in WILDCARDS for c in self.text)

    def matches(self, name: str) -> bool:
        """Whether the catalog name `name` is matched (case-exact)."""
        if not self.is_pattern:
            return name == self.text
        return _compiled(self.text).fullmatch(name) is not None


def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), re.DOTALL)


def _unquote(part: str, selector: str) -> NamePart:
    if len(part) >= 2 and part[0] == QUOTE and part[-1] == QUOTE:
        inner = part[1:-1]
        if QUOTE in inner.replace(QUOTE * 2, ""):
            raise ValueError(f"{selector!r}: a double quote inside a quoted name is written twice")
        return NamePart(inner.replace(QUOTE * 2, QUOTE), literal=True)
    return NamePart(part, literal=False)


def _split_qualified(selector: str) -> list[str]:
    """`schema.table` split on the dot outside double quotes (a part is quoted if it starts with one)."""
    parts: list[str] = []
    current = ""
    quoted = False
    for c in selector:
        if c == QUOTE and current[:1] in ("", QUOTE):
            quoted = not quoted  # a doubled quote toggles twice: still inside
        elif c == "." and not quoted:
            parts.append(current)
            current = ""
            continue
        current += c
    parts.append(current)
    return parts


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed `tables:` (or `collections:`) entry: one part per level of the name."""

    text: str
    parts: tuple[NamePart, ...]

    @classmethod
    def parse(cls, text: str, levels: int) -> Selector:
        """Parse `text` into `levels` parts (2: `schema.table`; 1: a collection); ValueError saying what is wrong."""
        if levels == 1:
            raw = [text]
        else:
            raw = _split_qualified(text)
            if len(raw) != levels:
                raise ValueError(f"{text!r} is not schema.table (a dot inside a name is not supported)")
        parts = tuple(_unquote(p, text) for p in raw)
        if any(not p.text for p in parts):
            raise ValueError(f"{text!r} has an empty name part")
        if levels > 1 and any("." in p.text for p in parts):
            raise ValueError(f"{text!r}: a dot inside a schema or table name is not supported")
        return cls(text, parts)

    @property
    def is_pattern(self) -> bool:
        """Whether the selector can match more than one name."""
        return any(p.is_pattern for p in self.parts)

    @property
    def name(self) -> str:
        """The one name a selector without wildcards names (`schema.table` as the rest of ingest spells it)."""
        return ".".join(self.parts_text)

    @property
    def parts_text(self) -> tuple[str, ...]:
        """The parts' text (unquoted)."""
        return tuple(p.text for p in self.parts)

    def matches(self, name: Sequence[str]) -> bool:
        """Whether the name given by its parts (`(schema, table)`, or `(collection,)`) is selected."""
        return len(name) == len(self.parts) and all(p.matches(n) for p, n in zip(self.parts, name, strict=True))


@dataclass(frozen=True, slots=True)
class Selection:
    """The tables a source captures: what its selectors match minus what its exclusions match.

    Responsibilities: parse and check the entries, tell whether any is a pattern (only then does
    the set depend on the catalog and change while running), match a name, and resolve the
    selection against a catalog's names, in the order the entries list them.
    """

    include: tuple[Selector, ...]
    exclude: tuple[Selector, ...]
    levels: int

    @classmethod
    def parse(cls, include: Iterable[str], exclude: Iterable[str], levels: int) -> Selection:
        """Parse the entries; ValueError naming the first one that is malformed."""
        inc = tuple(Selector.parse(t, levels) for t in include)
        exc = tuple(Selector.parse(t, levels) for t in exclude)
        both = [s.text for s in inc if not s.is_pattern and any(e.matches(s.parts_text) for e in exc)]
        if both:
            raise ValueError(f"{', '.join(both)} is listed and also excluded; keep one")
        return cls(inc, exc, levels)

    @property
    def has_patterns(self) -> bool:
        """Whether any entry is a pattern (the captured set then follows the catalog)."""
        return any(s.is_pattern for s in self.include)

    @property
    def named(self) -> list[str]:
        """The entries without wildcards, as names: each must exist (a pattern may match nothing)."""
        return [s.name for s in self.include if not s.is_pattern]

    def matches(self, name: Sequence[str]) -> bool:
        """Whether `name` (its parts) is selected and not excluded."""
        return any(s.matches(name) for s in self.include) and not any(e.matches(name) for e in self.exclude)

    def resolve(self, catalog: Iterable[Sequence[str]]) -> list[str]:
        """The selected names: every named entry (whether or not the catalog has it), then pattern matches.

        Named entries keep their order; each pattern adds its matches in catalog-name order, once.
        """
        out = self.named
        seen = set(out)
        names = sorted(tuple(n) for n in catalog)
        for s in self.include:
            if not s.is_pattern:
                continue
            for n in names:
                joined = ".".join(n)
                if joined not in seen and s.matches(n) and not any(e.matches(n) for e in self.exclude):
                    out.append(joined)
                    seen.add(joined)
        return out
