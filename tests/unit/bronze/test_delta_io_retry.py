"""Every bronze table operation rides out a transient I/O failure, then says "try again later" (exit 75).

Real delta-rs on real tables: a local table whose `_delta_log` is replaced by a plain file (a read
failure even for root, who ignores permissions), and an object-store warehouse whose endpoint
refuses connections. The backoff is lowered through the module's constants, nothing is mocked.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import (
    CommitFailedError,
    DeltaError,
    DeltaProtocolError,
    SchemaMismatchError,
    TableNotFoundError,
)

from ingest import cli
from ingest.bronze import delta
from ingest.bronze.delta import DeltaTables, transient_io
from ingest.bronze.schemas import STREAM_POSITIONS_TABLE, VERIFICATION_RUNS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.errors import BronzeUnavailableError, BronzeWriteError
from ingest.verify import Run, Silver, TableResult, record_run

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
ROWS = pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA)
# An object store that is down: a loopback port nobody listens on; object_store's own retries off.
STORE_DOWN_OPTIONS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
    "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    "max_retries": "0",
}


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta, "IO_BACKOFF_S", 0.0)
    monkeypatch.setattr(delta, "COMMIT_BACKOFF_S", 0.0)


@pytest.fixture
def table(tmp_path: Path) -> str:
    uri = str(tmp_path / "wh" / "bronze" / "t")
    write_deltalake(uri, ROWS)
    return uri


class BrokenLog:
    """The table's `_delta_log` swapped for a plain file (every read of the log fails), and back."""

    def __init__(self, uri: str) -> None:
        self.log = Path(uri) / "_delta_log"
        self.aside = Path(uri) / "_delta_log.aside"

    def break_it(self) -> None:
        self.log.rename(self.aside)
        self.log.write_text("not a directory")

    def mend(self) -> None:
        self.log.unlink()
        self.aside.rename(self.log)


class MendOnRetry(logging.Handler):
    """Mends the log when the first retry is logged: the failure clears within the retries."""

    def __init__(self, broken: BrokenLog) -> None:
        super().__init__(logging.WARNING)
        self.broken = broken
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.retries += 1
            if self.retries == 1:
                self.broken.mend()


@pytest.fixture
def retries_logged(caplog: pytest.LogCaptureFixture) -> Callable[[], int]:
    caplog.set_level(logging.WARNING, logger="ingest.bronze.delta")
    return lambda: sum("retrying" in r.getMessage() for r in caplog.records)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: connections are refused


# -- which errors are transient ---------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        OSError("Generic LocalFileSystem error: Unable to open file /wh/_delta_log/_last_checkpoint"),
        PermissionError(13, "Permission denied"),
        DeltaError("Failed to write: No space left on device (os error 28)"),
        DeltaError("Generic S3 error: Error performing GET in 1ms - HTTP error: error sending request"),
        DeltaError("Generic MicrosoftAzure error: operation timed out"),
        DeltaError("Object Store error: Connection reset by peer"),
        pa.ArrowInvalid(
            "External error: Parquet error: Failed to fetch metadata for file part-0.parquet: Object Store "
            "error: Generic LocalFileSystem error: Unable to read data from file part-0.parquet: Is a directory "
            "(os error 21)"
        ),
    ],
    ids=repr,
)
def test_io_failures_are_transient(error: Exception) -> None:
    assert transient_io(error)


@pytest.mark.parametrize(
    "error",
    [
        CommitFailedError("Transaction failed: version already exists; connection fine"),
        SchemaMismatchError("Cannot cast schema, number of fields does not match"),
        DeltaProtocolError("The table has set these reader features: deletionVectors (os error)"),
        TableNotFoundError("Generic delta kernel error: No files in log segment"),
        DeltaError("Kernel error: No table metadata found in delta log."),
        DeltaError("Generic delta kernel error: Invalid url"),
        DeltaError("Generic DeltaTable error: Invalid predicate: no such column"),
        DeltaError('SQL error: ParserError("Expected: an SQL statement, found: selec")'),
        pa.ArrowInvalid("Schema at index 1 was different"),
        ValueError("connection string is malformed"),
        RuntimeError("timed out"),
    ],
    ids=repr,
)
def test_other_failures_are_not_transient(error: Exception) -> None:
    assert not transient_io(error)


