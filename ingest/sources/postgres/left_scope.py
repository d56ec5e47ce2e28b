"""Captured tables that left the selection while ingest was stopped: which are gone (tombstoned at start) and which not.

A running `run` retires a table the moment it leaves scope (scope.ScopeWatch); a start only
resolves the selection anew, so a table dropped, renamed or moved out between two runs (every
`run --once` of a scheduled job) would keep its records live in silver. At start each table bronze
has a recorded shape of (`bronze.source_relations`, with its relation OID) that is out of scope
now is looked up by that OID:

- gone under that identity (no relation with that OID, or the relation has another schema or name
  now): dropped, renamed or moved. It is tombstoned like a named table found gone
  (PostgresAdmin.tombstone_gone), whatever the config says of the new name: records are keyed by
  the recorded name, which no longer holds them.
- the same relation under the same name: only the config left it out (an edited pattern, a new
  exclusion, or a user's publication that stopped publishing it). It leaves the publication and
  keeps its records, as a table removed from `tables` does.

A table already tombstoned since its last recorded shape, change and snapshot is not tombstoned
again at every start (bronze is read for these tables only, and only when there are any).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingest.bronze.schemas import SNAPSHOT_PAGES_TABLE, SOURCE_RELATIONS_TABLE, WAL_EVENTS_TABLE
from ingest.bronze.state import BronzeState, sql_str
from ingest.events import RelationShape
from ingest.sources.postgres.changes import TABLE_GONE_PREFIX

if TYPE_CHECKING:
    from ingest.sources.postgres.admin import PostgresAdmin

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BronzeMarks:
    """Where bronze last saw a table: its last tombstone, its last other change and its last snapshot page."""

    tombstone: int | None = None
    change: int | None = None
    snapshot: int | None = None


def tombstone_left_scope(admin: PostgresAdmin, bronze: BronzeState) -> list[str]:
    """Tombstone the recorded tables that left scope because they are gone (module doc); the tables tombstoned.

    Runs after the selection was adopted and before the publication is brought in step with it
    (a table renamed out is still a member by relation). The message is committed to the source's
    WAL, so the slot cannot pass it before bronze holds the truncate it becomes.
    """
    src = admin.src
    if not bronze.exists(SOURCE_RELATIONS_TABLE):
        return []
    scope = set(src.tables)
    left = {f"{s}.{t}": sh for (s, t), sh in bronze.known_shapes(src.name).items() if f"{s}.{t}" not in scope}
    if not left:
        return []
    now = names_by_oid(admin, sorted({sh.relation_id for sh in left.values()}))
    gone = {t: sh for t, sh in left.items() if now.get(sh.relation_id) != t}
    if not gone:
        return []
    marks = bronze_marks(bronze, src.name, gone)
    done: list[str] = []
    for table, shape in sorted(gone.items()):
        if _tombstoned_since(shape, marks.get(table, BronzeMarks())):
            continue
        where = now.get(shape.relation_id)
        log.warning(
            "source=%s: table %s left the selection while ingest was stopped (%s): tombstoning its records",
            src.name,
            table,
            f"now {where}" if where is not None else "dropped",
        )
        admin.tombstone_gone(table)
        done.append(table)
    return done


def names_by_oid(admin: PostgresAdmin, oids: list[int]) -> dict[int, str]:
    """The `schema.table` each of `oids` names now (an OID no relation has is absent)."""
    with admin.conn.cursor() as cur:
        cur.execute(
            "select c.oid::bigint, n.nspname || '.' || c.relname from pg_class c "
            "join pg_namespace n on n.oid = c.relnamespace where c.oid = any(%s::oid[])",
            (oids,),
        )
        return {int(str(oid)): str(name) for oid, name in cur.fetchall()}


def bronze_marks(bronze: BronzeState, source: str, shapes: dict[str, RelationShape]) -> dict[str, BronzeMarks]:
    """`schema.table` -> where bronze last saw it (BronzeMarks), from its oldest recorded shape among `shapes` on."""
    since = min(sh.first_seen_lsn for sh in shapes.values())
    names = " or ".join(
        f"(table_schema = {sql_str(sh.table_schema)} and table_name = {sql_str(sh.table_name)})"
        for sh in shapes.values()
    )
    gone = f"starts_with(message_prefix, {sql_str(TABLE_GONE_PREFIX)})"
    out: dict[str, dict[str, int | None]] = {}
    if bronze.exists(WAL_EVENTS_TABLE):
        rows = bronze.query(
            "select table_schema, table_name, "
            f"max(case when action = 'truncate' and {gone} then commit_lsn end) as tombstone, "
            f"max(case when message_prefix is null or not {gone} then commit_lsn end) as change "
            f"from t where source = {sql_str(source)} and commit_lsn >= {int(since)} and action <> 'message' "
            f"and ({names}) group by table_schema, table_name",
            t=WAL_EVENTS_TABLE,
        )
        for r in rows.to_pylist():
            mark = out.setdefault(f"{r['table_schema']}.{r['table_name']}", {})
            mark["tombstone"], mark["change"] = r["tombstone"], r["change"]
    if bronze.exists(SNAPSHOT_PAGES_TABLE):
        rows = bronze.query(
            "select table_schema, table_name, max(high_watermark_lsn) as snapshot from t "
            f"where source = {sql_str(source)} and ({names}) group by table_schema, table_name",
            t=SNAPSHOT_PAGES_TABLE,
        )
        for r in rows.to_pylist():
            out.setdefault(f"{r['table_schema']}.{r['table_name']}", {})["snapshot"] = r["snapshot"]
    return {t: BronzeMarks(m.get("tombstone"), m.get("change"), m.get("snapshot")) for t, m in out.items()}


def _tombstoned_since(shape: RelationShape, mark: BronzeMarks) -> bool:
    """Whether bronze's last word on the table is a tombstone, after its last shape, change and snapshot.

    A table that came back (renamed in again, recreated) and was captured since has a later
    change, page or shape, so its second leave is tombstoned too.
    """
    if mark.tombstone is None:
        return False
    return mark.tombstone > max(shape.first_seen_lsn, mark.change or 0, mark.snapshot or 0)
