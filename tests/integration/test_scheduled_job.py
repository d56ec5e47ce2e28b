"""The scheduled job (ops/scheduled_job.sh) and its systemd units, as a scheduler would run them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.pg import ROOT, prepare

pytestmark = pytest.mark.integration
UNITS = ROOT / "ops" / "systemd"


def test_an_unreachable_source_is_exit_75_and_nothing_to_build(tmp_path: Path) -> None:
    cfg = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": "nowhere", "dsn": "postgresql://nobody@127.0.0.1:1/x", "tables": ["p.t"]}
    cfg.write_text(
        yaml.safe_dump({"warehouse": str(tmp_path / "wh"), "retry": {"max_seconds": 1}, "sources": [source]})
    )
    env = {"PATH": "/usr/bin:/bin", "CHANGELAKE_CONFIG": str(cfg), "CHANGELAKE_WAREHOUSE": str(tmp_path / "wh")}
    r = subprocess.run(
        ["bash", str(ROOT / "ops/scheduled_job.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 75, r.stderr
    assert "source unavailable" in r.stderr and "nothing to build" in r.stderr


def test_a_configuration_error_stops_the_round_with_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "ingest.yml"
    cfg.write_text("sources: []\n")
    env = {"PATH": "/usr/bin:/bin", "CHANGELAKE_CONFIG": str(cfg)}
    r = subprocess.run(
        ["bash", str(ROOT / "ops/scheduled_job.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2, r.stderr


def job_on_a_source(tmp_path: Path, make_source: Any) -> tuple[Any, dict[str, str]]:
    """A source with one table, ingest's config and warehouse for it, and the job's environment."""
    s = make_source("create table t (id int primary key, v int)", ["t"])
    prepare(s.config())
    cfg, wh = tmp_path / "ingest.yml", tmp_path / "wh"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}
    cfg.write_text(yaml.safe_dump({"warehouse": str(wh), "sources": [source]}))
    env = {
        "PATH": "/usr/bin:/bin",
        "CHANGELAKE_CONFIG": str(cfg),
        "CHANGELAKE_WAREHOUSE": str(wh),
        "DBT_PROFILES_DIR": str(ROOT),
        "DBT_TARGET_PATH": str(tmp_path / "dbt-target"),
        "DBT_LOG_PATH": str(tmp_path / "dbt-logs"),
    }
    return s, env


def test_a_round_with_nothing_new_for_silver_skips_dbt(tmp_path: Path, make_source: Any) -> None:
    """A `run --once` that captured nothing still commits its drain marker and a position; no dbt then."""
    s, env = job_on_a_source(tmp_path, make_source)
    # A real dbt that needs no JVM: what is tested is whether the round starts dbt at all.
    env["CHANGELAKE_DBT_ARGS"] = "parse"

    def round_() -> str:
        r = subprocess.run(
            ["bash", str(ROOT / "ops/scheduled_job.sh")], env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stderr

    s.execute("insert into t values (1, 1)")
    assert "dbt skipped" not in round_()
    assert (tmp_path / "dbt-target" / "manifest.json").exists()
    (tmp_path / "dbt-target" / "manifest.json").unlink()
    skipped = round_()
    assert "ingest committed nothing new for silver since the last dbt build; dbt skipped" in skipped
    assert not (tmp_path / "dbt-target" / "manifest.json").exists()
    s.execute("update t set v = 2 where id = 1")
    assert "wal_events: new change events; running dbt" in round_()
    assert (tmp_path / "dbt-target" / "manifest.json").exists()
    env["CHANGELAKE_DBT_ALWAYS"] = "1"
    assert "dbt skipped" not in round_()


def test_the_build_after_a_failed_one_checks_whole_tables(tmp_path: Path, make_source: Any) -> None:
    """A failed build is followed by one whose data tests run whole (none passes as unchanged), once.

    dbt itself tells what it got: `compile --inline` renders macro changelake_full_tests (no JVM).
    """
    s, env = job_on_a_source(tmp_path, make_source)
    full_tests = "compile --no-populate-cache --inline select_{{changelake_full_tests()}}"

    def round_(dbt_args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(ROOT / "ops/scheduled_job.sh")],
            env={**env, "CHANGELAKE_DBT_ARGS": dbt_args},
            capture_output=True,
            text=True,
            timeout=300,
        )

    s.execute("insert into t values (1, 1)")
    failed = round_("run-operation changelake_no_such_macro")
    assert failed.returncode != 0, failed.stdout + failed.stderr
    after = round_(full_tests)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "the last dbt build failed; this one runs every data test on whole tables" in after.stderr
    assert "select_True" in after.stdout, after.stdout
    s.execute("update t set v = 2 where id = 1")
    next_ = round_(full_tests)
    assert next_.returncode == 0, next_.stdout + next_.stderr
    assert "select_False" in next_.stdout and "last dbt build failed" not in next_.stderr, next_.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the units, their /opt/changelake paths pointed at this checkout."""
    for unit in UNITS.iterdir():
        text = unit.read_text().replace("/opt/changelake", str(ROOT))
        (tmp_path / unit.name).write_text(text)
    (tmp_path / "changelake-ingest@shop.service").write_text((tmp_path / "changelake-ingest@.service").read_text())
    names = ["changelake-ingest@shop.service", "changelake-build.service", "changelake-build.timer"]
    r = subprocess.run(
        ["systemd-analyze", "verify", *[str(tmp_path / n) for n in names]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    problems = [line for line in (r.stdout + r.stderr).splitlines() if "changelake" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
