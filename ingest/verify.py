"""`verify`: compare a source table with silver's `consumer_records` at one position (docs/verify.md).

Source-independent parts live here: range checksums and the bisection to keys, the silver and
bronze reads (delta-rs; ingest never starts Spark), the result rows in bronze.verification_runs
and the `--json` document. The source adapters read the source at one position and say which:
ingest/sources/postgres/verify.py inside one MVCC snapshot, ingest/sources/mongodb/verify.py at
one cluster time.

The comparison, for a table, at position P (every change at or before P is in the source's
snapshot, none after it):
- silver holds every change up to S (the highest position of any of the source's records in
  `consumer_records`: the dbt run that wrote it folded everything up to its safe bound, S or later);
- bronze holds every change up to its safe bound, which verify waits to pass P;
- a key changed in (S, P] (bronze events and snapshot page rows) is "dirty": silver may not have
  that change, so the key is skipped on both sides; so is a key whose silver record is newer than
  P, or is marked needs_reread;
- every other key must be equal: live in silver with the same record JSON as the source row
  (encoded as ingest encodes it, masking included), or absent from both (deleted in silver).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from functools import partial
from typing import Any

import pyarrow as pa

from ingest.bronze.delta import DeltaTables
from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE, VERIFICATION_RUNS_TABLE, WAL_EVENTS_TABLE
from ingest.bronze.state import sql_str
from ingest.bronze.writer import BronzeWriter
from ingest.errors import BronzeWriteError
from ingest.positions import SourcePositions

# Exit codes of `verify`, apart from those of status --json (0, 3, 4, 5) and every command's 1, 2, 75.
EXIT_EQUAL = 0
EXIT_MISMATCH = 6
EXIT_NOT_VERIFIED = 7

RANGE_ROWS = 1000  # rows per checksum range (the table's size / this = ranges)
BISECT_ROWS = 200_000  # at most this many rows of mismatching ranges are held to find their keys
MAX_KEYS = 100  # keys listed per kind (missing, extra, different); the counts are always complete
PROGRESS_INTERVAL_S = 2.0
SCHEMA_VERSION = 1

Row = tuple[str, str | None]  # (record_pk, record) as compact JSON text; silver's record can be NULL
Rows = Callable[[], Iterator[list[Row]]]  # a fresh pass over one side, in batches


class Status(StrEnum):
    """A table's outcome."""

    EQUAL = "equal"
    MISMATCH = "mismatch"
    NOT_VERIFIED = "not_verified"


@dataclass(slots=True)
class TableResult:
    """What verify found for one table."""

    source: str
    table: str
    status: Status = Status.EQUAL
    reason: str | None = None
    position: int | None = None  # P: the comparison's position
    silver_position: int | None = None  # S: silver is complete up to it
    ranges: int = 0
    mismatched_ranges: int = 0
    unresolved_ranges: int = 0  # mismatching ranges not bisected (BISECT_ROWS)
    source_rows: int = 0
    silver_rows: int = 0
    skipped_keys: int = 0
    reread_keys: int = 0  # of the skipped keys, those silver flags needs_reread (never compared)
    missing: int = 0
    extra: int = 0
    different: int = 0
    missing_keys: list[str] = field(default_factory=list)
    extra_keys: list[str] = field(default_factory=list)
    different_keys: list[tuple[str, list[str]]] = field(default_factory=list)
    seconds: float = 0.0
    attempts: int = 1  # passes over the source (more than one: a read without isolation raced a write)

    def not_verified(self, reason: str) -> TableResult:
        """Mark the table as not comparable, saying why."""
        self.status, self.reason = Status.NOT_VERIFIED, reason
        return self

    def settle(self) -> TableResult:
        """An equal table with keys waiting for a re-read is not verified: those keys were not compared."""
        if self.status is Status.EQUAL and self.reread_keys:
            self.not_verified(
                f"{self.reread_keys:,} key(s) wait for a re-read from the source (needs_reread in silver) and "
                "were not compared: verify after the next round (run --once, then dbt build)"
            )
        return self

    @property
    def mismatches(self) -> int:
        """Keys found missing, extra or different."""
        return self.missing + self.extra + self.different

    def to_json(self, fmt: Callable[[int], str]) -> dict[str, Any]:
        """The table's entry of the `--json` document."""
        return {
            "source": self.source,
            "table": self.table,
            "status": self.status.value,
            "reason": self.reason,
            "position": self.position,
            "position_text": fmt(self.position) if self.position is not None else None,
            "silver_position": self.silver_position,
            "silver_position_text": fmt(self.silver_position) if self.silver_position is not None else None,
            "ranges": self.ranges,
            "mismatched_ranges": self.mismatched_ranges,
            "unresolved_ranges": self.unresolved_ranges,
            "source_rows": self.source_rows,
            "silver_rows": self.silver_rows,
            "skipped_keys": self.skipped_keys,
            "reread_keys": self.reread_keys,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "missing_keys": self.missing_keys,
            "extra_keys": self.extra_keys,
            "different_keys": [{"key": k, "columns": c} for k, c in self.different_keys],
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
        }

    def line(self, fmt: Callable[[int], str]) -> str:
        """One human line."""
        head = f"{self.source}: {self.table}: {self.status.value}"
        if self.status is Status.NOT_VERIFIED:
            return f"{head} ({self.reason})"
        at = f" at {fmt(self.position)}" if self.position is not None else ""
        counts = (
            f"{self.source_rows:,} source rows, {self.silver_rows:,} silver rows compared in {self.ranges:,} ranges, "
            f"{self.skipped_keys:,} keys skipped (changed after silver's position)"
        )
        if self.status is Status.EQUAL:
            return f"{head}{at}: {counts}"
        found = f"{self.missing:,} missing, {self.extra:,} extra, {self.different:,} different"
        more = f", {self.unresolved_ranges:,} mismatching ranges not bisected" if self.unresolved_ranges else ""
        why = f" ({self.reason})" if self.reason else ""
        return f"{head}{at}: {found}{more}{why}; {counts}"


