"""pyproject.toml's dependency ranges and requirements.txt's pins agree, and each side stays on its own."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.pg import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins() -> dict[str, str]:
    """requirements.txt as {name: pinned version}."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"requirements.txt pins exactly: {line}"
            out[canonicalize_name(req.name)] = spec.version
    return out


def ranges(group: str | None) -> list[Requirement]:
    deps = PROJECT["dependencies"] if group is None else PROJECT["optional-dependencies"][group]
    return [Requirement(d) for d in deps]


def test_every_range_admits_the_tested_pin() -> None:
    pinned = pins()
    for group in (None, *PROJECT["optional-dependencies"]):
        for req in ranges(group):
            name = canonicalize_name(req.name)
            assert name in pinned, f"{req.name} ({group or 'base'}) has no pin in requirements.txt"
            assert req.specifier.contains(pinned[name]), f"{req.name}=={pinned[name]} is outside {req.specifier}"


def test_the_base_install_is_ingest_and_the_jvm_side_is_the_dbt_extra() -> None:
    base = {canonicalize_name(r.name) for r in ranges(None)}
    dbt = {canonicalize_name(r.name) for r in ranges("dbt")}
    assert "deltalake" in base, "ingest writes bronze with delta-rs"
    assert not {"pyspark", "delta-spark", "dbt-core", "dbt-spark"} & base
    assert {"pyspark", "delta-spark", "dbt-core", "dbt-spark"} <= dbt
    assert PROJECT["scripts"]["changelake-ingest"] == "ingest.cli:main"
