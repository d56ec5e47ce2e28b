"""Ingest reads silver's consumer_records (a table with deletion vectors) for keys to re-read, correctly.

consumer_records is written by Spark with deletion vectors; ingest reads it with delta-rs. A reader
that ignored the vectors would re-read keys whose rows were deleted or rewritten; one that cannot
read them must fail loudly rather than re-read nothing or the wrong keys.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.errors import BronzeWriteError
from ingest.events import WriterKind
from ingest.sources.postgres.snapshot import SnapshotTask, Snapshotter

pytestmark = pytest.mark.integration

# consumer_records' columns that the re-read uses, with deletion vectors on, as dbt's model has them.
SPARK_SCRIPT = """
import sys
from pyspark.sql import SparkSession
path, source, schema = sys.argv[1], sys.argv[2], sys.argv[3]
spark = (
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .getOrCreate()
)
t = f"delta.`{path}`"
spark.sql(f"create table {t} (source string, table_schema string, table_name string, record_pk string, "
          "deleted boolean, needs_reread boolean, commit_lsn bigint, commit_index int) using delta "
          "tblproperties ('delta.enableDeletionVectors' = 'true')")
spark.sql(f"insert into {t} select '{source}', '{schema}', 'items', concat('{{\\"id\\":', id, '}}'), false, true, "
          "100 + id, 0 from range(1, 7)")
spark.sql(f"delete from {t} where record_pk = '{{\\"id\\":2}}'")
spark.sql(f"update {t} set needs_reread = false where record_pk = '{{\\"id\\":3}}'")
spark.sql(f"update {t} set deleted = true where record_pk = '{{\\"id\\":4}}'")
print("ok")
"""


def snapshotter(warehouse: Path, source: Any) -> Snapshotter:
    writer = BronzeWriter(warehouse)
    writer.ensure_tables()
    return Snapshotter(source, writer)


def test_needs_reread_keys_honour_deletion_vectors(tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, v text)", ["items"])
    warehouse = tmp_path / "warehouse"
    cr = warehouse / "dbt" / "silver.db" / "consumer_records"
    r = subprocess.run(
        [sys.executable, "-c", SPARK_SCRIPT, str(cr), s.name, s.schema], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    assert any(p.name.startswith("deletion_vector_") for p in cr.iterdir()), "Spark wrote no deletion vector"

    snap = snapshotter(warehouse, s.config())
    tasks = snap.request_rereads(lambda: 1000)
    keys = sorted(k for t in tasks for k in (t.keys or ()))
    # 2 deleted by a DV, 3 rewritten without the flag (old row masked by a DV), 4 soft-deleted.
    assert keys == [("1",), ("5",), ("6",)]
    assert all(isinstance(t, SnapshotTask) and t.table == f"{s.schema}.items" for t in tasks)
    rows = [p for p, _ in snap.writer.positions(s.name) if p.writer_kind is WriterKind.SNAPSHOT]
    assert len(rows) == len(tasks) == 1
    assert rows[0].durable_lsn == 1000  # a new writer starts at the current position (no writer yet)
    # A key is requested once per state of its record in a process.
    assert snap.request_rereads(lambda: 1000) == []


def test_an_unreadable_consumer_records_skips_the_round_with_a_warning(
    tmp_path: Path, make_source: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A silver table delta-rs cannot read stopped the capture of bronze (exit 2, never restarted).

    Re-reads are skipped for the round, loudly; nothing is registered, and a later round reads them.
    """
    s = make_source("create table items (id int primary key, v text)", ["items"])
    warehouse = tmp_path / "warehouse"
    log = warehouse / "dbt" / "silver.db" / "consumer_records" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text('{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n')
    snap = snapshotter(warehouse, s.config())
    caplog.set_level("WARNING", logger="ingest")
    assert snap.request_rereads(lambda: 1000) == []
    assert any("cannot read needs_reread keys from" in r.getMessage() for r in caplog.records)
    assert [p for p, _ in snap.writer.positions(s.name)] == []  # nothing was registered


def test_a_configured_reread_path_that_is_not_a_table_is_an_error(tmp_path: Path, make_source: Any) -> None:
    """W10: keys silver marks needs_reread were silently never re-read when silver lived elsewhere."""
    from ingest.config import SnapshotSettings

    s = make_source("create table items (id int primary key, v text)", ["items"])
    src = s.config(snapshot=SnapshotSettings(reread_from=str(tmp_path / "elsewhere" / "consumer_records")))
    snap = snapshotter(tmp_path / "warehouse", src)
    with pytest.raises(BronzeWriteError, match="reread_from .* is not a Delta table"):
        snap.request_rereads(lambda: 1000)


def test_no_silver_yet_is_said_once(tmp_path: Path, make_source: Any, caplog: pytest.LogCaptureFixture) -> None:
    s = make_source("create table items (id int primary key, v text)", ["items"])
    snap = snapshotter(tmp_path / "warehouse", s.config())
    caplog.set_level("INFO", logger="ingest")
    assert snap.request_rereads(lambda: 1000) == snap.request_rereads(lambda: 1000) == []
    said = [r for r in caplog.records if "no silver consumer_records" in r.getMessage()]
    assert len(said) == 1 and "snapshot.reread_from" in said[0].getMessage()
