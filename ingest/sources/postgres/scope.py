"""A Postgres source's table selection resolved against its catalog, and tables coming into or leaving scope.

Where ingest manages the publication it names each table (FOR TABLE ...), never FOR TABLES IN
SCHEMA: a schema-wide publication would send tables the selection excludes (their values leave the
server unmasked), and takes no per-table column lists (published.py). The member list is kept in
step instead: a table that comes into scope is added in a transaction that first takes a SHARE
lock on it, so every transaction that wrote to it has committed before the table is published, and
the snapshot that follows sees all of them (a transaction still open would have its earlier
changes decoded as unpublished, and be invisible to the snapshot's first page).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from ingest.errors import SourceError
from ingest.sources.postgres.changes import table_gone_prefix
from ingest.sources.postgres.published import supports_column_lists, table_spec, wanted_column_list

if TYPE_CHECKING:
    from ingest.sources.postgres.admin import PostgresAdmin

log = logging.getLogger(__name__)

# Tables a pattern may match: plain and partitioned tables (a partition is captured as its root),
# outside the system schemas.
CANDIDATES_SQL = (
    "select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace "
    "where c.relkind in ('r', 'p') and not c.relispartition and n.nspname <> 'information_schema' "
    "and n.nspname not like 'pg\\_%' order by 1, 2"
)
# How long publishing a new table waits for the SHARE lock (writers to it finishing) before trying
# again at the next check: the lock request queues the application's later writers behind it.
PUBLISH_LOCK_TIMEOUT = "2s"


@dataclass(frozen=True, slots=True)
class Scope:
    """What a selection resolves to now: the tables to capture, and on a user's publication what it lacks.

    `unpublished`: tables a pattern selects that the user's publication does not publish (left out
    until it does). `published_elsewhere`: tables the publication sends that the selection leaves
    out (their changes are skipped).
    """

    tables: tuple[str, ...]
    unpublished: tuple[str, ...] = ()
    published_elsewhere: tuple[str, ...] = ()


def candidates(admin: PostgresAdmin) -> list[tuple[str, str]]:
    """Every table of the database a pattern could select, as (schema, table)."""
    with admin.conn.cursor() as cur:
        cur.execute(CANDIDATES_SQL)
        return [(str(s), str(t)) for s, t in cur.fetchall()]


def publication_members(admin: PostgresAdmin) -> set[str]:
    """The tables the source's publication publishes (by name, schema-wide or all tables alike)."""
    name = admin.src.publication_name
    with admin.conn.cursor() as cur:
        cur.execute(
            "select n.nspname || '.' || c.relname from pg_publication p "
            "join pg_publication_rel r on r.prpubid = p.oid join pg_class c on c.oid = r.prrelid "
            "join pg_namespace n on n.oid = c.relnamespace where p.pubname = %s "
            "union select schemaname || '.' || tablename from pg_publication_tables where pubname = %s",
            (name, name),
        )
        return {str(r[0]) for r in cur.fetchall()}


def resolve_scope(admin: PostgresAdmin) -> Scope:
    """The selection against the catalog now; a selection of names only is returned as it is (no query).

    On a user's publication (`create_publication: false`) a table a pattern selects is captured
    only once the publication publishes it; named tables are required as before (ensure_publication).
    """
    selection = admin.src.selection
    if not selection.has_patterns:
        return Scope(tuple(selection.named))
    wanted = selection.resolve(candidates(admin))
    if admin.src.create_publication:
        return Scope(tuple(wanted))
    published = publication_members(admin)
    named = set(selection.named)
    tables = tuple(t for t in wanted if t in published or t in named)
    return Scope(
        tables,
        tuple(t for t in wanted if t not in tables),
        tuple(sorted(published - set(wanted))),
    )


def adopt_scope(admin: PostgresAdmin) -> Scope:
    """Resolve the selection at start and make it the source's tables; say what a user's publication lacks."""
    scope = resolve_scope(admin)
    src = admin.src
    if not scope.tables:
        raise SourceError(
            f"source {src.name!r}: tables {', '.join(src.selectors)} select no table yet"
            + (f" (excluding {', '.join(src.exclude)})" if src.exclude else "")
            + " that the publication publishes" * (not src.create_publication)
            + "; check the names with `changelake-ingest discover`"
        )
    src.set_tables(scope.tables)
    report_scope(src.name, src.publication_name, scope)
    return scope