def test_the_real_errors_of_an_unreadable_log_and_a_corrupt_log(tmp_path: Path, table: str) -> None:
    """What delta-rs itself raises: an unreadable log is transient, a log it cannot parse is not."""
    broken = BrokenLog(table)
    broken.break_it()
    with pytest.raises(Exception) as unreadable:
        DeltaTable(table)
    assert transient_io(unreadable.value), repr(unreadable.value)
    broken.mend()
    with (Path(table) / "_delta_log" / "00000000000000000000.json").open("a") as f:
        f.write("garbage{\n")
    with pytest.raises(Exception) as corrupt:
        DeltaTable(table)
    assert not transient_io(corrupt.value), repr(corrupt.value)


# -- every operation, on a table whose log cannot be read --------------------------------------

OPERATIONS: dict[str, Callable[[DeltaTables, str], Any]] = {
    "exists": lambda t, uri: t.exists(uri),
    "open": lambda t, uri: t.table(uri),
    "query": lambda t, uri: t.query("select count(*) as n from t", t=uri),
    "create": lambda t, uri: t.create(uri, SCHEMA, (), {}),
    "set properties": lambda t, uri: t.set_missing_properties(uri, {"delta.appendOnly": "false"}),
    "add columns": lambda t, uri: t.add_missing_columns(uri, SCHEMA.append(pa.field("w", pa.string()))),
    "append": lambda t, uri: t.append(uri, ROWS, "app", 7),
    "replace": lambda t, uri: t.replace(uri, ROWS, "id >= 1"),
    "delete": lambda t, uri: t.delete(uri, "id = 2"),
    "compact": lambda t, uri: t.compact(uri),
    "vacuum": lambda t, uri: t.vacuum(uri),
}


@pytest.mark.parametrize("warm", [False, True], ids=["first open", "table already open"])
@pytest.mark.parametrize("operation", OPERATIONS)
def test_an_unreadable_table_is_retried_then_unavailable(
    table: str, operation: str, warm: bool, retries_logged: Callable[[], int]
) -> None:
    """Only append and replace retried I/O; every other operation (opening, every read) failed at once.

    The error escaped as OSError, which the CLI reports as exit 1, "internal error ... please report it".
    """
    tables = DeltaTables()
    if warm:
        tables.table(table)  # the cached table is refreshed (update_incremental) rather than opened
    BrokenLog(table).break_it()
    with pytest.raises(BronzeUnavailableError) as raised:
        OPERATIONS[operation](tables, table)
    message = str(raised.value)
    assert table in message and f"{delta.IO_ATTEMPTS} times" in message, message
    assert operation.split()[0] in message, message
    assert "\n" not in message and "\x1b" not in message, repr(message)  # the CLI prints it as one line
    assert retries_logged() == delta.IO_ATTEMPTS - 1


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_failure_that_clears_within_the_retries_is_ridden_out(
    table: str, operation: str, caplog: pytest.LogCaptureFixture
) -> None:
    tables = DeltaTables()
    tables.table(table)
    broken = BrokenLog(table)
    broken.break_it()
    mender = MendOnRetry(broken)
    logging.getLogger("ingest.bronze.delta").addHandler(mender)
    try:
        OPERATIONS[operation](tables, table)
    finally:
        logging.getLogger("ingest.bronze.delta").removeHandler(mender)
    assert mender.retries == 1
    assert tables.query("select count(*) as n from t", t=table).to_pylist()[0]["n"] >= 1


