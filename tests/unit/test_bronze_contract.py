"""One bronze contract: ingest's Arrow schemas (ingest/bronze/schemas.py) are the definition.

The copies a reader meets elsewhere must agree with it, column for column: docs/bronze.md (names,
types, partitioning) and the dbt sources (models/bronze/_bronze__sources.yml, names in order).
This test fails the moment one copy drifts. The dbt fixture writer builds its tables from the same
schemas (tests/helpers/bronze_fixture.py), and dbt registers whatever ingest created.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from ingest.bronze.schemas import ALL_TABLES, BronzeTable

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/bronze.md").read_text()
SOURCES = yaml.safe_load((ROOT / "models/bronze/_bronze__sources.yml").read_text())


def spark_type(t: pa.DataType) -> str:
    """The Spark SQL name of an Arrow type, as docs/bronze.md writes it."""
    if pa.types.is_string(t):
        return "string"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_list(t):
        return f"array<{spark_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}:{spark_type(f.type)}" for f in t) + ">"
    raise AssertionError(f"no Spark name for {t}")


def doc_section(table: str) -> str:
    start = DOC.index(f"## `bronze.{table}`")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end >= 0 else None]


def doc_columns(table: str) -> list[tuple[str, str]]:
    """(name, type) per row of the section's column table; `a`, `b` rows name several columns."""
    out, in_table = [], False
    for line in doc_section(table).splitlines():
        if line.startswith("| column | type |"):
            in_table = True  # the section's column table (not its other tables, e.g. MongoDB rows)
        elif in_table and not line.startswith("|"):
            break
        elif in_table and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out += [(name, cells[1]) for name in re.findall(r"`([a-z_]+)`", cells[0])]
    return out


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_docs_list_every_column_with_its_type_in_order(table: BronzeTable) -> None:
    expected = [(f.name, spark_type(f.type)) for f in table.schema]
    assert doc_columns(table.name) == expected


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_docs_state_the_partitioning(table: BronzeTable) -> None:
    said = re.search(r"partitioned by ((?:`[a-z_]+`(?:, )?)+)", doc_section(table.name))
    assert said is not None, f"docs/bronze.md does not say how {table.name} is partitioned"
    assert tuple(re.findall(r"`([a-z_]+)`", said.group(1))) == table.partition_by


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_dbt_sources_document_every_column_in_order(table: BronzeTable) -> None:
    (bronze,) = [s for s in SOURCES["sources"] if s["name"] == "bronze"]
    (declared,) = [t for t in bronze["tables"] if t["name"] == table.name]
    assert [c["name"] for c in declared["columns"]] == table.schema.names
    assert all(c.get("description") for c in declared["columns"])


def test_dbt_sources_declare_exactly_the_bronze_tables() -> None:
    (bronze,) = [s for s in SOURCES["sources"] if s["name"] == "bronze"]
    assert sorted(t["name"] for t in bronze["tables"]) == sorted(t.name for t in ALL_TABLES)
