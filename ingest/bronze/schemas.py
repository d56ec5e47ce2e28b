"""Arrow schemas, partitioning and names of the bronze Delta tables (docs/bronze.md)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

WAL_EVENTS = pa.schema(
    [
        ("source", pa.string()),
        ("source_kind", pa.string()),
        ("commit_lsn", pa.int64()),
        ("commit_index", pa.int32()),
        ("end_lsn", pa.int64()),
        ("xid", pa.int64()),
        ("commit_timestamp", TS),
        ("action", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("relation_id", pa.int64()),
        ("record_pk", pa.string()),
        ("old_record_pk", pa.string()),
        ("record", pa.string()),
        ("old_record", pa.string()),
        ("unchanged_toast", pa.list_(pa.string())),
        ("truncated_tables", pa.list_(pa.string())),
        ("truncate_options", pa.int32()),
        ("message_prefix", pa.string()),
        ("message_content", pa.string()),
        ("message_transactional", pa.bool_()),
        ("writer_id", pa.string()),
        ("ingested_at", TS),
    ]
)

STREAM_POSITIONS = pa.schema(
    [
        ("source", pa.string()),
        ("writer_id", pa.string()),
        ("writer_kind", pa.string()),
        ("durable_lsn", pa.int64()),
        ("ack_lsn", pa.int64()),
        ("resume_token", pa.string()),
        ("started_at", TS),
        ("updated_at", TS),
    ]
)

SNAPSHOT_PAGES = pa.schema(
    [
        ("source", pa.string()),
        ("source_kind", pa.string()),
        ("snapshot_id", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("page_number", pa.int64()),
        ("row_index", pa.int32()),
        ("last_page", pa.bool_()),
        ("record_pk", pa.string()),
        ("record", pa.string()),
        ("key_text", pa.list_(pa.string())),
        ("snapshot_xmin", pa.int64()),
        ("snapshot_xmax", pa.int64()),
        ("snapshot_xip", pa.list_(pa.int64())),
        (
            "table_snapshot",
            pa.struct(
                [
                    ("id", pa.string()),
                    ("parts", pa.int32()),
                    ("xmin", pa.int64()),
                    ("xmax", pa.int64()),
                    ("xip", pa.list_(pa.int64())),
                ]
            ),
        ),
        ("high_watermark_lsn", pa.int64()),
        ("read_at", TS),
        ("writer_id", pa.string()),
        ("ingested_at", TS),
    ]
)

VERIFICATION_RUNS = pa.schema(
    [
        ("source", pa.string()),
        ("run_id", pa.string()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("position", pa.int64()),
        ("silver_position", pa.int64()),
        ("ranges", pa.int64()),
        ("mismatched_ranges", pa.int64()),
        ("unresolved_ranges", pa.int64()),
        ("source_rows", pa.int64()),
        ("silver_rows", pa.int64()),
        ("skipped_keys", pa.int64()),
        ("missing", pa.int64()),
        ("extra", pa.int64()),
        ("different", pa.int64()),
        ("details", pa.string()),
        ("started_at", TS),
        ("finished_at", TS),
    ]
)

COMPOSITE_FIELD_STRUCT = pa.struct([("name", pa.string()), ("type_name", pa.string())])

COLUMN_STRUCT = pa.struct(
    [
        ("name", pa.string()),
        ("type_oid", pa.int64()),
        ("type_name", pa.string()),
        ("type_modifier", pa.int32()),
        ("is_key", pa.bool_()),
        ("pk_position", pa.int32()),
        ("json_kind", pa.string()),
        ("attnum", pa.int32()),  # null in rows written before it was recorded (docs/bronze.md)
        # A composite type's fields in order (of an array's element type): null for other types, and
        # in rows written before they were recorded (docs/bronze.md).
        ("fields", pa.list_(COMPOSITE_FIELD_STRUCT)),
    ]
)

SOURCE_RELATIONS = pa.schema(
    [
        ("source", pa.string()),
        ("relation_id", pa.int64()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("replica_identity", pa.string()),
        ("columns", pa.list_(COLUMN_STRUCT)),
        ("shape_hash", pa.string()),
        ("first_seen_lsn", pa.int64()),
        ("ingested_at", TS),
        # The publication rows that made the table a member when the row was recorded (docs/bronze.md);
        # null where the writer did not look (the stream's rows, rows of an older ingest).
        ("publication_membership", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class BronzeTable:
    """A bronze table: its directory name under `<warehouse>/bronze`, schema and partitioning."""

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    properties: tuple[tuple[str, str], ...] = ()

    def unindexed_columns(self) -> tuple[str, ...]:
        """The text columns outside `delta.dataSkippingStatsColumns`: written without Parquet statistics.

        delta-rs keeps the table's log statistics to the listed columns but still has its Parquet
        writer compute page and chunk min/max for every column, copying whole values: the JSON
        record of a 1 MiB row cost ~100 MiB more peak RSS per 32 MiB batch written (bench/
        wide_rows_rss.py --random-values) for statistics nothing reads. Other columns keep theirs
        (Spark's Parquet reader may skip row groups by them). None without the property.
        """
        listed = dict(self.properties).get("delta.dataSkippingStatsColumns")
        if listed is None:
            return ()
        keep = set(listed.split(",")) | set(self.partition_by)
        return tuple(f.name for f in self.schema if f.name not in keep and pa.types.is_string(f.type))


# The log of every bronze table. Ingest commits often (a batch per `batch.max_seconds` when
# changes trickle in), and a reader's cost follows the number of log files kept: Spark lists the
# whole `_delta_log` directory on a local or HDFS warehouse (bench/small_files.py: 3,000 files
# make a count 1.8x slower than the same rows after a checkpoint with the older entries gone).
# So delta-rs writes a checkpoint every 100 commits, and the log entries older than 15 minutes and
# before the latest checkpoint are removed after each checkpoint: time travel on bronze reaches
# back 15 minutes, which nothing needs (bronze keeps every change as rows; dbt reads the latest
# version). Data files that compaction replaced stay for a day before `vacuum` deletes them, so a
# long dbt run never loses a file it is reading.
LOG_PROPERTIES = (
    ("delta.checkpointInterval", "100"),
    ("delta.logRetentionDuration", "interval 15 minutes"),
    ("delta.deletedFileRetentionDuration", "interval 1 day"),
    ("delta.enableExpiredLogCleanup", "true"),
    # App transaction ids (writer.txn_identity) older than this leave the table state: a MongoDB
    # writer starts a new one every ~34 minutes. A retry is seconds after its batch, never days.
    ("delta.setTransactionRetentionDuration", "interval 7 days"),
)

WAL_EVENTS_TABLE = BronzeTable(
    "wal_events",
    WAL_EVENTS,
    ("source",),
    (
        # The contract: bronze is append-only. Delta refuses deletes and updates on it.
        ("delta.appendOnly", "true"),
        # Statistics only where readers filter (positions, table, ingest time); min/max of the
        # JSON text columns cost write time and prune nothing.
        ("delta.dataSkippingStatsColumns", "commit_lsn,commit_index,action,table_schema,table_name,ingested_at"),
        *LOG_PROPERTIES,
    ),
)
STREAM_POSITIONS_TABLE = BronzeTable("stream_positions", STREAM_POSITIONS, ("source", "writer_id"), LOG_PROPERTIES)
SOURCE_RELATIONS_TABLE = BronzeTable("source_relations", SOURCE_RELATIONS, ("source",), LOG_PROPERTIES)
SNAPSHOT_PAGES_TABLE = BronzeTable(
    "snapshot_pages",
    SNAPSHOT_PAGES,
    ("source",),
    (
        ("delta.appendOnly", "true"),
        ("delta.dataSkippingStatsColumns", "snapshot_id,table_schema,table_name,page_number,high_watermark_lsn"),
        *LOG_PROPERTIES,
    ),
)
# Written by `changelake-ingest verify` (ingest/verify.py), one row per verified table per run.
VERIFICATION_RUNS_TABLE = BronzeTable(
    "verification_runs", VERIFICATION_RUNS, ("source",), (("delta.appendOnly", "true"), *LOG_PROPERTIES)
)
ALL_TABLES = (
    WAL_EVENTS_TABLE,
    STREAM_POSITIONS_TABLE,
    SOURCE_RELATIONS_TABLE,
    SNAPSHOT_PAGES_TABLE,
    VERIFICATION_RUNS_TABLE,
)

# `snapshot pause|resume`: one row per command and snapshot, appended by the command and never
# rewritten, so a run's rewrite of the snapshot's writer row cannot undo it; the latest row of a
# snapshot decides. Ingest's own control record: created by the first command, not a dbt source.
SNAPSHOT_CONTROL = pa.schema(
    [
        ("source", pa.string()),
        ("snapshot_id", pa.string()),
        ("table_name", pa.string()),  # schema.table, for a reader of the log
        ("paused", pa.bool_()),
        ("issued_at", TS),
    ]
)
SNAPSHOT_CONTROL_TABLE = BronzeTable(
    "snapshot_control", SNAPSHOT_CONTROL, ("source",), (("delta.appendOnly", "true"), *LOG_PROPERTIES)
)
