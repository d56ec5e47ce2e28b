"""Shared fixtures: the project PostgreSQL, throwaway sources, a fresh warehouse (helpers: tests/helpers/)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import engine as engine_helper
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


@pytest.fixture(scope="session")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[engine_helper.Engine]:
    """The suite's warm engine (tests/helpers/engine.py), started by the first test that asks."""
    e = engine_helper.Engine(tmp_path_factory.mktemp("engine"))
    try:
        yield e
    finally:
        engine_helper.current = None
        e.down()


@pytest.fixture
def engine(shared_engine: engine_helper.Engine, warehouse: Path) -> Iterator[engine_helper.Engine]:
    """This test's dbt commands (tests/helpers/silver.py, dbt) run on the warm engine, on `warehouse`."""
    shared_engine.serve(warehouse)
    engine_helper.current = shared_engine
    try:
        yield shared_engine
    finally:
        engine_helper.current = None
        shared_engine.serving = None


# The suite runs on two pytest-xdist workers (scripts/test.sh: `-n 2`). Every test that starts
# Spark or dbt (a JVM with `local[2]`: the machine has 2 cores) belongs to one scope, which one
# worker runs in order and first; the other worker takes the PostgreSQL, MongoDB and unit tests,
# which mostly wait on servers, a module at a time (their module-scoped fixtures and scratch
# clusters' fixed ports stay on one worker). A test counts as Spark's when the text of its module
# names dbt, Spark or the dbt flow helpers and the text of the test, or of a module-level function
# or fixture it names (transitively), does too: erring towards the Spark scope only serializes
# more. (xdist's own `loadgroup` marks groups by rewriting node ids, which pytest 9 no longer lets
# it do, so the scopes come from a scheduler of ours.)
_SPARK_MODULE = re.compile(r"\bdbt\b|pyspark|SparkSession|spark_session|dbt_flow|cluster_flow", re.IGNORECASE)
SPARK_SCOPE = "spark-and-dbt"
_spark_tests: dict[Path, set[str] | None] = {}


def _tests_using_spark(path: Path) -> set[str] | None:
    """The module's test functions that use Spark or dbt (None: the module never names them)."""
    if path not in _spark_tests:
        text = path.read_text(encoding="utf-8", errors="replace")
        if not _SPARK_MODULE.search(text):
            _spark_tests[path] = None
            return None
        tree = ast.parse(text)
        defs = {
            node.name: node
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        # Module-level code outside functions (imports, constants) counts for every test.
        body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
        outside = "\n".join(
            ast.get_source_segment(text, node) or ""
            for node in body
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom)
        )
        names = {
            name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            | {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
            for name, node in defs.items()
        }
        own = {
            name: bool(_SPARK_MODULE.search(ast.get_source_segment(text, node) or "")) for name, node in defs.items()
        }
        spark = {name for name, uses in own.items() if uses}
        changed = True
        while changed:  # a def naming a Spark def uses Spark
            changed = False
            for name in defs.keys() - spark:
                if names[name] & spark:
                    spark.add(name)
                    changed = True
        everything = set(defs) if _SPARK_MODULE.search(outside) else spark
        _spark_tests[path] = {name for name in everything if name.startswith("test")}
    return _spark_tests[path]


def _scope(nodeid: str) -> str:
    module, _, rest = nodeid.partition("::")
    spark = _tests_using_spark(ROOT / module)
    test = re.split(r"[\[:]", rest, maxsplit=1)[0]
    return SPARK_SCOPE if spark is not None and (test in spark or not test) else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Scopes as above: a module's own, or the one Spark scope."""
    from xdist.scheduler import LoadScopeScheduling

    class SparkScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return SparkScope(config, log)


# The PostgreSQL matrix (scripts/test_pg_matrix.sh, docs/postgres.md) runs the PostgreSQL-facing
# integration tests on another major: those that use the suite's source (`pg_dsn`, via
# `make_source`) or a scratch cluster of the suite's major, not the dbt and Spark flows, not
# MongoDB, and not the modules that pin their majors themselves (they run across majors already).
MATRIX_ENV = "CHANGELAKE_PG_MATRIX"
_OWN_MAJORS = frozenset(
    {
        "test_pg_versions.py",
        "test_pg_failover.py",
        "test_pg_standby.py",
        "test_pg_streaming.py",
        "test_pg_slot_restart.py",
    }
)


def _pg_facing(item: pytest.Item) -> bool:
    path = Path(str(item.path))
    if path.parent.name != "integration" or path.name in _OWN_MAJORS or _scope(item.nodeid) == SPARK_SCOPE:
        return False
    fixtures = getattr(item, "fixturenames", ())
    return "pg_dsn" in fixtures or "ScratchCluster" in path.read_text(encoding="utf-8")


# scripts/test.sh runs the two scopes as two lanes, each a pytest process of its own: `spark` (the
# Spark scope, one JVM at a time) and `servers` (everything else, then the matrix on its majors), so
# the matrix runs while the Spark lane is still busy instead of after it.
LANE_ENV = "CHANGELAKE_TEST_LANE"
LANES = ("spark", "servers")


def _in_lane(item: pytest.Item, lane: str) -> bool:
    return (_scope(item.nodeid) == SPARK_SCOPE) == (lane == "spark")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the Spark scope first, so a worker starts on it at once; keep only the matrix's or the lane's tests."""
    lane = os.environ.get(LANE_ENV)
    if lane and lane not in LANES:
        raise pytest.UsageError(f"{LANE_ENV}={lane!r}: expected one of {', '.join(LANES)}")
    keep = [_pg_facing] if os.environ.get(MATRIX_ENV) else []
    if lane:
        keep.append(lambda item: _in_lane(item, lane))
    if keep:
        kept = [item for item in items if all(k(item) for k in keep)]
        config.hook.pytest_deselected(items=[item for item in items if not all(k(item) for k in keep)])
        items[:] = kept
    items.sort(key=lambda item: _scope(item.nodeid) != SPARK_SCOPE)  # stable: file order kept
