"""Shared fixtures: the project PostgreSQL, throwaway sources, a fresh warehouse (helpers: tests/helpers/)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.pg import ROOT, PgSource


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """CHANGELAKE_PG_DSN, or the project-owned cluster (started if needed)."""
    dsn = os.environ.get("CHANGELAKE_PG_DSN")
    if dsn:
        return dsn
    out = subprocess.run(["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def make_source(pg_dsn: str) -> Iterator[Any]:
    """Factory of throwaway Postgres sources (random schema, slot and publication names)."""
    made: list[PgSource] = []

    def make(tables_sql: str, table_names: list[str]) -> PgSource:
        s = PgSource(pg_dsn, tables_sql, table_names)
        made.append(s)
        return s

    yield make
    for s in made:
        s.drop()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    """A fresh warehouse directory for one test."""
    return tmp_path / "warehouse"


