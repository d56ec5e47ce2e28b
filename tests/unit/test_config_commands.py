"""`config check` and `config schema`: validate and describe the config without contacting a source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingest.cli import main

CONFIG = """
sources:
  - kind: postgres
    name: app
    dsn: postgresql://u@unreachable.invalid:1/d
    tables: [public.*, tenant_*.orders]
    exclude: [public.audit_*]
"""


def test_config_check_validates_without_touching_the_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The DSN's host does not resolve: a check that connected would fail."""
    path = tmp_path / "c.yml"
    path.write_text(CONFIG)
    assert main(["-c", str(path), "config", "check"]) == 0
    out = capsys.readouterr().out
    assert "config valid" in out and "tables public.*, tenant_*.orders excluding public.audit_*" in out


def test_config_check_fails_on_a_bad_pattern_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yml"
    path.write_text(CONFIG.replace("public.audit_*", "public"))
    assert main(["-c", str(path), "config", "check"]) == 2
    assert "sources.0" in capsys.readouterr().err


def test_config_schema_needs_no_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-c", str(tmp_path / "absent.yml"), "config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    pg = schema["$defs"]["PostgresSource"]["properties"]
    assert {"tables", "exclude", "new_tables_check_seconds"} <= set(pg)
