"""The position guard survives dbt-databricks: its merge dispatch reaches guarded_merge_sql.

dbt-databricks is not installable here, so two checks stand in for a run on Databricks:
- dbt's own dispatch code, given dbt-databricks' adapter prefixes (databricks, spark, default)
  and this project's macros next to the adapters' built-in merges, resolves `get_merge_sql` to
  the project's `databricks__get_merge_sql` (without that file it resolves to dbt-databricks'
  own merge, which has no guard: the failure this pins);
- that macro, rendered with dbt's Jinja environment for a model that sets `merge_guard` (as
  consumer_records does), emits the guarded MERGE: matched rows are updated only when the batch
  row's (commit_lsn, commit_index) is greater.
What it does not prove: that dbt-databricks' incremental materialization calls `get_merge_sql`
through dispatch for the merge strategy (it does in every release we read), or that Databricks
runs the SQL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dbt.context.macros import MacroNamespace
from dbt.context.providers import BaseDatabaseWrapper
from dbt_common.clients.jinja import get_template

ROOT = Path(__file__).resolve().parents[2]
MACROS = ROOT / "macros"
MACRO_NAME = re.compile(r"{%-?\s*macro\s+(\w+)\s*\(")
GUARD = ["commit_lsn", "commit_index"]


def project_macros() -> dict[str, Path]:
    """Macro name -> file, for every macro of the project."""
    return {m: p for p in MACROS.rglob("*.sql") for m in MACRO_NAME.findall(p.read_text())}


class _AdapterConfig:
    dependencies: dict[str, Any] = {}
    quoting: dict[str, bool] = {}

    def get_macro_search_order(self, namespace: str) -> None:
        return None


class _Adapter:
    config = _AdapterConfig()
    Relation = object


class DatabricksDispatch(BaseDatabaseWrapper):
    """dbt's dispatch with the prefixes dbt-databricks has (it declares dbt-spark its parent)."""

    def _get_adapter_macro_prefixes(self) -> list[str]:
        return ["databricks", "spark", "default"]


def resolve_merge(root_macros: dict[str, Any]) -> Any:
    adapters: dict[str, Any] = {
        "databricks__get_merge_sql": "dbt-databricks",
        "spark__get_merge_sql": "dbt-spark",
        "default__get_merge_sql": "dbt-core",
    }
    namespace = MacroNamespace(
        global_namespace=root_macros, local_namespace={}, global_project_namespace=adapters, packages={}
    )
    return DatabricksDispatch(_Adapter(), namespace).dispatch("get_merge_sql", "dbt")


def test_dbt_databricks_dispatch_finds_the_project_merge() -> None:
    root: dict[str, Any] = {name: f"project:{path.name}" for name, path in project_macros().items()}
    assert resolve_merge(root) == "project:databricks__get_merge_sql.sql"
    del root["databricks__get_merge_sql"]
    assert resolve_merge(root) == "dbt-databricks", "without it dbt-databricks' unguarded merge wins"


class _Config:
    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _Relation:
    def __init__(self, identifier: str) -> None:
        self.identifier = identifier

    def incorporate(self, path: dict[str, str]) -> _Relation:
        return _Relation(path["identifier"])

    def __str__(self) -> str:
        return f"silver.{self.identifier}"


def macro(name: str, context: dict[str, Any]) -> Any:
    """The project's macro `name`, compiled by dbt's Jinja environment over `context`."""
    module = get_template(project_macros()[name].read_text(), context).module
    return getattr(module, f"dbt_macro__{name}")  # dbt's macro parser prefixes the name


def render_merge(config: dict[str, Any]) -> str:
    """databricks__get_merge_sql for a model with `config`, at compile time (execute false)."""
    adapter_merge_calls: list[tuple[Any, ...]] = []

    class _Dbt:
        @staticmethod
        def databricks__get_merge_sql(*args: Any) -> str:
            adapter_merge_calls.append(args)
            return "dbt-databricks merge"

    context: dict[str, Any] = {"config": _Config(config), "execute": False, "dbt": _Dbt()}
    context["guarded_merge_sql"] = macro("guarded_merge_sql", context)
    context["changelake"] = {"merge_sql_with_guard": macro("merge_sql_with_guard", context)}
    merge = macro("databricks__get_merge_sql", context)
    sql = str(merge(_Relation("consumer_records"), "batch_view", ["source", "record_pk"], [], None))
    return re.sub(r"\s+", " ", sql).strip() if not adapter_merge_calls else "adapter: " + sql.strip()


def test_databricks_merge_of_a_guarded_model_is_the_guarded_merge() -> None:
    consumer_records = (ROOT / "models" / "silver" / "consumer_records.sql").read_text()
    assert "merge_guard=['commit_lsn', 'commit_index']" in consumer_records
    sql = render_merge({"merge_guard": GUARD, "merge_prune_by": []})
    assert "merge into silver.consumer_records as dbt_internal_dest" in sql
    assert "using silver.consumer_records__dbt_batch as dbt_internal_source" in sql
    assert (
        "when matched and ((dbt_internal_source.commit_lsn > dbt_internal_dest.commit_lsn) or "
        "(dbt_internal_source.commit_lsn = dbt_internal_dest.commit_lsn and "
        "dbt_internal_source.commit_index > dbt_internal_dest.commit_index)) then update set *"
    ) in sql, sql
    assert "when not matched then insert *" in sql and "delete" not in sql


def test_databricks_merge_of_an_unguarded_model_is_the_adapters() -> None:
    assert render_merge({}) == "adapter: dbt-databricks merge"


def test_the_guard_rejects_an_older_event_on_the_session_target(tmp_path: Path) -> None:
    """The guarded MERGE itself, run by Spark through dbt-spark (session; tests/cluster runs the same
    operation through the Thrift server): a stored row keeps its state against an older batch row."""
    from tests.helpers.silver import dbt

    out = dbt(tmp_path / "warehouse", "run-operation", "check_merge_guard")
    assert "merge guard holds on target local (spark): 1: stored, newer; 2: batch, newer; 3: batch, new key" in out
