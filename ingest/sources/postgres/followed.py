"""Mask rules that follow their column through a rename: by the attnums bronze recorded.

Rules name columns, and `ALTER TABLE ... RENAME COLUMN` changes the name, not the column: its
attnum stays for life and a dropped column's is never reused. Bronze records each shape of a
captured table with its columns' attnums (`bronze.source_relations`), masked ones marked, so a
column recorded masked under a name a mask rule names (or recorded under a rule's name that is no
column now) is still that rule's column, whatever it is called now
(masking.TableMask.follow_renames). Excluded columns are not in a recorded shape: their rules do
not follow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias

from psycopg import sql

from ingest.bronze.schemas import SOURCE_RELATIONS_TABLE
from ingest.events import RelationShape
from ingest.masking import MASKED_JSON_KIND, TableMask

if TYPE_CHECKING:
    from ingest.bronze.state import BronzeState
    from ingest.sources.postgres.admin import PostgresAdmin

# (schema.table, relation_id, column name, attnum, masked) of a column of a recorded shape
RecordedColumn: TypeAlias = tuple[str, int, str, int, bool]


def recorded_columns(shapes: Iterable[RelationShape]) -> set[RecordedColumn]:
    """The columns `shapes` hold, with their attnum (a shape recorded without attnums tells none)."""
    return {
        (f"{sh.table_schema}.{sh.table_name}", sh.relation_id, c.name, c.attnum, c.json_kind == MASKED_JSON_KIND)
        for sh in shapes
        for c in sh.columns
        if c.attnum is not None
    }


def bronze_recorded_columns(bronze: BronzeState, source: str) -> set[RecordedColumn]:
    """Every column bronze recorded for `source`, over its whole shape history (none before any)."""
    if not bronze.exists(SOURCE_RELATIONS_TABLE):
        return set()
    return recorded_columns(sh for sh, _ in bronze.shape_history(source))


def follow_renames(
    admin: PostgresAdmin, table: str, mask: TableMask | None, recorded: Iterable[RecordedColumn]
) -> TableMask | None:
    """`mask` (the config's rules of `table`) with each masked column renamed since masked by its new name.

    The catalog's columns now (every column not dropped, by attnum) against `recorded`, the
    columns bronze recorded (`recorded_columns`) of the relation the table is now; a table
    replaced under its name (another relation) follows nothing. Logs a warning per followed column.
    """
    if mask is None or not mask.mask:
        return mask
    schema, name = table.split(".", 1)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select a.attrelid::bigint, a.attname, a.attnum from pg_attribute a "
            "where a.attrelid = to_regclass(%s) and a.attnum > 0 and not a.attisdropped",
            (sql.Identifier(schema, name).as_string(admin.conn),),
        )
        rows = cur.fetchall()
    if not rows:
        return mask
    relation_id = int(str(rows[0][0]))
    now = {str(r[1]): int(str(r[2])) for r in rows}
    before = [(n, a, m) for t, rel, n, a, m in recorded if t == table and rel == relation_id]
    return mask.follow_renames(table, now, before, admin.src.name)
