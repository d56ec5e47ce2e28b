"""The CLI's exit codes and error lines: no Python traceback reaches a user (issue 20, top-level handler)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ingest import app, cli
from ingest.errors import SourceError

CONFIG = """
warehouse: {wh}
sources:
  - name: shop
    kind: postgres
    dsn: postgresql://nobody@127.0.0.1:1/x
    tables: [public.orders]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    p = tmp_path / "c.yml"
    p.write_text(CONFIG.format(wh=tmp_path / "wh"))
    return p


def test_an_unexpected_exception_is_one_line_and_exit_1(
    config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_: Any, **__: Any) -> list[str]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(app, "run", boom)
    assert cli.main(["-c", str(config), "run", "--once"]) == cli.EXIT_INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("changelake-ingest: internal error: RuntimeError: disk on fire")


def test_with_verbose_the_traceback_goes_to_the_log(
    config: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*_: Any, **__: Any) -> list[str]:
        raise KeyError("k")

    monkeypatch.setattr(app, "status", boom)
    caplog.set_level(logging.INFO, logger="ingest")  # what -v configures (pytest owns the root logger)
    assert cli.main(["-c", str(config), "-v", "status"]) == cli.EXIT_INTERNAL_ERROR
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is KeyError]
    assert logged and logged[0].levelno == logging.INFO


def test_an_error_the_user_can_fix_is_exit_2(
    config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(*_: Any, **__: Any) -> list[str]:
        raise SourceError("cannot connect")

    monkeypatch.setattr(app, "setup", refused)
    assert cli.main(["-c", str(config), "setup"]) == cli.EXIT_USER_ERROR
    assert capsys.readouterr().err == "changelake-ingest: error: cannot connect\n"
