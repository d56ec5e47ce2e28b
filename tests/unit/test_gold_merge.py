"""Tenant merges: the config entry (ingest/tenants.py) and the merged gold model (ingest/gold_merge.py).

The generated SQL running in dbt on real tenants is tested in tests/integration/test_dbt_tenant_merge.py;
here: the entry's checks, the tenant values, the files, the shape check and what a re-run says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake
from jinja2 import Environment

from ingest import cli, gold_merge
from ingest.config import parse_config
from ingest.errors import ConfigError
from ingest.tenants import TenantMerge
from tests.unit.test_gold import SCHEMA

MERGE = {"pattern": "tenant_*.orders", "merge_as": "orders", "tenant_column": "tenant"}


def orders(schema: str, *extra: tuple[str, str, str]) -> list[dict[str, Any]]:
    """table_columns rows of `schema`.orders: id (the key), amount, then `extra` (name, type, Spark type)."""
    cols = [("id", "bigint", "bigint"), ("amount", "numeric(12,2)", "decimal(12,2)"), *extra]
    return [
        {
            "source": "shop",
            "table_schema": schema,
            "table_name": "orders",
            "ordinal_position": i,
            "column_name": name,
            "type_name": type_name,
            "spark_type": spark_type,
            "pk_position": 1 if name == "id" else None,
        }
        for i, (name, type_name, spark_type) in enumerate(cols, 1)
    ]


def source(tables: list[Any], **extra: Any) -> dict[str, Any]:
    dsn = "postgresql://nobody@127.0.0.1:1/none"
    return {"kind": "postgres", "name": "shop", "dsn": dsn, "tables": tables, **extra}


def write(tmp_path: Path, rows: list[dict[str, Any]], src: dict[str, Any] | None = None) -> Path:
    """table_columns with `rows` and a config with `src` (default: public.* plus the tenant merge)."""
    path = tmp_path / "warehouse" / "dbt" / "silver.db" / "table_columns"
    write_deltalake(str(path), pa.Table.from_pylist(rows, SCHEMA), mode="overwrite")
    cfg = tmp_path / "changelake.yml"
    src = src or source(["public.*", MERGE])
    cfg.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"), "sources": [src]}))
    return cfg


def generate(cfg: Path, capsys: Any, *extra: str, code: int = 0) -> str:
    args = ["-c", str(cfg), "gold", "generate", "--out", str(cfg.parent / "gold"), "--no-comments", *extra]
    assert cli.main(args) == code
    captured = capsys.readouterr()
    return str(captured.out + captured.err)


def parse(*tables: Any, **extra: Any) -> Any:
    return parse_config(yaml.safe_dump({"sources": [source(list(tables), **extra)]}), "test.yml").sources[0]


def test_an_inline_merge_entry_captures_its_pattern_and_survives_a_dump() -> None:
    src = parse("public.*", MERGE)
    assert src.selectors == ["public.*", "tenant_*.orders"]
    assert src.merges == [TenantMerge(**MERGE)]
    again = parse_config(yaml.safe_dump({"sources": [src.model_dump()]}), "dumped.yml").sources[0]
    assert again.merges == src.merges and again.selectors == src.selectors


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"pattern": "tenant_*_*.orders", "merge_as": "o"}, "exactly one `*`"),
        ({"pattern": "tenant_?.orders", "merge_as": "o"}, "exactly one `*`"),
        ({"pattern": "public.orders", "merge_as": "o"}, "exactly one `*`"),
        ({"pattern": '"tenant_*".orders', "merge_as": "o"}, "exactly one `*`"),  # quoted: a literal star
        ({"pattern": "tenant_*.orders", "merge_as": "Orders"}, "merge_as: .*lowercase"),
        ({"merge_as": "o"}, "merges.0.pattern: required key is missing"),
        ({"pattern": "tenant_*.orders", "merge_as": "o", "tenant_column": "_cl_tenant"}, "not starting with _cl_"),
        ({"pattern": "tenant_*.orders", "merge_as": "o", "tenant_column": "a b"}, "letters, digits and _"),
        ({"pattern": "tenant_*.orders", "merge_as": "o", "mask_columns": ["x"]}, "mask_columns: unknown key"),
    ],
)
def test_a_bad_merge_entry_is_refused_saying_why(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse("public.*", entry)


def test_config_check_says_what_is_merged(tmp_path: Path, capsys: Any) -> None:
    cfg = tmp_path / "changelake.yml"
    cfg.write_text(yaml.safe_dump({"sources": [source(["public.*", MERGE])]}))
    assert cli.main(["-c", str(cfg), "config", "check"]) == 0
    assert "tables public.*, tenant_*.orders; tenant_*.orders merged as shop__orders;" in capsys.readouterr().out


def test_merges_must_name_a_tables_entry_and_be_distinct() -> None:
    with pytest.raises(ConfigError, match=r"merges.0: tenant_\*.orders is not one of the source's `tables`"):
        parse("public.*", merges=[MERGE])
    with pytest.raises(ConfigError, match="merge_as orders is used twice"):
        parse(MERGE, {**MERGE, "pattern": "tenant_*.order_lines"})


def test_the_tenant_is_what_the_star_matched() -> None:
    assert TenantMerge(**MERGE).tenant_of("tenant_acme", "orders") == "acme"
    assert TenantMerge(**MERGE).tenant_of("tenant_", "orders") == ""
    assert TenantMerge(**MERGE).tenant_of("tenant_acme", "Orders") is None  # case-exact
    assert TenantMerge(**MERGE).tenant_of("public", "orders") is None
    by_table = TenantMerge(pattern="app.orders_*", merge_as="orders")
    assert by_table.tenant_of("app", "orders_eu.west") == "eu.west" and by_table.tenant_of("x", "orders_eu") is None
    quoted = TenantMerge(pattern='"Shop*".orders_*', merge_as="o")  # the quoted schema part is literal
    assert quoted.tenant_of("Shop*", "orders_1") == "1" and quoted.tenant_of("Shopx", "orders_1") is None


def render(sql: str) -> list[tuple[Any, ...]]:
    """The model's SQL rendered by Jinja with stand-in macros: the typed_current_state calls, in order."""
    calls: list[tuple[Any, ...]] = []

    def typed_current_state(*args: Any) -> str:
        calls.append(("typed_current_state", *args))
        return "<typed>"

    env = Environment()
    env.globals["config"] = lambda **kw: ""
    env.globals["changelake"] = {
        "typed_current_state": typed_current_state,
        "sql_literal": lambda v: f"'{v}'",
        "spark_identifier": lambda v: f"`{v}`",
    }
    text = env.from_string(sql).render()
    code = [line for line in text.splitlines() if not line.startswith("--")]
    calls.append(("sql", " ".join(" ".join(code).split())))
    return calls


