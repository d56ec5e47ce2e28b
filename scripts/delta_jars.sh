#!/usr/bin/env bash
# Resolve Delta Lake's jars (not on PyPI) from Maven Central once, with Maven, into a local cache,
# and place them in the pyspark install's jars/ so every Spark this project starts -- ingest, dbt's
# session, a standalone master/worker, the Thrift server -- has Delta with no --packages download.
# Offline after the first run (Maven's ~/.m2 and our cache). Usage: scripts/delta_jars.sh PYTHON
#
# Also Hive's hive-llap-common, which Spark 4 no longer ships: the Thrift server (the `engine` and
# `cluster` targets) registers Hive's built-in functions the first time a session closes in some
# orders, and one of them (get_splits) names LlapSigner$Signable; without the jar that session
# close fails with NoClassDefFoundError and the dbt node running on it errors (SPARK-51041 added
# the same jar to Spark's own Thrift server tests). Same version as the Hive jars pyspark ships.
set -euo pipefail
PY="${1:-.venv/bin/python}"
DELTA_VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("delta-spark"))')"
SPARK_MM="$("$PY" -c 'import pyspark; print(".".join(pyspark.__version__.split(".")[:2]))')"
SPARK_HOME_DIR="$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
CACHE="${CHANGELAKE_JAR_CACHE:-$HOME/.cache/changelake/jars}/delta-$DELTA_VERSION-spark-$SPARK_MM"
HIVE_VERSION="$(cd "$SPARK_HOME_DIR/jars" && ls hive-common-*.jar | sed -E 's/hive-common-(.*)\.jar/\1/')"
CACHE="$CACHE-hive-$HIVE_VERSION"
ARTIFACTS=(
  "io.delta:delta-spark_${SPARK_MM}_2.13:$DELTA_VERSION" "io.delta:delta-storage:$DELTA_VERSION"
  "org.apache.hive:hive-llap-common:$HIVE_VERSION"
)

if [ ! -f "$CACHE/.complete" ]; then
  mkdir -p "$CACHE"
  for a in "${ARTIFACTS[@]}"; do
    echo "delta_jars: resolving $a (first run only)" >&2
    if ! mvn -q -B dependency:copy -Dartifact="$a:jar" -DoutputDirectory="$CACHE" >"$CACHE/mvn.log" 2>&1; then
      echo "delta_jars: could not resolve $a from Maven Central; see $CACHE/mvn.log" >&2; exit 1
    fi
  done
  touch "$CACHE/.complete"
fi
for j in "$CACHE"/*.jar; do
  [ -f "$SPARK_HOME_DIR/jars/$(basename "$j")" ] || cp "$j" "$SPARK_HOME_DIR/jars/"
done