def exit_code(results: Iterable[TableResult]) -> int:
    """6 if any table mismatches, else 7 if any could not be verified, else 0."""
    statuses = {r.status for r in results}
    if Status.MISMATCH in statuses:
        return EXIT_MISMATCH
    if Status.NOT_VERIFIED in statuses:
        return EXIT_NOT_VERIFIED
    return EXIT_EQUAL


class Progress:
    """Rows/s lines on stderr while a table is compared (at most every PROGRESS_INTERVAL_S)."""

    def __init__(self, label: str, enabled: bool = True) -> None:
        """Report for `label` (source: schema.table)."""
        self.label = label
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.last = self.t0
        self.rows = 0

    def add(self, n: int, what: str) -> None:
        """Count `n` more rows read of `what` (the source, silver)."""
        self.rows += n
        now = time.monotonic()
        if self.enabled and now - self.last >= PROGRESS_INTERVAL_S:
            self.last = now
            rate = self.rows / (now - self.t0)
            print(f"verify {self.label}: {self.rows:,} rows read ({what}), {rate:,.0f} rows/s", file=sys.stderr)


# -- comparison ------------------------------------------------------------------------------


def _bucket(pk: str, ranges: int) -> int:
    # Python's string hash: the same on both sides within one process, which is all it needs.
    return hash(pk) % ranges


def _sums(rows: Rows, ranges: int, skip: set[str], progress: Progress, what: str) -> tuple[list[int], list[int], int]:
    counts, sums = [0] * ranges, [0] * ranges
    n = 0
    mask = (1 << 64) - 1
    for batch in rows():
        for pk, record in batch:
            if pk in skip:
                continue
            b = hash(pk) % ranges
            counts[b] += 1
            sums[b] = (sums[b] + hash((pk, record))) & mask
        n += len(batch)
        progress.add(len(batch), what)
    return counts, sums, n


def _collect(rows: Rows, ranges: int, wanted: set[int], skip: set[str]) -> dict[str, str | None]:
    out = {}
    for batch in rows():
        for pk, record in batch:
            if pk not in skip and hash(pk) % ranges in wanted:
                out[pk] = record
    return out


def _canonical(value: Any) -> Any:
    """A JSON value as a comparable Python value: typed, numbers exact, key order gone.

    json.loads alone compares `true` equal to `1` (Python's True == 1) and two 20-digit numbers
    equal once both are rounded to floats. A JSON number has one type whatever its spelling, so
    numbers compare by exact decimal value (5 and 5.0, 1e2 and 100 are one value: Spark re-spells
    a value it carries through a variant); booleans, strings and null are never numbers.
    """
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    return (type(value).__name__ if not isinstance(value, Decimal) else "number", value)


def _parse(record: str | None) -> dict[str, Any]:
    if record is None:
        return {}
    parsed = json.loads(record, parse_float=Decimal, parse_int=Decimal, parse_constant=lambda c: ("constant", c))
    return parsed if isinstance(parsed, dict) else {"": parsed}


