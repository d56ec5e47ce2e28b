"""Publication column lists (Postgres 15+): excluded columns are left at the server (masking.py).

A table with `exclude_columns` is published with a column list of every other column, so its
excluded values never leave the server. Postgres refuses an UPDATE or DELETE of a table whose
column list does not cover its replica identity, so a table whose replica identity holds an
excluded column (REPLICA IDENTITY FULL, or an index over it) is published whole: the server sends
the value and the decoder drops it (it still never lands). Before Postgres 15 every table is
published whole, the same way.

A column list names columns, so a column added to the table later is not published until the
list is set again: a Relation message of a table whose list lacks a column it should send is an
error, and the next start sets the list (when ingest manages the publication) and, since the
changes in between came without the column, stops with an error asking for a re-snapshot of the
table. So does un-excluding a column, for the same reason: its values are in no bronze row yet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg import sql

from ingest.errors import SourceError
from ingest.masking import TableMask

if TYPE_CHECKING:
    from ingest.sources.postgres.admin import PostgresAdmin

log = logging.getLogger(__name__)

COLUMN_LISTS_VERSION = 150000  # server_version_num of the first release with publication column lists
GENERATED_COLUMNS_VERSION = 180000  # the first release that can publish stored generated columns
# The columns pgoutput sends, for a query over pg_attribute `a` given publishes_generated() as its
# parameter: stored generated ones only when the publication publishes them (18+), else never.
SENT_COLUMN = "(a.attgenerated = '' or (a.attgenerated = 's' and %s))"


@dataclass(frozen=True, slots=True)
class TableColumnsNow:
    """A table's columns as pgoutput sends them, and the part of them its replica identity covers."""

    columns: tuple[str, ...]
    identity: frozenset[str]


def publishes_generated(admin: PostgresAdmin) -> bool:
    """Whether the publication sends stored generated columns (`publish_generated_columns`, 18+).

    Before 18 pgoutput never sends a generated column, so snapshots leave them out too: a column
    that only a snapshot carried would vanish at the row's next change.
    """
    if not supports_generated_columns(admin):
        return False
    row = admin._one("select pubgencols = 's' from pg_publication where pubname = %s", (admin.src.publication_name,))
    if row is None:  # not created yet: ingest creates it publishing them (admin.ensure_publication)
        return admin.src.create_publication
    return bool(row[0])


def supports_generated_columns(admin: PostgresAdmin) -> bool:
    """Whether the server can publish stored generated columns (Postgres 18+)."""
    row = admin._one("select current_setting('server_version_num')::int")
    return row is not None and int(str(row[0])) >= GENERATED_COLUMNS_VERSION


def table_columns(admin: PostgresAdmin, table: str) -> TableColumnsNow:
    """Columns as pgoutput sends them (not dropped, by attnum; SENT_COLUMN) and replica identity columns of `table`."""
    schema, name = table.split(".", 1)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select a.attname, case c.relreplident when 'f' then true "
            "when 'd' then exists(select 1 from pg_index i where i.indrelid = c.oid and i.indisprimary "
            "  and a.attnum = any(i.indkey)) "
            "when 'i' then exists(select 1 from pg_index i where i.indrelid = c.oid and i.indisreplident "
            "  and a.attnum = any(i.indkey)) else false end "
            "from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace "
            "where n.nspname = %s and c.relname = %s and a.attnum > 0 and not a.attisdropped "
            f"and {SENT_COLUMN} order by a.attnum",
            (schema, name, publishes_generated(admin)),
        )
        rows = cur.fetchall()
    return TableColumnsNow(tuple(str(r[0]) for r in rows), frozenset(str(r[0]) for r in rows if r[1]))


def supports_column_lists(admin: PostgresAdmin) -> bool:
    """Whether the server has publication column lists (Postgres 15+)."""
    row = admin._one("select current_setting('server_version_num')::int")
    return row is not None and int(str(row[0])) >= COLUMN_LISTS_VERSION


def wanted_column_list(admin: PostgresAdmin, table: str, mask: TableMask | None) -> tuple[str, ...] | None:
    """The column list `table` is published with: None (every column) unless it excludes columns."""
    if mask is None or not mask.exclude:
        return None
    now = table_columns(admin, table)
    in_identity = sorted(mask.exclude & now.identity)
    if in_identity:
        log.warning(
            "source=%s table=%s: excluded column(s) %s are part of the replica identity, which a publication "
            "column list must cover: the server sends them and ingest drops them before anything is written",
            admin.src.name,
            table,
            ", ".join(in_identity),
        )
        return None
    return tuple(c for c in now.columns if c not in mask.exclude)