def test_a_retried_append_is_written_once(table: str) -> None:
    tables = DeltaTables()
    broken = BrokenLog(table)
    broken.break_it()
    mender = MendOnRetry(broken)
    logging.getLogger("ingest.bronze.delta").addHandler(mender)
    try:
        assert tables.append(table, ROWS, "app", 7)
    finally:
        logging.getLogger("ingest.bronze.delta").removeHandler(mender)
    assert not tables.append(table, ROWS, "app", 7)
    assert tables.query("select count(*) as n from t", t=table).to_pylist()[0]["n"] == 4


def test_a_query_of_two_tables_names_both(tmp_path: Path, table: str) -> None:
    other = str(tmp_path / "wh" / "bronze" / "u")
    write_deltalake(other, ROWS)
    BrokenLog(other).break_it()
    with pytest.raises(BronzeUnavailableError, match="query") as raised:
        DeltaTables().query("select * from t join u using (id)", t=table, u=other)
    assert table in str(raised.value) and other in str(raised.value)


def test_an_unreadable_data_file_is_retried_then_unavailable(table: str, retries_logged: Callable[[], int]) -> None:
    """The log reads, a data file does not (the query engine's error is an ArrowInvalid, not an OSError)."""
    (data,) = Path(table).glob("*.parquet")
    data.unlink()
    data.mkdir()
    with pytest.raises(BronzeUnavailableError, match="query"):
        DeltaTables().query("select * from t", t=table)
    assert retries_logged() == delta.IO_ATTEMPTS - 1


# -- what is not I/O keeps its own error, at once ----------------------------------------------


def test_errors_that_are_not_io_are_not_retried(tmp_path: Path, table: str, retries_logged: Callable[[], int]) -> None:
    tables = DeltaTables()
    missing = str(tmp_path / "wh" / "bronze" / "missing")
    assert not tables.exists(missing)
    with pytest.raises(TableNotFoundError):
        tables.table(missing)
    with pytest.raises(BronzeWriteError, match="no bronze table") as raised:
        tables.append(missing, ROWS)
    assert not isinstance(raised.value, BronzeUnavailableError)
    with pytest.raises(DeltaError, match="SQL error"):
        tables.query("selec nothing", t=table)
    with pytest.raises(Exception, match="Cast error") as cast:
        tables.append(table, pa.table({"id": ["not a number"]}))
    assert not isinstance(cast.value, BronzeWriteError)
    assert retries_logged() == 0


def test_a_table_without_metadata_is_not_retried(tmp_path: Path, retries_logged: Callable[[], int]) -> None:
    uri = tmp_path / "silver"
    (uri / "_delta_log").mkdir(parents=True)
    (uri / "_delta_log" / "00000000000000000000.json").write_text(
        '{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n'
    )
    with pytest.raises(DeltaError, match="No table metadata"):
        DeltaTables().query("select * from t", t=str(uri))
    assert retries_logged() == 0


# -- an object store that refuses connections ---------------------------------------------------


@pytest.fixture
def store_down() -> dict[str, str]:
    return {**STORE_DOWN_OPTIONS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}


@pytest.mark.parametrize("operation", ["exists", "open", "query", "create"])
def test_an_object_store_that_refuses_connections_is_unavailable(
    store_down: dict[str, str], operation: str, retries_logged: Callable[[], int]
) -> None:
    uri = "s3://bucket/wh/bronze/t"
    with pytest.raises(BronzeUnavailableError, match="s3://bucket/wh/bronze/t"):
        OPERATIONS[operation](DeltaTables(store_down), uri)
    assert retries_logged() == delta.IO_ATTEMPTS - 1


# -- the command line ---------------------------------------------------------------------------

CONFIG = """
warehouse: {warehouse}
storage_options: {options}
sources:
  - name: shop
    kind: postgres
    dsn: postgresql://nobody@127.0.0.1:{pg_port}/x
    tables: [public.orders]
"""


