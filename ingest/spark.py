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
QUIET_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_LOG4J}",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # bronze is append-only and read by stats-pruned scans; the default 50 partitions only add tasks
    "spark.databricks.delta.snapshotPartitions": "2",
}


def build_spark(cfg: SparkConfig, app_name: str = "changelake-ingest") -> SparkSession:
    """Start (or join) the SparkSession for `cfg`; Delta comes from the jars in pyspark's jars/."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
    builder = SparkSession.builder.appName(app_name)
    if cfg.remote:
        builder = builder.remote(cfg.remote)
    else:
        builder = builder.master(cfg.master)
        for k, v in QUIET_CONF.items():
            builder = builder.config(k, v)
    for k, v in DELTA_CONF.items():
        builder = builder.config(k, v)
    for k, v in cfg.conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()
