"""dbt's driver JVM maps the class archive `make setup` builds, and shrugs off a broken one.

The archive is scripts/driver_archive.py's; ingest starts no JVM, so only dbt's `local` target
maps it (profiles.yml).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.pg import ROOT

pytestmark = pytest.mark.integration


def _load_cds() -> ModuleType:
    spec = importlib.util.spec_from_file_location("driver_archive", ROOT / "scripts" / "driver_archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cds = _load_cds()

# A driver started with the options profiles.yml gives dbt's, logging where each class came from.
SCRIPT = """
import sys
from pyspark.sql import SparkSession
opts = "-Xlog:class+load=info:stdout " + sys.argv[2]
spark = (
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    .config("spark.driver.extraJavaOptions", opts)
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .getOrCreate()
)
spark.sql(f"create table delta.`{sys.argv[1]}/t` (k int) using delta")
"""


def delta_log_class_source(warehouse: Path, extra_options: str = "") -> str:
    """Where the driver loaded Delta's DeltaLog class from (the JVM's class+load log line)."""
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(warehouse), extra_options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[cds]" not in r.stdout + r.stderr, "the class archive must never print warnings"
    lines = [line for line in r.stdout.splitlines() if " org.apache.spark.sql.delta.DeltaLog source:" in line]
    assert lines, "DeltaLog was never loaded"
    return lines[0].split(" source: ", 1)[1]


def test_driver_loads_spark_and_delta_from_the_archive(tmp_path: Path) -> None:
    assert cds.is_current(), f"no current class archive at {cds.ARCHIVE}: `make setup` builds it"
    assert delta_log_class_source(tmp_path / "warehouse", cds.java_options()) == "shared objects file (top)"


def test_an_archive_for_another_jvm_is_ignored_and_classes_load_from_the_jars(tmp_path: Path) -> None:
    other = tmp_path / "other.jsa"
    other.write_bytes(b"\0" * 4096)  # no archive header this JVM accepts (like another JDK's archive)
    source = delta_log_class_source(tmp_path / "warehouse", f"-XX:SharedArchiveFile={other}")
    assert source.startswith(("file:", "jar:file:")) and "delta-spark" in source


def test_a_truncated_archive_is_never_put_in_place(tmp_path: Path) -> None:
    # A truncated archive crashes the JVM (SIGBUS), so build() checks every new one before its rename.
    assert cds.usable(cds.ARCHIVE)
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(cds.ARCHIVE.read_bytes()[: cds.ARCHIVE.stat().st_size // 2])
    crash_files = set(Path.cwd().glob("hs_err_pid*.log"))
    assert not cds.usable(truncated)
    assert set(Path.cwd().glob("hs_err_pid*.log")) == crash_files, "the check left a JVM crash file behind"
