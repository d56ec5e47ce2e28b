"""`run --once` of a MongoDB source whose oplog has lost the stream's resume point, as a process.

mongo-java-server keeps its whole oplog, so it never answers a resume with ChangeStreamHistoryLost
(code 286). This runner makes it: every stream opened from a position below `lost_before` fails the
way a real server's does (translated by `source.translate`), which is what the oplog window rolling
past a stopped ingest looks like. Everything else is real: the server, bronze, the capture. A
fault point (CHANGELAKE_CRASH_AT) kills the process as it would kill `changelake-ingest run`.

Usage: python -m tests.helpers.mongo_history_lost <config.json>
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pymongo.errors import OperationFailure

from ingest.bronze.writer import BronzeWriter
from ingest.config import BatchConfig, MongoSource
from ingest.progress import Progress
from ingest.sources.mongodb import capture
from ingest.sources.mongodb.changes import Namespace
from ingest.sources.mongodb.source import CHANGE_STREAM_HISTORY_LOST, translate
from ingest.sources.mongodb.stream import open_stream


def main(config: Path) -> None:
    """Run the source of `config` once (`source`: MongoSource fields, `warehouse`, `lost_before`)."""
    cfg = json.loads(config.read_text())
    src = MongoSource(**cfg["source"])
    lost_before = int(cfg["lost_before"])

    def lossy_open(
        client: Any, src: MongoSource, scope: Namespace, stored: tuple[str, Mapping[str, Any]] | None, start: int
    ) -> Any:
        if start < lost_before:  # the writer's durable position: where the stream resumes
            reply = {"codeName": "ChangeStreamHistoryLost"}
            raise translate(src, OperationFailure("Resume of change stream was not possible", 286, reply))
        return open_stream(client, src, scope, stored, start)

    assert CHANGE_STREAM_HISTORY_LOST == 286
    capture.open_stream = lossy_open  # type: ignore[assignment]
    cap = capture.MongoCapture(
        src, BatchConfig(max_events=1000, max_seconds=5), BronzeWriter(cfg["warehouse"]), Progress(src.name, False)
    )
    cap.run(once=True, should_stop=lambda: False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
