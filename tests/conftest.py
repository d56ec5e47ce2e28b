"""Shared fixtures: the project PostgreSQL, throwaway sources, a fresh warehouse (helpers: tests/helpers/)."""

from __future__ import annotations

import os
import re
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


# The suite runs on two pytest-xdist workers (scripts/test.sh: `-n 2`). Every module whose tests
# start Spark or dbt (a JVM with `local[2]`: the machine has 2 cores) belongs to one scope, which
# one worker runs in order and first; the other worker takes the PostgreSQL, MongoDB and unit
# modules, which mostly wait on servers, a module at a time (their module-scoped fixtures and
# scratch clusters' fixed ports stay on one worker). A module counts as Spark's when its text
# names dbt, Spark or the dbt flow helpers: erring towards the Spark scope only serializes more.
# (xdist's own `loadgroup` marks groups by rewriting node ids, which pytest 9 no longer lets it
# do, so the scopes come from a scheduler of ours.)
_SPARK_MODULE = re.compile(r"\bdbt\b|pyspark|SparkSession|spark_session|dbt_flow|cluster_flow", re.IGNORECASE)
SPARK_SCOPE = "spark-and-dbt"
_scopes: dict[Path, str] = {}


def _scope(path: Path) -> str:
    if path not in _scopes:
        text = path.read_text(encoding="utf-8", errors="replace")
        _scopes[path] = SPARK_SCOPE if _SPARK_MODULE.search(text) else str(path.relative_to(ROOT))
    return _scopes[path]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Scopes as above: a module's own, or the one Spark scope."""
    from xdist.scheduler import LoadScopeScheduling

    class SparkScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(ROOT / nodeid.split("::", 1)[0])

    return SparkScope(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the Spark scope first, so a worker starts on it at once."""
    items.sort(key=lambda item: _scope(Path(str(item.path))) != SPARK_SCOPE)  # stable: file order kept
