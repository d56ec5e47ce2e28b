"""`changelake-ingest remask`: rewrite what bronze holds of a table as ingest would write it under today's rules.

A rule added later masks what is written from then on (and re-snapshots the table); the events and
snapshot pages written before it keep the plain values. This command rewrites them in place: for
each table of a source with rules, the table's rows of `bronze.wal_events` (`record`, `old_record`,
`unchanged_toast`, and a MongoDB update's `message_content`) and of `bronze.snapshot_pages`
(`record`) are read, each masked column is given the value ingest writes under the rule (the same
encoder, salt and NULL handling: `TableMask.encoder` / `mask_text`) and each excluded column is
dropped. The table's rows are replaced in one Delta commit per bronze table and source table
(`write_deltalake(mode="overwrite", predicate=...)`), rows that need no change come back as they
were, and a table with nothing to change is not written at all: a second run changes nothing.
Then the replaced Parquet files are deleted (vacuum with a retention of 0). Silver and gold are
rebuilt from the rewritten bronze by `dbt build --full-refresh` (docs/masking.md).

Bronze tables are append-only (`delta.appendOnly`): the property is lifted for the rewrite and set
again after it, whatever happens in between. Ingest must not be running: a Postgres source whose
slot is in use is refused; otherwise an append by ingest to the table's rows between the read and
the commit fails the commit (Delta's conflict check), and the command says to stop ingest first.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE, WAL_EVENTS_TABLE, BronzeTable
from ingest.config import Config, MongoSource, PostgresSource, SourceConfig
from ingest.errors import IngestError, SourceError
from ingest.masking import MaskWith, TableMask

log = logging.getLogger(__name__)

APPEND_ONLY: Final = "delta.appendOnly"
MONGO_UPDATE_PREFIX: Final = "mongodb.updateDescription"  # changes.UPDATE_DESCRIPTION_PREFIX, without bson
# A masked value as the hash writes it: 64 lowercase hex digits. Such a value is taken as written
# under the rule and kept (hashing it again would make every run change it).
_HASH: Final = re.compile(r"[0-9a-f]{64}")
# Characters that make Postgres's array_out quote an element (array_isspace, braces, quote, backslash).
_ARRAY_QUOTE: Final = frozenset(' \t\n\r\v\f{}"\\')
_DECODER: Final = json.JSONDecoder()
_WS: Final = " \t\n\r"
_URI: Final = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")  # an object store, not a local path
# A value's JSON fragment -> the JSON fragment ingest writes for it under the rule (None: keep it).
FragmentMask = Callable[[str], str | None]


class RemaskError(IngestError):
    """Bronze could not be re-masked: ingest is running, or wrote while the rewrite ran."""


@dataclass(frozen=True, slots=True)
class RuledTable:
    """One table of a source with rules: where its rows are in bronze, and the rules."""

    source: str
    kind: str  # "postgres" or "mongodb"
    schema: str  # Postgres schema, MongoDB database
    name: str
    mask: TableMask

    @property
    def predicate(self) -> str:
        """SQL selecting the table's rows of a bronze table."""
        return (
            f"source = {_literal(self.source)} and table_schema = {_literal(self.schema)} "
            f"and table_name = {_literal(self.name)}"
        )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# -- Postgres: records are compact JSON objects of the values' JSON fragments (rows.encode_record)


def _members(text: str) -> list[tuple[str, str, str]]:
    """The members of a JSON object text as (name, the name's JSON text, the value's JSON text), in order."""
    out: list[tuple[str, str, str]] = []
    i = text.index("{") + 1
    n = len(text)
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if text[i] == "}":
            return out
        if text[i] == ",":
            i += 1
            continue
        start = i
        name, i = _DECODER.raw_decode(text, i)
        raw_name = text[start:i]
        i = text.index(":", i) + 1
        while text[i] in _WS:
            i += 1
        _value, end = _DECODER.raw_decode(text, i)
        out.append((name, raw_name, text[i:end]))
        i = end


def _array_text(items: list[Any]) -> str:
    """Postgres's text output (array_out, delimiter ',') of an array given as parsed bronze JSON."""
    parts = []
    for item in items:
        if item is None:
            parts.append("NULL")
        elif isinstance(item, list):
            parts.append(_array_text(item))
        else:
            text = ("t" if item else "f") if isinstance(item, bool) else str(item)
            quote = not text or text.upper() == "NULL" or any(c in _ARRAY_QUOTE or c == "," for c in text)
            if quote:
                text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
            parts.append(text)
    return "{" + ",".join(parts) + "}"


