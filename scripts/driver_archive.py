"""A class-data-sharing archive of dbt's Spark driver JVM: Spark's and Delta's classes, pre-parsed.

A Spark driver loads and verifies some 20k classes before its first Delta query; every `dbt`
command of the `local` target is a new JVM that pays it again (ingest starts no JVM). `make setup`
runs this script, which starts a driver with `-XX:ArchiveClassesAtExit`, walks it through what a
dbt run does (read a Delta table by path, create, insert into and merge into a Delta table, read
its history) in a throwaway warehouse, and keeps the archive the JVM writes when it exits. dbt's
drivers map it (`-XX:SharedArchiveFile` in profiles.yml); measured in docs/dbt.md.

The JVM checks the archive against its own build and class path; an archive that does not match
(other JDK, other jars) or is missing is ignored, silently. A truncated archive would crash the
JVM instead, so the build checks that a JVM starts with the new archive before it moves it into
place (by rename: running drivers keep the file they mapped).

Usage: python scripts/driver_archive.py [--force]   (rebuilds when missing or older than pyspark's jars)
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
    """Run dbt's kind of Delta work in a driver that dumps its classes to `archive`; returns seconds.

    The dump happens when the JVM exits, so this waits for the driver process to end, and moves
    the file into place only then (a reader never maps a half-written archive).
    """
    from pyspark.sql import SparkSession

    t0 = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    work = Path(tempfile.mkdtemp(prefix="changelake-cds-"))
    try:
        # Quiet: the JVM lists every class it cannot archive (generated, signed jars) as a warning.
        dump = f"-XX:ArchiveClassesAtExit={partial} {_QUIET}"
        spark = (
            SparkSession.builder.appName("changelake-cds")
            .master("local[2]")
            .config("spark.driver.extraJavaOptions", dump)
            .config("spark.driver.memory", "1g")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .getOrCreate()
        )
        t = f"delta.`{work / 'warehouse' / 't'}`"
        spark.sql(f"create table {t} (k bigint, v string, d boolean) using delta partitioned by (d)")
        spark.sql(f"insert into {t} select id, cast(id as string), false from range(1000)")
        spark.sql(
            f"merge into {t} as t using (select id as k, 'x' as v, id % 2 = 0 as d from range(500)) as s "
            "on t.k = s.k when matched then update set * when not matched then insert *"
        )
        spark.sql(f"select d, count(*), max(struct(k, v)) from {t} group by d").collect()
        spark.sql(f"describe history {t}").collect()
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
    # The JVM's and Spark's own lines (start-up warnings, stage progress) go to a log beside the
    # archive, not to the terminal of a first `make demo`; the log's tail is shown if it fails.
    log = ARCHIVE.with_name(ARCHIVE.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"setup: building the driver JVM's class archive (~40 s, once; Spark's output in {log})", flush=True)
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with log.open("w") as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            try:
                secs = build()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    except BaseException:
        sys.stderr.write("".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:]))
        raise
    finally:
        os.close(saved[0])
        os.close(saved[1])
    print(f"driver class archive built in {secs:.0f} s: {ARCHIVE} ({ARCHIVE.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
