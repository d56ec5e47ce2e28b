"""Merged gold models: the tenants of a source's tenant merge as one typed view with a tenant column.

Each tenant is a captured table with its own rows in silver (keyed by schema and table, so keys
never collide); the model is a `union all` of one typed_current_state call per tenant over one
shared column list, the tenant value first. consumer_records holds every table as of the same
safe bound, so the union is one consistent cut. Tenants whose shape (columns, gold types, key)
differs are refused with a message naming each one and how it differs: a union would silently
drop, null or mistype a column. The model's `merge` line records what the drift test
(tests/dbt/assert_generated_gold_matches_table_columns.sql) needs to find a tenant the model does
not union yet: the pattern's literal pieces and the matching tables the source leaves out.
docs/dbt.md ("Tenant merges") describes the files.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from ingest.config import PostgresSource
from ingest.errors import ConfigError
from ingest.gold import (
    HEADER,
    GoldColumn,
    GoldTable,
    ModelFiles,
    column_docs,
    column_line,
    contract,
    diff,
    inert,
    listed_items,
    model_yml,
    previous_columns,
)
from ingest.selection import Selector
from ingest.tenants import TenantMerge

_TENANT_LINE = re.compile(r"^\s*(\{.*\}),?\s*$")
_MERGE_LINE = re.compile(r"^\{%-? set merge = (\{.*\}) %\}$")


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant of a merge: its value in the tenant column and its captured table."""

    value: str
    table: GoldTable


@dataclass(frozen=True, slots=True)
class MergedTable:
    """The tenants of one merge (sorted by tenant value), all of the reference tenant's shape."""

    source: str
    merge: TenantMerge
    tenants: tuple[Tenant, ...]
    reference: GoldTable  # the tenant whose shape (and comments) the model takes
    left_out: tuple[tuple[str, str], ...] = ()  # (schema, table) the pattern matches that the source excludes

    @property
    def model(self) -> str:
        """`<source>__<merge_as>`."""
        return f"{self.source}__{self.merge.merge_as}"

    @property
    def columns(self) -> list[GoldColumn]:
        """The source columns (the reference tenant's)."""
        return self.reference.columns


def name_pieces(merge: TenantMerge) -> list[list[str]]:
    """Per name part (schema, table): the literal text before and after its `*`, or the one text of a part without.

    What TenantMerge.tenant_of matches, for the drift test to match table_columns' names in SQL.
    """
    parts = Selector.parse(merge.pattern, 2).parts
    return [[p.text] if p.literal or "*" not in p.text else p.text.split("*") for p in parts]


def shape_of(t: GoldTable) -> dict[str, tuple[str, int | None]]:
    """What a union needs equal across tenants: each column's gold type and key position, by name."""
    return {c.name: (c.spark_type, c.pk_position) for c in t.columns}


def differences(reference: GoldTable, other: GoldTable) -> list[str]:
    """How `other`'s shape differs from `reference`'s, as phrases (empty if a union may take both)."""
    ref, got = shape_of(reference), shape_of(other)
    out = [f"has {n} ({got[n][0]}) that {reference.schema}.{reference.table} lacks" for n in got if n not in ref]
    out += [f"lacks {n} ({ref[n][0]})" for n in ref if n not in got]
    out += [f"types {n} as {got[n][0]}, not {ref[n][0]}" for n in ref if n in got and got[n][0] != ref[n][0]]
    ref_key = [n for n, (_, pk) in sorted(ref.items(), key=lambda x: x[1][1] or 0) if pk is not None]
    got_key = [n for n, (_, pk) in sorted(got.items(), key=lambda x: x[1][1] or 0) if pk is not None]
    if ref_key != got_key:
        out.append(f"has key ({', '.join(got_key)}), not ({', '.join(ref_key)})")
    return out


def merge_tables(
    tables: list[GoldTable], sources: Mapping[str, PostgresSource]
) -> tuple[list[GoldTable], list[MergedTable]]:
    """Split `tables` into those no merge of their source takes and one MergedTable per merge with tenants.

    A table the source's `exclude` leaves out is no tenant (table_columns keeps every table it saw).

    ConfigError naming every tenant whose shape differs from its merge's most common shape (ties:
    the first tenant), a table two merges take, or a tenant column that is also a source column.
    A merge with no tenant yet has no model.
    """
    groups: dict[tuple[str, int], list[Tenant]] = {}
    left_out: dict[tuple[str, int], list[tuple[str, str]]] = {}
    rest = []
    for t in tables:
        src = sources.get(t.source)
        taken = src is not None and src.selection.matches((t.schema, t.table))
        for i, m in enumerate(src.merges if src is not None and not taken else []):
            if m.tenant_of(t.schema, t.table) is not None:
                left_out.setdefault((t.source, i), []).append((t.schema, t.table))
        merges = src.merges if src is not None and taken else []
        found = [(i, v) for i, m in enumerate(merges) if (v := m.tenant_of(t.schema, t.table)) is not None]
        if len(found) > 1:
            names = " and ".join(merges[i].merge_as for i, _ in found)
            raise ConfigError(
                f"gold generate: {t.schema}.{t.table} of source {t.source} is a tenant of merges {names}; "
                "narrow a pattern (or exclude the table)"
            )
        if not found:
            rest.append(t)
        for i, value in found:
            groups.setdefault((t.source, i), []).append(Tenant(value, t))
    merged, problems = [], []
    for (source, i), tenants in sorted(groups.items()):
        m = sources[source].merges[i]
        tenants.sort(key=lambda x: x.value)
        keys = [json.dumps(shape_of(x.table), sort_keys=True) for x in tenants]
        shapes = Counter(keys)
        reference = tenants[keys.index(shapes.most_common(1)[0][0])].table  # ties: the first tenant's shape
        name = f"{source}__{m.merge_as}"
        if m.tenant_column.lower() in {c.output_name.lower() for c in reference.columns}:
            problems.append(f"  {name}: tenant_column {m.tenant_column} is a column of the tenants too; pick another")
        for x in tenants:
            diff = differences(reference, x.table)
            if diff:
                problems.append(f"  {name}: tenant {x.value!r} ({x.table.schema}.{x.table.table}) " + "; ".join(diff))
        others = tuple(sorted(left_out.get((source, i), [])))
        merged.append(MergedTable(source, m, tuple(tenants), reference, others))
    if problems:
        raise ConfigError(
            "gold generate: a tenant merge cannot be one model, so nothing was written (migrate the tenants "
            "alike, or exclude a tenant from the source until it is):\n" + "\n".join(problems)
        )
    return rest, merged


