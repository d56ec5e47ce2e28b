"""The Python package: `pip install .` into a clean venv is a working ingest, without a JVM side.

The install takes the working tree's pyproject.toml and ingest/ (copied, so the build writes no
build/ or egg-info into the tree) and resolves its dependencies from the package index, held to the
pins of requirements.txt (pip's cache makes that quick after `make setup`). The installed
`changelake-ingest` then sets up a real source on the test server and captures it into bronze.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.pg import ROOT, bronze_events

pytestmark = pytest.mark.integration

# A requirement line's name and extras ("name[extra,...]==version"): pip's constraint files take
# neither extras nor the dev-only pins' comments.
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(\[[^\]]*\])?(?P<spec>==\S+)")


def constraints(path: Path) -> Path:
    """requirements.txt's pins as a constraints file (extras dropped: pip refuses them there)."""
    lines = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = _PIN.match(line.strip())
        if m:
            lines.append(m.group("name") + m.group("spec"))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with `pip install .` of the working tree (once per module: ~30 s)."""
    base = tmp_path_factory.mktemp("pkg")
    src = base / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "ingest", src / "ingest", ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check"]
        + ["-c", str(constraints(base / "constraints.txt")), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"pip install . failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    yield venv
    shutil.rmtree(base, ignore_errors=True)


def installed(venv: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(venv / "bin/pip"), "list", "--format", "json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {d["name"].lower(): d["version"] for d in json.loads(out)}


def cli(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed entry point, run from outside the working tree (so nothing imports from it)."""
    return subprocess.run(
        [str(venv / "bin/changelake-ingest"), *args],
        cwd=venv,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pip_install_gives_a_working_ingest_without_spark(clean_venv: Path, tmp_path: Path, make_source: Any) -> None:
    dists = installed(clean_venv)
    assert dists["deltalake"] == "1.6.6" and "changelake" in dists, dists
    assert not [d for d in dists if "spark" in d], f"the ingest install pulled a Spark side: {sorted(dists)}"
    assert "openlineage-python" not in dists, "lineage is an extra"

    helped = cli(clean_venv, "--help")
    assert helped.returncode == 0 and "usage: changelake-ingest" in helped.stdout, helped.stderr
    for command in ("run", "setup", "status", "verify", "gold"):
        assert command in helped.stdout

    s = make_source("create table items (id int primary key, note text)", ["items"])
    cfg = tmp_path / "ingest.yml"
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables, "snapshot": {"initial": False}}
    cfg.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"), "sources": [source]}))
    setup = cli(clean_venv, "-c", str(cfg), "setup")
    assert setup.returncode == 0, setup.stderr
    s.execute("insert into items select g, 'n' || g from generate_series(1, 25) g")
    s.execute("update items set note = 'changed' where id = 7")
    run = cli(clean_venv, "-c", str(cfg), "run", "--once")
    assert run.returncode == 0, run.stderr

    events = bronze_events(tmp_path / "warehouse", s.name)
    assert [e.action for e in events] == ["insert"] * 25 + ["update"]
    assert sorted(json.loads(e.record_pk)["id"] for e in events[:25]) == list(range(1, 26))
    assert json.loads(events[-1].record)["note"] == "changed"
