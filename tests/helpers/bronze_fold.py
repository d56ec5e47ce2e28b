"""Bronze folded to each table's live records without dbt: a small oracle for tests that compare with the source.

Position order as silver folds it (docs/snapshots.md): events at `(commit_lsn, commit_index)`,
page rows at `(high_watermark_lsn, row_index)` after the events at that LSN; a truncate ends every
record of its tables below it. A page row is dropped when an event for its key (a truncate for
every key of its table, a primary-key change for its old key too) commits at or before the page's
watermark and its transaction is invisible to the page's MVCC snapshot (DESIGN §5), as
snapshot_rows_placed drops it: tests that write while a page is read need that rule.
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
    touches = _key_touches([e for _, e in changes])
    if exists(pages):
        changes += [
            ((p.high_watermark_lsn, 1, p.row_index), p)
            for p in read(pages, f"source = '{source}' and record_pk is not null")
            if not _superseded(p, touches)
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


def _key_touches(events: list[Any]) -> dict[tuple[str, str | None], list[tuple[int, int]]]:
    """(`schema.table`, record_pk or None for a truncate) -> the (commit_lsn, xid) of each event touching it."""
    touches: dict[tuple[str, str | None], list[tuple[int, int]]] = {}
    for e in events:
        at = (e.commit_lsn, e.xid)
        if e.action == "truncate":
            for t in e.truncated_tables:
                touches.setdefault((t, None), []).append(at)
            continue
        table = f"{e.table_schema}.{e.table_name}"
        for pk in {e.record_pk, e.old_record_pk} - {None}:
            touches.setdefault((table, pk), []).append(at)
    return touches


def _superseded(page_row: Any, touches: dict[tuple[str, str | None], list[tuple[int, int]]]) -> bool:
    """Whether an event the page row's snapshot could not see commits at or before its watermark."""
    if page_row.snapshot_xmax is None:  # a MongoDB page: every event at or before it is older
        return False
    table = f"{page_row.table_schema}.{page_row.table_name}"
    xmin, xmax, xip = page_row.snapshot_xmin, page_row.snapshot_xmax, set(page_row.snapshot_xip or ())
    for lsn, xid in touches.get((table, page_row.record_pk), []) + touches.get((table, None), []):
        # pgoutput's xid is 32-bit, the snapshot's 64-bit: widen to the 64-bit xid nearest to xmax.
        distance = (xmax - xid) % 2**32
        full = xmax - (distance - 2**32 if distance > 2**31 else distance)
        visible = full < xmin or (full < xmax and full not in xip)
        if lsn <= page_row.high_watermark_lsn and not visible:
            return True
    return False


def table_rows(conn: Any, table: str, key: str = "id") -> dict[str, dict[str, Any]]:
    """The source table's rows as `record` holds them (simple types only), by `record_pk`."""
    rows = [json.loads(r[0]) for r in conn.execute(f"select row_to_json(t)::text from {table} t").fetchall()]
    return {json.dumps({key: r[key]}, separators=(",", ":")): r for r in rows}
