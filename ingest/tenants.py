"""A tenant merge: the tables one `tables:` pattern matches, taken as one logical table with a tenant column.

`{pattern: "tenant_*.orders", merge_as: orders, tenant_column: tenant}` captures every
`tenant_<x>.orders` as usual (bronze and silver keep each physical table, so no keys collide) and
has `gold generate` write one model over all of them, the tenant column holding what the pattern's
single `*` matched (`acme` for `tenant_acme.orders`). One star, so the tenant names its table
uniquely and reads without a rule to remember; docs/dbt.md ("Tenant merges") has the rest.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ingest.selection import Selector

_MERGE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
BOOKKEEPING_PREFIX = "_cl_"


class TenantMerge(BaseModel):
    """One merge entry of a Postgres source.

    Responsibilities: check the entry (one `*` in the pattern, a model-name-safe `merge_as`, a
    plain tenant column that is not a bookkeeping one) and say which tables are tenants and with
    which tenant value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str
    merge_as: str
    tenant_column: str = "tenant"

    @field_validator("pattern")
    @classmethod
    def _one_star(cls, v: str) -> str:
        selector = Selector.parse(v, 2)
        unquoted = [p.text for p in selector.parts if not p.literal]
        if sum(t.count("*") for t in unquoted) != 1 or any("?" in t for t in unquoted):
            raise ValueError(
                f"{v!r}: a tenant pattern has exactly one `*` and no `?` (what the `*` matches is the tenant), "
                "e.g. tenant_*.orders"
            )
        return v

    @field_validator("merge_as")
    @classmethod
    def _model_safe(cls, v: str) -> str:
        if not _MERGE_NAME.match(v):
            raise ValueError(f"{v!r} must be lowercase letters, digits and _ (it names the gold model <source>__{v})")
        return v

    @field_validator("tenant_column")
    @classmethod
    def _plain_column(cls, v: str) -> str:
        if not _COLUMN_NAME.match(v) or v.lower().startswith(BOOKKEEPING_PREFIX):
            raise ValueError(
                f"{v!r} must be letters, digits and _, not starting with {BOOKKEEPING_PREFIX} (gold's bookkeeping)"
            )
        return v

    @model_validator(mode="after")
    def _compiles(self) -> TenantMerge:
        self._regexes()
        return self

    def _regexes(self) -> tuple[re.Pattern[str], ...]:
        """One regex per name part; the part with the star captures it as group `tenant`."""
        out = []
        for part in Selector.parse(self.pattern, 2).parts:
            if part.literal or "*" not in part.text:
                out.append(re.compile(re.escape(part.text)))
                continue
            before, after = part.text.split("*")
            out.append(re.compile(f"{re.escape(before)}(?P<tenant>.*){re.escape(after)}", re.DOTALL))
        return tuple(out)

    def tenant_of(self, schema: str, table: str) -> str | None:
        """The tenant value of `schema.table` (case-exact), or None if the pattern does not match it."""
        tenant = None
        for regex, name in zip(self._regexes(), (schema, table), strict=True):
            m = regex.fullmatch(name)
            if m is None:
                return None
            tenant = m.groupdict().get("tenant", tenant)
        return tenant


def fold_merge_entries(raw: object) -> object:
    """Move a source's `{pattern: ..., merge_as: ...}` entries of `tables` to `merges`, leaving the pattern."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tables"), list):
        return raw
    entries = [e for e in raw["tables"] if isinstance(e, dict) and ("merge_as" in e or "pattern" in e)]
    if not entries:
        return raw
    merges = raw.get("merges") or []
    if not isinstance(merges, list):
        return raw  # pydantic reports `merges` as not a list
    # An entry without a usable pattern stays out of `tables`: validating `merges` names what it lacks.
    tables = []
    for e in raw["tables"]:
        if not any(e is x for x in entries):
            tables.append(e)
        elif isinstance(e.get("pattern"), str):
            tables.append(e["pattern"])
    return {**raw, "tables": tables, "merges": [*merges, *entries]}


def check_merges(merges: list[TenantMerge], selectors: list[str]) -> None:
    """ValueError unless every merge's pattern is a `tables` entry and no two merges share a name or pattern."""
    for i, m in enumerate(merges):
        if m.pattern not in selectors:
            raise ValueError(f"merges.{i}: {m.pattern} is not one of the source's `tables` entries; list it there")
    for key in ("merge_as", "pattern"):
        values = [getattr(m, key) for m in merges]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise ValueError(f"merges: {key} {', '.join(dupes)} is used twice; a table belongs to one merge")