def test_one_typed_model_over_every_tenant(tmp_path: Path, capsys: Any) -> None:
    rows = orders("tenant_beta") + orders("tenant_acme") + orders("public")
    out = generate(write(tmp_path, rows), capsys)
    assert "shop__orders: new model, 2 tenants of tenant_*.orders, 2 columns (shop)" in out
    assert "shop__public__orders: new model" in out and "2 models" in out
    gold = tmp_path / "gold"
    assert sorted(p.name for p in gold.iterdir()) == [
        "shop__orders.sql",
        "shop__orders.yml",
        "shop__public__orders.sql",
        "shop__public__orders.yml",
    ]  # no model per tenant
    *calls, (_, sql) = render((gold / "shop__orders.sql").read_text())
    columns = [["id", "bigint", "id"], ["amount", "decimal(12,2)", "amount"]]
    assert calls == [
        ("typed_current_state", "shop", "tenant_acme", "orders", columns),
        ("typed_current_state", "shop", "tenant_beta", "orders", columns),
    ]
    assert sql == (
        "select 'acme' as `tenant`, * from ( <typed> ) as tenant_1 union all "
        "select 'beta' as `tenant`, * from ( <typed> ) as tenant_2"
    )
    (model,) = yaml.safe_load((gold / "shop__orders.yml").read_text())["models"]
    assert model["config"] == {"contract": {"enforced": True}}
    types = {c["name"]: c["data_type"] for c in model["columns"]}
    assert types == {
        "tenant": "string",
        "id": "bigint",
        "amount": "decimal(12,2)",
        "_cl_record_pk": "string",
        "_cl_source": "string",
        "_cl_needs_reread": "boolean",
        "_cl_commit_lsn": "bigint",
        "_cl_commit_index": "int",
        "_cl_seq": "bigint",
        "_cl_updated_at": "timestamp",
    }
    tests = {c["name"]: c.get("data_tests") for c in model["columns"]}
    # a key repeats across tenants: unique per tenant, not alone
    assert tests["id"] == tests["_cl_record_pk"] == tests["tenant"] == ["not_null"]
    assert model["data_tests"] == [
        {"changelake.unique_combination_of_columns": {"combination_of_columns": ["tenant", "_cl_record_pk"]}}
    ]
    assert "2 tenants" in model["description"]