def pg_value_text(fragment: str) -> str | None:
    """The Postgres text output a bronze JSON fragment was encoded from (values.py's mapping, inverted).

    None for JSON null. Strings (text, numeric, temporal, json, bytea, ...) are the text itself;
    numbers their digits; booleans t/f; arrays array_out of their elements (delimiter ',';
    non-default lower bounds are not in bronze, so `[0:1]={...}` is hashed as `{...}`).
    """
    head = fragment[0]
    if head == '"':
        value: str = json.loads(fragment)
        return value
    if fragment == "null":
        return None
    if fragment in ("true", "false"):
        return "t" if fragment == "true" else "f"
    if head == "[":
        return _array_text(json.loads(fragment, parse_int=str, parse_float=str))
    return fragment  # a number, as the server printed it


def pg_fragment_mask(mask: TableMask) -> FragmentMask:
    """The Postgres masked-column rewrite: what the stream and the snapshot write for the value under `mask`."""
    encode = mask.encoder()
    hashing = mask.mask_with is MaskWith.HASH and mask.salt is not None

    def rewrite(fragment: str) -> str | None:
        if fragment == "null" or hashing and fragment[0] == '"' and _HASH.fullmatch(fragment[1:-1]):
            return None  # NULL stays null; a hash is what the rule wrote
        text = pg_value_text(fragment)
        return None if text is None else encode(text.encode())

    return rewrite


def remask_pg_record(text: str, mask: TableMask, masked: FragmentMask) -> str:
    """A bronze `record`/`old_record` text with `mask`'s rules applied (the same text if nothing changes)."""
    members = _members(text)
    if not any(name in mask.exclude or name in mask.mask for name, _r, _v in members):
        return text
    parts = []
    changed = False
    for name, raw_name, value in members:
        if name in mask.exclude:
            changed = True
            continue
        if name in mask.mask and (new := masked(value)) is not None and new != value:
            value, changed = new, True
        parts.append(raw_name + ":" + value)
    return "{" + ",".join(parts) + "}" if changed else text


# -- MongoDB: records are canonical Extended JSON of the documents (mongodb/changes.py)


def _mongo_masked(mask: TableMask, value: Any) -> bool:
    """Whether `value` is already what the rule writes: null, or (hash) a hash's hex digits."""
    if value is None:
        return True
    return (
        mask.mask_with is MaskWith.HASH
        and mask.salt is not None
        and isinstance(value, str)
        and bool(_HASH.fullmatch(value))
    )


def remask_mongo_record(text: str, mask: TableMask) -> str:
    """A MongoDB document's bronze text with `mask`'s rules applied (the same text if nothing changes)."""
    from ingest.sources.mongodb.changes import ext_json, from_ext_json, mask_value

    doc = from_ext_json(text)
    if not any((k in mask.exclude or k in mask.mask and not _mongo_masked(mask, v)) for k, v in doc.items()):
        return text
    new = {k: (v if _mongo_masked(mask, v) else mask_value(mask, v)) if k in mask.mask else v for k, v in doc.items()}
    return ext_json({k: v for k, v in new.items() if k not in mask.exclude})


def remask_mongo_update(text: str, mask: TableMask) -> str:
    """An update's bronze description (`message_content`) with its `updatedFields` under `mask`'s rules."""
    from ingest.sources.mongodb.changes import ext_json, from_ext_json, mask_value

    description = from_ext_json(text)
    fields = description.get("updatedFields", {})
    out = {}
    changed = False
    for path, value in fields.items():
        top = path.split(".", 1)[0]
        if top in mask.exclude:
            changed = True
            continue
        if top in mask.mask and not _mongo_masked(mask, value):
            value, changed = mask_value(mask, value), True
        out[path] = value
    return ext_json({**description, "updatedFields": out}) if changed else text


# -- batches


def _record_rewriter(table: RuledTable) -> Callable[[str], str]:
    if table.kind == "mongodb":
        return lambda text: remask_mongo_record(text, table.mask)
    masked = pg_fragment_mask(table.mask)
    return lambda text: remask_pg_record(text, table.mask, masked)


