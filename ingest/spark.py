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
# have 2 cores (bench/ingest_throughput.py prints the CPU time of each). Serial GC: the heap is a few
# GiB at most, and parallel GC threads would take the decoder's core (JVM CPU -8% measured).
DRIVER_JAVA_OPTIONS = f"-Dlog4j2.configurationFile=file:{_LOG4J} -XX:+UseSerialGC"
# A short-lived driver (`run --once`, `status`, `snapshot`) compiles with C1 only: C2 compilation of
# Spark's and Delta's code costs more CPU than the run recovers (measured on `run --once` over 1M
# changes: JVM CPU 68 s -> 45 s, start-up 24 s -> 15 s, wall clock -12%). A continuous `run` keeps
# tiered compilation: over hours, C2's faster code pays for itself.
SHORT_LIVED_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
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
    A `spark.driver.extraJavaOptions` in the config replaces ingest's JVM options altogether.
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
        if short_lived:
            builder = builder.config(
                "spark.driver.extraJavaOptions", f"{DRIVER_JAVA_OPTIONS} {SHORT_LIVED_JAVA_OPTIONS}"
            )
    for k, v in DELTA_CONF.items():
        builder = builder.config(k, v)
    for k, v in cfg.conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()
