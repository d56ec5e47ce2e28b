"""A class-data-sharing archive of the driver JVM: Spark's and Delta's classes, loaded pre-parsed.

A Spark driver loads and verifies some 20k classes before its first Delta commit; every `run
--once`, `status` and `snapshot` is a new JVM that pays it again. `make setup` runs
`python -m ingest.cds`, which starts a driver with `-XX:ArchiveClassesAtExit`, walks the bronze
writer through what ingest does (create the tables, append a batch, raise a position, read them
back) in a throwaway warehouse, and keeps the archive the JVM writes when it exits. Drivers
started afterwards map it (`-XX:SharedArchiveFile`); measured: process start to the first Delta
commit and reads 12.3 s instead of 19-21 s (docs/delivery.md).

The JVM checks the archive against its own build and class path; an archive that does not match
(other JDK, other jars) or is missing is ignored, silently. A truncated archive would crash the
JVM instead, so the build checks that a JVM starts with the new archive before it moves it into
place (by rename: running drivers keep the file they mapped).

Usage: python -m ingest.cds [--force]   (rebuilds when missing or older than pyspark's jars)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Per virtualenv: the archive belongs to the pyspark (and Delta jars) installed in it.
ARCHIVE = Path(sys.prefix) / "share" / "changelake" / "driver.jsa"
# Ignore an archive that does not match instead of printing a warning on every start.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# The check may crash a JVM on purpose: no hs_err file in the working directory, no core dump.
_NO_CRASH_FILES = ("-XX:ErrorFile=/dev/null", "-XX:-CreateCoredumpOnCrash")


def java_options(archive: Path = ARCHIVE) -> str:
    """JVM options that map `archive` if it exists (else nothing)."""
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive.is_file() else ""


def java() -> str:
    """The `java` Spark starts: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "java")


def usable(archive: Path) -> bool:
    """Whether a JVM starts with `archive` mapped.

    The JVM ignores an archive of another JDK build or class path, but a truncated one (a disk
    that filled up while it was written) crashes it with SIGBUS, so none is ever put in place
    without this check.
    """
    r = subprocess.run(
        [java(), f"-XX:SharedArchiveFile={archive}", *_QUIET.split(), *_NO_CRASH_FILES, "-version"],
        capture_output=True,
        timeout=120,
    )
    return r.returncode == 0


def _jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def is_current(archive: Path = ARCHIVE) -> bool:
    """Whether `archive` exists and is newer than every jar on the driver's class path."""
    if not archive.is_file():
        return False
    built = archive.stat().st_mtime
    return all(j.stat().st_mtime <= built for j in _jars_dir().glob("*.jar"))


def build(archive: Path = ARCHIVE) -> float:
    """Run the bronze writer's steps in a driver that dumps its classes to `archive`; returns seconds.

    The dump happens when the JVM exits, so this waits for the driver process to end, and moves
    the file into place only then (a reader never maps a half-written archive).
    """
    from datetime import UTC, datetime

    from ingest.bronze.writer import BronzeWriter
    from ingest.config import SparkConfig
    from ingest.events import Action, ChangeEvent, RelationShape, WriterKind, WriterPosition
    from ingest.spark import build_spark

    t0 = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    work = Path(tempfile.mkdtemp(prefix="changelake-cds-"))
    try:
        # Quiet: the JVM lists every class it cannot archive (generated, signed jars) as a warning.
        dump = f"-XX:ArchiveClassesAtExit={partial} {_QUIET}"
        conf = {"spark.driver.extraJavaOptions": dump, "spark.driver.memory": "1g"}
        spark = build_spark(SparkConfig(conf=conf), app_name="changelake-cds", short_lived=True)
        writer = BronzeWriter(spark, work / "warehouse")
        writer.ensure_tables()
        lsn = 1 << 24
        events = [
            ChangeEvent(lsn, i, 1, 1_700_000_000_000_000, Action.INSERT, "public", "t", 1, f'{{"id":{i}}}', None, "{}")
            for i in range(1000)
        ]
        writer.append_relations("cds", [RelationShape(1, "public", "t", "default", (), lsn)])
        writer.append_events("cds", "postgres", "stream", events, {lsn: lsn + 1})
        writer.raise_position(WriterPosition("cds", "stream", WriterKind.STREAM, lsn, lsn + 1), datetime.now(UTC))
        writer.positions("cds")
        writer.last_event_position("cds", "stream")
        writer.known_shapes("cds")
        writer.completed_snapshots("cds")
        writer.max_commit_time("cds")
        gateway = spark.sparkContext._gateway
        spark.stop()
        # The JVM exits (and writes the archive) when its stdin closes; wait for it.
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=300)
        if not partial.is_file():
            raise RuntimeError(f"the driver JVM wrote no class archive at {partial}")
        if not usable(partial):
            raise RuntimeError(f"the class archive the driver JVM wrote is unusable (truncated?): {partial}")
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return time.monotonic() - t0


def main() -> None:
    """Build the archive unless it is current (`--force`: anyway)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--force", action="store_true", help="rebuild even if the archive is current")
    args = ap.parse_args()
    if not args.force and is_current():
        print(f"driver class archive is current: {ARCHIVE}")
        return
    secs = build()
    print(f"driver class archive built in {secs:.0f} s: {ARCHIVE} ({ARCHIVE.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