def remask_batch(batch: pa.RecordBatch, table: RuledTable, bronze: BronzeTable) -> tuple[pa.RecordBatch, int]:
    """`batch` (rows of `table` in `bronze`, in its schema) with the rules applied, and how many rows changed."""
    record = _record_rewriter(table)
    names = set(batch.schema.names)
    rewritten = [n for n in ("record", "old_record", "unchanged_toast", "message_content") if n in names]
    columns = {n: batch.column(n).to_pylist() for n in rewritten}
    prefixes = batch.column("message_prefix").to_pylist() if "message_prefix" in names else None
    changed_rows: set[int] = set()
    for name, values in columns.items():
        for i, v in enumerate(values):
            if v is None:
                continue
            new: Any
            if name in ("record", "old_record"):
                new = record(v)
            elif name == "unchanged_toast":
                new = [c for c in v if c not in table.mask.exclude] or None  # ingest writes no empty list
            elif table.kind == "mongodb" and prefixes is not None and prefixes[i] == MONGO_UPDATE_PREFIX:
                new = remask_mongo_update(v, table.mask)
            else:
                continue
            if new != v:
                values[i] = new
                changed_rows.add(i)
    if not changed_rows:
        return batch, 0
    arrays = [pa.array(columns[f.name], f.type) if f.name in columns else batch.column(f.name) for f in bronze.schema]
    return pa.RecordBatch.from_arrays(arrays, schema=bronze.schema), len(changed_rows)


def _batches(dt: DeltaTable, table: RuledTable, bronze: BronzeTable) -> Iterator[pa.RecordBatch]:
    """The table's rows of `dt` (one pinned version), in the bronze schema.

    Read with pyarrow, not delta-rs's query engine: the write pulls these batches from inside
    delta-rs's runtime, which cannot start another. Bronze has no deletion vectors (delta-rs
    writes none; a table with them is refused by the dataset).
    """
    names = [f.name for f in bronze.schema]
    where = (
        (pc.field("source") == table.source)
        & (pc.field("table_schema") == table.schema)
        & (pc.field("table_name") == table.name)
    )
    dataset = dt.to_pyarrow_dataset()  # here, not lazily: it asks delta-rs for the files
    return (
        pa.RecordBatch.from_arrays(
            [b.column(n).cast(f.type) for n, f in zip(names, bronze.schema, strict=True)], schema=bronze.schema
        )
        for b in dataset.to_batches(columns=names, filter=where)
    )


@dataclass(frozen=True, slots=True)
class Rewritten:
    """What one rewrite did: rows of the table read in a bronze table, and rows changed."""

    bronze: str
    table: RuledTable
    rows: int
    changed: int


def _count(dt: DeltaTable, table: RuledTable, bronze: BronzeTable) -> tuple[int, int]:
    rows = changed = 0
    for b in _batches(dt, table, bronze):
        rows += b.num_rows
        changed += remask_batch(b, table, bronze)[1]
    return rows, changed


def _rewrite(dt: DeltaTable, table: RuledTable, bronze: BronzeTable) -> None:
    """Replace the table's rows of `dt` by their re-masked form in one commit, conflicting with any append since."""
    out = pa.RecordBatchReader.from_batches(
        bronze.schema, (remask_batch(b, table, bronze)[0] for b in _batches(dt, table, bronze))
    )
    try:
        write_deltalake(dt, out, mode="overwrite", predicate=table.predicate)
    except CommitFailedError as e:
        raise RemaskError(
            f"bronze.{bronze.name}: the rewrite of {table.schema}.{table.name} (source {table.source!r}) could not be "
            f"committed: {str(e).splitlines()[0]}. Another writer (a running ingest?) changed the table meanwhile; "
            "stop `changelake-ingest run` for the source and run remask again (nothing was rewritten by this attempt)"
        ) from None


def rewrite_bronze(
    uri: str, bronze: BronzeTable, tables: Sequence[RuledTable], opts: dict[str, str] | None = None
) -> list[Rewritten]:
    """Re-mask `tables`' rows of the bronze table at `uri`; one commit per table that has rows to change.

    The append-only property is lifted only when some row changes, and set again afterwards.
    """
    if not DeltaTable.is_deltatable(uri, storage_options=opts):
        return []
    dt = DeltaTable(uri, storage_options=opts)
    counted = []
    for t in tables:
        rows, changed = _count(dt, t, bronze)
        log.info("remask bronze=%s source=%s table=%s.%s rows=%d to_rewrite=%d", bronze.name, t.source, t.schema,
                 t.name, rows, changed)  # fmt: skip
        counted.append(Rewritten(bronze.name, t, rows, changed))
    todo = [r for r in counted if r.changed]
    if not todo:
        return counted
    append_only = dt.metadata().configuration.get(APPEND_ONLY)
    if append_only == "true":
        dt.alter.set_table_properties({APPEND_ONLY: "false"})
    try:
        for r in todo:
            dt = DeltaTable(uri, storage_options=opts)
            _rewrite(dt, r.table, bronze)
            log.info("remask bronze=%s source=%s table=%s.%s rewritten=%d of %d rows", bronze.name, r.table.source,
                     r.table.schema, r.table.name, r.changed, r.rows)  # fmt: skip
    finally:
        if append_only == "true":
            DeltaTable(uri, storage_options=opts).alter.set_table_properties({APPEND_ONLY: "true"})
    return counted


