"""OpenLineage run events of `run` (`lineage:` in the config): source tables in, bronze tables out.

One run per source and `run` invocation: START before capture, COMPLETE when it ends (a stop
signal, or `--once` drained), FAIL with the error when it raises. Inputs are the captured tables
(`postgres://host:port` / `db.schema.table`, `mongodb://host:port` / `db.collection`), outputs
the bronze tables the capture writes, and the writers' durable positions travel as the
`changelake_positions` run facet. Lineage never stops ingest: a collector that does not answer
costs a WARNING and at most the transport's timeout and retries.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlsplit

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import RunFacet, error_message_run
from openlineage.client.transport.http import HttpConfig, HttpTransport, create_token_provider
from openlineage.client.uuid import generate_new_uuid
from psycopg.conninfo import conninfo_to_dict

from ingest.bronze.schemas import STREAM_POSITIONS_TABLE, WAL_EVENTS_TABLE
from ingest.config import LineageConfig, MongoSource, PostgresSource, SourceConfig
from ingest.errors import ConfigError
from ingest.events import WriterPosition
from ingest.positions import safe_bound

log = logging.getLogger(__name__)

PRODUCER: Final = "https://github.com/changelake/changelake"
# The collector is told once or twice, quickly: a run must not wait minutes on a catalog.
TRANSPORT_RETRY: Final = {"total": 2, "backoff_factor": 0.3, "status_forcelist": [500, 502, 503, 504]}
BRONZE_OUTPUTS: Final = (WAL_EVENTS_TABLE.name, STREAM_POSITIONS_TABLE.name)
POSTGRES_PORT: Final = 5432
MONGODB_PORT: Final = 27017


@attr.define
class PositionsRunFacet(RunFacet):
    """`changelake_positions`: each writer's durable position when the run ended, and the safe bound."""

    source: str
    safeBound: int | None  # noqa: N815 - OpenLineage facets are camelCase
    safeBoundText: str | None  # noqa: N815
    writers: list[dict[str, Any]]

    @staticmethod
    def _get_schema() -> str:
        return "https://github.com/changelake/changelake/blob/main/docs/operations.md#lineage"


@dataclass(frozen=True, slots=True)
class Datasets:
    """The inputs and outputs of one source's run."""

    inputs: list[InputDataset]
    outputs: list[OutputDataset]


def datasets(src: SourceConfig, warehouse_uri: str) -> Datasets:
    """The source's captured tables as inputs, bronze's tables as outputs (OpenLineage naming)."""
    if isinstance(src, PostgresSource):
        params = conninfo_to_dict(src.dsn)
        host = str(params.get("host") or "localhost").split(",")[0]
        port = str(params.get("port") or POSTGRES_PORT).split(",")[0]
        db = str(params.get("dbname") or params.get("user") or "postgres")
        namespace, names = f"postgres://{host}:{port}", [f"{db}.{t}" for t in src.tables]
    elif isinstance(src, MongoSource):
        parts = urlsplit(src.uri)
        host = (parts.hostname or "localhost") if parts.scheme == "mongodb" else (parts.hostname or "")
        namespace = f"mongodb://{host}:{parts.port or MONGODB_PORT}"
        # Collections named without a pattern are one dataset each; a selection with patterns (or
        # every collection) follows the database as it changes, so it is one dataset: the database.
        selection = src.selection
        names = [src.database] if selection.has_patterns else [f"{src.database}.{c}" for c in selection.named]
    out_ns, out_root = _storage(warehouse_uri)
    return Datasets(
        [InputDataset(namespace, n) for n in names],
        [OutputDataset(out_ns, f"{out_root}/bronze/{t}" if out_root else f"bronze/{t}") for t in BRONZE_OUTPUTS],
    )


def _storage(warehouse_uri: str) -> tuple[str, str]:
    """OpenLineage's namespace and path of a warehouse: `file` and the path, or `s3://bucket` and the key."""
    if "://" not in warehouse_uri:
        return "file", warehouse_uri
    parts = urlsplit(warehouse_uri)
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


class Lineage:
    """Owns the OpenLineage client of a `run`.

    Responsibilities: build the HTTP transport from `lineage:` (bearer token from `api_key_env`),
    and emit START, COMPLETE and FAIL events of one source's run; a failed emit is logged, never
    raised.
    """

    def __init__(self, cfg: LineageConfig, warehouse_uri: str) -> None:
        """Send to `cfg.url`; the bronze outputs are named under `warehouse_uri`."""
        self.cfg = cfg
        self.warehouse_uri = warehouse_uri
        auth = {}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ConfigError(f"lineage.api_key_env: environment variable {cfg.api_key_env} is not set")
            auth = {"type": "api_key", "apiKey": key}
        transport = HttpTransport(
            HttpConfig(
                url=cfg.url,
                endpoint=cfg.endpoint,
                timeout=cfg.timeout_seconds,
                auth=create_token_provider(auth),
                retry=dict(TRANSPORT_RETRY),
            )
        )
        self.client = OpenLineageClient(transport=transport)

    def start(self, src: SourceConfig) -> LineageRun:
        """Emit START of `src`'s run; the returned run emits its end."""
        run = LineageRun(self, src, str(generate_new_uuid()), datasets(src, self.warehouse_uri))
        run.emit(RunState.START, {})
        return run


@dataclass(slots=True)
class LineageRun:
    """One source's run, between its START and its COMPLETE or FAIL."""

    lineage: Lineage
    src: SourceConfig
    run_id: str
    sets: Datasets

    def complete(self, positions: Sequence[WriterPosition], fmt: Callable[[int], str]) -> None:
        """Emit COMPLETE with the writers' positions."""
        self.emit(RunState.COMPLETE, {"changelake_positions": self._facet(positions, fmt)})

    def fail(self, error: BaseException, positions: Sequence[WriterPosition], fmt: Callable[[int], str]) -> None:
        """Emit FAIL with the error's message (no traceback: it may quote values) and the positions."""
        facets: dict[str, RunFacet] = {
            "changelake_positions": self._facet(positions, fmt),
            "errorMessage": error_message_run.ErrorMessageRunFacet(
                message=f"{type(error).__name__}: {error}", programmingLanguage="python"
            ),
        }
        self.emit(RunState.FAIL, facets)

    def _facet(self, positions: Sequence[WriterPosition], fmt: Callable[[int], str]) -> PositionsRunFacet:
        bound = safe_bound(positions)
        writers = [
            {"writerId": p.writer_id, "durablePosition": p.durable_lsn, "durablePositionText": fmt(p.durable_lsn)}
            for p in sorted(positions, key=lambda p: p.writer_id)
        ]
        return PositionsRunFacet(
            source=self.src.name,
            safeBound=bound,
            safeBoundText=fmt(bound) if bound is not None else None,
            writers=writers,
            producer=PRODUCER,
        )

    def emit(self, state: RunState, facets: dict[str, RunFacet]) -> None:
        """Send one event of this run; a collector that fails is logged at WARNING."""
        event = RunEvent(
            eventType=state,
            eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=self.run_id, facets=facets),
            job=Job(namespace=self.lineage.cfg.namespace, name=f"changelake.ingest.{self.src.name}"),
            producer=PRODUCER,
            inputs=self.sets.inputs,
            outputs=self.sets.outputs,
        )
        try:
            self.lineage.client.emit(event)
        except Exception as e:  # lineage is advisory: the capture's data and positions do not depend on it
            log.warning(
                "lineage emit failed source=%s event=%s error=%s: %s", self.src.name, state.value, type(e).__name__, e
            )