def test_a_tenant_of_another_shape_is_named_and_nothing_is_written(tmp_path: Path, capsys: Any) -> None:
    """Unioned, a tenant with an extra column would lose it, one with a retyped column would mistype it."""
    rows = orders("tenant_a") + orders("tenant_b") + orders("tenant_c", ("note", "text", "string"))
    rows += [dict(r, spark_type="string") if r["column_name"] == "amount" else r for r in orders("tenant_d")]
    rows += [dict(r, pk_position=None) for r in orders("tenant_e")]
    out = generate(write(tmp_path, rows), capsys, code=2)
    assert "tenant 'c' (tenant_c.orders) has note (string) that tenant_a.orders lacks" in out
    assert "tenant 'd' (tenant_d.orders) types amount as string, not decimal(12,2)" in out
    assert "tenant 'e' (tenant_e.orders) has key (), not (id)" in out
    assert "'a'" not in out and "'b'" not in out
    assert not (tmp_path / "gold").exists()


def test_the_most_common_shape_is_the_reference(tmp_path: Path, capsys: Any) -> None:
    """A migration half rolled out: the tenants not yet migrated are the ones named."""
    note = ("note", "text", "string")
    rows = orders("tenant_a") + orders("tenant_b", note) + orders("tenant_c", note)
    out = generate(write(tmp_path, rows), capsys, code=2)
    assert "tenant 'a' (tenant_a.orders) lacks note (string)" in out and "'b'" not in out


def test_a_tenant_column_that_is_a_source_column_is_refused(tmp_path: Path, capsys: Any) -> None:
    cfg = write(tmp_path, orders("tenant_a"), source([{**MERGE, "tenant_column": "Amount"}]))
    assert "tenant_column Amount is a column of the tenants too" in generate(cfg, capsys, code=2)


def test_an_excluded_tenant_is_left_out(tmp_path: Path, capsys: Any) -> None:
    rows = orders("tenant_a") + orders("tenant_test", ("note", "text", "string"))
    cfg = write(tmp_path, rows, source([MERGE], exclude=["tenant_test.*"]))
    out = generate(cfg, capsys)
    assert "shop__orders: new model, 1 tenants" in out


def test_a_new_tenant_makes_the_model_out_of_date_until_generated_again(tmp_path: Path, capsys: Any) -> None:
    cfg = write(tmp_path, orders("tenant_a") + orders("tenant_b"))
    generate(cfg, capsys)
    assert "0 would be written, 1 unchanged" in generate(cfg, capsys, "--check")
    write(tmp_path, orders("tenant_a") + orders("tenant_b") + orders("tenant_c"))
    before = (tmp_path / "gold" / "shop__orders.sql").read_text()
    out = generate(cfg, capsys, "--check", code=2)
    assert "1 of 1 models" in out and "shop__orders: tenant c added" in out
    assert (tmp_path / "gold" / "shop__orders.sql").read_text() == before  # --check writes nothing
    out = generate(cfg, capsys)
    assert "shop__orders: tenant c added" in out and "1 written" in out
    write(tmp_path, orders("tenant_a", ("note", "text", "string")) + orders("tenant_c", ("note", "text", "string")))
    assert "shop__orders: added note (string); tenant b removed" in generate(cfg, capsys)