def unreadable_warehouse(tmp_path: Path, what: str) -> Path:
    """A local warehouse whose stream_positions table cannot be read: its log, or its data file."""
    warehouse = tmp_path / "wh"
    positions = warehouse / "bronze" / STREAM_POSITIONS_TABLE.name
    row = pa.Table.from_pylist([{"source": "shop", "writer_id": "w"}], schema=STREAM_POSITIONS_TABLE.schema)
    write_deltalake(str(positions), row, partition_by=list(STREAM_POSITIONS_TABLE.partition_by))
    if what == "log":
        BrokenLog(str(positions)).break_it()
    else:
        (data,) = positions.glob("**/*.parquet")
        data.unlink()
        data.mkdir()
    return warehouse


@pytest.mark.parametrize("json_output", [False, True], ids=["status", "status --json"])
@pytest.mark.parametrize("where", ["object store", "local log", "local data file"])
def test_status_of_a_warehouse_that_cannot_be_read_exits_75_in_one_line(
    tmp_path: Path, store_down: dict[str, str], where: str, json_output: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bronze read failing on I/O ended as exit 1 "internal error ... please report it".

    Or as exit 2 (a failed query taken for a write error), or as "bronze not created yet".
    """
    if where == "object store":
        warehouse, options = "s3://bucket/wh", store_down
    else:
        warehouse, options = str(unreadable_warehouse(tmp_path, where.split(maxsplit=1)[1])), {}
    config = tmp_path / "c.yml"
    config.write_text(CONFIG.format(warehouse=warehouse, options=options or "{}", pg_port=closed_port()))
    argv = ["-c", str(config), "status"] + (["--json"] if json_output else [])
    assert cli.main(argv) == cli.EXIT_TEMPFAIL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "\x1b" not in err, err
    assert err.startswith("changelake-ingest: warehouse unavailable: "), err
    assert f"{warehouse}/bronze/stream_positions" in err, err


# -- silver and verify's own bronze table: verify and gold generate ------------------------------

SILVER_RECORDS = pa.schema(
    [
        ("source", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("record_pk", pa.string()),
        ("record", pa.string()),
        ("commit_lsn", pa.int64()),
        ("deleted", pa.bool_()),
        ("needs_reread", pa.bool_()),
    ]
)
TABLE_COLUMNS = pa.schema(
    [
        ("source", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("ordinal_position", pa.int32()),
        ("column_name", pa.string()),
        ("type_name", pa.string()),
        ("spark_type", pa.string()),
        ("pk_position", pa.int32()),
    ]
)


def silver_table(warehouse: Path, name: str, what: str) -> str:
    """Silver's `name` (consumer_records or table_columns) with one row; `what` is made unreadable (log, data file)."""
    uri = str(warehouse / "dbt" / "silver.db" / name)
    row: dict[str, Any]
    if name == "consumer_records":
        row = {"source": "shop", "table_schema": "app", "table_name": "orders", "record_pk": '{"_id":1}'}
        row |= {"record": '{"_id":1,"a":1}', "commit_lsn": 7, "deleted": False, "needs_reread": False}
        write_deltalake(uri, pa.Table.from_pylist([row], schema=SILVER_RECORDS))
    else:
        row = {"source": "shop", "table_schema": "public", "table_name": "orders", "ordinal_position": 1}
        row |= {"column_name": "id", "type_name": "int4", "spark_type": "int", "pk_position": 1}
        write_deltalake(uri, pa.Table.from_pylist([row], schema=TABLE_COLUMNS))
    if what == "log":
        BrokenLog(uri).break_it()
    elif what == "data file":
        (data,) = Path(uri).glob("*.parquet")
        data.unlink()
        data.mkdir()
    return uri


@pytest.mark.parametrize("what", ["log", "data file"])
def test_verify_reading_an_unreadable_silver_is_unavailable(
    tmp_path: Path, what: str, retries_logged: Callable[[], int]
) -> None:
    """Silver was opened with DeltaTable() and read with a bare QueryBuilder: no retry; exit 2 or 1."""
    uri = silver_table(tmp_path / "wh", "consumer_records", what)
    with pytest.raises(BronzeUnavailableError, match="consumer_records"):
        Silver(uri).position("shop")
    assert retries_logged() == delta.IO_ATTEMPTS - 1


def test_verify_reads_a_readable_silver_at_one_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "records")
    row = {"source": "shop", "table_schema": "app", "table_name": "orders", "record_pk": "1", "record": "{}"}
    write_deltalake(uri, pa.Table.from_pylist([row | {"commit_lsn": 7, "deleted": False, "needs_reread": True}]))
    silver = Silver(uri)
    later = pa.Table.from_pylist([row | {"commit_lsn": 9, "deleted": False, "needs_reread": False}])
    write_deltalake(uri, later, mode="overwrite")
    assert silver.position("shop") == 7 and silver.position("other") is None
    assert silver.reread_keys("shop", "app", "orders") == {"1"}
    assert [r for batch in silver.rows("shop", "app", "orders")() for r in batch] == [("1", "{}")]
    assert Silver(uri).position("shop") == 9


