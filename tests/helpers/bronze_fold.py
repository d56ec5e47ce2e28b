"""Bronze folded to each table's live records without dbt: a small oracle for tests that compare with the source.

Position order as silver folds it (docs/snapshots.md): events at `(commit_lsn, commit_index)`,
page rows at `(high_watermark_lsn, row_index)` after the events at that LSN; a truncate ends every
record of its tables below it. The rule that drops a page row superseded by an event its snapshot
could not see is left out: tests using this fold do not write while a page is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.delta_rows import exists, read


def live_records(warehouse: Path, source: str) -> dict[str, dict[str, dict[str, Any]]]:
    """`schema.table` -> record_pk -> record, as bronze has them after its last position (none yet: empty)."""
    changes: list[tuple[tuple[int, int, int], Any]] = []
    events, pages = warehouse / "bronze" / "wal_events", warehouse / "bronze" / "snapshot_pages"
    if exists(events):
        changes += [
            ((e.commit_lsn, 0, e.commit_index), e) for e in read(events, f"source = '{source}' and action != 'message'")
        ]
    if exists(pages):
        changes += [
            ((p.high_watermark_lsn, 1, p.row_index), p)
            for p in read(pages, f"source = '{source}' and record_pk is not null")
        ]
    tables: dict[str, dict[str, dict[str, Any]]] = {}
    for _, c in sorted(changes, key=lambda c: c[0]):
        action = getattr(c, "action", "snapshot")
        if action == "truncate":
            for t in c.truncated_tables:
                tables[t] = {}
            continue
        records = tables.setdefault(f"{c.table_schema}.{c.table_name}", {})
        if action == "delete":
            records.pop(c.record_pk, None)
            continue
        if getattr(c, "old_record_pk", None):
            records.pop(c.old_record_pk, None)
        records[c.record_pk] = json.loads(c.record)
    return tables


def table_rows(conn: Any, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    """The source table's rows as `record` holds them (simple types only), by `record_pk`."""
    rows = [json.loads(r[0]) for r in conn.execute(f"select row_to_json(t)::text from {table} t").fetchall()]
    return {json.dumps({key: r[key]}, separators=(",", ":")): r for r in rows}