def report_scope(source: str, publication: str, scope: Scope) -> None:
    """Log what is in scope and, on a user's publication, what is selected but not published and the reverse."""
    log.info("source=%s tables in scope: %s", source, ", ".join(scope.tables))
    if scope.unpublished:
        log.warning(
            "source=%s: %s selected but not in publication %s: not captured until it publishes them "
            "(ALTER PUBLICATION %s ADD TABLE ...)",
            source,
            ", ".join(scope.unpublished),
            publication,
            publication,
        )
    if scope.published_elsewhere:
        log.info(
            "source=%s: publication %s also publishes %s, outside the selection: their changes are skipped",
            source,
            publication,
            ", ".join(scope.published_elsewhere),
        )


def publish_with_columns(admin: PostgresAdmin, table: str, lock_timeout: str) -> None:
    """Add `table` with the column list its rules want (15+) once its writers have ended (publish_after_writers)."""
    columns = None
    if supports_column_lists(admin):
        columns = wanted_column_list(admin, table, admin.src.masks().table(table))
    publish_after_writers(admin, {table: table_spec(table, columns)}, lock_timeout)


def publish_after_writers(admin: PostgresAdmin, specs: dict[str, sql.Composable], lock_timeout: str) -> None:
    """Add the tables (`specs`: table -> its publication spec) under a SHARE lock on each (module doc).

    psycopg.errors.LockNotAvailable if a writer holds a table longer than `lock_timeout`. On a
    standby source, on its primary (where the writers are), and replayed by the standby on return.
    """
    conn = admin.writer()
    with conn.transaction():
        conn.execute(sql.SQL("set local lock_timeout = {}").format(sql.Literal(lock_timeout)))
        conn.execute(
            sql.SQL("lock table {} in share mode").format(
                sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in specs)
            )
        )
        conn.execute(
            sql.SQL("alter publication {} add table {}").format(
                sql.Identifier(admin.src.publication_name), sql.SQL(", ").join(specs.values())
            )
        )
    admin.await_standby()


class ScopeWatch:
    """Follows the selection while a run streams: tables that come into scope and that leave it.

    Responsibilities: re-resolve the selection, check a new table can be captured (keyed, its rules
    valid), publish it (when ingest manages the publication) with no transaction of it left open,
    make it one of the source's tables, and retire a table that left scope (dropped, renamed or
    moved out): its records are tombstoned where the stream meets the message written here, and
    it leaves the publication. A table that cannot be captured is said once and left out.
    """

    def __init__(self, admin: PostgresAdmin) -> None:
        """Watch `admin`'s source; its tables must have been adopted (adopt_scope)."""
        self.admin = admin
        self.refused: dict[str, str] = {}
        self._unpublished: set[str] = set()

    def check(self) -> tuple[list[str], list[str]]:
        """Bring tables that came into scope in and retire those that left; (came in, left)."""
        src = self.admin.src
        scope = resolve_scope(self.admin)
        now = set(scope.tables)
        current = set(src.tables)
        named = set(src.selection.named)
        came = [t for t in scope.tables if t not in current and t not in self.refused]
        left = [t for t in src.tables if t not in now and t not in named]
        fresh = set(scope.unpublished) - self._unpublished
        if fresh:
            report_scope(src.name, src.publication_name, Scope((), tuple(sorted(fresh))))
        self._unpublished = set(scope.unpublished)
        adopted = [t for t in came if self._admit(t)]
        if adopted or left:
            src.set_tables(tuple(t for t in src.tables if t not in left) + tuple(adopted))
        for t in left:
            self._retire(t)
        return adopted, left

    def _admit(self, table: str) -> bool:
        """Check and publish `table`; False (said once, with why) if it cannot be captured."""
        try:
            self.admin.check_table(table)
            if self.admin.src.create_publication:
                self._publish(table)
        except SourceError as e:
            self.refused[table] = str(e)
            log.error("source=%s: table %s came into scope but is not captured: %s", self.admin.src.name, table, e)
            return False
        except psycopg.errors.LockNotAvailable:
            log.info(
                "source=%s: table %s is being written to; publishing it at the next check", self.admin.src.name, table
            )
            return False
        log.warning("source=%s: table %s came into scope: capturing it", self.admin.src.name, table)
        return True

    def _publish(self, table: str) -> None:
        """Add `table` to the publication once every transaction that wrote to it has ended (module doc)."""
        admin = self.admin
        if table in publication_members(admin):
            return
        publish_with_columns(admin, table, PUBLISH_LOCK_TIMEOUT)

    def _retire(self, table: str) -> None:
        """Tombstone a table that left scope where the stream meets it, and take it out of the publication."""
        admin = self.admin
        log.warning(
            "source=%s: table %s left the selection (dropped, renamed or moved): tombstoning its records",
            admin.src.name,
            table,
        )
        admin.emit_message(table_gone_prefix(admin.src.slot_name), table)
        # A table renamed or moved out keeps its membership (by relation): it would go on being sent.
        admin.drop_unconfigured()
