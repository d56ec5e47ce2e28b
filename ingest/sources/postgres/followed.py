"""Mask rules that follow their column through a rename: by the attnums bronze recorded masked.

Rules name columns, and `ALTER TABLE ... RENAME COLUMN` changes the name, not the column: its
attnum stays for life and a dropped column's is never reused. Bronze records each shape of a
captured table with its columns' attnums (`bronze.source_relations`), masked ones marked, so a
column once recorded masked under a name a mask rule names is still that rule's column, whatever
it is called now (masking.TableMask.follow_renames). Excluded columns are not in a recorded shape:
their rules do not follow.
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

# (schema.table, relation_id, column name, attnum) of a column a recorded shape holds masked
MaskedColumn: TypeAlias = tuple[str, int, str, int]


def masked_columns(shapes: Iterable[RelationShape]) -> set[MaskedColumn]:
    """The columns `shapes` hold masked, with their attnum (a shape recorded without attnums tells none)."""
    return {
        (f"{sh.table_schema}.{sh.table_name}", sh.relation_id, c.name, c.attnum)
        for sh in shapes
        for c in sh.columns
        if c.json_kind == MASKED_JSON_KIND and c.attnum is not None
    }


def recorded_masked_columns(bronze: BronzeState, source: str) -> set[MaskedColumn]:
    """Every column bronze recorded masked for `source`, over its whole shape history (none before any)."""
    if not bronze.exists(SOURCE_RELATIONS_TABLE):
        return set()
    return masked_columns(sh for sh, _ in bronze.shape_history(source))


def follow_renames(
    admin: PostgresAdmin, table: str, mask: TableMask | None, masked: Iterable[MaskedColumn]
) -> TableMask | None:
    """`mask` (the config's rules of `table`) with each recorded masked column renamed since masked by its new name.

    The catalog's columns now (every column not dropped, by attnum) against `masked`, the columns
    recorded masked (`masked_columns`) of the relation the table is now; a table replaced under
    its name (another relation) follows nothing. Logs a warning per followed column.
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
    before = [(n, a) for t, rel, n, a in masked if t == table and rel == relation_id]
    return mask.follow_renames(table, now, before, admin.src.name)
