"""Config loading: ${ENV} substitution and errors that name the offending key."""

from __future__ import annotations

import pytest
import yaml

from ingest.config import parse_config
from ingest.errors import ConfigError

GOOD = """
warehouse: ${WH:-/tmp/wh}
sources:
  - name: shop
    kind: postgres
    dsn: ${SHOP_DSN}
    tables: [public.orders]
"""


def test_env_substitution_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_DSN", "postgresql://u:secret@h/db")
    monkeypatch.delenv("WH", raising=False)
    cfg = parse_config(GOOD)
    assert cfg.warehouse == "/tmp/wh"
    src = cfg.source("shop")
    assert src.kind == "postgres" and src.slot_name == "changelake_shop"  # type: ignore[union-attr]


def test_unset_env_var_names_key_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHOP_DSN", raising=False)
    with pytest.raises(ConfigError, match=r"sources\.0\.dsn: environment variable SHOP_DSN is not set"):
        parse_config(GOOD)


def test_unknown_key_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_DSN", "host=x")
    with pytest.raises(ConfigError, match=r"sources\.0\.slott: unknown key"):
        parse_config(GOOD + "    slott: s\n")


def test_bad_table_name_names_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_DSN", "host=x")
    with pytest.raises(ConfigError, match=r"sources\.0\.tables.*'orders' is not schema\.table"):
        parse_config(GOOD.replace("public.orders", "orders"))


def test_malformed_yaml() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config("sources: [\n")


def test_dsn_is_never_echoed() -> None:
    text = GOOD.replace("${SHOP_DSN}", "123").replace("tables: [public.orders]", "tables: 5")
    with pytest.raises(ConfigError) as e:
        parse_config(text.replace("dsn: 123", "dsn: {password: hunter2}"))
    assert "hunter2" not in str(e.value)


def test_duplicate_source_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_DSN", "host=x")
    twice = GOOD + "  - {name: shop, kind: postgres, dsn: host=y, tables: [a.b]}\n"
    with pytest.raises(ConfigError, match="repeated: shop"):
        parse_config(twice)


def test_an_old_spark_section_is_an_error_that_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ingest no longer starts Spark (issue 12): a config written for the Spark writer is refused by name."""
    monkeypatch.setenv("SHOP_DSN", "postgresql://h/db")
    with pytest.raises(ConfigError, match=r"spark: no longer a config key: .*delta-rs.*Remove the `spark:` section"):
        parse_config(GOOD + "spark:\n  master: local[2]\n", "old.yml")


def test_warehouse_may_be_an_object_store_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_DSN", "postgresql://h/db")
    text = GOOD.replace("${WH:-/tmp/wh}", "s3://bucket/wh/") + "storage_options:\n  AWS_REGION: eu-west-1\n"
    cfg = parse_config(text)
    assert cfg.warehouse_uri == "s3://bucket/wh" and cfg.storage_options == {"AWS_REGION": "eu-west-1"}
    local = parse_config(GOOD.replace("${WH:-/tmp/wh}", "relative/wh"))
    assert local.warehouse_uri.startswith("/") and local.warehouse_uri.endswith("/relative/wh")


def test_a_dumped_config_parses_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source dumped to YAML (tools and tests write configs so) wrote `selectors`, which no config
    reads: the key is `tables`."""
    monkeypatch.setenv("SHOP_DSN", "postgresql://u@h/db")
    cfg = parse_config(GOOD)
    dumped = yaml.safe_dump({"warehouse": cfg.warehouse, "sources": [s.model_dump() for s in cfg.sources]})
    assert "tables:" in dumped and "selectors" not in dumped
    again = parse_config(dumped)
    assert again.source("shop") == cfg.source("shop")