def differing_columns(source: str | None, silver: str | None) -> list[str]:
    """The columns whose values differ between two record JSON objects (absent on one side counts).

    Values are compared as typed JSON (`_canonical`): only the spelling of a number, whitespace and
    key order may differ between equal records. A NULL record has no columns: silver holds one for a
    MongoDB update whose document was gone when ingest looked it up (`updateLookup`,
    docs/mongodb.md) until it folds the delete.
    """
    a, b = _parse(source), _parse(silver)
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or _canonical(a[k]) != _canonical(b[k]))


class ColumnOrder:
    """Re-encodes a record JSON object with its keys in the table's column order, values as they are.

    Silver's fold writes a record that carries an unchanged TOAST value forward with that key last
    (a map concatenation), while the source side encodes in column order: the same record in
    another key order hashes differently, so every range of such a table mismatched and was read
    twice (or, past the bisection budget, reported as a mismatch naming no key). A record already in
    column order (the usual case, found by a scan for the keys in order) is returned as it is, and
    so is one that does not parse: the bisection compares it value by value anyway.
    """

    def __init__(self, columns: Sequence[str]) -> None:
        """`columns`: the table's columns, in the order the source side encodes them."""
        self.keys = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) + ":" for c in columns]
        self.index = {c: i for i, c in enumerate(columns)}

    def apply(self, record: str) -> str:
        """`record` with its top-level keys in column order (unknown keys after them, in their order)."""
        at = 0
        for key in self.keys:
            at = record.find(key, at)
            if at < 0:
                break
            at += len(key)
        else:
            return record
        members = _members(record)
        if members is None:
            return record
        members.sort(key=lambda m: self.index.get(m[0], len(self.index)))
        known = len(self.index)
        parts = [
            (self.keys[self.index[k]] if self.index.get(k, known) < known else json.dumps(k, ensure_ascii=False) + ":")
            + raw
            for k, raw in members
        ]
        return "{" + ",".join(parts) + "}"


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    m = _SPACE.match(text, at)
    return m.end() if m else at


def _members(record: str) -> list[tuple[str, str]] | None:
    """The top-level (key, value text) pairs of a JSON object, or None if it is not one."""
    members: list[tuple[str, str]] = []
    i = _skip(record, 0)
    if record[i : i + 1] != "{":
        return None
    i = _skip(record, i + 1)
    try:
        while record[i : i + 1] != "}" or members:
            key, i = _DECODER.raw_decode(record, i)
            i = _skip(record, i)
            if not isinstance(key, str) or record[i : i + 1] != ":":
                return None
            start = _skip(record, i + 1)
            _, end = _DECODER.raw_decode(record, start)
            members.append((key, record[start:end]))
            i = _skip(record, end)
            if record[i : i + 1] != ",":
                break
            i = _skip(record, i + 1)
    except ValueError:
        return None
    return members if record[i : i + 1] == "}" and not record[i + 1 :].strip() else None


def in_column_order(rows: Rows, columns: Sequence[str]) -> Rows:
    """`rows` (silver's) with each record re-encoded in the table's column order (ColumnOrder)."""
    order = ColumnOrder(columns)

    def scan() -> Iterator[list[Row]]:
        for batch in rows():
            yield [(pk, order.apply(record) if record is not None else None) for pk, record in batch]

    return scan