def test_a_table_two_merges_take_or_a_model_name_taken_twice_is_refused(tmp_path: Path, capsys: Any) -> None:
    both = [MERGE, {"pattern": "tenant_a*.orders", "merge_as": "a_orders"}]
    cfg = write(tmp_path, orders("tenant_ab"), source(both))
    assert "tenant_ab.orders of source shop is a tenant of merges orders and a_orders" in generate(cfg, capsys, code=2)
    # the merged model would have the name of public.orders' own model
    clash = source(["public.*", {**MERGE, "merge_as": "public__orders"}])
    cfg = write(tmp_path, orders("tenant_a") + orders("public"), clash)
    assert "tables map to the same model name: shop__public__orders" in generate(cfg, capsys, code=2)


def test_every_generated_model_declares_its_types_and_enforces_them_where_dbt_can(tmp_path: Path, capsys: Any) -> None:
    """Per-table models get the contract too; a backtick in a column name (which dbt's contract query
    would not escape on Spark) leaves that model's types declared but not enforced."""
    odd = [
        dict(r, table_name="odd", column_name="a`b" if r["column_name"] == "amount" else r["column_name"])
        for r in orders("public")
    ]
    generate(write(tmp_path, orders("public") + odd, source(["public.*"])), capsys)
    (model,) = yaml.safe_load((tmp_path / "gold" / "shop__public__orders.yml").read_text())["models"]
    assert model["config"] == {"contract": {"enforced": True}}
    assert [c["data_type"] for c in model["columns"]][:3] == ["bigint", "decimal(12,2)", "string"]
    (model,) = yaml.safe_load((tmp_path / "gold" / "shop__public__odd.yml").read_text())["models"]
    assert "config" not in model and {c["name"]: c["data_type"] for c in model["columns"]}["a`b"] == "decimal(12,2)"


def merge_line(sql: str) -> Any:
    """The JSON object of a merged model's `{%- set merge = ... %}` line (what the drift test reads)."""
    (line,) = [x for x in sql.splitlines() if x.startswith("{%- set merge = ")]
    return json.loads(line.removeprefix("{%- set merge = ").removesuffix(" %}"))


def test_the_merge_line_records_what_the_drift_test_matches_new_tenants_with(tmp_path: Path, capsys: Any) -> None:
    """The pattern's text around its * per name part, and the matched tables the source excludes (no new tenant)."""
    rows = orders("tenant_a") + orders("tenant_b") + orders("tenant_test", ("note", "text", "string"))
    cfg = write(tmp_path, rows, source([MERGE], exclude=["tenant_test.*"]))
    generate(cfg, capsys)
    sql = (tmp_path / "gold" / "shop__orders.sql").read_text()
    assert merge_line(sql) == {
        "source": "shop",
        "tenant_column": "tenant",
        "pattern": "tenant_*.orders",
        "name_pieces": [["tenant_", ""], ["orders"]],
        "left_out": [["tenant_test", "orders"]],
    }
    assert gold_merge.previous_left_out(sql) == [("tenant_test", "orders")]
    # the model reads its source and tenant column from that line
    *calls, (_, text) = render(sql)
    assert [c[1] for c in calls] == ["shop", "shop"] and text.startswith("select 'a' as `tenant`")
    # a table excluded later is left out (a re-run says so), not a tenant any more
    write(tmp_path, rows, source([MERGE], exclude=["tenant_test.*", "tenant_b.*"]))
    out = generate(cfg, capsys)
    assert "shop__orders: tenant b removed; tenant_b.orders left out (the source excludes it)" in out
    assert merge_line((tmp_path / "gold" / "shop__orders.sql").read_text())["left_out"] == [
        ["tenant_b", "orders"],
        ["tenant_test", "orders"],
    ]


@pytest.mark.parametrize(
    ("pattern", "pieces"),
    [
        ("tenant_*.orders", [["tenant_", ""], ["orders"]]),
        ("app.orders_*_v2", [["app"], ["orders_", "_v2"]]),
        ('"Shop*".orders_*', [["Shop*"], ["orders_", ""]]),  # the quoted star is literal text
        ("*.orders", [["", ""], ["orders"]]),
    ],
)
def test_name_pieces_are_the_text_around_the_tenant_star(pattern: str, pieces: list[list[str]]) -> None:
    assert gold_merge.name_pieces(TenantMerge(pattern=pattern, merge_as="o")) == pieces
