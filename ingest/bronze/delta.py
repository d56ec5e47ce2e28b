"""Delta table access with delta-rs: open, create, idempotent append, replace rows, query, maintain.

Everything here takes a table URI (a local path or an object-store URI such as `s3://bucket/wh/
bronze/wal_events`) and storage options; nothing knows what the rows mean. No JVM: delta-rs is
Rust, called through the `deltalake` bindings, and reads go through its DataFusion query engine,
which honours deletion vectors (the pyarrow dataset path refuses such tables, loudly).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
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
# A write that fails on I/O (disk full, an object store timing out) is retried after 0.5, 1, 2 and
# 4 s; the app-transaction check before each attempt keeps a retried append exactly once. Past
# that, BronzeUnavailableError: exit 75, and the service manager starts ingest again later.
IO_ATTEMPTS = 5
IO_BACKOFF_S = 0.5
# How delta-rs and object_store word an I/O failure (DeltaError carries no finer type).
_IO_MARKERS = ("(os error", "Generic ", "error sending request", "timed out", "Connection", "connection")


def transient_io(error: Exception) -> bool:
    """Whether `error` of a Delta write is an I/O failure that the same write may survive later."""
    if isinstance(error, OSError):
        return True
    if isinstance(error, CommitFailedError | SchemaMismatchError | DeltaProtocolError | TableNotFoundError):
        return False
    return isinstance(error, DeltaError) and any(m in str(error) for m in _IO_MARKERS)


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
        return bool(DeltaTable.is_deltatable(uri, self.storage_options))

    def table(self, uri: str) -> DeltaTable:
        """The table at `uri` at its latest version; TableNotFoundError if there is none."""
        dt = self._open.get(uri)
        if dt is None:
            dt = DeltaTable(uri, storage_options=self.storage_options)
            self._open[uri] = dt
        else:
            dt.update_incremental()
        return dt

    def create(self, uri: str, schema: pa.Schema, partition_by: tuple[str, ...], properties: Mapping[str, str]) -> bool:
        """Create the table at `uri` unless it exists; True if this call created it.

        Safe against a concurrent creator: whoever loses the race finds the winner's table.
        """
        if self.exists(uri):
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
            if not self.exists(uri):
                raise BronzeWriteError(f"cannot create bronze table {uri}: {e}") from e
            return False
        log.info("created bronze table uri=%s", uri)
        return True

    def set_missing_properties(self, uri: str, properties: Mapping[str, str]) -> None:
        """Add table properties a table created by an older ingest lacks (never changes a set one)."""
        with self.lock(uri):
            dt = self.table(uri)
            have = dt.metadata().configuration
            missing = {k: v for k, v in properties.items() if k not in have}
            if missing:
                dt.alter.set_table_properties(missing, raise_if_not_exists=False)
                log.info("set bronze table properties uri=%s properties=%s", uri, missing)

    def add_missing_columns(self, uri: str, schema: pa.Schema) -> None:
        """Give a table an older ingest created the fields of `schema` it lacks, nested ones too.

        One empty append with schema merge: a metadata commit, no row written or rewritten (old
        rows read the new fields as null). No commit when nothing is missing.
        """
        with self.lock(uri):
            dt = self.table(uri)
            missing = field_paths(schema) - field_paths(pa.schema(dt.schema().to_arrow()))
            if missing:
                write_deltalake(dt, schema.empty_table(), mode="append", schema_mode="merge")
                log.info("added bronze columns uri=%s columns=%s", uri, sorted(missing))

    def append(self, uri: str, data: pa.Table, app_id: str | None = None, version: int | None = None) -> bool:
        """Append `data` in one commit; with `app_id`/`version`, exactly once. False: already committed.

        delta-rs records the app transaction but, unlike Spark, does not skip a version it has
        already committed: the table's recorded version for `app_id` is read (after loading the
        latest commit) before each attempt, and a batch at or below it is not written again.
        """
        props = None
        if app_id is not None and version is not None:
            props = CommitProperties(app_transactions=[Transaction(app_id, version)])
        with self.lock(uri):
            io_failures = 0
            for attempt in range(1, COMMIT_ATTEMPTS + IO_ATTEMPTS):
                dt = self._table_for_write(uri)
                if app_id is not None and version is not None:
                    recorded = dt.transaction_version(app_id)
                    if recorded is not None and recorded >= version:
                        log.info("skipped a committed batch uri=%s app_id=%s version=%d", uri, app_id, version)
                        return False
                try:
                    write_deltalake(dt, data, mode="append", schema_mode="merge", commit_properties=props)
                    return True
                except CommitFailedError as e:
                    self._retry_or_raise(uri, attempt - io_failures, e)
                except Exception as e:
                    io_failures += 1
                    self._retry_io_or_raise(uri, io_failures, e)
        raise AssertionError("unreachable")

    def replace(self, uri: str, data: pa.Table, predicate: str) -> None:
        """Replace the rows matching `predicate` (SQL over the table's columns) by `data`, in one commit."""
        with self.lock(uri):
            io_failures = 0
            for attempt in range(1, COMMIT_ATTEMPTS + IO_ATTEMPTS):
                dt = self._table_for_write(uri)
                try:
                    write_deltalake(dt, data, mode="overwrite", predicate=predicate, schema_mode="merge")
                    return
                except CommitFailedError as e:
                    self._retry_or_raise(uri, attempt - io_failures, e)
                except Exception as e:  # the same rows replace them again: a retry is safe
                    io_failures += 1
                    self._retry_io_or_raise(uri, io_failures, e)

    def delete(self, uri: str, predicate: str) -> None:
        """Delete the rows matching `predicate`, in one commit."""
        with self.lock(uri):
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                dt = self._table_for_write(uri)
                try:
                    dt.delete(predicate)
                    return
                except CommitFailedError as e:
                    self._retry_or_raise(uri, attempt, e)

    def compact(self, uri: str, partition: tuple[str, str] | None = None) -> dict[str, Any]:
        """Rewrite small files of the table (or of one partition) into few; no data change.

        Readers keep reading the old files until they pick up the new version; the old files go
        with `vacuum` after the table's retention.
        """
        with self.lock(uri):
            dt = self._table_for_write(uri)
            filters = [(partition[0], "=", partition[1])] if partition else None
            metrics: dict[str, Any] = dt.optimize.compact(partition_filters=filters)
            return metrics

    def vacuum(self, uri: str) -> list[str]:
        """Delete files no version within the table's retention needs (default 7 days)."""
        with self.lock(uri):
            removed: list[str] = self._table_for_write(uri).vacuum(dry_run=False)
            return removed

    def query(self, sql: str, **tables: str) -> pa.Table:
        """Run `sql` over the tables given as name=uri; deletion vectors are honoured."""
        qb = QueryBuilder()
        for name, uri in tables.items():
            qb.register(name, self.table(uri))
        # Through the Arrow stream interface: `pa.table()` of the result would import pandas to ask
        # whether it is a DataFrame (0.3 s of every command's start, for nothing).
        return pa.RecordBatchReader.from_stream(qb.execute(sql)).read_all()

    def _table_for_write(self, uri: str) -> DeltaTable:
        try:
            return self.table(uri)
        except TableNotFoundError as e:
            raise BronzeWriteError(f"no bronze table at {uri}: {e}") from e

    def _retry_or_raise(self, uri: str, attempt: int, error: CommitFailedError) -> None:
        if attempt >= COMMIT_ATTEMPTS:
            raise BronzeWriteError(f"commit to {uri} failed after {attempt} attempts: {error}") from error
        log.info("commit conflict, retrying uri=%s attempt=%d error=%s", uri, attempt, error)
        self._open.pop(uri, None)  # reload from the log: another process committed meanwhile
        time.sleep(COMMIT_BACKOFF_S * attempt)

    def _retry_io_or_raise(self, uri: str, failures: int, error: Exception) -> None:
        if not transient_io(error):
            raise error
        if failures >= IO_ATTEMPTS:
            raise BronzeUnavailableError(
                f"write to {uri} failed {failures} times on I/O, last: {error}; nothing was acknowledged past "
                "durable data: free space or restore access to the warehouse, and ingest continues where it left off"
            ) from error
        log.warning("write failed on I/O, retrying uri=%s attempt=%d error=%s", uri, failures, error)
        self._open.pop(uri, None)
        time.sleep(IO_BACKOFF_S * 2 ** (failures - 1))
