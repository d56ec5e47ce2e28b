"""changelake as a dbt package: a host project installs it from the working tree and builds on real bronze.

The host project (in tmp) has a `local:` entry in packages.yml, its own incremental models over
the package's macros for users' models (`changelake.records_changed_since`, `changelake.changes_since`),
a model over `changelake.as_of` (as docs/dbt.md shows it), and the typed gold models
`changelake-ingest gold generate` writes into its own models folder; it sets the package's bronze
root through a project var. Two rounds of ingest and `dbt build` check what only works when the
package's own macros are found from a package: its materializations (named changelake_*, as dbt
ignores a package's override of the built-ins), its generate_schema_name (silver.*, not <target
schema>_silver), its merge with the position guard on the second, incremental round, the
user and typed gold macros called from the host's models, and the package's hand-written gold with
its data tests, one of its singular tests and one of its dbt unit tests, built from the host.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest import cli
from tests.helpers.delta_rows import read
from tests.helpers.pg import ROOT, capture_once, prepare
from tests.helpers.silver import dbt, silver

pytestmark = pytest.mark.integration

HOST = "shop_analytics"
# One singular test and one dbt unit test of the package, run from the host.
SINGULAR = "assert_gold_completeness_is_consistent"
UNIT = "schema_changes_classifies_each_shape_change"
ORDERS = "create table orders (id int primary key, customer text, total numeric(10, 2), placed date)"


def host_project(path: Path, bronze_root: Path) -> Path:
    """A host dbt project that installs changelake with a `local:` package entry."""
    (path / "models").mkdir(parents=True)
    project = {
        "name": HOST,
        "version": "1.0.0",
        "config-version": 2,
        "profile": "changelake",
        "model-paths": ["models"],
        # The package's own vars, set for it from the host (docs/dbt.md, "As a package").
        "vars": {"changelake": {"changelake_bronze_root": str(bronze_root)}},
        "models": {HOST: {"+file_format": "delta", "changelake_gold": {"+materialized": "view"}}},
        # The package's overrides of dbt's test and merge SQL (docs/dbt.md, "As a package").
        "dispatch": [{"macro_namespace": "dbt", "search_order": ["changelake", "dbt"]}],
    }
    (path / "dbt_project.yml").write_text(yaml.safe_dump(project, sort_keys=False))
    (path / "packages.yml").write_text(yaml.safe_dump({"packages": [{"local": str(ROOT)}]}))
    # The host's own merge model, fed by the package's user macro for incremental models: the
    # package's merge override must leave it dbt-spark's merge, and each run merges only the
    # records that changed past what it holds.
    (path / "models" / "order_keys.sql").write_text(
        "{{ config(materialized='incremental', incremental_strategy='merge', unique_key='record_pk') }}\n"
        "select source, record_pk, deleted, commit_lsn, commit_index\n"
        "from {{ changelake.records_changed_since(this) }} as changed\n"
    )
    # And an append-only change log over the package's changes_since: each event exactly once.
    (path / "models" / "order_changes.sql").write_text(
        "{{ config(materialized='incremental', incremental_strategy='append') }}\n"
        "select source, seq, action, record_pk from {{ changelake.changes_since(this) }} as changes\n"
    )
    return path


def round_two_selector() -> dict[str, Any]:
    """The second round's build: the host's models and the package's silver and gold they and the
    gold need, their generic data tests (cautious: a test of the selected models only), and of the
    package's singular tests and dbt unit tests only SINGULAR and UNIT."""
    models = ["loaded_bounds", "typed_orders", "orders_as_of", "completeness", "source_health", "schema_changes"]
    built: list[Any] = [
        {"method": "fqn", "value": m, "parents": True, "indirect_selection": "cautious"} for m in models
    ]
    built += [{"method": "fqn", "value": m, "indirect_selection": "cautious"} for m in ("order_keys", "order_changes")]
    built.append({"exclude": [{"method": "test_type", "value": "singular"}, {"method": "test_type", "value": "unit"}]})
    chosen = [{"method": "fqn", "value": SINGULAR}, {"method": "fqn", "value": UNIT}]
    return {"name": "round_two", "definition": {"union": [{"union": built}, *chosen]}}


def run_results(warehouse: Path) -> dict[str, dict[str, Any]]:
    """The last invocation's results by node id (the dbt helper's target path)."""
    doc = json.loads((warehouse.parent / "dbt-target" / "run_results.json").read_text())
    return {r["unique_id"]: r for r in doc["results"]}