def table_spec(table: str, columns: tuple[str, ...] | None) -> sql.Composable:
    """`schema.table` or `schema.table (c1, c2)` for CREATE / ALTER PUBLICATION."""
    ident = sql.Identifier(*table.split(".", 1))
    if columns is None:
        return ident
    return sql.SQL("{} ({})").format(ident, sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def published_columns(admin: PostgresAdmin, table: str) -> tuple[bool, tuple[str, ...] | None]:
    """Whether the publication names `table` itself, and the columns it publishes (None: all)."""
    schema, name = table.split(".", 1)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select r.prattrs is not null, coalesce((select array_agg(a.attname order by a.attnum) "
            "  from pg_attribute a where a.attrelid = r.prrelid and a.attnum = any(r.prattrs)), '{}') "
            "from pg_publication p join pg_publication_rel r on r.prpubid = p.oid "
            "join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace "
            "where p.pubname = %s and n.nspname = %s and c.relname = %s",
            (admin.src.publication_name, schema, name),
        )
        row = cur.fetchone()
    if row is None:
        return False, None
    has_list, names = row
    assert isinstance(names, list)
    return True, tuple(str(n) for n in names) if has_list else None


def sync_column_lists(admin: PostgresAdmin) -> None:
    """Make each configured table's column list the wanted one, or say what to run (existing publication).

    With `create_publication` (ingest manages the publication) a table whose list differs is
    dropped from and added back to the publication in one transaction: changes committed after it
    are sent with the new list, which is a new relation shape. Otherwise a table that publishes an
    excluded column it could leave out, or leaves out a column that is not excluded, is an error.
    """
    if not supports_column_lists(admin):
        return
    masks = admin.src.masks()
    name = admin.src.publication_name
    for table in admin.src.tables:
        mask = masks.table(table)
        wanted = wanted_column_list(admin, table, mask)
        listed, have = published_columns(admin, table)
        if have == wanted or (not listed and wanted is None):
            continue
        if not listed:  # published by a schema-wide or all-tables publication: no column list possible
            if wanted is not None:
                log.warning(
                    "source=%s table=%s: publication %s publishes the table by schema or all tables, so it "
                    "cannot leave excluded columns out; ingest drops them before anything is written",
                    admin.src.name,
                    table,
                    name,
                )
            continue
        statement = sql.SQL("alter publication {} drop table {}; alter publication {} add table {}").format(
            sql.Identifier(name), table_spec(table, None), sql.Identifier(name), table_spec(table, wanted)
        )
        unsent = [c for c in wanted or table_columns(admin, table).columns if have is not None and c not in have]
        if not admin.src.create_publication:
            raise SourceError(
                f"source {admin.src.name!r}: publication {name!r} publishes {table} with columns "
                f"{'all' if have is None else ', '.join(have)}, but the config asks for "
                f"{'all' if wanted is None else ', '.join(wanted)} (exclude_columns); run "
                f"{statement.as_string(admin.conn)} (or set create_publication: true)"
            )
        with admin.writer().transaction():
            admin.writer().execute(statement)
        admin.await_standby()
        log.info("source=%s table=%s: publication %s column list set", admin.src.name, table, name)
        if unsent:
            # Changes until now came without these columns: not a gap to pass over silently.
            raise SourceError(
                f"source {admin.src.name!r}: publication {name!r} did not send column(s) {', '.join(unsent)} of "
                f"{table} (added to the table after its column list was set, or no longer excluded); the list "
                "now includes them, so changes from here on carry them. Request a snapshot of the table "
                f"(`changelake-ingest snapshot {table}`) to bring their values in for the rows changed before, "
                "then run again"
            )


def check_published(admin: PostgresAdmin, table: str, mask: TableMask | None) -> None:
    """Refuse a table whose publication column list lacks a column it should send (added since it was set).

    Called on a Relation message of a table with excluded columns: changes from the column's
    addition on came without it, so the error names the restart (which sets the list again and
    asks for the re-snapshot that brings its values in).
    """
    if mask is None or not mask.exclude or not supports_column_lists(admin):
        return
    _listed, have = published_columns(admin, table)
    if have is None:
        return
    missing = [c for c in table_columns(admin, table).columns if c not in have and c not in mask.exclude]
    if missing:
        raise SourceError(
            f"source {admin.src.name!r}: table {table} has column(s) {', '.join(missing)} that publication "
            f"{admin.src.publication_name!r} does not send: its column list (which leaves the excluded columns "
            "out) was set before they were added. Run ingest again: it sets the list, and says how to bring "
            "their values in"
        )


def publish_again(admin: PostgresAdmin, table: str) -> None:
    """Add `table` to the publication if it is not in it: a table replaced under its name is another relation.

    Dropping a table takes it out of a publication that names tables, and the relation that now
    has its name was never in it. With `create_publication` it is added (with its column list);
    else SourceError with the statement to run.
    """
    name = admin.src.publication_name
    with admin.conn.cursor() as cur:
        cur.execute(
            "select 1 from pg_publication_tables where pubname = %s and schemaname || '.' || tablename = %s "
            "union all select 1 from pg_publication p join pg_publication_rel r on r.prpubid = p.oid "
            "where p.pubname = %s and r.prrelid = to_regclass(%s)",
            (name, table, name, sql.Identifier(*table.split(".", 1)).as_string(admin.conn)),
        )
        if cur.fetchone() is not None:
            return
    mask = admin.src.masks().table(table)
    columns = wanted_column_list(admin, table, mask) if supports_column_lists(admin) else None
    statement = sql.SQL("alter publication {} add table {}").format(sql.Identifier(name), table_spec(table, columns))
    if not admin.src.create_publication:
        raise SourceError(
            f"source {admin.src.name!r}: table {table} was replaced and the new table is not in publication {name!r}; "
            f"run {statement.as_string(admin.conn)} (or set create_publication: true)"
        )
    admin.writer().execute(statement)
    admin.await_standby()
    log.info("source=%s table=%s: added to publication %s again (replaced)", admin.src.name, table, name)
