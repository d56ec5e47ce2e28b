"""One typed config for ingest: loaded from YAML once, ${ENV} substituted, validated, frozen."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from ingest.errors import ConfigError
from ingest.masking import SourceMasks
from ingest.selection import Selection, Selector
from ingest.tenants import TenantMerge, check_merges, fold_merge_entries

DEFAULT_WAREHOUSE = "./warehouse"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")
# Keys of older configs, with what to do instead.
_REMOVED_KEYS = {
    "spark": "ingest no longer starts Spark: it writes bronze with delta-rs (deltalake). Remove the "
    "`spark:` section; Spark settings belong to the dbt profile (profiles.yml), which reads bronze",
}
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class _Strict(BaseModel):
    # A dumped config loads again: fields with an alias (a Postgres source's `tables`, held as
    # `selectors`) are written under the key a config file uses, and either key is read.
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True, validate_by_name=True)


MIB = 1 << 20


class BatchConfig(_Strict):
    """How much change data one bronze commit holds (a batch ends on a transaction boundary).

    A batch closes at `max_events` events or `max_bytes` of record text, whichever comes first; a
    transaction larger than that goes to bronze in pages (DESIGN §3).
    """

    # 100k events: a commit of ~0.1 s with delta-rs, and ingest's peak RSS under 500 MiB with one
    # batch being built, one queued and one committing (BENCHMARKS.md; 200k: ~700 MiB, no faster).
    max_events: Annotated[int, Field(gt=0)] = 100_000
    # Wide rows fill memory long before 100k events do (200 rows of 1 MB took 1.2 GB as one
    # batch): a batch also closes at this many bytes of record, old record and message text, so
    # that a bulk update of wide rows, and its replay after a crash, fits in memory. One event
    # wider than this still goes through, alone. 32 MiB keeps `run --once` over a transaction of
    # 2,000 rows of 1 MB under 600 MiB of peak RSS (BENCHMARKS.md, wide rows).
    max_bytes: Annotated[int, Field(gt=0)] = 32 * MIB
    # A bronze commit costs tens of milliseconds (delta-rs): a short window keeps freshness
    # (source commit -> bronze) around a second without making many more files than compaction
    # folds away (BENCHMARKS.md, freshness).
    max_seconds: Annotated[float, Field(gt=0)] = 1.0


class RetryConfig(_Strict):
    """How `run` rides out a source it cannot reach (ingest/capture/retry.py).

    `max_seconds`: how long one outage may last before the run gives up with exit code 75
    (None: forever for `run`, RUN_ONCE_MAX_SECONDS for `run --once`, so a scheduled job ends).
    `max_delay_seconds`: the longest wait between two attempts (exponential backoff up to it).
    """

    max_seconds: Annotated[float, Field(gt=0)] | None = None
    max_delay_seconds: Annotated[float, Field(gt=0)] = 60.0


# A scheduled `run --once` gives up on an unreachable source after this long by default.
RUN_ONCE_MAX_SECONDS = 300.0


class MetricsConfig(_Strict):
    """Prometheus metrics of a running `run` (docs/operations.md): `port` 0 (the default) serves none."""

    port: Annotated[int, Field(ge=0, le=65535)] = 0
    # The interface the endpoint listens on. It has no authentication and names sources, slots,
    # tables and positions: loopback unless exposed on purpose (docs/operations.md).
    address: str = "127.0.0.1"
    # `/healthz` answers 503 once a capture loop has not turned for this long (ingest/ops/probes.py).
    liveness_seconds: Annotated[float, Field(gt=0)] = 120.0


_HTTP_URL = re.compile(r"^https?://[^\s/?#]+[^\s]*$")


def _http_url(v: str) -> str:
    if not _HTTP_URL.match(v):
        raise ValueError("must be an http:// or https:// URL with a host (not shown: it may hold a token)")
    return v


class WebhookConfig(_Strict):
    """A Slack-compatible webhook the watcher posts `{"text": ...}` to when an alert starts and ends.

    `url` is a secret (a Slack webhook URL is its own credential): give it as `${ENV}`.
    `timeout_seconds` bounds one post; `retries` more attempts follow a failed one, then the
    notice is dropped with a WARNING (the alert still shows in the log, metric and status).
    """

    url: str
    timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0
    retries: Annotated[int, Field(ge=0, le=10)] = 3

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)


class LogConfig(_Strict):
    """How ingest logs: `text` (key=value lines) or `json` (one object a line); `--log-format` overrides."""

    format: Literal["text", "json"] = "text"


class LineageConfig(_Strict):
    """OpenLineage run events of `run` (docs/operations.md); absent: none are sent.

    `url`: the OpenLineage HTTP endpoint's base (events go to `<url>/<endpoint>`); `namespace`: the
    job namespace; `api_key_env`: an environment variable holding a bearer token, if it needs one.
    """

    url: str
    endpoint: str = "api/v1/lineage"
    namespace: str = "changelake"
    timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0
    api_key_env: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)


class AlertsConfig(_Strict):
    """When ingest warns before data is lost (log line at WARNING, metric, `status --json`).

    `max_lag_bytes`: slot lag (server WAL position minus the slot's confirmed position) above which
    a source is lagging (None: no fixed threshold). `slot_keep_fraction`: a source is lagging once
    its slot holds this fraction of the server's `max_slot_wal_keep_size` (past all of it the server
    invalidates the slot and the changes in between are gone). `max_position_age_seconds`: a writer
    whose row in bronze.stream_positions was not raised for this long is stale (None: never; a
    running stream raises it at least every `heartbeat_seconds` plus a batch).
    """

    max_lag_bytes: Annotated[int, Field(gt=0)] | None = None
    slot_keep_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    max_position_age_seconds: Annotated[float, Field(gt=0)] | None = None
    webhook: WebhookConfig | None = None


class SnapshotSettings(_Strict):
    """Table snapshots of a source (DESIGN §5): taken beside the stream, in keyset pages."""

    initial: bool = True  # snapshot every configured table that never completed a snapshot
    # Rows per page. The compiled encoder keeps a COPY page out of Python row objects, so a page's
    # fixed cost (its Delta commit, watermark, transaction) is what a larger page spreads out:
    # 50,000 snapshotted about twice as fast as 10,000 (BENCHMARKS.md, "Snapshot throughput vs COPY").
    page_rows: Annotated[int, Field(gt=0, le=1_000_000)] = 50_000
    # A page also ends once its rows' JSON reaches this many bytes (a row wider than that is a page
    # of its own): 10k rows of 1 MB would be 10 GB in one page.
    page_bytes: Annotated[int, Field(gt=0)] = 64 * MIB
    # Snapshots run side by side, each its own writer and connection holding at most one page
    # (memory: max_parallel x page_bytes). A table of more than split_rows estimated rows is cut
    # into max_parallel key ranges (block ranges for a keyless table). Default: one per core, at most 4.
    max_parallel: Annotated[int, Field(gt=0, le=64)] = max(1, min(4, (os.cpu_count() or 1)))
    split_rows: Annotated[int, Field(gt=0)] = 1_000_000
    # Where dbt's consumer_records is, to re-read keys it marks needs_reread (default:
    # <warehouse>/dbt/silver.db/consumer_records, the local profile's location).
    reread_from: str | None = None


class TableColumns(_Strict):
    """Columns of one table that must never land in bronze (docs/masking.md).

    `exclude_columns` are never written (nor, on Postgres 15+, published); `mask_columns` are
    written as the source's `mask_with` says (a keyed hash, or null). Key columns can be neither.
    MongoDB: top-level fields of the collection's documents (`_id` can be neither).
    """

    exclude_columns: list[str] = Field(default_factory=list)
    mask_columns: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct(self) -> TableColumns:
        for key, names in (("exclude_columns", self.exclude_columns), ("mask_columns", self.mask_columns)):
            if any(not n for n in names):
                raise ValueError(f"{key}: a column name is empty")
            if len(set(names)) != len(names):
                raise ValueError(f"{key}: a column is listed twice")
        both = sorted(set(self.exclude_columns) & set(self.mask_columns))
        if both:
            raise ValueError(f"{', '.join(both)}: in both exclude_columns and mask_columns; pick one")
        return self


def _fold_table_entries(raw: Any, list_key: str, what: str) -> Any:
    """Move `{name: t, exclude_columns: ..., mask_columns: ...}` entries of `list_key` into `columns`.

    The inline form is short for the `columns:` mapping; both may be used, not for one table.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get(list_key), list):
        return raw
    names: list[Any] = []
    columns = dict(raw.get("columns") or {}) if isinstance(raw.get("columns") or {}, dict) else raw.get("columns")
    for i, entry in enumerate(raw[list_key]):
        if not isinstance(entry, dict):
            names.append(entry)
            continue
        if not isinstance(entry.get("name"), str):
            raise ValueError(f"{list_key}.{i}: a mapping entry needs `name: {what}`")
        name = entry["name"]
        if not isinstance(columns, dict) or name in columns:
            raise ValueError(f"{list_key}.{i}: {name} has column rules here and under `columns:`; keep one")
        columns[name] = {k: v for k, v in entry.items() if k != "name"}
        names.append(name)
    return {**raw, list_key: names, "columns": columns}