def purge_old_files(uri: str, opts: dict[str, str] | None = None) -> list[str]:
    """Delete every Parquet file of the table no current version references (vacuum, retention 0)."""
    if not DeltaTable.is_deltatable(uri, storage_options=opts):
        return []
    dt = DeltaTable(uri, storage_options=opts)
    candidates = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True)
    # delta-rs lists a removed file until the log forgets it, deleted or not: on a local warehouse
    # look, so a run with nothing left to delete commits nothing (an object store is vacuumed again).
    if not _URI.match(uri):
        candidates = [c for c in candidates if os.path.exists(os.path.join(uri, c))]  # relative, or absolute
    if not candidates:
        return []
    removed: list[str] = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    return removed


def ruled_tables(src: SourceConfig) -> list[RuledTable]:
    """The source's tables with rules, in config order (the salt is read here: ConfigError if unset)."""
    masks = src.masks()
    out = []
    for name in src.columns:
        mask = masks.table(name)
        if mask is None:
            continue
        if isinstance(src, MongoSource):
            out.append(RuledTable(src.name, "mongodb", src.database, name, mask))
        else:
            schema, _, table = name.partition(".")
            out.append(RuledTable(src.name, "postgres", schema, table, mask))
    return out


def _refuse_running(src: SourceConfig) -> None:
    """Refuse a Postgres source whose slot is in use: its ingest is running and would append meanwhile."""
    if not isinstance(src, PostgresSource):
        return  # no slot to ask: a concurrent append fails the rewrite's commit instead
    from ingest.sources.postgres.slot_probe import SlotProbe

    probe = SlotProbe(src)
    try:
        state = probe.read()
    except SourceError as e:
        log.warning("remask source=%s: cannot tell whether ingest is running (%s); relying on Delta's commit "
                    "conflict check", src.name, e)  # fmt: skip
        return
    finally:
        probe.close()
    if state.active_pid is not None:
        raise RemaskError(
            f"source {src.name!r}: slot {src.slot_name} is in use (PID {state.active_pid}): ingest is running. Stop "
            "`changelake-ingest run` for the source, then run remask (bronze must not change while it is rewritten)"
        )


def remask(cfg: Config, source: str | None) -> list[str]:
    """Re-mask bronze for `source` (None: every source with rules); the summary lines, then the next steps."""
    sources = [cfg.source(source)] if source else [s for s in cfg.sources if s.columns]
    opts = cfg.storage_options or None
    if not sources:
        return ["no source has exclude_columns or mask_columns: nothing to re-mask"]
    lines = []
    for src in sources:
        tables = ruled_tables(src)
        if not tables:
            lines.append(f"{src.name}: no table has exclude_columns or mask_columns; nothing to re-mask")
            continue
        _refuse_running(src)
        done = []
        for bronze in (WAL_EVENTS_TABLE, SNAPSHOT_PAGES_TABLE):
            uri = f"{cfg.warehouse_uri}/bronze/{bronze.name}"
            done += rewrite_bronze(uri, bronze, tables, opts)
            removed = purge_old_files(uri, opts)
            log.info("remask bronze=%s vacuumed files=%d", bronze.name, len(removed))
        for r in done:
            what = f"{r.table.schema}.{r.table.name}: bronze.{r.bronze}"
            line = f"{src.name}: {what}: {r.changed} of {r.rows} rows rewritten"
            log.info("remask summary %s", line)
            lines.append(line)
    if not any("rows rewritten" in line for line in lines):
        return lines
    lines.append(
        "bronze is re-masked and its old files deleted. Now rebuild silver and gold from it: `dbt build "
        "--full-refresh`, then VACUUM each silver and gold Delta table with RETAIN 0 HOURS "
        "(spark.databricks.delta.retentionDurationCheck.enabled=false), as docs/masking.md says"
    )
    return lines