def test_a_host_project_builds_silver_and_gold_from_the_package(tmp_path: Path, make_source: Any) -> None:
    s = make_source(ORDERS, ["orders"])
    prepare(s.config())
    s.execute("insert into orders select g, 'c' || g, g * 1.25, date '2026-01-01' + g from generate_series(1, 6) g")
    s.execute("update orders set customer = 'moved' where id = 2")
    s.execute("delete from orders where id = 3")
    lake = tmp_path / "lake"  # ingest's warehouse; dbt's is another one, finding bronze through the var
    warehouse = tmp_path / "warehouse"
    capture_once(lake, s.config())
    host = host_project(tmp_path / "host", lake / "bronze")
    dbt(warehouse, "deps", project=host)
    assert (host / "dbt_packages" / "changelake" / "dbt_project.yml").exists()

    # Light: silver's chain to loaded_bounds, table_columns and the host's model, without tests here
    # (the second round runs the tests of what it builds).
    dbt(warehouse, "run", "--select", "+loaded_bounds", "+table_columns", "order_keys", "order_changes", project=host)
    results = run_results(warehouse)
    manifest = json.loads((warehouse.parent / "dbt-target" / "manifest.json").read_text())
    records_id = "model.changelake.consumer_records"
    assert manifest["nodes"][records_id]["config"]["materialized"] == "changelake_incremental"
    assert manifest["nodes"][records_id]["schema"] == "silver", "the package's generate_schema_name"
    failed = {k: r["status"] for k, r in results.items() if r["status"] not in ("success", "pass")}
    assert not failed and records_id in results, failed

    def live() -> dict[int, dict[str, Any]]:
        rows = [r for r in silver(warehouse, "consumer_records") if r.source == s.name and not r.deleted]
        return {json.loads(r.record_pk)["id"]: json.loads(r.record) for r in rows}

    round_one = live()
    assert sorted(round_one) == [1, 2, 4, 5, 6] and round_one[2]["customer"] == "moved"
    assert len(read(warehouse / "dbt" / "order_keys")) == 6

    def changes_logged() -> list[tuple[int, str, str]]:
        return sorted((r.seq, r.action, r.record_pk) for r in read(warehouse / "dbt" / "order_changes"))

    def changes_in_silver() -> list[tuple[int, str, str]]:
        events = [e for e in silver(warehouse, "sequin_events") if e.source == s.name]
        return sorted((e.seq, e.action, e.record_pk) for e in events)

    assert changes_logged() == changes_in_silver() and len(changes_logged()) == 8
    # A moment after round one's changes and before round two's: the host's model of the state then,
    # over the package's as_of, written as docs/dbt.md shows it (with the package's prefix).
    moment = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    (host / "models" / "orders_as_of.sql").write_text(
        "{{ config(materialized='table') }}\n"
        f"select * from ({{{{ changelake.as_of(ref('record_history'), '{moment}') }}}}) as state\n"
        "where table_name = 'orders'\n"
    )

    # Typed gold, generated into the host project from silver's table_columns.
    config = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}
    config.write_text(yaml.safe_dump({"warehouse": str(lake), "sources": [source]}))
    gold = host / "models" / "changelake_gold"
    table_columns = warehouse / "dbt" / "silver.db" / "table_columns"
    generate = ["gold", "generate", "--out", str(gold), "--table-columns", str(table_columns)]
    assert cli.main(["-c", str(config), *generate]) == 0
    model = f"{s.name}__{s.schema}__orders"
    assert "changelake.typed_current_state(" in (gold / f"{model}.sql").read_text()
    (host / "models" / "typed_orders.sql").write_text(
        f"{{{{ config(materialized='table') }}}}\nselect id, customer, total, placed from {{{{ ref('{model}') }}}}\n"
    )

    # Round two: an update, a delete, a new row; silver merges them (the incremental round).
    s.execute("update orders set total = 99.5 where id = 4")
    s.execute("delete from orders where id = 5")
    s.execute("insert into orders values (7, 'new', 7.75, date '2026-02-01')")
    capture_once(lake, s.config())
    # What it builds, the package's hand-written gold among it, with the generic data tests of it,
    # and one of the package's singular tests and one of its dbt unit tests (fixtures in the
    # package's tests/dbt/fixtures): the other singular invariants and unit tests are the dbt flow's
    # to run. One YAML selector, so the two run in the same build (one Spark session).
    (host / "selectors.yml").write_text(yaml.safe_dump({"selectors": [round_two_selector()]}, sort_keys=False))
    dbt(warehouse, "build", "--selector", "round_two", project=host)
    results = run_results(warehouse)
    failed = {k: r["status"] for k, r in results.items() if r["status"] not in ("success", "pass")}
    assert not failed and f"model.{HOST}.{model}" in results, failed
    # The package's data tests ran, scoped to this run's rows by its get_where_subquery (without the
    # `dispatch:` entry dbt's own kept the placeholder, and Spark failed on the unknown column).
    tests = [k for k in results if k.startswith("test.changelake.")]
    assert any(t.startswith("test.changelake.changelake_rules_consumer_records") for t in tests), tests
    compiled = warehouse.parent / "dbt-target" / "compiled" / "changelake"
    scoped = [p for p in compiled.rglob("*.sql") if "__changelake_this_run__" in p.read_text()]
    assert len(tests) > 5 and not scoped, scoped
    package_gold = ("completeness", "source_health", "verification_runs", "fct_change_activity", "schema_changes")
    assert all(f"model.changelake.{m}" in results for m in package_gold), sorted(results)
    assert all(any(t.startswith(f"test.changelake.changelake_rules_{m}_") for t in tests) for m in package_gold), tests
    singular = [k for k in results if k.startswith("test.changelake.assert_")]
    unit = [k for k in results if k.startswith("unit_test.")]
    assert singular == [f"test.changelake.{SINGULAR}"], singular
    assert unit == [f"unit_test.changelake.schema_changes.{UNIT}"], unit
    assert sorted(live()) == [1, 2, 4, 6, 7]
    keys = {json.loads(r.record_pk)["id"]: r.deleted for r in read(warehouse / "dbt" / "order_keys")}
    assert keys == {1: False, 2: False, 3: True, 4: False, 5: True, 6: False, 7: False}
    records = {r.record_pk: (r.deleted, r.commit_lsn) for r in silver(warehouse, "consumer_records")}
    assert {r.record_pk: (r.deleted, r.commit_lsn) for r in read(warehouse / "dbt" / "order_keys")} == records
    assert changes_logged() == changes_in_silver() and len(changes_logged()) == 11, "each event exactly once"
    merged = (
        warehouse.parent / "dbt-target" / "run" / "changelake" / "models" / "silver" / "consumer_records.sql"
    ).read_text()
    assert "merge into" in merged and "dbt_internal_source.commit_lsn > dbt_internal_dest.commit_lsn" in merged, merged

    # as_of from the host: round one's state, after round two was built.
    state = {json.loads(r.record_pk)["id"]: json.loads(r.record) for r in read(warehouse / "dbt" / "orders_as_of")}
    assert state == round_one and state != live()

    # The package's gold, built from the host: the run's certificate (in the table and in dbt's
    # artifacts), the change counts and the table's first shape.
    (loaded,) = [r for r in silver(warehouse, "loaded_bounds") if r.source == s.name]
    (certified,) = [r for r in read(warehouse / "dbt" / "gold.db" / "completeness") if r.source == s.name]
    assert (certified.complete_through_lsn, certified.last_change_seq) == (loaded.loaded_safe_lsn, 11)
    assert (certified.verify_status, certified.tables_verified) == (None, 0)
    assert results["model.changelake.completeness"]["adapter_response"]["code"] == "completeness"
    activity = [r for r in read(warehouse / "dbt" / "gold.db" / "fct_change_activity") if r.source == s.name]
    assert sum(r.change_count for r in activity) == 11
    assert {r.action for r in activity} == {"insert", "update", "delete"}
    shapes = [r for r in read(warehouse / "dbt" / "gold.db" / "schema_changes") if r.source == s.name]
    assert [(r.table_name, r.change_kind) for r in shapes] == [("orders", "table_added")]

    typed = {r.id: r for r in read(warehouse / "dbt" / "typed_orders")}
    assert sorted(typed) == [1, 2, 4, 6, 7]
    assert typed[4].total == Decimal("99.50") and typed[7].customer == "new" and str(typed[7].placed) == "2026-02-01"