def render_merged_sql(m: MergedTable) -> str:
    """The model's SQL: the merge line, the columns once, the tenants one per line, a union of typed_current_state.

    Column lines read back as in a per-table model (gold.previous_columns); tenant lines are JSON
    objects (previous_tenants); the merge line is one JSON object (previous_left_out). The drift
    test reads all three.
    """
    record = {
        "source": m.source,
        "tenant_column": m.merge.tenant_column,
        "pattern": m.merge.pattern,
        "name_pieces": name_pieces(m.merge),
        "left_out": [list(x) for x in m.left_out],
    }
    lines = [
        HEADER,
        "-- The tenants of one merge: the column list once, one typed_current_state per tenant, union all.\n",
        "-- merge: name_pieces is the text around the pattern's * in the schema and the table name (one piece\n",
        "-- where a part has none); left_out, the tables the pattern matches that the source excludes.\n",
        "{{ config(materialized='view') }}\n\n",
        f"{{%- set merge = {json.dumps(record, ensure_ascii=False)} %}}\n",
        "{%- set columns = [\n",
    ]
    lines += [column_line(c) for c in m.columns]
    lines += ["] %}\n", "{%- set tenants = [\n"]
    for x in m.tenants:
        entry = {"tenant": x.value, "schema": x.table.schema, "table": x.table.table}
        lines.append(f"        {json.dumps(entry, ensure_ascii=False)},\n")
    lines += [
        "] %}\n",
        "{%- for tenant in tenants %}\n",
        "{% if not loop.first %}union all\n{% endif %}\n",
        "select\n",
        "    {{ changelake.sql_literal(tenant.tenant) }} as {{ changelake.spark_identifier(merge.tenant_column) }},\n",
        "    *\n",
        "from (\n",
        "    {{ changelake.typed_current_state(merge.source, tenant.schema, tenant.table, columns) }}\n",
        ") as {{ 'tenant_' ~ loop.index }}\n",
        "{%- endfor %}\n",
    ]
    return "".join(lines)


def previous_tenants(sql: str) -> list[str]:
    """The tenant values of a model file render_merged_sql wrote (empty for any other file)."""
    return [
        item["tenant"]
        for item in listed_items(sql, _TENANT_LINE)
        if isinstance(item, dict) and isinstance(item.get("tenant"), str)
    ]


def previous_left_out(sql: str) -> list[tuple[str, str]]:
    """The left_out tables of a model file render_merged_sql wrote (empty for any other file or an older one)."""
    for text in sql.splitlines():
        m = _MERGE_LINE.match(text)
        if m:
            try:
                record = json.loads(m.group(1))
            except json.JSONDecodeError:
                return []
            items = record.get("left_out") if isinstance(record, dict) else None
            return [(x[0], x[1]) for x in items or [] if isinstance(x, list) and len(x) == 2]
    return []


def render_merged_yml(m: MergedTable) -> str:
    """The model's yml: its contract (every column's Spark type, gold.contract), docs, tests per tenant and key."""
    ref = m.reference
    description = (
        f"One row per current (non-deleted) record of each tenant's table of source {m.source} matched by "
        f"{m.merge.pattern} ({len(m.tenants)} tenants), the tenant (what the pattern's * matched) in "
        f"{m.merge.tenant_column}; one typed column per source column; bookkeeping columns are prefixed _cl_."
    )
    tenant = {
        "name": m.merge.tenant_column,
        "description": inert(f"The tenant: the part of the table's name {m.merge.pattern} matched with *."),
        "data_type": "string",
        "data_tests": ["not_null"],
    }
    columns = [tenant, *column_docs(ref, unique_key=False)]
    key = [m.merge.tenant_column, "_cl_record_pk"]
    tests = [{"changelake.unique_combination_of_columns": {"combination_of_columns": key}}]
    model = {
        "name": m.model,
        "description": inert(description),
        **contract(ref),
        "data_tests": tests,
        "columns": columns,
    }
    return model_yml(model)


def merged_files(m: MergedTable) -> ModelFiles:
    """The files of a merge's model; a re-run says which columns and which tenants changed."""
    what = f"new model, {len(m.tenants)} tenants of {m.merge.pattern}, {len(m.columns)} columns ({m.source})"

    def changes(old_sql: str) -> list[str]:
        before = previous_tenants(old_sql)
        now = [x.value for x in m.tenants]
        out = diff(previous_columns(old_sql), m.columns)
        out += [f"tenant {v} added" for v in now if v not in before]
        out += [f"tenant {v} removed" for v in before if v not in now]
        left_before = previous_left_out(old_sql)
        out += [f"{s}.{t} left out (the source excludes it)" for s, t in m.left_out if (s, t) not in left_before]
        return out

    return ModelFiles(m.model, render_merged_sql(m), render_merged_yml(m), what, changes)