def compare(
    result: TableResult,
    source_rows: Rows,
    silver_rows: Rows,
    rows: int,
    skip: set[str],
    range_rows: int = RANGE_ROWS,
    bisect_rows: int = BISECT_ROWS,
    max_keys: int = MAX_KEYS,
    progress: Progress | None = None,
) -> TableResult:
    """Checksum both sides in ranges of the key's hash, then bisect mismatching ranges to keys.

    Each side is read once, both at the same time (count and hash sum per range); only if ranges
    differ is each read once more, holding the rows of those ranges (at most `bisect_rows`, the
    rest counted as unresolved). Keys in `skip` are left out on both sides.
    """
    progress = progress or Progress(result.table, enabled=False)
    ranges = max(1, math.ceil(max(rows, 1) / range_rows))
    result.ranges = ranges
    # Silver's pass runs in a thread beside the source's: its batches are decoded by delta-rs
    # (Rust, the GIL released) while the source's rows are encoded here (bench/verify.py).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-silver") as pool:
        silver_pass = pool.submit(_sums, silver_rows, ranges, skip, progress, "silver")
        src_counts, src_sums, result.source_rows = _sums(source_rows, ranges, skip, progress, "source")
        sil_counts, sil_sums, result.silver_rows = silver_pass.result()
    bad = [b for b in range(ranges) if src_counts[b] != sil_counts[b] or src_sums[b] != sil_sums[b]]
    result.mismatched_ranges = len(bad)
    if not bad:
        return result.settle()
    wanted: set[int] = set()
    held = 0
    for b in bad:
        size = max(src_counts[b], sil_counts[b])
        if held + size > bisect_rows:
            continue
        wanted.add(b)
        held += size
    result.unresolved_ranges = len(bad) - len(wanted)
    src = _collect(source_rows, ranges, wanted, skip)
    sil = _collect(silver_rows, ranges, wanted, skip)
    explained: set[int] = set()  # ranges whose difference the bisection found
    for pk in sorted(src.keys() - sil.keys()):
        explained.add(_bucket(pk, ranges))
        result.missing += 1
        if len(result.missing_keys) < max_keys:
            result.missing_keys.append(pk)
    for pk in sorted(sil.keys() - src.keys()):
        explained.add(_bucket(pk, ranges))
        result.extra += 1
        if len(result.extra_keys) < max_keys:
            result.extra_keys.append(pk)
    for pk in sorted(src.keys() & sil.keys()):
        if src[pk] == sil[pk]:
            continue
        explained.add(_bucket(pk, ranges))
        cols = differing_columns(src[pk], sil[pk])
        if not cols:  # the same typed values, spelt otherwise (a number's spelling, key order): equal
            continue
        result.different += 1
        if len(result.different_keys) < max_keys:
            result.different_keys.append((pk, cols))
    unexplained = len(wanted - explained)
    if unexplained:
        # The checksums differ and every key read the same: a key held by two rows on one side
        # (the per-key view keeps one), or a read that changed between the passes. Not equal.
        result.unresolved_ranges += unexplained
        result.reason = (
            f"{unexplained:,} mismatching range(s) bisected to no key: a key held by two rows, or a side "
            "that changed between the two reads"
        )
    if result.mismatches or result.unresolved_ranges:
        result.status = Status.MISMATCH
    return result.settle()


# -- silver and bronze -----------------------------------------------------------------------

WAIT_POLL_S = 0.5


def wait_for_bronze(writer: BronzeWriter, source: str, position: int, wait_s: float) -> int | None:
    """Poll bronze's safe bound until it passes `position`; the bound last seen (None: no writer)."""
    deadline = time.monotonic() + wait_s
    while True:
        bound = SourcePositions.read(writer, source).safe_bound
        if bound is not None and bound >= position or time.monotonic() >= deadline:
            return bound
        time.sleep(WAIT_POLL_S)


def silver_path(writer: BronzeWriter, reread_from: str | None = None) -> str:
    """Where dbt's consumer_records lives (the path rereads.py reads too)."""
    return reread_from or f"{writer.warehouse}/dbt/silver.db/consumer_records"


class Silver:
    """consumer_records at one version: the position it is complete to, and a table's records.

    Reads go through DeltaTables: a transient I/O failure is retried, then BronzeUnavailableError
    (exit 75), as for bronze.
    """

    def __init__(self, path: str, storage_options: dict[str, str] | None = None) -> None:
        """Open the table at its latest version; every read below sees that version."""
        self.tables = DeltaTables(storage_options)
        try:
            self.table = self.tables.pinned(path)
        except BronzeWriteError:
            raise
        except Exception as e:
            raise BronzeWriteError(f"cannot read silver consumer_records at {path}: {e}") from e
        self.path = path

    def _query(self, sql: str) -> Iterator[pa.RecordBatch]:
        return self.tables.batches(sql, self.path, self.table)

    def position(self, source: str) -> int | None:
        """The highest position of any of the source's records (None: none yet)."""
        rows = pa.Table.from_batches(
            self._query(f"select max(commit_lsn) as m from t where source = {sql_str(source)}")
        )
        m = rows.column("m").to_pylist()[0]
        return int(m) if m is not None else None

    def _where(self, source: str, schema: str, name: str) -> str:
        return f"source = {sql_str(source)} and table_schema = {sql_str(schema)} and table_name = {sql_str(name)}"

    def reread_keys(self, source: str, schema: str, name: str) -> set[str]:
        """Keys whose record waits for a re-read from the source (needs_reread)."""
        reader = self._query(f"select record_pk from t where {self._where(source, schema, name)} and needs_reread")
        return {pk for batch in reader for pk in batch.column(0).to_pylist()}

    def unusable_keys(self, source: str, schema: str, name: str, position: int) -> set[str]:
        """Keys whose record is newer than `position` or needs a re-read: not comparable at it."""
        reader = self._query(
            f"select record_pk from t where {self._where(source, schema, name)} "
            f"and (commit_lsn > {int(position)} or needs_reread)"
        )
        return {pk for batch in reader for pk in batch.column(0).to_pylist()}

    def rows(self, source: str, schema: str, name: str) -> Rows:
        """A pass over the table's live records (deleted ones are absent at the source)."""
        sql = f"select record_pk, record from t where {self._where(source, schema, name)} and not deleted"

        def scan() -> Iterator[list[Row]]:
            for batch in self._query(sql):
                yield list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))

        return scan


