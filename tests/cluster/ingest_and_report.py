"""Run `changelake-ingest` in this process, then save its driver's executor list from the REST API.

The cluster test runs this as a subprocess, so the ingest app gets a driver of its own (not the
test process's). Ingest never stops its SparkSession (the JVM ends with the process), so once
`run --once` has returned the driver is still up and its REST API can say where the tasks ran.

usage: python -m tests.cluster.ingest_and_report REPORT.json -c CONFIG run --once
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ingest.cli import main as ingest_main

# The status store behind the REST API is fed by Spark's listener bus, a little after tasks end.
SETTLE_TIMEOUT_S = 10.0


def executors(ui_url: str, app_id: str) -> list[dict[str, Any]]:
    """The driver's /api/v1/applications/<app id>/executors list (the driver is one of them)."""
    with urllib.request.urlopen(f"{ui_url}/api/v1/applications/{app_id}/executors", timeout=30) as r:
        listed: list[dict[str, Any]] = json.load(r)
    return listed


def main(argv: list[str]) -> int:
    report, args = Path(argv[0]), argv[1:]
    rc = ingest_main(args)
    if rc != 0:
        return rc
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or sc.uiWebUrl is None:
        print("ingest_and_report: no live SparkContext with a UI (spark.ui.enabled?)", file=sys.stderr)
        return 1
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    listed = executors(sc.uiWebUrl, sc.applicationId)
    while time.monotonic() < deadline and not any(
        e["id"] != "driver" and e["completedTasks"] > 0 for e in listed
    ):
        time.sleep(0.5)
        listed = executors(sc.uiWebUrl, sc.applicationId)
    report.write_text(json.dumps({"app_id": sc.applicationId, "master": sc.master, "executors": listed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