class _MaskedSource(_Strict):
    """Per-table column rules of a source, and how masked columns are written."""

    columns: dict[str, TableColumns] = Field(default_factory=dict)
    mask_with: Literal["hash", "null"] = "hash"
    mask_salt_env: str | None = None

    def masks(self) -> SourceMasks:
        """The source's column rules with the salt read from the environment (ConfigError if unset)."""
        name = getattr(self, "name", "?")
        rules = {t: (c.exclude_columns, c.mask_columns) for t, c in self.columns.items()}
        return SourceMasks.build(name, rules, self.mask_with, self.mask_salt_env)

    @model_validator(mode="after")
    def _salt_is_set(self) -> _MaskedSource:
        try:
            self.masks()
        except ConfigError as e:
            raise ValueError(f"mask_salt_env: {str(e).split(': ', 1)[-1]}") from None
        return self


def check_postgres_dsn(dsn: str) -> str:
    """`dsn` if libpq can use it; else ValueError saying what is wrong without showing any of it.

    A DSN that libpq misreads fails at connect with a message quoting the fragment it choked on,
    often a piece of the password, which then reaches errors, logs and `status --json`.
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ValueError(
            "not a valid libpq connection string or URI (not shown: it may hold a password). In key=value "
            "form quote a value with spaces (password='a b'); in a URI percent-encode reserved characters "
            "of the user or password (@ is %40, / is %2F, : is %3A)"
        ) from None
    if any("@" in host for host in str(params.get("host", "")).split(",")):
        raise ValueError(
            "its host holds an '@' (not shown: it may hold a password): percent-encode an '@' in a URI's "
            "password as %40"
        )
    return dsn


class PostgresSource(_MaskedSource):
    """A Postgres source: a pgoutput slot over a publication of the selected tables.

    `tables` lists names and patterns (`public.orders`, `public.*`, `tenant_*.orders`; see
    ingest/selection.py), `exclude` patterns to leave out. A pattern's matches are resolved against
    the catalog at start and, in a continuous run, every `new_tables_check_seconds`: a table that
    comes into scope is published and snapshotted without a restart (docs/postgres.md).

    `on_history_lost`: what a slot that no longer continues where bronze left off does (it was
    invalidated, dropped and recreated, or advanced by someone else: the changes in between are
    gone), `fail` (an error saying how to recover) or `resnapshot` (a new slot if the old one is
    invalidated, every table tombstoned at the slot's position, then snapshotted afresh).

    `non_utf8`: a text value that is not UTF-8 (a SQL_ASCII database stores any bytes) is an
    `error` naming the table and column (the default: nothing lands altered), `replace`d (each
    invalid byte becomes U+FFFD) or read as `latin1` (every byte a character: lossless for data
    written in Latin-1). Values that are UTF-8 are never touched.
    """

    kind: Literal["postgres"]
    name: str
    dsn: str
    # `schema.table`, a pattern, or `{name: schema.table, exclude_columns: [...], mask_columns: [...]}`.
    selectors: list[str] = Field(alias="tables")
    exclude: list[str] = Field(default_factory=list)
    # How often a continuous run looks for tables that came into (or left) the patterns' scope.
    new_tables_check_seconds: Annotated[float, Field(gt=0)] = 10.0
    slot: str | None = None
    publication: str | None = None
    create_publication: bool = True
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 30.0
    snapshot: SnapshotSettings = Field(default_factory=SnapshotSettings)
    on_history_lost: Literal["fail", "resnapshot"] = "fail"
    non_utf8: Literal["error", "replace", "latin1"] = "error"
    # PostgreSQL 14+: have the server stream a transaction larger than its logical_decoding_work_mem
    # while it runs (pgoutput protocol 2), held by ingest until it commits, instead of spilling it
    # to the server's disk; false keeps protocol 1 (docs/postgres.md).
    streaming: bool = True
    # When `dsn` is a physical standby (PostgreSQL 16+): a connection to its primary, used only for
    # the few logical messages that must be in WAL and for publication changes; the slot, the
    # stream and snapshot reads stay on the standby (docs/postgres.md, Capture from a standby).
    primary_dsn: str | None = None
    # Tables of one `tables:` pattern that gold merges into one model with a tenant column
    # (ingest/tenants.py); also written inline in `tables` as `{pattern: ..., merge_as: ...}`.
    merges: list[TenantMerge] = Field(default_factory=list)
    # The tables the selection resolved to (set_tables); until resolved, the named entries.
    _resolved: tuple[str, ...] | None = PrivateAttr(default=None)
    _selection: tuple[tuple[tuple[str, ...], tuple[str, ...]], Selection] | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError(f"{v!r} must be lowercase letters, digits and _ (a slot name is derived from it)")
        return v

    @field_validator("dsn")
    @classmethod
    def _dsn_parses(cls, v: str) -> str:
        return check_postgres_dsn(v)

    @field_validator("primary_dsn")
    @classmethod
    def _primary_dsn_parses(cls, v: str | None) -> str | None:
        return None if v is None else check_postgres_dsn(v)

    @field_validator("selectors")
    @classmethod
    def _tables_are_qualified(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("list at least one table as schema.table (or a pattern such as public.*)")
        Selection.parse(v, (), 2)
        if len(set(v)) != len(v):
            raise ValueError("a table is listed twice")
        return v

    @model_validator(mode="before")
    @classmethod
    def _inline_columns(cls, raw: Any) -> Any:
        return _fold_table_entries(fold_merge_entries(raw), "tables", "schema.table")

    @model_validator(mode="after")
    def _columns_of_captured_tables(self) -> PostgresSource:
        try:
            selection = Selection.parse(self.selectors, self.exclude, 2)
        except ValueError as e:
            raise ValueError(f"exclude: {e}") from None
        unknown = sorted(t for t in self.columns if t.count(".") != 1 or not selection.matches(t.split(".", 1)))
        if unknown:
            raise ValueError(f"columns: {', '.join(unknown)} is not one of the source's tables (nor matched by them)")
        self._selection = ((tuple(self.selectors), tuple(self.exclude)), selection)
        check_merges(self.merges, self.selectors)
        return self

    @property
    def selection(self) -> Selection:
        """The parsed `tables` and `exclude` entries."""
        entries = (tuple(self.selectors), tuple(self.exclude))
        if self._selection is None or self._selection[0] != entries:  # model_copy keeps private attributes
            self._selection = (entries, Selection.parse(self.selectors, self.exclude, 2))
        return self._selection[1]

    @property
    def tables(self) -> list[str]:
        """The captured tables as `schema.table`: the selection as last resolved, else its named entries."""
        return list(self._resolved) if self._resolved is not None else self.selection.named

    def set_tables(self, tables: tuple[str, ...]) -> None:
        """Record what the selection resolves to now (at start, and as tables come into or leave scope).

        Every part of a run reads the source's tables through this one object (stream, snapshots,
        re-reads), so a table picked up while running is seen by all of them at once.
        """
        self._resolved = tables

    @property
    def slot_name(self) -> str:
        """The replication slot; `changelake_<name>` unless set."""
        return self.slot or f"changelake_{self.name}"

    @property
    def publication_name(self) -> str:
        """The publication; `changelake_<name>` unless set."""
        return self.publication or f"changelake_{self.name}"


class MongoSource(_MaskedSource):
    """A MongoDB source: one change stream over a database (or one collection) plus snapshots.

    `uri` holds credentials: give it as `${ENV}`. `collections` lists collection names and
    patterns of `database` (None: every collection), `exclude` patterns to leave out; matched as
    a Postgres source's `tables` (ingest/selection.py), against the database's collections at
    start and against each change event's namespace while streaming. `pre_post_images` says the
    collections have `changeStreamPreAndPostImages` enabled: the stream then asks for `required`
    post-images and `whenAvailable` pre-images instead of `updateLookup` (see docs/mongodb.md).
    `on_history_lost`: what a resume point that fell off the oplog does, `fail` (an error saying
    how to recover) or `resnapshot` (tombstone every collection, restart the stream now, snapshot
    every collection).
    """

    kind: Literal["mongodb"]
    name: str
    uri: str
    database: str
    # collection names and patterns (`orders_*`, `"literal*name"`), or `{name: coll, exclude_columns: [...],
    # mask_columns: [...]}` (top-level fields); None: every collection
    collections: list[str] | None = None
    # patterns of collections to leave out of `collections` (or of every collection)
    exclude: list[str] = Field(default_factory=list)
    pre_post_images: bool = False
    max_await_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    snapshot_page_size: Annotated[int, Field(gt=0)] = 5_000
    # A page also ends once its documents' JSON reaches this many bytes; the server ends a reply at
    # 16 MiB anyway, so only a smaller budget changes anything.
    snapshot_page_bytes: Annotated[int, Field(gt=0)] = 16 * MIB
    on_history_lost: Literal["fail", "resnapshot"] = "fail"

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError(f"{v!r} must be lowercase letters, digits and _")
        return v

    @field_validator("uri")
    @classmethod
    def _uri_is_mongodb(cls, v: str) -> str:
        if not v.startswith(("mongodb://", "mongodb+srv://")):
            raise ValueError("must start with mongodb:// or mongodb+srv://")
        return v

    @field_validator("database")
    @classmethod
    def _database_name(cls, v: str) -> str:
        if not v or any(c in v for c in '/\\. "$') or v in ("admin", "local", "config"):
            raise ValueError(f'{v!r} is not a user database name (no / \\ . space " $; not admin, local, config)')
        return v

    @field_validator("collections")
    @classmethod
    def _collection_names(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("list at least one collection, or leave the key out for all collections")
        _check_collection_entries(v)
        if len(set(v)) != len(v):
            raise ValueError("collections are listed twice")
        return v

    @field_validator("exclude")
    @classmethod
    def _excluded_names(cls, v: list[str]) -> list[str]:
        _check_collection_entries(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _inline_columns(cls, raw: Any) -> Any:
        return _fold_table_entries(raw, "collections", "collection")

    @model_validator(mode="after")
    def _columns_of_captured_collections(self) -> MongoSource:
        try:
            selection = self.selection
        except ValueError as e:
            raise ValueError(f"exclude: {e}") from None
        patterns = sorted(c for c in self.columns if any(w in c for w in "*?") and c not in selection.named)
        if patterns:
            # A rule keyed by a pattern would apply to a collection of that literal name only: the
            # fields of the collections the pattern matches would land unmasked.
            raise ValueError(
                f"columns: {', '.join(patterns)} is a pattern; column rules name collections, one entry each "
                '(a collection whose name holds * or ? is listed quoted in `collections`: "name*")'
            )
        unknown = sorted(c for c in self.columns if not selection.matches((c,)))
        if unknown:
            raise ValueError(
                f"columns: {', '.join(unknown)} is not one of the source's collections (nor matched by them)"
            )
        for coll, rules in self.columns.items():
            if "_id" in rules.exclude_columns or "_id" in rules.mask_columns:
                raise ValueError(f"columns.{coll}: _id is the key (record_pk): it cannot be excluded or masked")
            dotted = [n for n in rules.exclude_columns + rules.mask_columns if "." in n]
            if dotted:
                # A rule matches a top-level field by its name: a path would match nothing, and the
                # nested value would land as it is.
                top = sorted({n.split(".", 1)[0] for n in dotted})
                raise ValueError(
                    f"columns.{coll}: {', '.join(dotted)} is a path into a document; rules apply to top-level fields "
                    f"only: exclude or mask the whole field ({', '.join(top)})"
                )
        return self

    @property
    def selection(self) -> Selection:
        """The parsed `collections` (every collection when absent) and `exclude` entries."""
        return Selection.parse(self.collections if self.collections is not None else ["*"], self.exclude, 1)


def _check_collection_entries(entries: list[str]) -> None:
    """Each entry parses as a collection name or pattern that can name a user collection (ValueError if not)."""
    for c in entries:
        try:
            part = Selector.parse(c, 1).parts[0]
        except ValueError as e:
            raise ValueError(str(e)) from None
        if "$" in part.text or part.text.startswith("system."):
            raise ValueError(f"{c!r} is not a capturable collection name")


SourceConfig = Annotated[PostgresSource | MongoSource, Field(discriminator="kind")]


class Config(_Strict):
    """The whole ingest config: sources, the warehouse location (path or object-store URI), batching.

    `storage_options` go to delta-rs as they are, for an object-store warehouse (endpoint,
    region, ...); credentials are best left to the store's standard environment variables.
    """

    warehouse: str = DEFAULT_WAREHOUSE
    storage_options: dict[str, str] = Field(default_factory=dict)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    lineage: LineageConfig | None = None
    sources: list[SourceConfig]

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, v: list[SourceConfig]) -> list[SourceConfig]:
        names = [s.name for s in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {', '.join(dupes)}")
        if not v:
            raise ValueError("configure at least one source")
        return v

    @property
    def warehouse_uri(self) -> str:
        """The warehouse as an object-store URI as given, or a local path made absolute.

        Bronze lives in `<warehouse>/bronze/<table>`.
        """
        if _URI.match(self.warehouse):
            return self.warehouse.rstrip("/")
        return str(Path(self.warehouse).expanduser().resolve())

    def source(self, name: str) -> SourceConfig:
        """The source called `name`, or a ConfigError listing the configured ones."""
        for s in self.sources:
            if s.name == name:
                return s
        raise ConfigError(f"no source named {name!r}; configured: {', '.join(s.name for s in self.sources)}")


def _substitute(value: Any, where: str) -> Any:
    """Replace ${VAR} and ${VAR:-default} in every string of the parsed YAML."""
    if isinstance(value, dict):
        return {k: _substitute(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, f"{where}.{i}") for i, v in enumerate(value)]
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            var, default = m.group(1), m.group(2)
            got = os.environ.get(var)
            if got is None or got == "" and default is not None:
                if default is None:
                    raise ConfigError(f"{where}: environment variable {var} is not set")
                return default
            return got

        return _ENV_REF.sub(repl, value)
    return value


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"] if p not in ("postgres", "mongodb"))
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key")
        elif e["type"] == "missing":
            lines.append(f"{key}: required key is missing")
        else:
            shown = e.get("input")
            shown_s = "" if isinstance(shown, dict | list) else f" (got {shown!r})"
            if "dsn" in key or "uri" in key or "url" in key:
                shown_s = ""  # never echo a connection string: it may hold a password
            lines.append(f"{key}: {e['msg']}{shown_s}")
    return "invalid config:\n  " + "\n  ".join(lines)


def parse_config(text: str, origin: str = "<config>") -> Config:
    """Parse and validate YAML text; raise ConfigError naming the offending key and value."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{origin}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: expected a mapping at the top level, got {type(raw).__name__}")
    for key, why in _REMOVED_KEYS.items():
        if key in raw:
            raise ConfigError(f"{origin}: {key}: no longer a config key: {why}")
    raw = _substitute(raw, "")
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{origin}: {_format_validation_error(e)}") from None


def load_config(path: str | Path) -> Config:
    """Read and validate the YAML config file at `path`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror}") from None
    return parse_config(text, str(p))


def config_summary(cfg: Config) -> list[str]:
    """`config check`: what a validated config captures, read from the file alone (no source is contacted).

    Patterns are shown as given: what they match is the catalog's to say (`discover`, or the log at start).
    """
    lines = [f"config valid: warehouse {cfg.warehouse_uri}, {len(cfg.sources)} source(s)"]
    for s in cfg.sources:
        if isinstance(s, PostgresSource):
            what = f"tables {', '.join(s.selectors)}" + (f" excluding {', '.join(s.exclude)}" if s.exclude else "")
            what += "".join(f"; {m.pattern} merged as {s.name}__{m.merge_as}" for m in s.merges)
            where = f"publication {s.publication_name}, slot {s.slot_name}"
        else:
            what = f"collections {', '.join(s.collections)}" if s.collections is not None else "every collection"
            what += f" excluding {', '.join(s.exclude)}" if s.exclude else ""
            where = f"database {s.database}"
        lines.append(f"  {s.name} ({s.kind}): {what}; {where}")
    return lines