@dataclass(frozen=True, slots=True)
class Changed:
    """What bronze says changed in a table within a window of positions."""

    keys: set[str]
    truncated: bool


def changed_keys(writer: BronzeWriter, source: str, table: str, after: int, upto: int) -> Changed:
    """Keys with an event or a snapshot page row in (after, upto], and whether a truncate hit the table."""
    schema, name = table.split(".", 1)
    window = f"source = {sql_str(source)} and commit_lsn > {int(after)} and commit_lsn <= {int(upto)}"
    events = writer.tables.query(
        "select record_pk, old_record_pk, action, truncated_tables from t "
        f"where {window} and action != 'message' and ((table_schema = {sql_str(schema)} "
        f"and table_name = {sql_str(name)}) or action = 'truncate')",
        t=writer.path(WAL_EVENTS_TABLE),
    )
    keys: set[str] = set()
    truncated = False
    for r in events.to_pylist():
        if r["action"] == "truncate":
            truncated = truncated or table in (r["truncated_tables"] or [])
            continue
        keys.update(k for k in (r["record_pk"], r["old_record_pk"]) if k)
    if writer.exists(SNAPSHOT_PAGES_TABLE):
        pages = writer.tables.query(
            f"select record_pk from t where source = {sql_str(source)} and table_schema = {sql_str(schema)} "
            f"and table_name = {sql_str(name)} and high_watermark_lsn > {int(after)} "
            f"and high_watermark_lsn <= {int(upto)} and record_pk is not null",
            t=writer.path(SNAPSHOT_PAGES_TABLE),
        )
        keys.update(pages.column("record_pk").to_pylist())
    return Changed(keys, truncated)


# -- results ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """One `verify` invocation: its id, times and tables."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    results: list[TableResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The process's exit code."""
        return exit_code(self.results)

    def document(self, fmt: Callable[[str, int], str]) -> dict[str, Any]:
        """The `--json` document (docs/verify.md); `fmt(source, position)` prints a position."""
        statuses = {r.status for r in self.results}
        result = next((s for s in (Status.MISMATCH, Status.NOT_VERIFIED) if s in statuses), Status.EQUAL)
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "started_at": self.started_at.isoformat(),
            "finished_at": (self.finished_at or datetime.now(UTC)).isoformat(),
            "result": result.value,
            "exit_code": self.exit_code,
            "tables": [r.to_json(partial(fmt, r.source)) for r in self.results],
        }

    def to_arrow(self) -> pa.Table:
        """The run's rows of bronze.verification_runs (one per table)."""
        finished = self.finished_at or datetime.now(UTC)
        rows = []
        for r in self.results:
            schema, name = r.table.split(".", 1)
            details = {
                "missing_keys": r.missing_keys,
                "extra_keys": r.extra_keys,
                "different_keys": [{"key": k, "columns": c} for k, c in r.different_keys],
            }
            rows.append(
                {
                    "source": r.source,
                    "run_id": self.run_id,
                    "table_schema": schema,
                    "table_name": name,
                    "status": r.status.value,
                    "reason": r.reason,
                    "position": r.position,
                    "silver_position": r.silver_position,
                    "ranges": r.ranges,
                    "mismatched_ranges": r.mismatched_ranges,
                    "unresolved_ranges": r.unresolved_ranges,
                    "source_rows": r.source_rows,
                    "silver_rows": r.silver_rows,
                    "skipped_keys": r.skipped_keys,
                    "missing": r.missing,
                    "extra": r.extra,
                    "different": r.different,
                    "details": json.dumps(details, separators=(",", ":")),
                    "started_at": self.started_at,
                    "finished_at": finished,
                }
            )
        return pa.Table.from_pylist(rows, schema=VERIFICATION_RUNS_TABLE.schema)


def record_run(writer: BronzeWriter, run: Run) -> None:
    """Append the run's rows to bronze.verification_runs (created on first use)."""
    t = VERIFICATION_RUNS_TABLE
    uri = writer.path(t)
    writer.tables.create(uri, t.schema, t.partition_by, dict(t.properties))
    try:
        writer.tables.append(uri, run.to_arrow())
    except BronzeWriteError:  # BronzeUnavailableError among them: exit 75, not 2
        raise
    except Exception as e:
        raise BronzeWriteError(f"append to {uri} failed: {e}") from e
