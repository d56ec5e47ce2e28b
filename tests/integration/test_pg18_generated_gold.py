"""Stored generated columns of a PostgreSQL 18 source reach typed gold (docs/postgres.md).

From 18 ingest publishes stored generated columns (`publish_generated_columns = stored`) and
captures them in the stream and in snapshots alike; test_pg_versions.py checks bronze only. Here
they go the whole way on a throwaway 18 cluster: rows that existed before the slot (a snapshot),
streamed inserts, updates that change a generated column's inputs and a delete, one `--once` run
with snapshots, `dbt build`, `changelake-ingest gold generate`, `dbt build` of the generated model;
then an update of the inputs after gold exists and the same again. The gold model's generated
columns must have their Spark types (the contract and `typeof`) and every row the source's values,
read back with psycopg. A virtual generated column (18's default kind, never published) is in
neither.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest import cli
from tests.helpers.pg import ROOT, PgSource, capture_once, prepare
from tests.helpers.scratch_pg import ScratchCluster
from tests.helpers.silver import NO_UNIT_TESTS, dbt
from tests.integration.test_pg_types import _gold_rows

pytestmark = pytest.mark.integration

MAJOR = 18
PORT = 25520  # free of the other scratch clusters' ports (scripts/test_pg_matrix.sh takes 25614-25618)
TABLE_SQL = """
create table priced (
    id int primary key,
    label text,
    price numeric(10, 2),
    qty int,
    total numeric(12, 2) generated always as (price * qty) stored,
    tag text generated always as (upper(label) || '-' || id) stored,
    doubled int generated always as (qty * 2) virtual
)
"""
# The model's source columns and their Spark types (docs/dbt.md "Gold types"); `doubled` is not published.
GOLD_TYPES = {
    "id": "int",
    "label": "string",
    "price": "decimal(10,2)",
    "qty": "int",
    "total": "decimal(12,2)",
    "tag": "string",
}


def source_gold(s: PgSource) -> dict[str, dict[str, str | None]]:
    """The source's rows as gold should show them, by id: each value as Spark casts it to a string."""
    cur = s.conn.execute(f"select {', '.join(GOLD_TYPES)} from priced")
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return {
        str(row[0]): {n: None if v is None else str(v) for n, v in zip(names, row, strict=True)}
        for row in cur.fetchall()
    }


def gold_rows(warehouse: Path, project: Path, model: str) -> dict[str, dict[str, str | None]]:
    """The gold model's rows by id, each value as a string; every value's Spark type must be its column's."""
    rows = _gold_rows(warehouse, project, {model: list(GOLD_TYPES)})[model]
    for r in rows:
        assert {c: spark_type for c, (spark_type, _) in r.items()} == GOLD_TYPES
    return {str(r["id"][1]): {c: v for c, (_, v) in r.items()} for r in rows}


@pytest.fixture
def pg18() -> Any:
    cluster = ScratchCluster(PORT, major=MAJOR)  # a major not installed errors, never skips
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.mark.usefixtures("engine")
def test_stored_generated_columns_reach_typed_gold(
    pg18: ScratchCluster, warehouse: Path, tmp_path: Path, capsys: Any
) -> None:
    s = PgSource(pg18.dsn, TABLE_SQL, ["priced"])
    try:
        with psycopg.connect(pg18.dsn) as c:
            (version,) = c.execute("select current_setting('server_version_num')::int").fetchone() or (0,)
        assert int(str(version)) // 10000 == MAJOR
        # Rows before the slot exists: the snapshot pages them (8 comes from it alone until round two).
        s.execute(
            "insert into priced (id, label, price, qty) values "
            "(1, 'apple', 1.50, 3), (2, 'pear', 2.25, 4), (3, 'fig', null, 2), (4, 'plum', 0.10, 10), "
            "(8, 'olive', 0.75, 4)"
        )
        src = s.config()
        prepare(src)
        with s.conn.transaction():
            s.execute("insert into priced (id, label, price, qty) values (5, 'kiwi', 3.33, 3), (6, null, 1.00, null)")
        with s.conn.transaction():  # each changes a generated column's inputs
            s.execute("update priced set qty = 7 where id = 1")
            s.execute("update priced set label = 'Pear' where id = 2")
            s.execute("update priced set price = 4.00 where id = 3")
        s.execute("delete from priced where id = 4")
        expected = source_gold(s)
        assert expected["1"]["total"] == "10.50" and expected["2"]["tag"] == "PEAR-2" and expected["6"]["tag"] is None
        olive = {"id": "8", "label": "olive", "price": "0.75", "qty": "4", "total": "3.00", "tag": "OLIVE-8"}
        assert expected["8"] == olive
        capture_once(warehouse, src, snapshots=True)

        project = tmp_path / "project"  # a copy of the dbt project: the generated models stay out of the tree
        for part in ("models", "macros", "tests/dbt"):
            shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("generated"))
        shutil.copy(ROOT / "dbt_project.yml", project)
        dbt(warehouse, "build", *NO_UNIT_TESTS, "--select", "silver", project=project)

        out = project / "models" / "gold" / "generated"
        config = tmp_path / "changelake.yml"
        config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [src.model_dump()]}))
        assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out)]) == 0
        model = f"{s.name}__{s.schema}__priced"
        printed = capsys.readouterr().out
        assert f"{model}: new model, {len(GOLD_TYPES)} columns" in printed, printed
        yml = yaml.safe_load((out / f"{model}.yml").read_text())["models"][0]
        assert yml["config"]["contract"] == {"enforced": True}  # dbt checks each column's data_type at build
        contract = {c["name"]: c["data_type"] for c in yml["columns"] if not c["name"].startswith("_cl_")}
        assert contract == GOLD_TYPES  # the generated columns typed, the virtual one absent
        dbt(warehouse, "build", *NO_UNIT_TESTS, "--select", "path:models/gold/generated", project=project)
        assert gold_rows(warehouse, project, model) == expected

        # After gold exists: the inputs change again, a row comes; generating again changes nothing.
        with s.conn.transaction():
            s.execute("update priced set price = 2.00, qty = 5 where id = 5")
            s.execute("update priced set label = 'lime', qty = 1 where id = 6")
            s.execute("update priced set price = 1.25 where id = 8")
            s.execute("insert into priced (id, label, price, qty) values (7, 'date', 0.25, 8)")
        moved = source_gold(s)
        lime = {"id": "6", "label": "lime", "price": "1.00", "qty": "1", "total": "1.00", "tag": "LIME-6"}
        assert moved["5"]["total"] == "10.00" and moved["8"]["total"] == "5.00" and moved["6"] == lime
        capture_once(warehouse, src, snapshots=True)
        assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert f"1 models in {out}: 0 written, 1 unchanged" in printed, printed
        build = ("build", *NO_UNIT_TESTS, "--select", "silver", "path:models/gold/generated")
        dbt(warehouse, *build, project=project)  # silver, then gold with its contract and tests
        assert gold_rows(warehouse, project, model) == moved
    finally:
        s.drop()
