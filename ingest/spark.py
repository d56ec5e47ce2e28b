"""Builds the one SparkSession ingest uses: local by default, a cluster master or Spark Connect."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.config import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J = Path(__file__).with_name("log4j2.properties")

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
# The driver JVM runs inside the ingest process, beside the pgoutput decoder, on a machine that may
# have 2 cores (bench/ingest_throughput.py prints the CPU time of each).
DRIVER_JAVA_OPTIONS = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
# A short-lived driver (`run --once`, `status`, `snapshot`) compiles with C1 only and collects with
# the serial GC: C2 compilation of Spark's and Delta's code and parallel GC threads cost more CPU
# than such a run recovers (measured on `run --once` over 1M changes: JVM CPU 74 s -> 47 s,
# start-up 24 s -> 15-18 s, wall clock -12%). A continuous `run` keeps the JVM's defaults (G1,
# tiered compilation): over hours, C2's faster code pays for itself.
SHORT_LIVED_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
QUIET_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS,
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # bronze is append-only and read by stats-pruned scans; the default 50 partitions only add tasks
    "spark.databricks.delta.snapshotPartitions": "2",
}


def build_spark(cfg: SparkConfig, app_name: str = "changelake-ingest", short_lived: bool = False) -> SparkSession:
    """Start (or join) the SparkSession for `cfg`; Delta comes from the jars in pyspark's jars/.

    `short_lived`: the process exits after a bounded amount of work, so its driver JVM skips C2.
    A `spark.driver.extraJavaOptions` in the config is appended to ingest's own JVM options (the
    JVM takes the last of repeated flags, so the config's win).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
    builder = SparkSession.builder.appName(app_name)
    if cfg.remote:
        builder = builder.remote(cfg.remote)
    else:
        builder = builder.master(cfg.master)
        for k, v in QUIET_CONF.items():
            builder = builder.config(k, v)
        builder = builder.config("spark.driver.extraJavaOptions", driver_java_options(cfg, short_lived))
    for k, v in DELTA_CONF.items():
        builder = builder.config(k, v)
    for k, v in cfg.conf.items():
        if k != "spark.driver.extraJavaOptions" or cfg.remote:
            builder = builder.config(k, v)
    return builder.getOrCreate()


def driver_java_options(cfg: SparkConfig, short_lived: bool) -> str:
    """The driver JVM's options: ingest's, the class archive, then the config's own.

    The class archive is the one `make setup` builds (ingest/cds.py), if it exists; the config's
    own are its `spark.driver.extraJavaOptions`.
    """
    from ingest import cds

    own = cfg.conf.get("spark.driver.extraJavaOptions", "")
    opts = [DRIVER_JAVA_OPTIONS]
    if short_lived:
        opts.append(SHORT_LIVED_JAVA_OPTIONS)
    if "-XX:ArchiveClassesAtExit" not in own:  # a JVM that dumps an archive cannot map one
        opts.append(cds.java_options())
    opts.append(own)
    return " ".join(o for o in opts if o)
