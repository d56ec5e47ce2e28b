"""Delta table access with delta-rs: open, create, idempotent append, replace rows, query, maintain.

Everything here takes a table URI (a local path or an object-store URI such as `s3://bucket/wh/
bronze/wal_events`) and storage options; nothing knows what the rows mean. No JVM: delta-rs is
Rust, called through the `deltalake` bindings, and reads go through its DataFusion query engine,
which honours deletion vectors (the pyarrow dataset path refuses such tables, loudly).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import (
    CommitFailedError,
    DeltaError,
    DeltaProtocolError,
    SchemaMismatchError,
    TableNotFoundError,
)

from ingest.errors import BronzeUnavailableError, BronzeWriteError

log = logging.getLogger(__name__)

# A commit that loses a race with another process's commit (another ingest raising its positions,
# a compaction) is retried on the table's new version; each retry first re-checks idempotency.
COMMIT_ATTEMPTS = 8
COMMIT_BACKOFF_S = 0.05
# Any table operation, read or write, that fails on I/O (disk full or failing, an object store
# timing out or refusing connections) is retried after 0.5, 1, 2 and 4 s; the app-transaction
# check before each attempt keeps a retried append exactly once. Past that,
# BronzeUnavailableError: exit 75, and the service manager starts ingest again later.
IO_ATTEMPTS = 5
IO_BACKOFF_S = 0.5
# A compaction runs inside the writer's process, beside its batches: one rewrite task at a time,
# into files of 32 MiB, so its memory stays small. delta-rs's defaults (a task per core, 100 MiB
# files) took a writer from 321 to 562 MiB peak compacting 100 snapshot pages of 50,000 rows;
# these settings, 393 MiB (BENCHMARKS.md, "Snapshot numbers at HEAD").
COMPACT_TASKS = 1
COMPACT_TARGET_BYTES = 32 * 1024 * 1024
# How delta-rs, its query engine and object_store word an I/O failure (DeltaError, and the
# ArrowException a query raises, carry no finer type).
_IO_MARKERS = ("(os error", "Object Store error", "error sending request", "timed out", "Connection", "connection")
# object_store's generic error names its store; delta-rs's own "Generic DeltaTable error" and the
# kernel's "Generic delta kernel error" are not I/O (a bad predicate, an invalid URL).
_STORE_ERROR = re.compile(r"Generic (LocalFileSystem|S3|GCS|MicrosoftAzure|HTTP) error")
_ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")

T = TypeVar("T")


def transient_io(error: BaseException) -> bool:
    """Whether `error` of a Delta read or write is an I/O failure that the same operation may survive later."""
    if isinstance(error, OSError):
        return True
    if isinstance(error, CommitFailedError | SchemaMismatchError | DeltaProtocolError | TableNotFoundError):
        return False
    if not isinstance(error, DeltaError | pa.ArrowException):
        return False
    text = str(error)
    return any(m in text for m in _IO_MARKERS) or _STORE_ERROR.search(text) is not None


def one_line(error: BaseException) -> str:
    """`error`'s text on one line: delta-rs puts each cause on its own indented, colored line."""
    lines = (line.strip().lstrip("↳").strip() for line in _ANSI_COLOR.sub("", str(error)).splitlines())
    return ": ".join(line for line in lines if line)


def field_paths(schema: pa.Schema) -> set[str]:
    """Every field of `schema` as a dotted path, into structs and list elements (`columns.attnum`)."""

    def paths(prefix: str, data_type: pa.DataType) -> set[str]:
        if pa.types.is_struct(data_type):
            return {p for f in data_type for p in {f"{prefix}.{f.name}"} | paths(f"{prefix}.{f.name}", f.type)}
        if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
            return paths(prefix, data_type.value_type)
        return set()

    return {p for f in schema for p in {f.name} | paths(f.name, f.type)}


