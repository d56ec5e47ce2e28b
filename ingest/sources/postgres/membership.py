"""Which publication rows make each captured table a member, and what a change of them lost.

pgoutput decides with the catalog as of each change whether the table is published. A table
dropped from the publication and added back later is sent nothing in between, and nothing in the
stream says so. Each pg_publication_rel row (and, from Postgres 15, each pg_publication_namespace
row) has its own oid, and a row dropped and added back is a new row: so a table's membership is
the set of rows that make it a member (`rel:<oid>` for its own row or a partitioned ancestor's,
`ns:<oid>` for its schema's or an ancestor's, `all:<publication oid>` under FOR ALL TABLES), and
a recorded membership that shares no row with the catalog's means the table was out of the
publication at some moment since it was recorded. `ALTER PUBLICATION ... SET TABLE` keeps the row
of a table it leaves as it was (the same columns), and replaces it otherwise (checked on 14, 15
and 18).

Ingest records a table's membership with its shape rows (bronze.source_relations), so a start
(and `run --once`) sees a change made while no ingest ran; a continuous run compares at its
periodic shape check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from ingest.sources.postgres.scope import publish_with_columns

if TYPE_CHECKING:
    from ingest.sources.postgres.admin import PostgresAdmin

log = logging.getLogger(__name__)

SCHEMA_PUBLICATIONS_VERSION = 150000  # the first release with FOR TABLES IN SCHEMA (pg_publication_namespace)
# How long republishing a table that left a managed publication waits for its writers (scope.py):
# the loop is held meanwhile, and a table still written to is tried again at the next check.
REPUBLISH_LOCK_TIMEOUT = "2s"

# Each configured table (by schema and name) and what it is published by: its own row or a
# partitioned ancestor's, its schema's or an ancestor's (15+), or the whole database.
_RELATIONS = (
    "with wanted(schema_name, table_name) as (select * from unnest(%(schemas)s::text[], %(names)s::text[])), "
    "rels as (select w.schema_name, w.table_name, c.oid from wanted w "
    "  join pg_namespace n on n.nspname = w.schema_name "
    "  join pg_class c on c.relnamespace = n.oid and c.relname = w.table_name), "
    # pg_partition_ancestors lists nothing for a table that is not a partition or partitioned
    "lineage as (select rels.*, rels.oid as member from rels "
    "  union select rels.*, a.relid from rels cross join lateral pg_partition_ancestors(rels.oid) a(relid)), "
    "pub as (select oid, puballtables from pg_publication where pubname = %(publication)s) "
    "select rels.schema_name, rels.table_name, null from rels "
    "union all select l.schema_name, l.table_name, 'rel:' || r.oid from lineage l "
    "  join pg_publication_rel r on r.prrelid = l.member join pub on pub.oid = r.prpubid "
    "union all select rels.schema_name, rels.table_name, 'all:' || pub.oid from rels cross join pub "
    "  where pub.puballtables"
)
_SCHEMAS = (
    " union all select l.schema_name, l.table_name, 'ns:' || pn.oid from lineage l "
    "  join pg_class m on m.oid = l.member join pg_publication_namespace pn on pn.pnnspid = m.relnamespace "
    "  join pub on pub.oid = pn.pnpubid"
)


def encode(membership: frozenset[str]) -> str:
    """The token bronze stores: the rows sorted and comma-joined; '' for a table that is not a member."""
    return ",".join(sorted(membership))


def decode(token: str) -> frozenset[str]:
    """The rows of a stored token (encode's inverse)."""
    return frozenset(t for t in token.split(",") if t)


def membership_lost(recorded: frozenset[str] | None, found: frozenset[str]) -> bool:
    """Whether a table whose membership was `recorded` and is `found` now was out of the publication meanwhile.

    Only if the two share no row: a row in both was there throughout (a table that gained a schema's
    membership and then lost its own row never stopped being published). None (recorded by an older
    ingest, or a table ingest just took care of itself) is unknown, not a loss; so is a table that
    is still out of the publication as it was recorded (its leaving was met when it happened).
    """
    if recorded is None or recorded == found:
        return False
    return not recorded & found


def memberships(admin: PostgresAdmin, tables: Iterable[str]) -> dict[str, frozenset[str]]:
    """`schema.table` -> the rows of the source's publication that make it a member now (empty: none).

    A table the catalog does not have is left out.
    """
    pairs = [t.split(".", 1) for t in tables]
    query = _RELATIONS
    if admin.conn.info.server_version >= SCHEMA_PUBLICATIONS_VERSION:
        query += _SCHEMAS
    out: dict[str, set[str]] = {}
    with admin.conn.cursor() as cur:
        cur.execute(
            query,
            {
                "schemas": [s for s, _ in pairs],
                "names": [n for _, n in pairs],
                "publication": admin.src.publication_name,
            },
        )
        for schema, name, row in cur.fetchall():
            rows = out.setdefault(f"{schema}.{name}", set())
            if row is not None:
                rows.add(str(row))
    return {t: frozenset(rows) for t, rows in out.items()}


@dataclass(frozen=True, slots=True)
class MembershipCheck:
    """What one comparison found.

    `changed`: `schema.table` -> membership to record (it differs from the recorded one).
    `lost`: tables whose changes were not sent for a while and that are members again (to be
    re-snapshotted). `refusals`: for each named table a user's publication does not publish now,
    the error to raise once `changed` is recorded (its membership then reads as none, so its
    return is met as a change whatever had been recorded).
    """

    changed: dict[str, frozenset[str]]
    lost: list[str]
    refusals: list[str]


class MembershipWatch:
    """Compares each captured table's publication membership with the recorded one.

    Responsibilities: keep what bronze recorded last (`recorded`), find the tables whose changes
    were not sent for a while (out of the publication, back or not), publish such a table again
    where ingest manages the publication, refuse a named table a user's publication no longer
    publishes (with the statement to run), and say which memberships to record. Ingest's own
    publication changes are not losses: one that replaces a table's row in a single transaction
    (a new column list, at start) notes the rows before (`PostgresAdmin.memberships_before_own`), and a
    table ingest re-snapshots anyway for another reason is forgotten (`settle`) and recorded afresh.
    """

    def __init__(self, recorded: dict[str, frozenset[str]]) -> None:
        """Start from bronze's latest recorded membership of each table (tables without one: unknown)."""
        self.recorded = recorded

    def settle(self, table: str) -> None:
        """Take `table`'s next membership as it is: ingest brought the table in again itself (and snapshots it)."""
        self.recorded.pop(table, None)

    def check(self, admin: PostgresAdmin) -> MembershipCheck:
        """Compare every captured table's membership now with the recorded one (MembershipCheck).

        A table a pattern selected that left a user's publication is left to the scope watch (it
        retires it) and not recorded. A table that left a managed publication is published again
        first; if its writers hold it, it is tried again at the next check.
        """
        src = admin.src
        now = memberships(admin, src.tables)
        named = set(src.selection.named)
        changed: dict[str, frozenset[str]] = {}
        lost: list[str] = []
        refusals: list[str] = []
        for table in src.tables:
            if table not in now:
                continue  # gone: refused at the next start (check_tables)
            found = admin.memberships_before_own.pop(table, now[table])
            rec = self.recorded.get(table)
            if not now[table]:
                if not src.create_publication:
                    if table in named:
                        refusals.append(self._not_published(admin, table, rec))
                        if rec != now[table]:  # its return is then a change, whatever was recorded before
                            changed[table] = now[table]
                    continue  # a pattern's table: the scope watch retires it
                if not self._publish_again(admin, table, rec):
                    continue
                now[table] = memberships(admin, [table]).get(table, frozenset())
                admin.memberships_before_own.pop(table, None)
                lost.append(table)
            elif membership_lost(rec, found):
                log.warning(
                    "source=%s: table %s was out of publication %s for a while (its publication rows were %s, "
                    "now %s: dropped from it and added back): its changes in between were never sent; "
                    "re-snapshotting it",
                    src.name,
                    table,
                    src.publication_name,
                    encode(rec or frozenset()) or "none",
                    encode(now[table]),
                )
                lost.append(table)
            if now[table] != rec:
                changed[table] = now[table]
        return MembershipCheck(changed, lost, refusals)

    def _publish_again(self, admin: PostgresAdmin, table: str, rec: frozenset[str] | None) -> bool:
        """Add a table that left the managed publication back (scope.py's way); False if its writers hold it."""
        src = admin.src
        try:
            publish_with_columns(admin, table, REPUBLISH_LOCK_TIMEOUT)
        except psycopg.errors.LockNotAvailable:
            log.info("source=%s: table %s is being written to; publishing it at the next check", src.name, table)
            return False
        log.warning(
            "source=%s: table %s left publication %s%s: its changes since were never sent; added it back and "
            "re-snapshotting it",
            src.name,
            table,
            src.publication_name,
            "" if rec is None else f" (publication rows {encode(rec) or 'none'})",
        )
        return True

    @staticmethod
    def _not_published(admin: PostgresAdmin, table: str, rec: frozenset[str] | None) -> str:
        name = admin.src.publication_name
        return (
            f"source {admin.src.name!r}: publication {name!r} no longer publishes {table}"
            + ("" if rec is None else f" (it did through publication rows {encode(rec) or 'none'})")
            + ": its changes are not sent. Run ALTER PUBLICATION "
            f"{name} ADD TABLE {table} (or take the table out of `tables`); the next start re-snapshots it, "
            "which brings back what changed while it was out"
        )
