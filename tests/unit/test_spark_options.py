"""The driver JVM options ingest starts Spark with (docs/delivery.md, "The driver JVM")."""

from __future__ import annotations

import shlex

from ingest.config import SparkConfig
from ingest.spark import driver_java_options


def flags(cfg: SparkConfig, short_lived: bool) -> list[str]:
    return shlex.split(driver_java_options(cfg, short_lived))


def test_short_lived_driver_uses_c1_and_serial_gc_and_a_long_running_one_the_jvm_defaults() -> None:
    once = flags(SparkConfig(), short_lived=True)
    continuous = flags(SparkConfig(), short_lived=False)
    assert "-XX:TieredStopAtLevel=1" in once and "-XX:+UseSerialGC" in once
    assert not any(f.startswith(("-XX:TieredStopAtLevel", "-XX:+Use")) for f in continuous)
    for f in (once, continuous):
        assert any(x.startswith("-Dlog4j2.configurationFile=file:") and x.endswith("log4j2.properties") for x in f)


def test_config_java_options_come_last_so_they_win() -> None:
    cfg = SparkConfig(conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4 -Xss4m"})
    got = flags(cfg, short_lived=True)
    assert got[-2:] == ["-XX:TieredStopAtLevel=4", "-Xss4m"]
    assert got.index("-XX:TieredStopAtLevel=1") < got.index("-XX:TieredStopAtLevel=4")