class DeltaTables:
    """Owns the open Delta tables of one warehouse and serializes this process's writes to each.

    Responsibilities: create a table once (schema, partitioning, properties, one commit), append
    with an app transaction and skip a batch whose version the table already records, replace the
    rows a predicate selects, delete rows, answer SQL over a table (deletion vectors honoured),
    and compact small files. One lock per table: the stream committer and the snapshot worker of
    a process never race each other; a race with another process is retried (COMMIT_ATTEMPTS).
    Every operation rides out a transient I/O failure (IO_ATTEMPTS), then raises
    BronzeUnavailableError naming the operation and the table.
    """

    def __init__(self, storage_options: Mapping[str, str] | None = None) -> None:
        """Open tables with `storage_options` (None: a local warehouse, or credentials from the env)."""
        self.storage_options = dict(storage_options) if storage_options else None
        self._open: dict[str, DeltaTable] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, uri: str) -> threading.Lock:
        """The lock this process holds while it writes `uri`."""
        with self._guard:
            return self._locks.setdefault(uri, threading.Lock())

    def exists(self, uri: str) -> bool:
        """Whether a Delta table is at `uri`."""
        return self._io("exists check", (uri,), lambda: self._exists(uri))

    def table(self, uri: str) -> DeltaTable:
        """The table at `uri` at its latest version; TableNotFoundError if there is none."""
        return self._io("open", (uri,), lambda: self._load(uri))

    def create(self, uri: str, schema: pa.Schema, partition_by: tuple[str, ...], properties: Mapping[str, str]) -> bool:
        """Create the table at `uri` unless it exists; True if this call created it.

        Safe against a concurrent creator: whoever loses the race finds the winner's table.
        """

        def attempt() -> bool:
            if self._exists(uri):
                return False
            try:
                DeltaTable.create(
                    uri,
                    schema,
                    mode="ignore",
                    partition_by=list(partition_by) or None,
                    configuration=dict(properties),
                    storage_options=self.storage_options,
                )
            except (CommitFailedError, DeltaError) as e:
                if transient_io(e):
                    raise
                if not self._exists(uri):
                    raise BronzeWriteError(f"cannot create bronze table {uri}: {e}") from e
                return False
            return True

        created = self._io("create", (uri,), attempt)
        if created:
            log.info("created bronze table uri=%s", uri)
        return created

    def set_missing_properties(self, uri: str, properties: Mapping[str, str]) -> None:
        """Add table properties a table created by an older ingest lacks (never changes a set one)."""

        def attempt() -> None:
            dt = self._load(uri)
            have = dt.metadata().configuration
            missing = {k: v for k, v in properties.items() if k not in have}
            if missing:
                dt.alter.set_table_properties(missing, raise_if_not_exists=False)
                log.info("set bronze table properties uri=%s properties=%s", uri, missing)

        with self.lock(uri):
            self._io("set properties", (uri,), attempt)

    def add_missing_columns(self, uri: str, schema: pa.Schema) -> None:
        """Give a table an older ingest created the fields of `schema` it lacks, nested ones too.

        One empty append with schema merge: a metadata commit, no row written or rewritten (old
        rows read the new fields as null). No commit when nothing is missing.
        """

        def attempt() -> None:
            dt = self._load(uri)
            missing = field_paths(schema) - field_paths(pa.schema(dt.schema().to_arrow()))
            if missing:
                write_deltalake(dt, schema.empty_table(), mode="append", schema_mode="merge")
                log.info("added bronze columns uri=%s columns=%s", uri, sorted(missing))

        with self.lock(uri):
            self._io("add columns", (uri,), attempt)

    def append(
        self,
        uri: str,
        data: pa.Table,
        app_id: str | None = None,
        version: int | None = None,
        writer_properties: WriterProperties | None = None,
    ) -> bool:
        """Append `data` in one commit; with `app_id`/`version`, exactly once. False: already committed.

        `writer_properties`: how the Parquet files are written (None: delta-rs's defaults).

        delta-rs records the app transaction but, unlike Spark, does not skip a version it has
        already committed: the table's recorded version for `app_id` is read (after loading the
        latest commit) before each attempt, and a batch at or below it is not written again.
        """
        props = None
        if app_id is not None and version is not None:
            props = CommitProperties(app_transactions=[Transaction(app_id, version)])

        def attempt() -> bool:
            dt = self._table_for_write(uri)
            if app_id is not None and version is not None:
                recorded = dt.transaction_version(app_id)
                if recorded is not None and recorded >= version:
                    log.info("skipped a committed batch uri=%s app_id=%s version=%d", uri, app_id, version)
                    return False
            given: dict[str, Any] = {} if writer_properties is None else {"writer_properties": writer_properties}
            write_deltalake(dt, data, mode="append", schema_mode="merge", commit_properties=props, **given)
            return True

        with self.lock(uri):
            return self._io("append", (uri,), attempt, retry_conflicts=True)

    def replace(self, uri: str, data: pa.Table, predicate: str) -> None:
        """Replace the rows matching `predicate` (SQL over the table's columns) by `data`, in one commit."""

        def attempt() -> None:  # the same rows replace them again: a retry is safe
            dt = self._table_for_write(uri)
            write_deltalake(dt, data, mode="overwrite", predicate=predicate, schema_mode="merge")

        with self.lock(uri):
            self._io("replace", (uri,), attempt, retry_conflicts=True)

    def delete(self, uri: str, predicate: str) -> None:
        """Delete the rows matching `predicate`, in one commit."""
        with self.lock(uri):
            self._io("delete", (uri,), lambda: self._table_for_write(uri).delete(predicate), retry_conflicts=True)

    def compact(self, uri: str, partition: tuple[str, str] | None = None) -> dict[str, Any]:
        """Rewrite small files of the table (or of one partition) into few; no data change.

        Readers keep reading the old files until they pick up the new version; the old files go
        with `vacuum` after the table's retention. A lost commit race is raised, not retried.
        """
        filters = [(partition[0], "=", partition[1])] if partition else None

        def attempt() -> dict[str, Any]:
            metrics: dict[str, Any] = self._table_for_write(uri).optimize.compact(
                partition_filters=filters, target_size=COMPACT_TARGET_BYTES, max_concurrent_tasks=COMPACT_TASKS
            )
            return metrics

        with self.lock(uri):
            return self._io("compact", (uri,), attempt)

    def vacuum(self, uri: str) -> list[str]:
        """Delete files no version within the table's retention needs (default 7 days)."""

        def attempt() -> list[str]:
            removed: list[str] = self._table_for_write(uri).vacuum(dry_run=False)
            return removed

        with self.lock(uri):
            return self._io("vacuum", (uri,), attempt)

    def query(self, sql: str, **tables: str) -> pa.Table:
        """Run `sql` over the tables given as name=uri; deletion vectors are honoured."""

        def attempt() -> pa.Table:
            qb = QueryBuilder()
            for name, uri in tables.items():
                qb.register(name, self._load(uri))
            # Through the Arrow stream interface: `pa.table()` of the result would import pandas to
            # ask whether it is a DataFrame (0.3 s of every command's start, for nothing).
            return pa.RecordBatchReader.from_stream(qb.execute(sql)).read_all()

        return self._io("query", tuple(tables.values()), attempt)

    def pinned(self, uri: str) -> DeltaTable:
        """The table at `uri` at its latest version, kept apart from this object's tables: it stays at that version."""
        return self._io("open", (uri,), lambda: DeltaTable(uri, storage_options=self.storage_options))

    def batches(self, sql: str, uri: str, table: DeltaTable | None = None) -> Iterator[pa.RecordBatch]:
        """The record batches of `sql` over one table registered as `t`: `table` (a version of `uri`), or its latest.

        One batch in memory at a time. Opening the table and reading the first batch ride out a
        transient I/O failure as every operation does; one after batches were handed out cannot be
        retried here (they were consumed): BronzeUnavailableError at once.
        """

        def first() -> tuple[Iterator[pa.RecordBatch], pa.RecordBatch | None]:
            qb = QueryBuilder().register("t", table if table is not None else self._load(uri))
            # Through pyarrow's reader: a failed read is an ArrowException that transient_io knows.
            rest = iter(pa.RecordBatchReader.from_stream(qb.execute(sql)))
            return rest, next(rest, None)

        rest, batch = self._io("query", (uri,), first)
        if batch is None:
            return
        try:
            yield batch
            yield from rest
        except Exception as e:
            if not transient_io(e):
                raise
            raise BronzeUnavailableError(
                f"query of {uri} failed on I/O after it had returned rows: {one_line(e)}; restore access to the "
                "warehouse and run the command again"
            ) from e

    def _exists(self, uri: str) -> bool:
        if DeltaTable.is_deltatable(uri, self.storage_options):
            return True
        # is_deltatable also answers False for a log it cannot read (a local one, at least): only a
        # table that is not there fails to open with TableNotFoundError.
        try:
            self._load(uri)
        except TableNotFoundError:
            return False
        return True

    def _load(self, uri: str) -> DeltaTable:
        dt = self._open.get(uri)
        if dt is None:
            dt = DeltaTable(uri, storage_options=self.storage_options)
            self._open[uri] = dt
        else:
            dt.update_incremental()
        return dt

    def _io(self, operation: str, uris: Sequence[str], attempt: Callable[[], T], retry_conflicts: bool = False) -> T:
        """`attempt()`, again after a transient I/O failure and (`retry_conflicts`) after a lost commit race.

        Any other error is raised as it is, at once. Each retry reloads the tables from their logs.
        """
        io_failures = lost_races = 0
        while True:
            try:
                return attempt()
            except CommitFailedError as e:
                if not retry_conflicts:
                    raise
                lost_races += 1
                self._retry_or_raise(uris[0], lost_races, e)
            except Exception as e:
                io_failures += 1
                self._retry_io_or_raise(operation, uris, io_failures, e)

    def _table_for_write(self, uri: str) -> DeltaTable:
        try:
            return self._load(uri)
        except TableNotFoundError as e:
            raise BronzeWriteError(f"no bronze table at {uri}: {e}") from e

    def _retry_or_raise(self, uri: str, attempt: int, error: CommitFailedError) -> None:
        if attempt >= COMMIT_ATTEMPTS:
            raise BronzeWriteError(f"commit to {uri} failed after {attempt} attempts: {error}") from error
        log.info("commit conflict, retrying uri=%s attempt=%d error=%s", uri, attempt, error)
        self._open.pop(uri, None)  # reload from the log: another process committed meanwhile
        time.sleep(COMMIT_BACKOFF_S * attempt)

    def _retry_io_or_raise(self, operation: str, uris: Sequence[str], failures: int, error: Exception) -> None:
        if not transient_io(error):
            raise error
        where = ", ".join(uris)
        if failures >= IO_ATTEMPTS:
            raise BronzeUnavailableError(
                f"{operation} of {where} failed {failures} times on I/O, last: {one_line(error)}; nothing was "
                "acknowledged past durable data: restore access to the warehouse (or free space on it), and ingest "
                "continues where it left off"
            ) from error
        log.warning(
            "bronze I/O failed, retrying operation=%s uri=%s attempt=%d error=%s",
            operation,
            where,
            failures,
            one_line(error),
        )
        for uri in uris:
            self._open.pop(uri, None)
        time.sleep(IO_BACKOFF_S * 2 ** (failures - 1))
