"""The driver JVM maps the class archive `make setup` builds, and shrugs off a broken one (ingest/cds.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingest import cds
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

# A driver as `run --once` starts it, logging where each class came from, then Delta's first steps.
SCRIPT = """
import sys
from pathlib import Path
from ingest.bronze.writer import BronzeWriter
from ingest.config import SparkConfig
from ingest.spark import build_spark
opts = "-Xlog:class+load=info:stdout " + sys.argv[2]
spark = build_spark(SparkConfig(conf={"spark.driver.extraJavaOptions": opts}), short_lived=True)
BronzeWriter(spark, Path(sys.argv[1])).ensure_tables()
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
    assert delta_log_class_source(tmp_path / "warehouse") == "shared objects file (top)"


def test_an_archive_for_another_jvm_is_ignored_and_classes_load_from_the_jars(tmp_path: Path) -> None:
    other = tmp_path / "other.jsa"
    other.write_bytes(b"\0" * 4096)  # no archive header this JVM accepts (like another JDK's archive)
    # The config's options come last, so this archive replaces the good one.
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