def test_recording_a_verify_run_on_a_failing_warehouse_is_unavailable(
    tmp_path: Path, retries_logged: Callable[[], int]
) -> None:
    """record_run rewrapped the append's BronzeUnavailableError into a BronzeWriteError: exit 2, not 75."""
    writer = BronzeWriter(tmp_path / "wh")
    uri = writer.path(VERIFICATION_RUNS_TABLE)
    t = VERIFICATION_RUNS_TABLE
    writer.tables.create(uri, t.schema, t.partition_by, dict(t.properties))
    (Path(uri) / "source=shop").write_text("a file where the partition's folder goes")  # os error 20 on write
    run = Run(results=[TableResult("shop", "public.orders")])
    with pytest.raises(BronzeUnavailableError, match="append"):
        record_run(writer, run)
    assert retries_logged() == delta.IO_ATTEMPTS - 1


GOLD_CONFIG = """
warehouse: {warehouse}
sources:
  - {source}
"""
GOLD_SOURCES = {
    "table_columns": "{name: shop, kind: postgres, dsn: 'postgresql://nobody@127.0.0.1:1/x', tables: [public.orders]}",
    "consumer_records": "{name: shop, kind: mongodb, uri: 'mongodb://127.0.0.1:1/', database: app}",
}


@pytest.mark.parametrize("what", ["log", "data file"])
@pytest.mark.parametrize("silver", ["table_columns", "consumer_records"])
def test_gold_generate_on_an_unreadable_silver_exits_75_in_one_line(
    tmp_path: Path, silver: str, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """gold generate opened silver with DeltaTable(): exit 1 "internal error ... please report it"."""
    warehouse = tmp_path / "wh"
    uri = silver_table(warehouse, silver, what)
    config = tmp_path / "c.yml"
    config.write_text(GOLD_CONFIG.format(warehouse=warehouse, source=GOLD_SOURCES[silver]))
    out = tmp_path / "models"
    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out)]) == cli.EXIT_TEMPFAIL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "\x1b" not in err, err
    assert err.startswith("changelake-ingest: warehouse unavailable: "), err
    assert uri in err, err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("silver", ["table_columns", "consumer_records"])
def test_gold_generate_reads_a_readable_silver(tmp_path: Path, silver: str, capsys: pytest.CaptureFixture[str]) -> None:
    warehouse = tmp_path / "wh"
    silver_table(warehouse, silver, "nothing")
    config = tmp_path / "c.yml"
    config.write_text(GOLD_CONFIG.format(warehouse=warehouse, source=GOLD_SOURCES[silver]))
    out = tmp_path / "models"
    assert cli.main(["-c", str(config), "gold", "generate", "--out", str(out)]) == 0, capsys.readouterr().err
    assert any(p.suffix == ".sql" for p in out.rglob("*"))
