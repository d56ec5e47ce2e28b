"""MongoDB source config: secrets from env, defaults, and errors that name the key."""

from __future__ import annotations

import pytest

from ingest.config import MongoSource, parse_config
from ingest.errors import ConfigError

GOOD = """
sources:
  - name: docs
    kind: mongodb
    uri: ${MONGO_URI}
    database: shop
"""


def test_uri_from_env_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONGO_URI", "mongodb://u:secret@h1,h2/?replicaSet=rs0")
    src = parse_config(GOOD).source("docs")
    assert isinstance(src, MongoSource)
    assert src.uri == "mongodb://u:secret@h1,h2/?replicaSet=rs0"
    assert src.collections is None and src.pre_post_images is False and src.on_history_lost == "fail"


def test_bad_uri_is_named_but_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONGO_URI", "postgres://u:secret@h")
    with pytest.raises(ConfigError, match=r"sources\.0\.uri: .*mongodb://") as e:
        parse_config(GOOD)
    assert "secret" not in str(e.value)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("    collections: []\n", r"sources\.0\.collections: .*at least one collection"),
        ("    collections: [orders, orders]\n", r"sources\.0\.collections: .*twice"),
        ("    collections: [system.views]\n", r"sources\.0\.collections: .*not a capturable"),
        ("    pre_post_images: maybe\n", r"sources\.0\.pre_post_images: "),
        ("    on_history_lost: ignore\n", r"sources\.0\.on_history_lost: "),
        ("    snapshot_page_size: 0\n", r"sources\.0\.snapshot_page_size: "),
        ("    colections: [a]\n", r"sources\.0\.colections: unknown key"),
    ],
)
def test_errors_name_the_key(monkeypatch: pytest.MonkeyPatch, extra: str, key: str) -> None:
    monkeypatch.setenv("MONGO_URI", "mongodb://h")
    with pytest.raises(ConfigError, match=key):
        parse_config(GOOD + extra)


def test_system_database_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONGO_URI", "mongodb://h")
    with pytest.raises(ConfigError, match=r"sources\.0\.database: .*'local'"):
        parse_config(GOOD.replace("database: shop", "database: local"))
